"""A SavedModel checked where it will run: loaded and called in another
Python process, as TF Serving (or any other program) loads it.

The in-process check loads the SavedModel in the process that wrote it,
where everything the graph refers to still exists: a `tf.py_function`'s
Python callback, say, which a server never has ("Could not find callback
with key=pyfunc_14"). So every SavedModel export is also loaded and called
once in a separate process, on inputs this process chose, and must give
the outputs this process's run of the same signature gave.

That process is a loader, nothing else: it imports NumPy and TensorFlow
only (no kerasnorm, no Keras, no user module, never the code that built
the model), with the user's environment, and loads each SavedModel from
its directory as a server does. Importing TensorFlow costs seconds, so one
loader serves the exports of a Python session: it is started by the first
SavedModel export (its import overlapping with that export's work), and
replaced when it dies, after `RESTART_AFTER` loads, or in a forked child
(`verify.session`, the helper process both checks keep the same way).
"""

from __future__ import annotations

import json
import os
import queue
import tempfile
import time

import numpy as np

from kerasnorm.export.numerics.errors import ExportVerificationError
from kerasnorm.export.verify import session

# The loader's outputs against this process's, relative to the output
# scale: the same graph on the same inputs, so only thread-order rounding
# can differ.
FRESH_TOLERANCE = 1e-4
# Importing TensorFlow and loading one model: seconds; a loader that has
# not answered after this many is stopped and the check fails.
FRESH_TIMEOUT_S = 600
# Each load leaves functions in the loader's TensorFlow context: a new
# loader after this many.
RESTART_AFTER = 50
_ANSWER = "kerasnorm-fresh:"

_LOADER = r"""
import json
import re
import sys

import numpy as np
import tensorflow as tf

ANSWER = "kerasnorm-fresh:"
for request in sys.stdin:
    path, feeds, out = json.loads(request)
    try:
        function = tf.saved_model.load(path).signatures["serving_default"]
        with np.load(feeds, allow_pickle=False) as archive:
            named = {name: tf.constant(archive[name]) for name in archive.files}
        result = function(**named)
        np.savez(out, **{name: value.numpy() for name, value in result.items()})
        answer = None
    except Exception as err:
        # The innermost error TensorFlow wraps (`ValueError: Could not
        # find callback ...`), else the whole message on one line.
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        inner = [line for line in lines if re.match(r"\w*(Error|Exception): ", line)]
        answer = inner[-1] if inner else f"{type(err).__name__}: {' '.join(lines)}"
        answer = re.sub(r" \[\[.*$", "", answer)[:600]
    print(ANSWER + json.dumps(answer), flush=True)
"""


class Loader(session.SessionProcess):
    """The loader process (see the module docstring): `run` one SavedModel
    at a time, from any thread."""

    def __init__(self):
        super().__init__(_LOADER)
        self.loads = 0

    def parse(self, line):
        if line.startswith(_ANSWER):
            return ("answer", json.loads(line[len(_ANSWER) :]))
        return None

    @property
    def usable(self) -> bool:
        return super().usable and self.loads < RESTART_AFTER

    def run(self, directory, feeds) -> dict:
        """`{output name: array}`: the `serving_default` signature of the
        SavedModel `directory` loaded and called once on `feeds` (`{input
        name: array}`) in the loader. Raises ExportVerificationError, with
        the loader's error, when it cannot load or call it."""
        self.loads += 1
        with tempfile.TemporaryDirectory(prefix="kerasnorm-fresh-") as tmp:
            inputs = os.path.join(tmp, "inputs.npz")
            outputs = os.path.join(tmp, "outputs.npz")
            np.savez(inputs, **{name: np.asarray(x) for name, x in feeds.items()})
            request = json.dumps([os.fspath(directory), inputs, outputs])
            try:
                self.send(request)
                kind, answer = self.event(FRESH_TIMEOUT_S)
            except (OSError, queue.Empty) as err:
                self.close()
                raise ExportVerificationError(
                    f"The SavedModel {directory} did not answer within "
                    f"{FRESH_TIMEOUT_S} s when loaded in another Python process "
                    "(as TF Serving loads it)."
                ) from err
            if kind == "eof":
                code = self._child.wait()
                raise ExportVerificationError(
                    _failure(directory, f"the loading process died (status {code})")
                )
            if answer is not None:
                raise ExportVerificationError(_failure(directory, answer))
            with np.load(outputs, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}


# The session's loader (`session.Kept`).
kept = session.Kept(lambda: Loader())


def loader() -> Loader:
    """The session's loader, started (or replaced) if needed. Call it when
    an export starts: the loader imports TensorFlow meanwhile."""
    return kept.get()


def check_in_fresh_process(directory, feeds, expected, label=None) -> float:
    """Load the SavedModel `directory` in the loader process, call it on
    `feeds` and compare each output with `expected` (`{output name:
    array}`, this process's run of the same call) within `FRESH_TOLERANCE`
    of its scale; the seconds it took. Raises ExportVerificationError when
    it fails or differs."""
    start = time.perf_counter()
    # One request at a time: the loader answers in order.
    with kept.run_lock:
        got = loader().run(directory, feeds)
    seconds = time.perf_counter() - start
    label = directory if label is None else label
    for name, want in expected.items():
        want = np.asarray(want, "float64")
        if name not in got:
            raise ExportVerificationError(
                f"The SavedModel {label}, loaded in another Python process (as "
                f"TF Serving loads it), has no output {name!r}: it gives "
                f"{sorted(got)}."
            )
        scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
        error = float(np.max(np.abs(got[name] - want), initial=0.0)) / scale
        if not error <= FRESH_TOLERANCE:
            raise ExportVerificationError(
                f"The SavedModel {label} computes something else when loaded in "
                f"another Python process (as TF Serving loads it): output "
                f"{name!r} differs from this process's run by {error:.3e} of "
                f"its scale (tolerance {FRESH_TOLERANCE:g}); a layer depends "
                "on state of this process (a Python callback, a global)."
            )
    return seconds


def _failure(directory, reason):
    hint = ""
    if "callback" in reason.lower() or "pyfunc" in reason.lower():
        hint = (
            " A tf.py_function / tf.numpy_function calls back into the Python "
            "process that traced it, which no server has: write the layer "
            "with TensorFlow or keras.ops operations."
        )
    return (
        f"The SavedModel {directory} fails when loaded and called in another "
        f"Python process (as TF Serving loads it): {reason.rstrip('.')}.{hint}"
    )
