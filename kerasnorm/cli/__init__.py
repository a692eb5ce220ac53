"""The `kerasnorm` console command: `kerasnorm demo`, `kerasnorm export`, ...

Each subcommand is a module here (the demo a package) with
`add_parser(subparsers)` that registers its parser and sets `func` to the
function that runs it and returns an exit code. Subcommands import Keras and
TensorFlow inside `func` only, so that parsing (and `--help`) costs no
TensorFlow import, and so that the log environment `main` sets is in place
before TensorFlow first loads. The command's entry point, for the console
script and `python -m kerasnorm.cli` alike, is `kerasnorm_cli.main`.
"""

import argparse
import importlib
import logging
import os

SUBCOMMANDS = ["demo", "export", "qat"]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="kerasnorm",
        description="Normalization layers for Keras: demo and export tools.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"kerasnorm.cli.{name}").add_parser(subparsers)
    return parser


def quiet_logs(verbose=False):
    """Keep TensorFlow's and absl's log lines off the terminal.

    `TF_CPP_MIN_LOG_LEVEL` 3 drops TensorFlow's C++ log lines (such as
    "failed call to cuInit" on a machine without a GPU, an ERROR line that
    is no error here); it is read when TensorFlow loads, which the installed
    command's entry point (`kerasnorm_cli`) makes sure is after this, and
    which is too late in a process that imported TensorFlow already. A value
    the user set is left alone. Python's absl and TensorFlow loggers are
    lowered to errors; the converter's own log is handled where it runs
    (`kerasnorm.export.litert.convert`).
    """
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.getLogger("absl").setLevel(logging.ERROR)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)


def main(argv=None):
    args = build_parser().parse_args(argv)
    quiet_logs(getattr(args, "verbose", False))
    return args.func(args)
