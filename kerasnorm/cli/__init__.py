"""The `kerasnorm` command's work: `demo`, `export`, `export-adapter`, `qat`.

The command's front (parsers, the checks that need no model, the exit
statuses) is the top-level package `kerasnorm_cli`, which imports no Keras,
so that `--help`, `--version` and refusals answer at once. It calls `run`
here once the arguments have passed, with what they ask for decided
(`args.targets`: the artifacts to write); nothing here imports the front.
Each subcommand is a module here (the demo a package) with `run(args)`
returning an outcome (`OUTCOMES`), which the front turns into the exit
status. `kerasnorm_cli.command(argv)` runs the command in process.
"""

import logging
import os

from kerasnorm.cli import adapter
from kerasnorm.cli import demo
from kerasnorm.cli import export
from kerasnorm.cli import qat

COMMANDS = {
    "demo": demo.run_demo,
    "export": export.run,
    "export-adapter": adapter.run,
    "qat": qat.run,
}
# What a command reports: every artifact written and verified; a parity
# check failed; refused (an argument only the model can judge, an input
# file); the model cannot be written as asked. `kerasnorm_cli.exits` maps
# each to its exit status.
OUTCOMES = ("ok", "parity", "usage", "conversion")


def run(args):
    """Run a checked command; its outcome (one of `OUTCOMES`)."""
    quiet_logs(args.verbose)
    return COMMANDS[args.command](args)


def quiet_logs(verbose=False):
    """Keep TensorFlow's and absl's log lines off the terminal.

    `TF_CPP_MIN_LOG_LEVEL` 3 drops TensorFlow's C++ log lines (such as
    "failed call to cuInit" on a machine without a GPU, an ERROR line that
    is no error here); it is read when TensorFlow loads, which the
    command's entry point (`kerasnorm_cli.main`) makes sure is after this,
    and which is too late in a process that imported TensorFlow already. A
    value the user set is left alone. Python's absl and TensorFlow loggers
    are lowered to errors; the converter's own log is handled where it runs
    (`kerasnorm.export.litert.convert`).

    absl's level is set through absl's own verbosity, not only on its
    logger: saving a SavedModel sets absl's verbosity to FATAL and back to
    what absl holds, which would put the logger back at WARNING, and
    loading one then logs "Importing a function ... with ops with unsaved
    custom gradients" for every custom-gradient function.
    """
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.getLogger("absl").setLevel(logging.ERROR)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)
