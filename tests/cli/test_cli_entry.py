"""`python -m kerasnorm.cli` is the installed `kerasnorm` command."""

import os
import pathlib
import re
import subprocess
import sys

import keras
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Lines TensorFlow, absl and the converter print to stderr.
# ("XNNPACK delegate": LiteRT's INFO line; the command's own table names
# XNNPACK partitions on stdout.)
_LOG_LINE = re.compile(
    r"^[IWEF]\d{4} |cuInit|absl::|absl:|oneDNN|XNNPACK delegate|deprecated", re.M
)


@pytest.mark.slow
@pytest.mark.tf_only
def test_python_m_kerasnorm_cli_forces_tensorflow_and_quiets_it(tmp_path):
    """Under `KERAS_BACKEND=jax`, `python -m kerasnorm.cli export` writes a
    SavedModel and a TFLite file as the `kerasnorm` command does (which
    forces the TensorFlow backend), and no TensorFlow log line reaches the
    terminal. It went through `kerasnorm.cli.main` before, on JAX, with
    TensorFlow's log lines on stderr."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,), name="x"), keras.layers.Dense(3)], name="tiny"
    )
    model.save(tmp_path / "tiny.keras")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=str(ROOT), KERAS_BACKEND="jax")
    args = ["tiny.keras", "--out", "out", "--tflite"]
    result = subprocess.run(
        [sys.executable, "-m", "kerasnorm.cli", "export", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "tiny.tflite").exists(), result.stdout
    assert not _LOG_LINE.search(result.stdout + result.stderr), result.stderr
