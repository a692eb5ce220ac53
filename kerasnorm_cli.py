"""The `kerasnorm` command's entry point, outside the `kerasnorm` package.

`import kerasnorm` imports Keras, and with it TensorFlow: the layers register
with Keras on import so that `keras.saving.load_model` finds them. TensorFlow
logs from C++ as its libraries load, partly before its log level is even
read, and any module inside `kerasnorm` runs `kerasnorm/__init__` first. So
the command starts here and quiets TensorFlow before importing the package;
`kerasnorm.cli.main` does the rest.
"""

import os
import sys


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    # Every subcommand ends in TensorFlow (SavedModel, the TFLite converter);
    # a .keras file loads on any backend, so a model trained on JAX or
    # PyTorch exports from the same shell, KERAS_BACKEND notwithstanding.
    os.environ["KERAS_BACKEND"] = "tensorflow"
    if _keras_fixed_another_backend():
        # `python -m kerasnorm.cli` imports the `kerasnorm` package, and with
        # it Keras, before this runs: a backend Keras has fixed cannot
        # change in this process, so the command starts again in a new one.
        os.execv(sys.executable, [sys.executable, "-m", "kerasnorm_cli", *args])
    if "--verbose" not in args:
        _quiet_native_logs()
    from kerasnorm.cli import main as run

    return run(args)


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


if __name__ == "__main__":
    sys.exit(main())
