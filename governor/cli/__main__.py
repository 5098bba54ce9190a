"""`python -m governor.cli ...`: the `governor` command, as `python -m governor` is."""

import sys

from governor.cli import main

sys.exit(main())
