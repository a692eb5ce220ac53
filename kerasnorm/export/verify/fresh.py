"""A SavedModel checked where it will run: loaded and called in a fresh
Python process, as TF Serving (or any other program) loads it.

The in-process check loads the SavedModel in the process that wrote it,
where everything the graph refers to still exists: a `tf.py_function`'s
Python callback, say, which a server never has ("Could not find callback
with key=pyfunc_14"). One child process per export, started when the
export starts so that its TensorFlow import overlaps with the export's
work, runs the signature once on inputs the parent chose and sends the
outputs back; the parent compares them with its own run of the same
signature. The child imports only NumPy and TensorFlow (no kerasnorm, no
Keras, no user module), with the user's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from kerasnorm.export._common.errors import ExportVerificationError

# The child's outputs against the parent's, relative to the output scale:
# the same graph on the same inputs, so only thread-order rounding differs.
FRESH_TOLERANCE = 1e-4
# Importing TensorFlow and loading the model: seconds; a hung child is
# stopped after this many.
FRESH_TIMEOUT_S = 600

_CHILD = r"""
import json
import re
import sys

import numpy as np
import tensorflow as tf

request = sys.stdin.readline()
if not request.strip():
    sys.exit(0)
path, feeds, out = json.loads(request)
try:
    function = tf.saved_model.load(path).signatures["serving_default"]
    with np.load(feeds, allow_pickle=False) as archive:
        named = {name: tf.constant(archive[name]) for name in archive.files}
    result = function(**named)
    np.savez(out, **{name: value.numpy() for name, value in result.items()})
except Exception as err:
    # The innermost error TensorFlow wraps (`ValueError: Could not find
    # callback ...`), else the whole message on one line.
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    inner = [line for line in lines if re.match(r"\w*(Error|Exception): ", line)]
    text = inner[-1] if inner else f"{type(err).__name__}: {' '.join(lines)}"
    print(re.sub(r" \[\[.*$", "", text)[:600], file=sys.stderr)
    sys.exit(1)
"""


class FreshProcess:
    """A new Python process, started when an export starts, that imports
    TensorFlow meanwhile (the seconds it costs overlap with the export)
    and then runs one SavedModel (`run`). `close` stops it if unused."""

    def __init__(self):
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        # -P: the working directory is not put on the path (a user's
        # `tensorflow.py` there must not shadow the real one).
        self._child = subprocess.Popen(
            [sys.executable, "-P", "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.seconds = None

    def run(self, directory, feeds) -> dict:
        """`{output name: array}`: the `serving_default` signature of the
        SavedModel `directory` called once on `feeds` (`{input name:
        array}`) in this process. Raises ExportVerificationError, with the
        child's error, when it cannot load or call it."""
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="kerasnorm-fresh-") as tmp:
            inputs = os.path.join(tmp, "inputs.npz")
            outputs = os.path.join(tmp, "outputs.npz")
            np.savez(inputs, **{name: np.asarray(x) for name, x in feeds.items()})
            request = json.dumps([os.fspath(directory), inputs, outputs]) + "\n"
            try:
                _, stderr = self._child.communicate(request, timeout=FRESH_TIMEOUT_S)
            except subprocess.TimeoutExpired as err:
                self.close()
                raise ExportVerificationError(
                    f"The SavedModel {directory} did not answer within "
                    f"{FRESH_TIMEOUT_S} s when loaded in a fresh Python process "
                    "(as TF Serving loads it)."
                ) from err
            self.seconds = time.perf_counter() - start
            if self._child.returncode != 0:
                raise ExportVerificationError(_failure(directory, stderr))
            with np.load(outputs, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}

    def close(self):
        """Stop the process if it is still running (an export that failed
        before its check, or a check that timed out)."""
        if self._child.poll() is None:
            self._child.kill()
        self._child.communicate()


@contextlib.contextmanager
def fresh_process():
    """`with fresh_process() as fresh:` a `FreshProcess` for one export,
    stopped at the end of the block."""
    fresh = FreshProcess()
    try:
        yield fresh
    finally:
        fresh.close()


def check_in_fresh_process(fresh, directory, feeds, expected, label=None):
    """Run the SavedModel `directory` on `feeds` in `fresh` (a
    `FreshProcess`) and compare each output with `expected` (`{output
    name: array}`, this process's run of the same call) within
    `FRESH_TOLERANCE` of its scale. Raises ExportVerificationError when it
    fails or differs."""
    got = fresh.run(directory, feeds)
    label = directory if label is None else label
    for name, want in expected.items():
        want = np.asarray(want, "float64")
        if name not in got:
            raise ExportVerificationError(
                f"The SavedModel {label}, loaded in a fresh Python process (as "
                f"TF Serving loads it), has no output {name!r}: it gives "
                f"{sorted(got)}."
            )
        scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
        error = float(np.max(np.abs(got[name] - want), initial=0.0)) / scale
        if not error <= FRESH_TOLERANCE:
            raise ExportVerificationError(
                f"The SavedModel {label} computes something else when loaded in "
                f"a fresh Python process (as TF Serving loads it): output "
                f"{name!r} differs from this process's run by {error:.3e} of "
                f"its scale (tolerance {FRESH_TOLERANCE:g}). A layer depends "
                "on state of this process (a Python callback, a global)."
            )


def _failure(directory, stderr):
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    reason = lines[-1] if lines else "no message"
    hint = ""
    if "callback" in reason.lower() or "pyfunc" in reason.lower():
        hint = (
            " A tf.py_function / tf.numpy_function calls back into the Python "
            "process that traced it, which no server has: write the layer "
            "with TensorFlow or keras.ops operations."
        )
    return (
        f"The SavedModel {directory} fails when loaded and called in a fresh "
        f"Python process (as TF Serving loads it): {reason.rstrip('.')}.{hint}"
    )
