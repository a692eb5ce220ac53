"""`python -m kerasnorm_cli`: the `kerasnorm` command."""

import sys

from kerasnorm_cli import main

sys.exit(main())
