"""A new `.tflite` file's first load and run, in a child process: a crash
there is an error, not the end of the caller's process.

LiteRT checks some things it cannot run with a `TFLITE_CHECK` that aborts
the process rather than returning an error: an int8 `SQUARED_DIFFERENCE`
whose output scale is far below its input's made `allocate_tensors()` kill
a notebook kernel (`tflite.degenerate`). So before this process loads a file
it has just converted, a child process loads it (`Interpreter(model_path=
...)`, LiteRT's default op resolver: XNNPACK on CPU, as the verifier and a
phone's default runtime use), allocates its tensors and invokes it once on
the first verification inputs. A signal there becomes an
ExportVerificationError naming the step, the delegate, the signal and LiteRT's
last words on stderr; the staged file is then removed as for any failed
check. Only a file that ran in the child is loaded here.

The child imports NumPy and LiteRT only (no TensorFlow, no kerasnorm, no
user module): it starts in well under a second, overlapping the
conversion, and one child serves the exports of a session (replaced when
it dies or in a forked process; `verify.session`). The cost per export is
one more load, allocation and call of the file and the inputs' round trip
through a temporary `.npz`: docs/guides/export.md ("When LiteRT crashes") has the
figures.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import tempfile

import numpy as np

from kerasnorm.export.numerics.errors import ExportVerificationError
from kerasnorm.export.verify import session

# Loading, allocating and calling a small file takes milliseconds; a child
# that has not answered after this many seconds is stopped.
CHILD_TIMEOUT_S = 600
DELEGATE = "XNNPACK (LiteRT's default CPU delegate)"
_ANSWER = "kerasnorm-child:"
_STEP = "kerasnorm-step:"

# The inputs of a file as LiteRT takes them, for the children that run one
# (this module's and `verify.entry`'s): NumPy only.
FEED_SOURCE = r"""
import json
import sys

import numpy as np


# Every input: a fixed batch cut (or repeated) to its size, an input not
# given (a streaming step's state) zeros at the batch given; a shape the
# file does not take is a ValueError, left to the caller's own run.
def fitted(feeds, details):
    batch = len(next(iter(feeds.values())))
    named = {}
    for name, detail in details.items():
        fixed = [int(d) for d in detail["shape_signature"]]
        value = feeds.get(name)
        if value is None:
            shape = [d if d > 0 else 1 for d in fixed]
            shape[0] = fixed[0] if fixed[0] > 0 else batch
            value = np.zeros(shape, np.float32)
        elif len(value.shape) != len(fixed) or any(
            f > 0 and f != d for f, d in zip(fixed[1:], value.shape[1:])
        ):
            raise ValueError(f"input {name} of shape {value.shape}: {fixed}")
        elif fixed and fixed[0] > 0 and len(value) != fixed[0]:
            value = np.resize(value, (fixed[0], *value.shape[1:]))
        named[name] = quantized(value, detail)
    return named


def quantized(value, detail):
    scale, zero = detail["quantization"]
    if np.issubdtype(detail["dtype"], np.integer) and scale:
        value = np.round(value / scale + zero)
        info = np.iinfo(detail["dtype"])
        value = np.clip(value, info.min, info.max)
    return np.asarray(value).astype(detail["dtype"])
"""

CHILD_SOURCE = (
    FEED_SOURCE
    + r"""
from ai_edge_litert.interpreter import Interpreter

ANSWER, STEP = "kerasnorm-child:", "kerasnorm-step:"


def step(name):
    print(STEP + name, flush=True)


for request in sys.stdin:
    path, feeds = json.loads(request)
    try:
        step("load")
        interpreter = Interpreter(model_path=path)
        step("allocate")
        interpreter.allocate_tensors()
        step("invoke")
        runner = interpreter.get_signature_runner("serving_default")
        details = runner.get_input_details()
        with np.load(feeds, allow_pickle=False) as archive:
            given = {n: archive[n] for n in archive.files}
        runner(**fitted(given, details))
        answer = None
    except Exception as err:
        answer = f"{type(err).__name__}: {' '.join(str(err).split())}"[:600]
    print(ANSWER + json.dumps(answer), flush=True)
"""
)


class Child(session.SessionProcess):
    """The child process (see the module docstring): `first_run` one file
    at a time."""

    def __init__(self):
        self._stderr = tempfile.TemporaryFile(prefix="kerasnorm-child-")
        super().__init__(CHILD_SOURCE, stderr=self._stderr)

    def parse(self, line):
        if line.startswith(_STEP):
            return ("step", line[len(_STEP) :].strip())
        if line.startswith(_ANSWER):
            return ("answer", json.loads(line[len(_ANSWER) :]))
        return None

    def first_run(self, path, feeds, label=None):
        """Load `path` in the child, allocate it and call its
        `serving_default` once on `feeds` (`{input name: float array}`).
        None, or the error LiteRT raised there other than a kernel's
        RuntimeError (the caller's own run raises it again). Raises
        ExportVerificationError when the child dies (a signal) or hangs, or
        a kernel cannot be prepared or run."""
        label = path if label is None else label
        with tempfile.TemporaryDirectory(prefix="kerasnorm-child-") as tmp:
            inputs = os.path.join(tmp, "inputs.npz")
            np.savez(inputs, **{n: np.asarray(x) for n, x in feeds.items()})
            self._stderr.seek(0)
            self._stderr.truncate()
            step = "load"
            try:
                self.send(json.dumps([os.fspath(path), inputs]))
                while True:
                    kind, value = self.event(CHILD_TIMEOUT_S)
                    if kind == "step":
                        step = value
                    elif kind == "answer":
                        break
                    else:
                        raise EOFError
            except (OSError, EOFError):
                code = self._child.wait()
                raise ExportVerificationError(
                    crash_message(label, step, code, self._last_words())
                ) from None
            except queue.Empty:
                self.close()
                raise ExportVerificationError(
                    f"LiteRT did not finish the {step} step of {label} within "
                    f"{CHILD_TIMEOUT_S} s (delegate {DELEGATE}); the file was "
                    "not written."
                ) from None
        # A kernel LiteRT cannot prepare or run raises RuntimeError (int16
        # scales its checks refuse, say): a failed check of this file. Any
        # other error (inputs of the wrong shape) is left to the run in this
        # process, which raises it again with the runner's own message.
        if value is not None and value.startswith("RuntimeError: "):
            raise ExportVerificationError(
                f"LiteRT cannot run {label} (step {step}, delegate {DELEGATE}): "
                f"{value[len('RuntimeError: ') :].rstrip('.')}. The file was "
                "not written. Next step: another quantize mode (the modes' "
                "table in docs/guides/export.md), or quantize=None."
            )
        return value

    def _last_words(self):
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", "replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        # LiteRT's startup lines say nothing about the crash.
        lines = [line for line in lines if "Created TensorFlow Lite" not in line]
        return lines[-1][:300] if lines else ""

    def close(self):
        super().close()
        self._stderr.close()


def crash_message(label, step, code, last_words=""):
    """The error of a child that died in `step` with exit status `code`."""
    died = f"exited with status {code}"
    if code < 0:
        try:
            died = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            died = f"was killed by signal {-code}"
    said = f' (its last words: "{last_words}")' if last_words else ""
    return (
        f"LiteRT crashed at the {step} step of {label} (delegate {DELEGATE}): "
        f"the process running it {died}{said}; that file would crash any "
        "program that loads it, so it was not written, and this process "
        "carries on. Next step: export with quantize='dynamic' or None (float "
        "activations), or to_saved_model, and report the model to kerasnorm "
        "with this message."
    )


# The session's child (`session.Kept`).
kept = session.Kept(lambda: Child())


def child() -> Child:
    """The session's child, started (or replaced) if needed. Call it when
    an export starts: the child imports LiteRT meanwhile."""
    return kept.get()


def first_run(path, feeds, label=None):
    """The guarded first load and run of the `.tflite` file `path` on
    `feeds` (`Child.first_run`), in the session's child."""
    label = staged_target(path) if label is None else label
    # One request at a time: the child answers in order.
    with kept.run_lock:
        return child().first_run(path, feeds, label)


def staged_target(path):
    """The path a staged file (`staging.atomic`) becomes: the name the
    user gave."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    match = re.fullmatch(r"\.(.+)\.tmp-(?:\d+-)?[0-9a-f]{8}(\.tflite)?", name)
    return os.path.join(directory, match.group(1)) if match else path
