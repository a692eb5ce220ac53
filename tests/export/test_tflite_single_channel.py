"""A Keras `LayerNormalization` over one channel at int8: the file the
time-series Transformer of Keras' code examples gave aborted LiteRT at
`allocate_tensors` (an int8 `SQUARED_DIFFERENCE(x, x)`,
`tflite.degenerate`); the fast int8 file keeps that op in float and is
checked here by a raw LiteRT run against Keras, and the full-integer file
is refused naming the norms."""

import keras
import numpy as np
import pytest

from kerasnorm.export import ExportConversionError
from kerasnorm.export import to_tflite

pytestmark = pytest.mark.tf_only

L = keras.layers


def timeseries_transformer(blocks=2):
    """The Keras code example "Timeseries classification with a Transformer
    model", smaller: inputs (32, 1), Pre-LN blocks of attention and a
    1-channel feed-forward, global pooling, a dense head."""
    inputs = keras.Input((32, 1))
    x = inputs
    for _ in range(blocks):
        y = L.LayerNormalization(epsilon=1e-6)(x)
        y = L.MultiHeadAttention(key_dim=16, num_heads=2, dropout=0.1)(y, y)
        res = L.Dropout(0.1)(y) + x
        y = L.LayerNormalization(epsilon=1e-6)(res)
        y = L.Conv1D(4, 1, activation="relu")(y)
        y = L.Conv1D(1, 1)(L.Dropout(0.1)(y))
        x = y + res
    x = L.GlobalAveragePooling1D(data_format="channels_first")(x)
    x = L.Dense(32, activation="relu")(x)
    return keras.Model(inputs, L.Dense(2, activation="softmax")(x))


def four_lines():
    inputs = keras.Input((32, 1))
    x = L.Conv1D(4, 1, activation="relu")(L.LayerNormalization()(inputs))
    return keras.Model(inputs, L.Dense(2)(L.GlobalAveragePooling1D()(x)))


def _data(model, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(96, 32, 1)).astype("float32")
    y = rng.integers(0, 2, len(x))
    model.compile("adam", "sparse_categorical_crossentropy", jit_compile=False)
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    return x


def raw_litert(path, x):
    """The file run by LiteRT's own interpreter, one sample per call,
    quantized inputs and outputs converted by hand."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    interp.allocate_tensors()
    (inp,), (out,) = interp.get_input_details(), interp.get_output_details()
    outputs = []
    for sample in x:
        value = sample[None]
        scale, zero = inp["quantization"]
        if scale:
            value = np.round(value / scale + zero).astype(inp["dtype"])
        interp.set_tensor(inp["index"], value.astype(inp["dtype"]))
        interp.invoke()
        y = interp.get_tensor(out["index"])
        scale, zero = out["quantization"]
        outputs.append((y.astype("float32") - zero) * scale if scale else y)
    return np.concatenate(outputs)


@pytest.mark.parametrize(
    "build", [pytest.param(timeseries_transformer, marks=pytest.mark.slow), four_lines]
)
def test_int8_single_channel_layer_norm_exports_and_runs(tmp_path, build):
    keras.utils.set_random_seed(0)
    model = build()
    x = _data(model)
    path = tmp_path / "m.tflite"
    result = to_tflite(
        model, path, quantize="int8", representative_data=x, verify_inputs=x
    )
    # The always-zero variance is computed in float, not int8.
    assert "SQUARED_DIFFERENCE" in result.float_ops
    want = model.predict(x, verbose=0)
    got = raw_litert(path, x)
    rms = np.sqrt(np.mean((got - want) ** 2)) / max(np.sqrt(np.mean(want**2)), 1e-6)
    assert rms < 0.1


def test_int8_io_single_channel_layer_norm_refused_naming_the_layers(tmp_path):
    keras.utils.set_random_seed(0)
    model = four_lines()
    x = _data(model)
    names = [layer.name for layer in model.layers if "layer_norm" in layer.name]
    with pytest.raises(ExportConversionError) as caught:
        to_tflite(
            model,
            tmp_path / "m.tflite",
            quantize="int8",
            int8_io=True,
            representative_data=x,
            verify_inputs=x,
        )
    first = str(caught.value).splitlines()[0]
    assert all(repr(name) in first for name in names) and "int8_io=False" in first
    assert list(tmp_path.iterdir()) == []
