"""`quantize="int16x8"` on the text and token models: the exact GELU of a
`TransformerEncoderBlock`'s default `activation="gelu"`, integer token
inputs into an `Embedding`, and the refusal of a Keras mask.

References: the exact GELU from its equation, `0.5 x (1 + erf(x / sqrt 2))`
in float64 (`math.erf`); the Keras model for the files' checks; for the
embedding rewrite, the rows of the embedding table themselves.
"""

import math

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import QUANTIZE_MODES
from kerasnorm.export import ExportConversionError
from kerasnorm.export import litert
from kerasnorm.export import to_tflite

pytestmark = pytest.mark.tf_only

L = keras.layers
LENGTH, WIDTH, VOCAB = 12, 16, 50


def _features(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, LENGTH, WIDTH)).astype("float32")


def _tokens(n, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (n, LENGTH)).astype("int32")


def _encoder(activation="gelu", tokens=False, norm_position="pre"):
    keras.utils.set_random_seed(0)
    if tokens:
        inputs = keras.Input((LENGTH,), dtype="int32", name="tokens")
        x = L.Embedding(VOCAB, WIDTH)(inputs)
    else:
        inputs = x = keras.Input((LENGTH, WIDTH), name="x")
    x = kerasnorm.TransformerEncoderBlock(
        num_heads=2,
        key_dim=8,
        intermediate_dim=32,
        activation=activation,
        norm_position=norm_position,
        name="block",
    )(x)
    x = L.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, L.Dense(2)(x))


def _rms_rel(path, model, data):
    """The file's rms error against the Keras model on `data`, relative to
    the rms of the model's output (one sample per call, the file's batch)."""
    runner = litert.Runner(path.read_bytes(), model)  # inputs in model order
    flat = data if isinstance(data, list) else [data]
    got = np.concatenate(
        [runner([x[i : i + 1] for x in flat])[0] for i in range(len(flat[0]))]
    )
    want = np.asarray(model(data))
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))


# Held-out rms error a mode's file stays under (its check's tolerance).
RMS_LIMIT = {None: 1e-4, "float16": 1e-2, "dynamic": 0.05, "int8": 0.1, "int16x8": 0.05}


def _export(model, path, quantize, data):
    return to_tflite(
        model,
        path,
        quantize=quantize,
        batch_size=1,
        representative_data=data,
        verify_inputs=data,
    )


def _mode_cells():
    # The int8 file of an untrained block on token ids misses its 0.1 check
    # (rms 0.16-0.22: issue 33's int8-on-tokens item, not the GELU's);
    # on features the block is within it, and every other mode on both.
    for tokens in (False, True):
        for q in QUANTIZE_MODES:
            if tokens and q == "int8":
                continue
            slow = () if q in ("int16x8", None) else (pytest.mark.slow,)
            kind = "tokens" if tokens else "features"
            yield pytest.param(q, tokens, marks=slow, id=f"{q}-{kind}")


@pytest.mark.parametrize("quantize, tokens", list(_mode_cells()))
def test_default_gelu_encoder_exports_in_every_mode(quantize, tokens, tmp_path):
    """The block with its default, exact GELU: every mode converts it with
    TFLite's `GELU` builtin (no `tf.Erfc`, which has no TFLite op) and the
    file passes its mode's check, on float features and on token ids."""
    model = _encoder(tokens=tokens)
    data = _tokens(48) if tokens else _features(48)
    path = tmp_path / "m.tflite"
    _export(model, path, quantize, data)
    held_out = _tokens(16, seed=7) if tokens else _features(16, seed=7)
    assert _rms_rel(path, model, held_out) < RMS_LIMIT[quantize]
    ops = litert.op_counts(path.read_bytes())
    assert ops.get("GELU") == 1, ops
    if tokens:
        assert ops.get("GATHER") == 1, ops


def test_int16x8_gelu_is_as_accurate_as_the_relu_block(tmp_path):
    """Equal accuracy: the GELU file's error is within the relu block's
    (same weights, same inputs) by the int16 rounding, not a
    approximation's."""
    data = _features(64)
    errors = {}
    for activation in ("gelu", "relu"):
        result = _export(
            _encoder(activation), tmp_path / f"{activation}.tflite", "int16x8", data
        )
        errors[activation] = result.verification.rms_rel_error
    assert errors["gelu"] < 0.02
    assert errors["gelu"] < 2 * errors["relu"]


def test_int16x8_gelu_op_against_the_exact_equation(tmp_path):
    """TFLite's int16 `GELU` kernel against `0.5 x (1 + erf(x / sqrt 2))`
    on [-6, 6]: within a few steps of the output's int16 scale (6 / 32767),
    below the tanh approximation's own error (4.7e-4 at x = +-2.1)."""
    inputs = keras.Input((4001,))
    model = keras.Model(inputs, L.Activation("gelu")(inputs))
    x = np.linspace(-6, 6, 4001, dtype="float32")[None]
    path = tmp_path / "gelu.tflite"
    to_tflite(model, path, quantize="int16x8", representative_data=x)
    content = path.read_bytes()
    assert "GELU" in litert.op_counts(content)
    (got,) = litert.run(content, x)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x[0]])
    err = np.abs(got[0] - exact).max()
    assert err < 4 * 6 / 32767
    tanh = (
        0.5
        * x[0]
        * (1 + np.tanh(math.sqrt(2 / math.pi) * (x[0] + 0.044715 * x[0] ** 3)))
    )
    assert err < np.abs(tanh - exact).max()


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_int16x8_token_recurrent_model(kind, tmp_path):
    """Integer ids into an Embedding then an unrolled LN recurrent layer:
    the ids are not calibrated (they used to fail with "Max and min for
    dynamic tensors should be recorded during calibration"), the rows
    looked up are the table's."""
    keras.utils.set_random_seed(0)
    cls = {"gru": kerasnorm.LayerNormGRU, "lstm": kerasnorm.LayerNormLSTM}[kind]
    inputs = keras.Input((LENGTH,), dtype="int32", name="tokens")
    embedded = L.Embedding(VOCAB, 8, name="embed")(inputs)
    model = keras.Model(inputs, L.Dense(2)(cls(8, name="rec")(embedded)))
    path = tmp_path / "m.tflite"
    result = _export(model, path, "int16x8", _tokens(64))
    assert result.unrolled == ("rec",)
    assert _rms_rel(path, model, _tokens(16, seed=7)) < 0.05
    # The file's embedding output, read as a model of its own, is the table.
    table = model.get_layer("embed").embeddings.numpy()
    lookup = keras.Model(inputs, embedded)
    lookup_path = tmp_path / "lookup.tflite"
    ids = _tokens(8, seed=3)
    to_tflite(lookup, lookup_path, quantize="int16x8", representative_data=ids)
    (rows,) = litert.run(lookup_path.read_bytes(), ids[:1])
    scale = np.abs(table).max() / 127  # int8 weights
    np.testing.assert_allclose(rows[0], table[ids[0]], atol=scale)


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("masking", ["mask_zero", "Masking"])
def test_int16x8_refuses_a_mask_before_conversion(masking, streaming, tmp_path):
    """A Keras mask goes through SELECT_V2 and NOT_EQUAL, which the 16x8
    quantizer cannot quantize: refused by layer name, nothing written,
    and a mode it names converts the same model."""
    keras.utils.set_random_seed(0)
    if masking == "mask_zero":
        inputs = keras.Input((LENGTH,), dtype="int32")
        x = L.Embedding(VOCAB, 8, mask_zero=True, name="masked")(inputs)
        data = _tokens(32)
    else:
        inputs = keras.Input((LENGTH, 4))
        x = L.Masking(name="masked")(inputs)
        data = _features(32)[..., :4]
    model = keras.Model(inputs, kerasnorm.LayerNormGRU(4)(x))
    path = tmp_path / "m.tflite"
    with pytest.raises(
        ExportConversionError, match=r"'masked' .*int16x8.*SELECT_V2.*'int8'"
    ):
        to_tflite(
            model,
            path,
            quantize="int16x8",
            representative_data=data,
            streaming=streaming,
        )
    assert not path.exists()
    to_tflite(
        model, path, quantize="dynamic", representative_data=data, streaming=streaming
    )
    assert path.exists()


def _masked_attention(kind):
    keras.utils.set_random_seed(0)
    if kind == "decoder":
        inputs = keras.Input((LENGTH, WIDTH))
        x = kerasnorm.TransformerDecoderBlock(
            num_heads=2, key_dim=8, intermediate_dim=32, name="attends"
        )(inputs)
        return keras.Model(inputs, L.Dense(2)(x)), _features(32)
    ids = keras.Input((LENGTH,), dtype="int32", name="tokens")
    mask = keras.Input((LENGTH,), dtype="bool", name="padding_mask")
    x = L.Embedding(VOCAB, WIDTH)(ids)
    x = kerasnorm.TransformerEncoderBlock(
        num_heads=2, key_dim=8, intermediate_dim=32, name="attends"
    )(x, padding_mask=mask)
    model = keras.Model([ids, mask], L.Dense(2)(L.GlobalAveragePooling1D()(x)))
    tokens = _tokens(32)
    tokens[::2, 8:] = 0
    return model, [tokens, tokens != 0]


@pytest.mark.parametrize("kind", ["decoder", "encoder_with_padding_mask"])
def test_int16x8_refuses_masked_attention_before_conversion(kind, tmp_path):
    """A causal mask, or a padding mask given to an encoder block, masks the
    scores with SELECT_V2 (LOGICAL_AND combines two masks): before, the
    converter failed after calibrating ("Quantization to 16x8-bit not yet
    supported for op: 'SELECT_V2'" / "'LOGICAL_AND'"); now the layer is
    named before conversion, and the mode it names converts the model."""
    model, data = _masked_attention(kind)
    path = tmp_path / "m.tflite"
    with pytest.raises(
        ExportConversionError, match=r"'attends' \(Transformer\w+\).*SELECT_V2"
    ):
        to_tflite(model, path, quantize="int16x8", representative_data=data)
    assert not path.exists()
    to_tflite(model, path, quantize="dynamic", representative_data=data)
    assert _rms_rel(path, model, data) < 0.05
