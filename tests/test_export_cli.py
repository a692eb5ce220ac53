"""`kerasnorm export` end to end, in-process."""

import os

import keras
import numpy as np
import pytest

from kerasnorm.cli import main

L = keras.layers


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1), name="image"),
            L.Conv2D(4, 3, use_bias=False, name="conv"),
            L.BatchNormalization(name="bn"),
            L.ReLU(),
            L.Flatten(),
            L.Dense(3),
        ],
        name="tiny",
    )
    model.layers[1].moving_mean.assign(np.full(4, 0.3, "float32"))
    path = root / "tiny.keras"
    model.save(path)
    calibration = root / "calib.npy"
    np.save(calibration, np.random.default_rng(0).random((40, 8, 8, 1), "float32"))
    return root, str(path), str(calibration)


def test_export_all_artifacts(files, capsys):
    root, model, calibration = files
    out = str(root / "out")
    argv = ["export", model, "--out", out, "--quantize", "int8"]
    code = main([*argv, "--tflite", "--saved-model", "--calibration", calibration])
    text = capsys.readouterr().out
    assert code == 0, text
    assert sorted(os.listdir(out)) == ["tiny", "tiny.int8.tflite", "tiny.tflite"]
    assert os.listdir(os.path.join(out, "tiny")) == ["1"]
    assert "1 folded, 0 kept" in text and "folded bn -> conv (after)" in text
    for row in ("tiny/1", "tiny.tflite", "tiny.int8.tflite"):
        assert any(
            line.startswith(row + " ") and line.endswith("ok")
            for line in (x.strip() for x in text.splitlines())
        ), text
    assert "artifact" in text and "latency/call" in text and "Calibrating" in text

    # A second run refuses to overwrite and leaves the files alone.
    stamp = os.stat(os.path.join(out, "tiny.tflite")).st_mtime_ns
    code = main(["export", model, "--out", out, "--tflite"])
    captured = capsys.readouterr()
    assert code == 2 and "--force" in captured.err
    assert os.stat(os.path.join(out, "tiny.tflite")).st_mtime_ns == stamp
    assert main(["export", model, "--out", out, "--tflite", "--force"]) == 0
    assert "tiny.tflite" in capsys.readouterr().out


def test_no_fold_and_defaults(files, capsys):
    root, model, _ = files
    out = str(root / "plain")
    assert main(["export", model, "--out", out, "--no-fold"]) == 0
    text = capsys.readouterr().out
    assert "folded" not in text
    assert sorted(os.listdir(out)) == ["tiny", "tiny.tflite"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--quantize", "int8"], "needs --calibration"),
        (["--calibration", "bad.npy"], "should have shape"),
        (["--calibration", "x.txt"], "should be a .npy or .npz"),
    ],
)
def test_errors(files, capsys, extra, message):
    root, model, _ = files
    np.save(root / "bad.npy", np.zeros((4, 8, 8), "float32"))
    (root / "x.txt").write_text("")
    extra = [str(root / e) if e.endswith((".npy", ".txt")) else e for e in extra]
    code = main(["export", model, "--out", str(root / "err"), *extra])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(root / "err")


def test_missing_model(tmp_path, capsys):
    code = main(["export", str(tmp_path / "nope.keras"), "--out", str(tmp_path)])
    assert code == 2 and "not found" in capsys.readouterr().err
