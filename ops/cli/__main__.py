"""`python -m ops.cli`: the same as `ppf`."""

import sys

from ops.cli import main

sys.exit(main())
