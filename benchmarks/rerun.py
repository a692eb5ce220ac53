"""A benchmark running itself in a subprocess.

TensorFlow reads `TF_ENABLE_ONEDNN_OPTS` and `XLA_FLAGS` once, at import, so
a script that compares two settings, or dumps one XLA profile per layer, runs
each in a child process of its own: `python -m <the script's module> ...`,
with the repository root on `PYTHONPATH` so that the child imports this
package from any working directory.
"""

import os
import pathlib
import sys

ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


def command(spec, *arguments):
    """The command line that runs the module of `spec` (the caller's
    `__spec__`) with `arguments`."""
    if spec is None:
        raise RuntimeError(
            "Run the benchmark as a module from the repository root, e.g. "
            "`python -m benchmarks.bench_norms`, not as a file path."
        )
    return [sys.executable, "-m", spec.name, *map(str, arguments)]


def environment(**variables):
    """`os.environ` with `variables` set and the repository root first on
    `PYTHONPATH`."""
    env = dict(os.environ, **variables)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = ROOT if not path else ROOT + os.pathsep + path
    return env
