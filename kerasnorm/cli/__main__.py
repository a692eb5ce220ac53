"""`python -m kerasnorm.cli`: the installed command's entry point, the same
one (`kerasnorm_cli.main`), so that it forces the TensorFlow backend and
quiets TensorFlow's logs as `kerasnorm` does."""

import sys

from kerasnorm_cli import main

sys.exit(main())
