"""`kerasnorm qat`: fine-tune with QAT, export int8, verify, print the table."""

import importlib.util
import re

import keras
import numpy as np
import pytest

pytest.importorskip("tf_keras")
if importlib.util.find_spec("tensorflow_model_optimization") is None:
    pytest.skip(
        "tensorflow-model-optimization is not installed", allow_module_level=True
    )

import kerasnorm
from kerasnorm.export import litert
from kerasnorm_cli import command as main

# TFMOT, tf_keras and the TFLite converter: TensorFlow.
pytestmark = pytest.mark.tf_only


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    inputs = keras.Input((6, 6, 2), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    x = keras.layers.Flatten()(kerasnorm.GroupNorm(groups=2)(x))
    model = keras.Model(inputs, keras.layers.Dense(3)(x), name="tiny")
    model.save(tmp_path / "tiny.keras")
    x = rng.normal(size=(96, 6, 6, 2)).astype("float32")
    np.savez(tmp_path / "data.npz", x=x, y=rng.integers(0, 3, 96))
    np.savez(tmp_path / "no_y.npz", x=x)
    return tmp_path


def _args(files, *extra, data="data.npz"):
    return [
        "qat",
        str(files / "tiny.keras"),
        "--data",
        str(files / data),
        "--epochs",
        "1",
        "--out",
        str(files / "out"),
        *extra,
    ]


@pytest.mark.slow
def test_qat_writes_a_verified_int8_file(files, capsys):
    assert main(_args(files, "--from-logits")) == 0
    table = capsys.readouterr().out
    assert "tiny.qat.int8.tflite" in table and " ok" in table
    with open(files / "out" / "tiny.qat.int8.tflite", "rb") as f:
        ops = litert.op_names(f.read())
    assert "CONV_2D" in ops and not [op for op in ops if op.startswith("Flex")]
    # The output exists now: refused without --force, before any work.
    assert main(_args(files)) == 2
    assert "--force" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "data", "message"),
    [
        ((), "no_y.npz", r"no array `y`"),
        (
            ("--loss", "mean_squared_error", "--from-logits"),
            "data.npz",
            r"crossentropy",
        ),
        ((), "missing.npz", r"--data file not found: '.*missing\.npz'"),
    ],
)
def test_qat_usage_errors(files, capsys, extra, data, message):
    assert main(_args(files, *extra, data=data)) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize(
    ("error", "status", "said"),
    [
        (ImportError("install kerasnorm's `qat` extra"), 2, r"error: install"),
        (ValueError("no tf_keras twin for layer 'odd'"), 3, r"cannot quantize: no"),
        ("parity", 1, r"differs from the Keras model"),
    ],
)
def test_qat_exit_statuses_follow_the_table(
    files, capsys, monkeypatch, error, status, said
):
    """A QAT model that fails its check against the Keras model exits 1 (it
    exited 2, the status of a bad argument); a model TFMOT cannot quantize
    exits 3; a missing extra is a refusal, 2. Nothing is written."""
    from kerasnorm import export

    if error == "parity":
        error = export.ExportVerificationError(
            "the QAT model differs from the Keras model"
        )

    def fail(model, **kwargs):
        raise error

    monkeypatch.setattr(export, "quantize_aware", fail)
    assert main(_args(files)) == status
    assert re.search(said, capsys.readouterr().err)
    assert not (files / "out").exists()
