"""``python -m delegate``: the same command line as ``delegate``."""

import sys

from .cli import main

sys.exit(main())
