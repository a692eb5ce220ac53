import sys

from kerasnorm.cli import main

sys.exit(main())
