"""`python -m dslc.cli`: the same as the `dslc` command."""

import sys

from dslc.cli import main

sys.exit(main())
