"""SavedModel and TFLite export: parity, layout, quantization, errors, atomicity."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasnorm
from kerasnorm.export import ExportVerificationError
from kerasnorm.export import to_saved_model
from kerasnorm.export import to_tflite
from kerasnorm.export import verify

L = keras.layers


def _randomize_bn(model, seed=0):
    rng = np.random.default_rng(seed)
    for w in model.weights:
        if w.name in ("moving_mean", "beta"):
            w.assign(0.2 * rng.standard_normal(w.shape).astype("float32"))
        elif w.name in ("moving_variance", "gamma"):
            w.assign(rng.uniform(0.5, 1.5, w.shape).astype("float32"))


def _cnn():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1), name="image")
    x = L.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = L.ReLU()(L.BatchNormalization()(x))
    x = L.DepthwiseConv2D(3, padding="same", depth_multiplier=2)(x)
    x = L.ReLU()(L.BatchNormalization()(x))
    x = kerasnorm.LayerNorm()(x)
    x = L.GlobalAveragePooling2D()(x)
    outputs = L.Dense(10, name="logits")(x)
    model = keras.Model(inputs, outputs, name="cnn")
    _randomize_bn(model)
    return model


@pytest.fixture(scope="module")
def cnn():
    return _cnn()


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(1).random((48, 8, 8, 1)).astype("float32")


@pytest.fixture(scope="module")
def saved(cnn, data, tmp_path_factory):
    base = tmp_path_factory.mktemp("serving") / "cnn"
    return base, to_saved_model(cnn, base, verify_inputs=data[:8])


def _op_types(fn):
    graph = fn.graph.as_graph_def()
    ops = {n.op for n in graph.node}
    for f in graph.library.function:
        ops |= {n.op for n in f.node_def}
    return ops


def test_saved_model_layout_signature_and_parity(cnn, data, saved):
    base, result = saved
    assert result.path == os.path.join(str(base), "1")
    assert os.path.exists(os.path.join(result.path, "saved_model.pb"))
    assert os.listdir(base) == ["1"], "temporary directories left behind"
    assert result.verification.passed and result.verification.max_rel_error < 1e-4
    assert len(result.fold_report.folded) == 2 and not result.fold_report.kept
    fn = tf.saved_model.load(result.path).signatures["serving_default"]
    assert list(fn.structured_input_signature[1]) == ["image"]
    assert list(fn.structured_outputs) == ["logits"]
    assert fn.structured_input_signature[1]["image"].shape.as_list() == [None, 8, 8, 1]
    got = fn(image=tf.constant(data[:5]))["logits"].numpy()
    want = np.asarray(cnn(data[:5]))
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert not any("BatchNorm" in op for op in _op_types(fn))


def test_saved_model_versions_and_overwrite(cnn, saved):
    base, _ = saved
    pb = os.path.join(str(base), "1", "saved_model.pb")
    stamp = os.stat(pb).st_mtime_ns
    with pytest.raises(FileExistsError, match="overwrite=True"):
        to_saved_model(cnn, base, version=1)
    assert os.stat(pb).st_mtime_ns == stamp
    assert sorted(os.listdir(base)) == ["1"]
    unfolded = to_saved_model(cnn, base, fold=False)
    assert unfolded.path.endswith(os.sep + "2") and unfolded.fold_report is None
    replaced = to_saved_model(cnn, base, version=2, overwrite=True)
    assert sorted(os.listdir(base)) == ["1", "2"]
    # Keras' BN at inference is rsqrt(var + eps) * ... per call: two BNs fewer.
    assert unfolded.verification.ops["Rsqrt"] == 3  # 2 BN + LayerNorm
    assert replaced.verification.ops["Rsqrt"] == 1
    assert replaced.fold_report is not None
    with pytest.raises(ValueError, match="positive integer"):
        to_saved_model(cnn, base, version=0)


@pytest.mark.parametrize(
    "quantize, int8_io, tol",
    [
        (None, False, 1e-4),
        ("float16", False, 1e-2),
        ("dynamic", False, 5e-2),
        ("int8", False, 0.15),
        ("int8", True, 0.15),
    ],
)
def test_tflite_parity(cnn, data, tmp_path, quantize, int8_io, tol):
    path = tmp_path / "cnn.tflite"
    result = to_tflite(
        cnn, path, quantize=quantize, representative_data=data, int8_io=int8_io
    )
    check = result.verification
    assert os.listdir(tmp_path) == ["cnn.tflite"]
    assert check.passed and check.max_rel_error <= tol
    assert check.size_bytes == os.path.getsize(path) == result.size_bytes
    assert "FlexDelegate" not in check.ops
    # Re-run independently of verify(): LiteRT on fresh samples.
    again = verify(cnn, path, data[-4:], tolerance=tol)
    assert again.max_rel_error <= tol
    if quantize is None:
        assert check.max_rel_error < 1e-4
        assert "BATCH_NORM" not in " ".join(check.ops)
    if quantize == "int8":
        assert "CONV_2D" in check.ops
        assert (check.ops.get("QUANTIZE", 0) > 0) != int8_io


def test_multi_input_output(tmp_path):
    a = keras.Input((6,), name="a")
    b = keras.Input((4, 4, 2), name="b")
    h = L.BatchNormalization()(L.Dense(5)(a))
    g = L.GlobalAveragePooling2D()(L.BatchNormalization()(L.Conv2D(3, 3)(b)))
    model = keras.Model(
        [a, b], {"score": L.Dense(1)(h), "mix": L.Concatenate()([h, g])}
    )
    _randomize_bn(model)
    result = to_saved_model(model, tmp_path / "sm")
    assert result.verification.passed and len(result.fold_report.folded) == 2
    fn = tf.saved_model.load(result.path).signatures["serving_default"]
    assert sorted(fn.structured_input_signature[1]) == ["a", "b"]
    assert sorted(fn.structured_outputs) == ["mix", "score"]
    tfl = to_tflite(model, tmp_path / "m.tflite")
    assert tfl.verification.max_rel_error < 1e-4


def test_layer_norm_lstm(tmp_path):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((6, 3), name="sequence")
    x = kerasnorm.LayerNormLSTM(8, return_sequences=True)(inputs)
    x = kerasnorm.LayerNormLSTM(4)(x)
    model = keras.Model(inputs, L.Dense(2, name="out")(x))
    sm = to_saved_model(model, tmp_path / "sm")
    assert sm.verification.max_rel_error < 1e-4
    tfl = to_tflite(model, tmp_path / "lstm.tflite")
    assert tfl.verification.max_rel_error < 1e-4
    assert "FlexDelegate" not in tfl.verification.ops


class _Det(L.Layer):
    def call(self, x):
        return keras.ops.linalg.det(keras.ops.reshape(x, (-1, 2, 2)))


def test_errors(cnn, data, tmp_path):
    existing = tmp_path / "old.tflite"
    existing.write_bytes(b"keep me")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        to_tflite(cnn, existing)
    assert existing.read_bytes() == b"keep me"
    with pytest.raises(ValueError, match=r"end in '\.tflite'.*model\.lite"):
        to_tflite(cnn, tmp_path / "model.lite")
    with pytest.raises(ValueError, match="needs representative_data"):
        to_tflite(cnn, tmp_path / "a.tflite", quantize="int8")
    with pytest.raises(ValueError, match=r"representative_data.*'image'.*\(48, 8, 8\)"):
        to_tflite(
            cnn,
            tmp_path / "a.tflite",
            quantize="int8",
            representative_data=data[..., 0],
        )
    with pytest.raises(
        ValueError, match=r"`quantize` must be one of.*Received: quantize='int4'"
    ):
        to_tflite(cnn, tmp_path / "a.tflite", quantize="int4")
    with pytest.raises(ValueError, match="int8_io=True needs"):
        to_tflite(cnn, tmp_path / "a.tflite", int8_io=True)
    unbuilt = keras.Sequential([L.Dense(2)])
    with pytest.raises(ValueError, match="not built"):
        to_tflite(unbuilt, tmp_path / "a.tflite")
    with pytest.raises(ValueError, match="not built"):
        to_saved_model(unbuilt, tmp_path / "sm")
    with pytest.raises(ValueError, match="should be a directory"):
        to_saved_model(cnn, tmp_path / "model.keras")
    inputs = keras.Input((4,))
    det = keras.Model(inputs, _Det(name="my_det")(L.Dense(4)(inputs)))
    with pytest.raises(ValueError, match=r"layer\(s\) 'my_det'.*MatrixDeterminant"):
        to_tflite(det, tmp_path / "det.tflite")
    assert sorted(os.listdir(tmp_path)) == ["old.tflite"]


def test_failed_parity_is_loud_and_leaves_nothing(cnn, data, tmp_path):
    path = tmp_path / "f16.tflite"
    with pytest.raises(ExportVerificationError, match="parity check failed"):
        to_tflite(cnn, path, quantize="float16", tolerance=1e-7)
    assert os.listdir(tmp_path) == []
    with pytest.raises(ExportVerificationError):
        to_saved_model(cnn, tmp_path / "sm", tolerance=0.0)
    assert os.listdir(tmp_path / "sm") == []
    other = _cnn()
    _randomize_bn(other, seed=5)
    good = to_tflite(cnn, tmp_path / "ok.tflite").path
    with pytest.raises(ExportVerificationError, match="above the tolerance"):
        verify(other, good, data[:4])
    report = verify(other, good, data[:4], raise_on_failure=False)
    assert not report.passed and "FAILED" in str(report)
