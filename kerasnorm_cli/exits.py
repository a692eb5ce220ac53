"""The exit statuses of every `kerasnorm` subcommand, and their help text."""

EXIT_OK = 0  # every artifact written and verified
EXIT_PARITY = 1  # an artifact (or the folded or QAT model) failed its check
EXIT_USAGE = 2  # refused: a bad argument or input file, an existing output
EXIT_CONVERSION = 3  # the model cannot be written as asked (converter, QAT)

# The work (`kerasnorm.cli.run`) reports an outcome by name; its status.
STATUS = {
    "ok": EXIT_OK,
    "parity": EXIT_PARITY,
    "usage": EXIT_USAGE,
    "conversion": EXIT_CONVERSION,
}

# The epilog of every subcommand's --help.
EXIT_STATUS_HELP = """\
exit status:
  0  every artifact written and verified
  1  a parity check failed (the folded or QAT model's check included)
  2  refused: a bad argument, an unreadable model or data file, an existing
     output without --force, a missing extra; found before anything is
     written, except an argument only the model can judge (--max-unroll-steps
     shorter than its sequences, --streaming on a model without a time axis),
     which refuses that artifact alone
  3  the model cannot be written as asked: a layer the converter or TFMOT
     cannot express, with --streaming a layer that mixes time steps, an
     error writing the file
"""
