"""`python -m governor ...` is the `governor` command."""

import sys

from governor.cli import main

sys.exit(main())
