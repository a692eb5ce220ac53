"""deepnorm_constants, NormResidual and TransformerEncoderBlock."""

import keras
import numpy as np
import pytest

import kerasnorm
from tests.support import blocks_reference
from tests.support.helpers import random_inputs
from tests.support.helpers import run_layer_test
from tests.support.helpers import tiered

SMALL = {"num_heads": 2, "key_dim": 4, "intermediate_dim": 16}
POSITIONS = ("pre", "post", "deepnorm")
NORM_TYPES = ("layer", "rms")


# deepnorm_constants: docs/design.md §3 table, recomputed here from the formulas.


@pytest.mark.parametrize("n", [1, 2, 6, 12, 48, 100, 1000])
def test_constants_encoder_only(n):
    alpha, beta = kerasnorm.deepnorm_constants(encoder_layers=n)["encoder"]
    assert set(kerasnorm.deepnorm_constants(encoder_layers=n)) == {"encoder"}
    np.testing.assert_allclose(alpha, (2.0 * n) ** 0.25, rtol=1e-12)
    np.testing.assert_allclose(beta, 1.0 / (8.0 * n) ** 0.25, rtol=1e-12)


@pytest.mark.parametrize("m", [1, 3, 12, 64, 500])
def test_constants_decoder_only(m):
    constants = kerasnorm.deepnorm_constants(decoder_layers=m)
    assert set(constants) == {"decoder"}
    np.testing.assert_allclose(constants["decoder"][0], (2.0 * m) ** 0.25, rtol=1e-12)
    np.testing.assert_allclose(
        constants["decoder"][1], 1.0 / (8.0 * m) ** 0.25, rtol=1e-12
    )


@pytest.mark.parametrize("n, m", [(1, 1), (6, 6), (12, 6), (18, 100), (100, 100)])
def test_constants_encoder_decoder(n, m):
    constants = kerasnorm.deepnorm_constants(encoder_layers=n, decoder_layers=m)
    assert set(constants) == {"encoder", "decoder"}
    root = (float(n) ** 4 * m) ** (1.0 / 16.0)
    np.testing.assert_allclose(constants["encoder"], (0.81 * root, 0.87 / root))
    np.testing.assert_allclose(
        constants["decoder"], ((3.0 * m) ** 0.25, (12.0 * m) ** -0.25)
    )


def test_constants_known_values():
    """Two entries worked out by hand: N = 2 gives alpha = 4**(1/4) = sqrt(2),
    beta = 16**(-1/4) = 1/2; N = M = 1 gives 0.81 and 0.87 exactly."""
    np.testing.assert_allclose(
        kerasnorm.deepnorm_constants(encoder_layers=2)["encoder"], (2**0.5, 0.5)
    )
    np.testing.assert_allclose(
        kerasnorm.deepnorm_constants(1, 1)["encoder"], (0.81, 0.87)
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "encoder_layers=None, decoder_layers=None"),
        ({"encoder_layers": 0}, "encoder_layers=0"),
        ({"decoder_layers": 2.5}, "decoder_layers=2.5"),
        ({"encoder_layers": 3, "decoder_layers": True}, "decoder_layers=True"),
    ],
)
def test_constants_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.deepnorm_constants(**kwargs)


# NormResidual


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_norm_residual_formula(position, norm_type):
    x = random_inputs((3, 4, 8), seed=4)
    alpha = 1.7 if position == "deepnorm" else 1.0
    dense = keras.layers.Dense(8, activation="tanh")
    layer = kerasnorm.NormResidual(
        dense, position, norm_type, alpha=alpha, norm_epsilon=1e-3
    )
    y = np.asarray(layer(x))
    blocks_reference.randomize(layer)
    y = np.asarray(layer(x))
    if norm_type == "layer":
        norm = keras.layers.LayerNormalization(epsilon=1e-3)
    else:
        norm = keras.layers.RMSNormalization(epsilon=1e-3)
    norm.build(x.shape)
    norm.set_weights(layer.norm.get_weights())
    ref_dense = keras.layers.Dense(8, activation="tanh")
    ref_dense.build(x.shape)
    ref_dense.set_weights(dense.get_weights())
    # A backend tensor: numpy + torch.Tensor is not defined on PyTorch.
    t = keras.ops.convert_to_tensor(x)
    expected = {
        "pre": lambda: t + ref_dense(norm(t)),
        "post": lambda: norm(t + ref_dense(t)),
        "deepnorm": lambda: norm(1.7 * t + ref_dense(t)),
    }[position]()
    np.testing.assert_allclose(y, keras.ops.convert_to_numpy(expected), atol=1e-5)


@pytest.mark.parametrize("position, checks", tiered(["post", "deepnorm"]))
def test_norm_residual_layer_test(position, checks, tmp_path):
    """The shared checks; mixed precision is covered through the blocks: the
    helper reuses the one `sublayer` instance of `init_kwargs` in every model,
    so a float32 sub-layer would sit inside a mixed_float16 wrapper."""
    run_layer_test(
        kerasnorm.NormResidual,
        {
            "sublayer": keras.layers.Dense(8),
            "norm_position": position,
            "norm_type": "rms",
            "alpha": 2.0 if position == "deepnorm" else 1.0,
        },
        (4, 5, 8),
        tmp_path,
        checks=checks,
        mixed_precision=False,
    )


def test_norm_residual_passes_call_arguments():
    """Extra call arguments go to the sub-layer; only the stream is normed."""
    x = random_inputs((2, 3, 8), seed=1)
    context = random_inputs((2, 5, 8), seed=2)
    mha = keras.layers.MultiHeadAttention(2, 4)
    layer = kerasnorm.NormResidual(mha, "pre")
    y = np.asarray(layer(x, context))
    expected = x + np.asarray(mha(np.asarray(layer.norm(x)), context))
    np.testing.assert_allclose(y, expected, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sublayer": "dense"}, "sublayer='dense'"),
        ({"norm_position": "middle"}, "norm_position='middle'"),
        ({"norm_type": "batch"}, "norm_type='batch'"),
        ({"alpha": 2.0}, "alpha=2.0"),
        ({"norm_position": "deepnorm", "alpha": 0.0}, "alpha=0.0"),
        ({"norm_epsilon": 0}, "norm_epsilon=0"),
        ({"dropout": 1.0}, "dropout=1.0"),
    ],
)
def test_norm_residual_bad_arguments(kwargs, match):
    kwargs = {"sublayer": keras.layers.Dense(4), **kwargs}
    with pytest.raises(ValueError, match=match):
        kerasnorm.NormResidual(**kwargs)


# TransformerEncoderBlock


@pytest.mark.parametrize(
    "kwargs, checks",
    tiered(
        [
            {"norm_position": "pre", "norm_type": "layer"},
            {"norm_position": "post", "norm_type": "rms", "activation": "relu"},
            {"norm_position": "deepnorm", "norm_type": "layer", "num_layers": 24},
            {"norm_position": "deepnorm", "norm_type": "rms", "decoder_layers": 6},
        ]
    ),
)
def test_encoder_layer_test(kwargs, checks, tmp_path):
    run_layer_test(
        kerasnorm.TransformerEncoderBlock,
        {**SMALL, **kwargs},
        (4, 5, 8),
        tmp_path,
        checks=checks,
        expected_output_shape=(4, 5, 8),
    )


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_encoder_matches_keras_reference(position, norm_type):
    x = random_inputs((3, 6, 8), seed=5)
    block = kerasnorm.TransformerEncoderBlock(
        **SMALL, norm_position=position, norm_type=norm_type, num_layers=12
    )
    block(x)
    blocks_reference.randomize(block)
    expected = blocks_reference.encoder(
        block,
        x,
        position=position,
        norm_type=norm_type,
        alpha=blocks_reference.alpha_for(position, "encoder", n=12),
    )
    np.testing.assert_allclose(np.asarray(block(x)), expected, atol=1e-5)


def test_encoder_decoder_constants_change_alpha():
    x = random_inputs((2, 4, 8), seed=6)
    block = kerasnorm.TransformerEncoderBlock(
        **SMALL, norm_position="deepnorm", num_layers=12, decoder_layers=3
    )
    block(x)
    blocks_reference.randomize(block)
    alpha = blocks_reference.alpha_for("deepnorm", "encoder", n=12, m=3)
    assert block.alpha == pytest.approx(alpha)
    expected = blocks_reference.encoder(
        block, x, position="deepnorm", norm_type="layer", alpha=alpha
    )
    np.testing.assert_allclose(np.asarray(block(x)), expected, atol=1e-5)


def _padded_batch():
    x = random_inputs((2, 5, 8), seed=7)
    padding = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=bool)
    return x, padding


@pytest.mark.parametrize("position", POSITIONS)
def test_encoder_padding_mask(position):
    """Padded keys are not attended to: the reference with the same mask
    agrees on real tokens, and changing padded inputs changes nothing there."""
    x, padding = _padded_batch()
    block = kerasnorm.TransformerEncoderBlock(**SMALL, norm_position=position)
    block(x)
    blocks_reference.randomize(block)
    y = np.asarray(block(x, padding_mask=padding))
    attention = np.broadcast_to(padding[:, None, :], (2, 5, 5))
    expected = blocks_reference.encoder(
        block,
        x,
        position=position,
        norm_type="layer",
        alpha=blocks_reference.alpha_for(position, "encoder", n=1),
        mask=attention,
    )
    np.testing.assert_allclose(y, expected, atol=1e-5)
    y_attention = np.asarray(block(x, attention_mask=attention))
    np.testing.assert_allclose(y_attention, y, atol=1e-6)
    changed = x.copy()
    changed[0, 3:] += 5.0
    y_changed = np.asarray(block(changed, padding_mask=padding))
    np.testing.assert_allclose(y_changed[padding], y[padding], atol=1e-5)
    assert not np.allclose(np.asarray(block(changed)), np.asarray(block(x)))


def test_encoder_keras_mask_propagates():
    tokens = np.array([[3, 1, 4, 0, 0], [1, 5, 9, 2, 6]])
    inputs = keras.Input((5,), dtype="int32")
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    block = kerasnorm.TransformerEncoderBlock(**SMALL)
    outputs = block(embedded)
    pooled = keras.layers.GlobalAveragePooling1D()(outputs)
    model = keras.Model(inputs, [outputs, pooled])
    y, _ = model(tokens)
    padding = tokens != 0
    mask = model.get_layer(index=2).compute_mask(embedded, embedded._keras_mask)
    assert mask is not None
    embeddings = np.asarray(model.layers[1](tokens))
    expected = np.asarray(block(embeddings, padding_mask=padding))
    np.testing.assert_allclose(np.asarray(y)[padding], expected[padding], atol=1e-5)
    # The pooled output averages real tokens only: the mask reached the pooling.
    pooled_expected = np.stack(
        [np.asarray(y)[i][padding[i]].mean(axis=0) for i in range(2)]
    )
    np.testing.assert_allclose(np.asarray(model(tokens)[1]), pooled_expected, atol=1e-5)


def test_encoder_dropout():
    x = random_inputs((2, 5, 8), seed=8)
    block = kerasnorm.TransformerEncoderBlock(**SMALL, dropout=0.5)
    eval_1 = np.asarray(block(x, training=False))
    eval_2 = np.asarray(block(x, training=False))
    np.testing.assert_array_equal(eval_1, eval_2)
    assert not np.allclose(np.asarray(block(x, training=True)), eval_1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"norm_position": "sandwich"}, "norm_position='sandwich'"),
        ({"norm_type": "batch"}, "norm_type='batch'"),
        ({"num_layers": 0}, "num_layers=0"),
        ({"num_layers": 2.0}, "num_layers=2.0"),
        ({"num_heads": 0}, "num_heads=0"),
        ({"key_dim": -4}, "key_dim=-4"),
        ({"key_dim": None}, "key_dim=None"),
        ({"intermediate_dim": 0}, "intermediate_dim=0"),
        ({"dropout": -0.1}, "dropout=-0.1"),
        ({"norm_epsilon": -1.0}, "norm_epsilon=-1.0"),
        ({"decoder_layers": 0}, "decoder_layers=0"),
    ],
)
def test_encoder_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kerasnorm.TransformerEncoderBlock(**{**SMALL, **kwargs})


# DeepNorm initialization: Xavier-normal, gain beta for the FFN and the
# attention value/output projections, gain 1 for query/key.


def xavier_std(gain, fan_in, fan_out):
    return gain * np.sqrt(2.0 / (fan_in + fan_out))


def assert_xavier_normal(kernel, gain, fan_in, fan_out):
    """Std within 3% (the standard error at 65k entries is ~0.3%), mean ~0,
    and the kurtosis of a normal (3; a uniform draw has 1.8)."""
    w = np.asarray(kernel, dtype="float64").ravel()
    expected = xavier_std(gain, fan_in, fan_out)
    np.testing.assert_allclose(w.std(), expected, rtol=0.03)
    assert abs(w.mean()) < 0.05 * expected
    kurtosis = np.mean((w - w.mean()) ** 4) / w.var() ** 2
    assert abs(kurtosis - 3.0) < 0.15, kurtosis


def check_block_init(residuals, beta, width, heads, key_dim, intermediate):
    for residual in residuals["attention"]:
        mha = residual.sublayer.attention
        for dense in (mha.query_dense, mha.key_dense):
            assert_xavier_normal(dense.kernel.numpy(), 1.0, width, heads * key_dim)
        assert_xavier_normal(
            mha.value_dense.kernel.numpy(), beta, width, heads * key_dim
        )
        assert_xavier_normal(
            mha.output_dense.kernel.numpy(), beta, heads * key_dim, width
        )
        for dense in (
            mha.query_dense,
            mha.key_dense,
            mha.value_dense,
            mha.output_dense,
        ):
            assert not np.any(dense.bias.numpy())
    ffn = residuals["feed_forward"].sublayer
    assert_xavier_normal(ffn.intermediate.kernel.numpy(), beta, width, intermediate)
    assert_xavier_normal(ffn.output_dense.kernel.numpy(), beta, intermediate, width)


@pytest.mark.parametrize(
    "position, num_layers, decoder_layers, beta",
    [
        ("deepnorm", 50, None, (8 * 50) ** -0.25),
        ("deepnorm", 12, 100, 0.87 * (12**4 * 100) ** (-1 / 16)),
        ("post", 50, None, 1.0),
        ("pre", 50, None, 1.0),
    ],
)
def test_encoder_initialization(position, num_layers, decoder_layers, beta):
    width, heads, key_dim, intermediate = 256, 4, 64, 1024
    keras.utils.set_random_seed(11)
    block = kerasnorm.TransformerEncoderBlock(
        heads,
        key_dim,
        intermediate,
        norm_position=position,
        num_layers=num_layers,
        decoder_layers=decoder_layers,
    )
    block.build((None, 4, width))
    assert block.beta == pytest.approx(beta)
    check_block_init(
        {"attention": [block.self_attention], "feed_forward": block.feed_forward},
        beta,
        width,
        heads,
        key_dim,
        intermediate,
    )
