"""`python -m kerasnorm.cli`: the installed command, started again as
`python -m kerasnorm_cli` (its front forces the TensorFlow backend and
quiets TensorFlow's logs before Keras loads, which importing this package
has done already); the work does not import its front."""

import os
import sys

os.execv(sys.executable, [sys.executable, "-m", "kerasnorm_cli", *sys.argv[1:]])
