"""A model Keras quantized (`model.quantize("int8")`, `"int4"`) exports
with `to_tflite` holding Keras' own integers and scales, read back here
from the flatbuffer, at most 0.45x (int8) / 0.30x (int4) the float32 file
of the same model, and checked against the quantized Keras model; float8
and a mode that would round the weights afresh are refused by name, before
anything is written."""

import os

import keras
import numpy as np
import pytest

from kerasnorm.export import litert
from kerasnorm.export import to_tflite

pytestmark = pytest.mark.tf_only

VOCAB, WIDTH, LENGTH = 512, 256, 8


def _model():
    """Embedding, Dense and EinsumDense large enough that their weights are
    the file (Keras quantizes each; the head too)."""
    keras.utils.set_random_seed(0)
    ids = keras.Input((LENGTH,), dtype="int32", name="ids")
    x = keras.layers.Embedding(VOCAB, WIDTH, name="embed")(ids)
    x = keras.layers.Dense(WIDTH, activation="relu", name="hidden")(x)
    x = keras.layers.EinsumDense(
        "abc,cd->abd", output_shape=(None, WIDTH), bias_axes="d", name="mix"
    )(x)
    return keras.Model(ids, keras.layers.Dense(16, name="head")(x), name="tagger")


def _ids(n=16):
    return np.random.default_rng(1).integers(0, VOCAB, (n, LENGTH)).astype("int32")


def _quantized(model, mode):
    try:
        model.quantize(mode)
    except ValueError as error:  # Keras 3.10 has no int4
        if "Invalid quantization mode" not in str(error):
            raise
        pytest.skip(f"this Keras cannot quantize to {mode!r}: {error}")
    return model


def _tensors(content):
    """Each constant tensor of the file: (type name, shape, its bytes, the
    tensor, the subgraph, the model)."""
    schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
    fu = pytest.importorskip("ai_edge_litert.tools.flatbuffer_utils")
    model = fu.read_model_from_bytearray(bytearray(content))
    names = {v: k for k, v in vars(schema.TensorType).items() if k.isupper()}
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            data = model.buffers[tensor.buffer].data
            if data is not None and len(data):
                data = np.asarray(data, np.uint8)
                yield (
                    names[tensor.type],
                    list(tensor.shape),
                    data,
                    tensor,
                    subgraph,
                    model,
                )


def _unpack_int4(packed, count):
    """LiteRT's packed int4 (two per byte, the even index low)."""
    low, high = packed & 0x0F, packed >> 4
    values = np.stack([low, high], axis=1).reshape(-1)[:count].astype(np.int8)
    return np.where(values > 7, values - 16, values).astype(np.int8)


def _keras_int4(layer):
    """Keras' int4 integers of `layer` as the file holds them: `(out, in)`
    for a product, `(vocab, dim)` for a table."""
    from keras import quantizers

    if isinstance(layer, keras.layers.Embedding):
        q = quantizers.unpack_int4(layer._embeddings, layer.output_dim, axis=-1)
        return np.asarray(q, np.int8)
    columns = 16 if layer.name == "head" else WIDTH
    q = quantizers.unpack_int4(layer._kernel, columns, axis=-1)
    return np.asarray(q, np.int8).reshape(-1, columns).T


def _export_pair(tmp_path, mode):
    model = _model()
    float_size = to_tflite(model, tmp_path / "f.tflite", verify_inputs=_ids()).path
    float_size = os.path.getsize(float_size)
    _quantized(model, mode)
    result = to_tflite(model, tmp_path / "q.tflite", verify_inputs=_ids())
    return model, result, (tmp_path / "q.tflite").read_bytes(), float_size


def _agrees(model, content, tolerance=0.05):
    """The file against the quantized Keras model, as `"dynamic"`'s check
    measures it: rms of the error over rms of the output."""
    ids = _ids(32)
    want = np.asarray(model.predict(ids, verbose=0))
    got = np.asarray(litert.Runner(content).predict(ids)[0])
    rms = np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2))
    assert rms <= tolerance, rms


def test_a_keras_int8_model_is_written_with_its_integers(tmp_path):
    pytest.importorskip("ai_edge_litert")
    model, result, content, float_size = _export_pair(tmp_path, "int8")
    assert result.quantize == "dynamic"
    check = result.verification
    assert (check.criterion, check.tolerance) == ("rms", 0.05)
    assert check.passed and check.rms_rel_error <= 0.05, check
    assert len(content) <= 0.45 * float_size, len(content) / float_size
    stored = [(t, d.view(np.int8)) for t, _, d, *_ in _tensors(content)]
    int8 = [d for t, d in stored if t == "INT8"]
    for layer in model._flatten_layers(include_self=False):
        if getattr(layer, "quantization_mode", None) != "int8":
            continue
        if isinstance(layer, keras.layers.Embedding):
            want = np.asarray(layer._embeddings)
        else:
            # (in, out) kernels stored (out, in).
            kernel = np.asarray(layer._kernel)
            want = kernel.reshape(-1, kernel.shape[-1]).T
        assert any(
            d.size == want.size and np.array_equal(d, want.ravel()) for d in int8
        ), layer.name
    _agrees(model, content)


def test_a_keras_int4_model_is_written_with_its_integers(tmp_path):
    pytest.importorskip("ai_edge_litert")
    model, result, content, float_size = _export_pair(tmp_path, "int4")
    assert result.quantize == "int4"
    check = result.verification
    assert (check.criterion, check.tolerance) == ("rms", 0.05)
    assert check.passed and check.rms_rel_error <= 0.05, check
    assert len(content) <= 0.30 * float_size, len(content) / float_size
    int4 = [
        _unpack_int4(d, int(np.prod(shape))).reshape(shape)
        for t, shape, d, *_ in _tensors(content)
        if t == "INT4"
    ]
    checked = 0
    for layer in model._flatten_layers(include_self=False):
        if getattr(layer, "quantization_mode", None) != "int4":
            continue
        want = _keras_int4(layer)
        assert any(q.shape == want.shape and np.array_equal(q, want) for q in int4), (
            layer.name
        )
        checked += 1
    assert checked == 4
    _agrees(model, content)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"quantize": "int8"}, "quantize='int8' would round the weights afresh"),
        ({"quantize": "float16"}, "quantize='float16' would round"),
        ({"export_dtype": "float16"}, 'export_dtype="float16" would round'),
    ],
)
def test_a_conflicting_mode_is_refused_by_name(tmp_path, options, message):
    pytest.importorskip("ai_edge_litert")
    model = _quantized(_model(), "int8")
    if options.get("quantize") == "int8":
        options = {**options, "representative_data": _ids()}
    with pytest.raises(ValueError, match=f"quantized by Keras to 'int8'.*{message}"):
        to_tflite(model, tmp_path / "q.tflite", **options)
    assert not os.listdir(tmp_path)


def test_dynamic_is_refused_for_a_keras_int4_model(tmp_path):
    pytest.importorskip("ai_edge_litert")
    model = _quantized(_model(), "int4")
    with pytest.raises(ValueError, match="quantize='dynamic' would round"):
        to_tflite(model, tmp_path / "q.tflite", quantize="dynamic")
    assert not os.listdir(tmp_path)


def test_a_keras_float8_model_is_refused_by_name(tmp_path):
    pytest.importorskip("ai_edge_litert")
    model = _quantized(_model(), "float8")
    with pytest.raises(
        ValueError,
        match=r"to_tflite: layer '.*' of 'tagger' is quantized by Keras to 'float8'",
    ):
        to_tflite(model, tmp_path / "q.tflite")
    assert not os.listdir(tmp_path)
