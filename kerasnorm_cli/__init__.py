"""The `kerasnorm` command's entry point and front, outside the package.

`import kerasnorm` imports Keras, and with it TensorFlow (seconds): the
layers register with Keras on import so that `keras.saving.load_model` finds
them, and importing any module inside `kerasnorm` runs `kerasnorm/__init__`
first. So the command's front lives in this separate top-level package,
which imports nothing beyond the standard library: `arguments` (the parsers,
`--help`, `--version`), `checks` (every check that needs no model, the
`.keras` archive's included) and `exits` (the exit statuses). `--help`,
`--version` and those refusals answer without TensorFlow. A command that
passes them quiets TensorFlow's native log and only then imports
`kerasnorm.cli`, which loads the model, does the work and reports an
outcome that `exits.STATUS` turns into the exit status; nothing in
`kerasnorm.cli` imports this package (the imports run one way).
`command(argv)` runs the same front and work in this process.
"""

import os
import sys

from kerasnorm_cli.checks import parse
from kerasnorm_cli.exits import STATUS


def main(argv=None):
    """The console script: the TensorFlow backend, checks, then the work."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # Every subcommand ends in TensorFlow (SavedModel, the TFLite converter);
    # a .keras file loads on any backend, so a model trained on JAX or
    # PyTorch exports from the same shell, KERAS_BACKEND notwithstanding.
    os.environ["KERAS_BACKEND"] = "tensorflow"
    if _keras_fixed_another_backend():
        # Keras was imported on another backend before this ran: a backend
        # Keras has fixed cannot change in this process, so start again.
        os.execv(sys.executable, [sys.executable, "-m", "kerasnorm_cli", *argv])
    args, status = parse(argv)
    if args is None:
        return status
    if not args.verbose:
        _quiet_native_logs()
    return _work(args)


def command(argv=None):
    """`kerasnorm ARGS` in this process (the tests' way in): the same
    checks, then the work; the exit status. The backend and the native log
    are the process's own."""
    args, status = parse(argv)
    if args is None:
        return status
    return _work(args)


def _work(args):
    """The work, called one way: `kerasnorm.cli` imports nothing from here
    and reports an outcome, which is turned into the exit status here."""
    from kerasnorm.cli import run

    return STATUS[run(args)]


def _keras_fixed_another_backend():
    keras = sys.modules.get("keras")
    return keras is not None and keras.backend.backend() != "tensorflow"


def _quiet_native_logs():
    """Drop what native code writes to stderr; keep Python's stderr.

    File descriptor 2 is pointed at the null device, so C++ log lines (the
    oneDNN and CUDA notices TensorFlow prints on import, whatever its log
    level, and the TFLite converter's log) go nowhere, while `sys.stderr`,
    through which Python prints errors, warnings and tracebacks, writes to a
    copy of the original descriptor. `--verbose` skips all of this.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    sys.stderr = os.fdopen(os.dup(2), "w", buffering=1, errors="backslashreplace")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
