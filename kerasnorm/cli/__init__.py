"""The `kerasnorm` console command: `kerasnorm demo`, `kerasnorm export`, ...

Each subcommand is a module here with `add_parser(subparsers)` that registers
its parser and sets `func` to the function that runs it and returns an exit
code.
"""

import argparse
import importlib
import os
import sys

SUBCOMMANDS = ["demo", "export"]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="kerasnorm",
        description="Normalization layers for Keras: demo and export tools.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"kerasnorm.cli.{name}").add_parser(subparsers)
    return parser


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
