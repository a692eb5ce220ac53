"""Decoders as users write them, exported by `to_litert_lm` and checked
token by token against their own full forward pass: keras.io's "GPT from
scratch with KerasHub" layout, `x + PositionEmbedding(L)(x)` with keras.ops
calls on the way, Keras' `MultiHeadAttention(use_causal_mask=True)` in a
functional graph, and keras.io's "miniature GPT", refused as the tutorial
writes it and generating after the documented `cached_step` change."""

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import cached_multi_head_attention
from kerasnorm.export import litert
from kerasnorm.export import to_litert_lm
from tests.export import lm_models

keras_hub = pytest.importorskip("keras_hub")

pytestmark = pytest.mark.tf_only
V = lm_models.VOCAB

LAYOUTS = {
    "hub_gpt": lm_models.hub_gpt,
    "operator": lm_models.operator_decoder,
    "attention": lm_models.attention_decoder,
    "miniature": lambda **kw: lm_models.miniature_gpt(cached=True, **kw),
}


def _greedy_reference(model, prompt, new):
    sequence = list(prompt)
    for _ in range(new):
        logits = np.asarray(model(np.array([sequence], np.int32), training=False))
        sequence.append(int(np.argmax(logits[0, -1])))
    return sequence[len(prompt) :]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_untrained_layout_generates_as_its_forward_pass(layout, tmp_path):
    """Every layout, one layer, float32: the export's own check (every
    step's logits within 1e-4 of the full pass's largest, the same greedy
    tokens), and the file's continuation against Keras' from Python."""
    keras.utils.set_random_seed(1)
    model = LAYOUTS[layout](layers=1)
    # As a trained model does, it never chooses the padding id 0, which a
    # `mask_zero` embedding's full pass masks and a cache does not hold.
    head = model.layers[-1]
    head.bias.assign(np.where(np.arange(V) == 0, -1e4, 0.0).astype("float32"))
    path = tmp_path / "lm.tflite"
    result = to_litert_lm(model, path, max_sequence_length=16, prefill_lengths=(4,))
    assert result.check.max_error <= 1e-4 and result.check.agreement == 1.0
    assert result.num_layers == 1
    assert result.delegation.partitions == 1
    prompt = [3, 1, 4, 1, 5]
    got = litert.Generator(path.read_bytes()).generate(prompt, 6)
    assert got == _greedy_reference(model, prompt, 6)


# CI's slow tier: the two keras.io layouts trained, one per mode (the
# default tier runs every layout untrained in float32); the rest of the
# product with -m exhaustive.
TRAINED = [
    ("hub_gpt", None),
    ("miniature", "dynamic"),
    *[
        pytest.param(layout, quantize, marks=pytest.mark.exhaustive)
        for layout, quantize in [
            ("attention", None),
            ("operator", None),
            ("miniature", None),
            ("hub_gpt", "dynamic"),
            ("attention", "dynamic"),
            ("operator", "dynamic"),
        ]
    ],
]


@pytest.mark.slow
@pytest.mark.parametrize("layout, quantize", TRAINED)
def test_trained_layout_generates_as_its_forward_pass(layout, quantize, tmp_path):
    """Two layers trained for seconds on the rule (the model predicts most
    of its next tokens): the file's greedy continuation is the model's own
    in float32, and its choice on 90 % of the steps in dynamic int8."""
    keras.utils.set_random_seed(0)
    kwargs = {"layers": 2} if layout == "miniature" else {}
    model = lm_models.train(LAYOUTS[layout](**kwargs), steps=400)
    rule = lm_models.rule_sequences(64, seed=7)
    predicted = np.argmax(np.asarray(model(rule[:, :-1])), axis=-1)
    assert np.mean(predicted[:, 2:] == rule[:, 3:]) >= 0.7
    prompts = rule[:2, :5]
    result = to_litert_lm(
        model,
        tmp_path / "lm.tflite",
        max_sequence_length=24,
        prefill_lengths=(8,),
        quantize=quantize,
        verify_inputs=prompts,
    )
    assert result.check.agreement >= (1.0 if quantize is None else 0.9)
    if quantize is None:
        generator = litert.Generator((tmp_path / "lm.tflite").read_bytes())
        got = generator.generate(prompts[0].tolist(), 10)
        assert got == _greedy_reference(model, prompts[0].tolist(), 10)


def test_miniature_gpt_is_refused_by_name_before_the_change(tmp_path):
    keras.utils.set_random_seed(0)
    model = lm_models.miniature_gpt(cached=False)
    with pytest.raises(ValueError) as info:
        to_litert_lm(model, tmp_path / "lm.tflite", max_sequence_length=16)
    message = str(info.value)
    assert "MiniTokenAndPositionEmbedding" in message
    assert "cached_step(x, key_cache, value_cache, positions)" in message
    assert "cached_step(x, positions)" in message
    # Past the embedding, the block is named too.
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(V, 32)(tokens)
    x = keras_hub.layers.PositionEmbedding(64)(x) + x
    x = lm_models.MiniTransformerBlock(32, 2, 64, name="tutorial_block")(x)
    block_only = keras.Model(tokens, keras.layers.Dense(V)(x))
    with pytest.raises(ValueError, match=r"'tutorial_block' \(MiniTransformerBlock\)"):
        to_litert_lm(block_only, tmp_path / "lm.tflite", max_sequence_length=16)
    assert not list(tmp_path.iterdir())


def _decoder_around(mixer_output):
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(V, 16)(tokens)
    x = mixer_output(x)
    x = kerasnorm.TransformerDecoderBlock(2, 8, 32)(x)
    return keras.Model(tokens, keras.layers.Dense(V)(x), name="decoder")


@pytest.mark.parametrize(
    "mixer, match",
    [
        (
            lambda x: keras.layers.MultiHeadAttention(2, 8, name="mha")(x, x),
            r"'mha' .* without use_causal_mask=True",
        ),
        (
            lambda x: keras.layers.MultiHeadAttention(2, 8, name="mha")(
                x, keras.layers.Dense(16)(x), use_causal_mask=True
            ),
            r"'mha' .* another sequence",
        ),
        (
            lambda x: keras.layers.MultiHeadAttention(2, 8, value_dim=4, name="mha")(
                x, x, use_causal_mask=True
            ),
            r"'mha' .* value_dim != key_dim",
        ),
        (
            lambda x: x + keras.ops.cumsum(x, axis=1),
            r"\(Cumsum\) .* mixes positions",
        ),
        (
            lambda x: x * keras.ops.mean(x, axis=1, keepdims=True),
            r"\(Mean\) .* mixes positions",
        ),
        (
            lambda x: keras.layers.Conv1D(16, 3, padding="causal", name="conv")(x),
            r"'conv' \(Conv1D\) .* no cached path",
        ),
        (
            lambda x: keras_hub.layers.TransformerDecoder(32, 2, name="cross")(x, x),
            r"'cross' .* encoder_sequence",
        ),
    ],
)
def test_layers_that_mix_positions_otherwise_are_refused_by_name(
    mixer, match, tmp_path
):
    model = _decoder_around(mixer)
    with pytest.raises(ValueError, match=match):
        to_litert_lm(model, tmp_path / "lm.tflite", max_sequence_length=16)
    assert not list(tmp_path.iterdir())


class _NoShape(keras.layers.Layer):
    def call(self, x):
        return x

    def cached_step(self, x, key_cache, value_cache, positions):
        return x, (key_cache, value_cache)


def test_protocol_layer_without_a_cache_shape_is_refused(tmp_path):
    model = _decoder_around(lambda x: _NoShape(name="own")(x))
    with pytest.raises(ValueError, match=r"'own' .*cache_shape = \(g, d\)"):
        to_litert_lm(model, tmp_path / "lm.tflite", max_sequence_length=16)


def test_a_position_mixing_op_past_the_positionwise_ones_is_per_position():
    """Softmax and a mean over the feature axis act on each position alone:
    accepted (the graph step is built, not refused)."""
    from kerasnorm.export.litert_lm.graph_step import graph_step

    def mixer(x):
        return keras.ops.softmax(x, axis=-1) * keras.ops.mean(x, axis=-1, keepdims=True)

    found = graph_step(_decoder_around(mixer))
    assert found.cache_shapes == [(2, 8)]


def test_cached_multi_head_attention_equals_the_causal_call():
    """Over a cache, prefill then one row at a time: the layer's own causal
    call on the whole sequence."""
    attention = keras.layers.MultiHeadAttention(2, 8)
    x = np.random.default_rng(0).normal(size=(1, 6, 16)).astype("float32")
    full = np.asarray(attention(x, x, use_causal_mask=True))
    k = v = np.zeros((1, 2, 8, 8), "float32")
    y, (k, v) = cached_multi_head_attention(attention, x[:, :3], k, v, np.arange(3))
    rows = [np.asarray(y)]
    for t in range(3, 6):
        y, (k, v) = cached_multi_head_attention(
            attention, x[:, t : t + 1], k, v, np.array([t])
        )
        rows.append(np.asarray(y))
    np.testing.assert_allclose(np.concatenate(rows, 1), full, atol=1e-5)
    assert not np.asarray(k)[:, :, 6:].any()


def test_attention_parts_without_the_public_properties():
    """A Keras whose MultiHeadAttention has no `query_dense` property: the
    attributes behind it (the fallback of `multi_head_attention_parts`)."""
    from types import SimpleNamespace

    from kerasnorm._compat.keras_attention import multi_head_attention_parts

    old = SimpleNamespace(
        _query_dense="q", _key_dense="k", _value_dense="v", _output_dense="o", key_dim=4
    )
    assert multi_head_attention_parts(old) == ("q", "k", "v", "o", 0.5)
    new = keras.layers.MultiHeadAttention(2, 16)
    new(np.zeros((1, 3, 8), "float32"), np.zeros((1, 3, 8), "float32"))
    parts = multi_head_attention_parts(new)
    names = ("query_dense", "key_dense", "value_dense", "output_dense")
    assert all(p is getattr(new, n) for p, n in zip(parts, names, strict=False))
    assert parts[4] == 0.25
