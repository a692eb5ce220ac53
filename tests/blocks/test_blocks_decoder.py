"""TransformerDecoderBlock: causal self-attention, cross-attention, FFN."""

import keras
import numpy as np
import pytest

import kerasnorm
from tests.blocks.test_blocks import check_block_init
from tests.support import blocks_reference
from tests.support.helpers import random_inputs
from tests.support.helpers import run_layer_test
from tests.support.helpers import tiered

SMALL = {"num_heads": 2, "key_dim": 4, "intermediate_dim": 16}
POSITIONS = ("pre", "post", "deepnorm")


@pytest.mark.parametrize(
    "kwargs, shapes, checks",
    tiered(
        [
            # First, so that its compiled checks run in the default tier: one
            # with cross-attention (an encoder input).
            ({"norm_position": "post", "num_layers": 3}, [(4, 5, 8), (4, 4, 8)]),
            ({"norm_position": "pre"}, (4, 5, 8)),
            (
                {"norm_position": "deepnorm", "norm_type": "rms", "encoder_layers": 6},
                [(4, 5, 8), (4, 6, 12)],
            ),
        ]
    ),
)
def test_decoder_layer_test(kwargs, shapes, checks, tmp_path):
    run_layer_test(
        kerasnorm.TransformerDecoderBlock,
        {**SMALL, **kwargs},
        shapes,
        tmp_path,
        checks=checks,
        expected_output_shape=(4, 5, 8),
        unpack_inputs=True,
    )


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("norm_type", ("layer", "rms"))
@pytest.mark.parametrize("cross", (False, True))
def test_decoder_matches_keras_reference(position, norm_type, cross):
    x = random_inputs((3, 5, 8), seed=1)
    context = random_inputs((3, 7, 8), seed=2) if cross else None
    block = kerasnorm.TransformerDecoderBlock(
        **SMALL,
        norm_position=position,
        norm_type=norm_type,
        num_layers=6,
        encoder_layers=4 if cross else None,
    )
    args = (x, context) if cross else (x,)
    block(*args)
    blocks_reference.randomize(block)
    alpha = blocks_reference.alpha_for(position, "decoder", n=4 if cross else None, m=6)
    expected = blocks_reference.decoder(
        block, x, context, position=position, norm_type=norm_type, alpha=alpha
    )
    np.testing.assert_allclose(np.asarray(block(*args)), expected, atol=1e-5)


@pytest.mark.parametrize("position", POSITIONS)
def test_decoder_is_causal(position):
    x = random_inputs((2, 6, 8), seed=3)
    context = random_inputs((2, 4, 8), seed=4)
    block = kerasnorm.TransformerDecoderBlock(
        **SMALL, norm_position=position, encoder_layers=2
    )
    y = np.asarray(block(x, context))
    changed = x.copy()
    changed[:, 4:] += 3.0
    y_changed = np.asarray(block(changed, context))
    np.testing.assert_allclose(y_changed[:, :4], y[:, :4], atol=1e-5)
    assert not np.allclose(y_changed[:, 4:], y[:, 4:])


def test_decoder_masks():
    """Padded encoder positions are not attended to; decoder padding and the
    extra decoder attention mask combine with the causal mask."""
    x = random_inputs((2, 5, 8), seed=5)
    context = random_inputs((2, 4, 8), seed=6)
    enc_padding = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=bool)
    dec_padding = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=bool)
    block = kerasnorm.TransformerDecoderBlock(**SMALL)
    block(x, context)
    blocks_reference.randomize(block)
    y = np.asarray(
        block(
            x,
            context,
            encoder_padding_mask=enc_padding,
            decoder_padding_mask=dec_padding,
        )
    )
    changed_context = context.copy()
    changed_context[0, 2:] += 4.0
    changed_x = x.copy()
    changed_x[0, 4] += 4.0
    y_changed = np.asarray(
        block(
            changed_x,
            changed_context,
            encoder_padding_mask=enc_padding,
            decoder_padding_mask=dec_padding,
        )
    )
    np.testing.assert_allclose(y_changed[dec_padding], y[dec_padding], atol=1e-5)
    same = np.asarray(
        block(
            x,
            context,
            encoder_attention_mask=np.broadcast_to(enc_padding[:, None], (2, 5, 4)),
            decoder_attention_mask=np.broadcast_to(dec_padding[:, None], (2, 5, 5)),
        )
    )
    np.testing.assert_allclose(same, y, atol=1e-6)


def test_decoder_keras_mask_propagates():
    tokens = np.array([[3, 1, 4, 0, 0], [1, 5, 9, 2, 6]])
    inputs = keras.Input((5,), dtype="int32")
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    outputs = kerasnorm.TransformerDecoderBlock(**SMALL)(embedded)
    pooled = keras.layers.GlobalAveragePooling1D()(outputs)
    model = keras.Model(inputs, [outputs, pooled])
    y, pooled = (np.asarray(t) for t in model(tokens))
    padding = tokens != 0
    expected = np.stack([y[i][padding[i]].mean(axis=0) for i in range(2)])
    np.testing.assert_allclose(pooled, expected, atol=1e-5)


def test_decoder_initialization():
    """Decoder constants of an encoder-decoder model, both attentions."""
    width, heads, key_dim, intermediate, m = 256, 4, 64, 1024, 30
    keras.utils.set_random_seed(12)
    block = kerasnorm.TransformerDecoderBlock(
        heads,
        key_dim,
        intermediate,
        norm_position="deepnorm",
        num_layers=m,
        encoder_layers=10,
    )
    block.build((None, 4, width), (None, 6, width))
    beta = (12 * m) ** -0.25
    assert block.beta == pytest.approx(beta)
    check_block_init(
        {
            "attention": [block.self_attention, block.cross_attention],
            "feed_forward": block.feed_forward,
        },
        beta,
        width,
        heads,
        key_dim,
        intermediate,
    )


def test_decoder_only_constants():
    block = kerasnorm.TransformerDecoderBlock(
        **SMALL, norm_position="deepnorm", num_layers=8
    )
    assert (block.alpha, block.beta) == pytest.approx((16**0.25, 64**-0.25))


def test_deepnorm_cross_attention_needs_encoder_layers():
    block = kerasnorm.TransformerDecoderBlock(**SMALL, norm_position="deepnorm")
    with pytest.raises(ValueError, match="encoder_layers=None"):
        block(random_inputs((2, 3, 8)), random_inputs((2, 4, 8)))


def test_call_must_match_build():
    block = kerasnorm.TransformerDecoderBlock(**SMALL)
    block(random_inputs((2, 3, 8)))
    with pytest.raises(ValueError, match="without cross-attention"):
        block(random_inputs((2, 3, 8)), random_inputs((2, 4, 8)))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"norm_position": "postln"}, "norm_position='postln'"),
        ({"norm_type": "group"}, "norm_type='group'"),
        ({"num_layers": 0}, "num_layers=0"),
        ({"num_heads": 1.5}, "num_heads=1.5"),
        ({"key_dim": 0}, "key_dim=0"),
        ({"encoder_layers": -2}, "encoder_layers=-2"),
    ],
)
def test_decoder_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.TransformerDecoderBlock(**{**SMALL, **kwargs})
