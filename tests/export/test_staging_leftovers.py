"""An export whose process died leaves its staged temporary beside the
target; the next export to the same target removes it (and only what dead
processes left)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest

from kerasnorm.export import to_tflite
from kerasnorm.export.staging.leftovers import UNOWNED_AGE_S
from kerasnorm.export.staging.leftovers import remove_leftovers

L = keras.layers


def _dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_removes_what_dead_processes_left_and_nothing_else(tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    names = {
        f".m.tflite.tmp-{dead}-0a1b2c3d.tflite": "file",
        f".m.tflite.old-{dead}-k2j_x9": "dir",
        ".m.tflite.tmp-ca7c11b6.tflite": "old file",  # no process id, old
        f".m.tflite.tmp-{alive}-0a1b2c3d.tflite": "file",  # a running export
        ".m.tflite.tmp-deadbeef.tflite": "file",  # no process id, recent
        f".other.tflite.tmp-{dead}-0a1b2c3d.tflite": "file",  # another target
        "m.tflite.tmp-1-0a1b2c3d.tflite": "file",  # not a staged name
    }
    for name, kind in names.items():
        path = tmp_path / name
        if kind == "dir":
            path.mkdir()
            (path / "m.tflite").write_bytes(b"x")
        else:
            path.write_bytes(b"x")
        if kind == "old file":
            past = time.time() - UNOWNED_AGE_S - 60
            os.utime(path, (past, past))
    removed = remove_leftovers(tmp_path, "m.tflite")
    assert removed == sorted(list(names)[:3])
    assert sorted(os.listdir(tmp_path)) == sorted(list(names)[3:])


@pytest.mark.tf_only
@pytest.mark.slow
def test_export_after_a_killed_export_removes_its_temporary(tmp_path):
    """A process killed (SIGKILL) while its file is staged; the next export
    to that target, in this process, removes what it left."""
    target = tmp_path / "m.tflite"
    script = textwrap.dedent(
        f"""
        import os, signal
        import keras, numpy as np
        from kerasnorm.export import to_tflite
        from kerasnorm.export.verify import run

        def killed(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

        run.first_run = killed
        inputs = keras.Input((6,))
        model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
        to_tflite(model, {str(target)!r}, verify_inputs=np.ones((4, 6), "float32"))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    code = subprocess.run([sys.executable, "-c", script], env=env).returncode
    assert code == -signal.SIGKILL
    (left,) = os.listdir(tmp_path)
    assert left.startswith(".m.tflite.tmp-")
    inputs = keras.Input((6,))
    model = keras.Model(inputs, L.Dense(2)(inputs))
    x = np.random.default_rng(0).normal(size=(8, 6)).astype("float32")
    to_tflite(model, target, verify_inputs=x)
    assert os.listdir(tmp_path) == ["m.tflite"]
