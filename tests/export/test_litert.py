"""The low-level LiteRT helpers the export and the layer tests rely on."""

import re

import keras
import numpy as np
import pytest

import kerasnorm
from kerasnorm.export import litert
from tests.support.helpers import random_inputs

# TFLite conversion traces TensorFlow.
pytestmark = pytest.mark.tf_only


def test_runner_predict_batches_and_drops_padding():
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4), kerasnorm.LayerNorm()]
    )
    runner = litert.Runner(litert.convert(model, batch_size=2))
    assert runner.batch_size == 2
    x = random_inputs((5, 6))
    (y,) = runner.predict(x)
    assert y.shape == (5, 4)
    np.testing.assert_allclose(y, np.asarray(model(x)), atol=1e-5)


def test_variables_are_frozen_into_the_flatbuffer():
    layer = kerasnorm.RMSNorm(gamma_initializer="random_normal")
    model = keras.Sequential([keras.Input((8,)), layer])
    content = litert.convert(model)
    assert not {"VAR_HANDLE", "READ_VARIABLE"} & set(litert.op_names(content))
    x = random_inputs((1, 8))
    np.testing.assert_allclose(litert.run(content, x)[0], model(x), atol=1e-5)


class _Determinant(keras.layers.Layer):
    def call(self, x):
        return keras.ops.linalg.det(keras.ops.reshape(x, (-1, 2, 2)))


def test_flex_ops_are_named_flex():
    # What the "builtin ops only" checks look for: with Flex allowed, an op
    # TFLite lacks is kept as a Flex op, and op_names shows it so.
    inputs = keras.Input((4,))
    model = keras.Model(inputs, _Determinant()(inputs))
    names = litert.op_names(litert.convert(model, builtins_only=False))
    assert "FlexMatrixDeterminant" in names
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    assert not any(n.startswith("Flex") for n in litert.op_names(litert.convert(dense)))


_QUIET_SCRIPT = """
import os, sys
import re

import keras
import numpy as np
from kerasnorm.export import to_tflite

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
os.write(2, b"--- exports start ---\\n")
for i in range(2):
    to_tflite(model, os.path.join(sys.argv[1], f"m{i}.tflite"))
os.write(2, b"--- exports done ---\\n")
"""


@pytest.mark.slow
def test_to_tflite_prints_no_tensorflow_log_lines(tmp_path):
    # TensorFlow's C++ code writes to file descriptor 2, which capsys does
    # not see: run a fresh process, with TensorFlow's log level at its
    # default, and read its whole stderr.
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(root)
    result = subprocess.run(
        [sys.executable, "-c", _QUIET_SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    during = result.stderr.split("--- exports start ---")[1]
    assert "--- exports done ---" in during, result.stderr
    during = during.split("--- exports done ---")[0]
    for line in ("Number of eligible GPUs", "Starting new session"):
        assert line not in during, during
    assert not re.search(r"^[IWEF]\d{4} ", during, re.M), during
    assert sorted(os.listdir(tmp_path)) == ["m0.tflite", "m1.tflite"]
