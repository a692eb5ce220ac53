"""Calibration progress (issue 34 item 5): a bar only on a terminal, a
plain line naming the mode when piped."""

import keras
import numpy as np
import pytest

from kerasnorm.export import to_tflite
from kerasnorm.export.tflite.converter import calibration_feed

pytestmark = pytest.mark.tf_only


def _feed(progress, mode):
    data = {"x": np.zeros((6, 2), "float32")}
    return list(calibration_feed(data, 2, progress, mode=mode)())


@pytest.mark.parametrize("mode", ["int8", "int16x8"])
def test_piped_progress_is_one_plain_line_naming_the_mode(mode, capsys):
    batches = _feed(True, mode)
    assert [b["x"].shape for b in batches] == [(2, 2)] * 3
    assert capsys.readouterr().out == f"Calibrating {mode} on 6 samples.\n"


def test_a_terminal_gets_a_bar(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    _feed(True, "int16x8")
    out = capsys.readouterr().out
    assert out.startswith("Calibrating int16x8 on 6 samples:\n")
    assert "6/6" in out


def test_no_progress_prints_nothing(capsys):
    _feed(False, "int8")
    assert capsys.readouterr().out == ""


def test_to_tflite_names_the_mode_it_calibrates(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    data = np.random.default_rng(0).random((16, 4), "float32")
    for mode in ("int16x8", "int8"):
        result = to_tflite(
            model,
            tmp_path / f"{mode}.tflite",
            quantize=mode,
            representative_data=data,
            progress=True,
        )
        assert result.verification.passed
        out = capsys.readouterr().out
        assert f"Calibrating {mode} on 16 samples.\n" in out
        assert "\x1b" not in out and "\r" not in out
