"""`kerasnorm demo` end to end: train under XLA, export, verify, evaluate."""

import os
import re

import pytest

from kerasnorm.cli import main

# The demo exports a SavedModel and TFLite files: TensorFlow.
pytestmark = pytest.mark.tf_only


def test_demo_trains_exports_and_reports_accuracy(tmp_path, capsys):
    out = str(tmp_path / "demo")
    assert main(["demo", "--epochs", "2", "--out", out]) == 0
    printed = capsys.readouterr().out
    for name in ("digits.keras", "digits.tflite", "digits.int8.tflite"):
        assert os.path.isfile(os.path.join(out, name)), name
    assert os.path.isfile(os.path.join(out, "digits", "1", "saved_model.pb"))
    assert "folded batch_normalization -> conv2d" in printed
    keras_acc = float(re.search(r"Keras test accuracy: ([0-9.]+)", printed)[1])
    assert keras_acc > 0.8
    artifact_accs = re.findall(r"^\s+(\S+).*?([01]\.[0-9]{4})$", printed, re.M)
    assert {name for name, _ in artifact_accs} >= {
        "digits.tflite",
        "digits.float16.tflite",
        "digits.int8.tflite",
    }
    for name, acc in artifact_accs:
        assert abs(float(acc) - keras_acc) <= 0.02, (name, acc, keras_acc)
