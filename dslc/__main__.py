"""`python -m dslc`: the command line, where the `dslc` script is not on PATH."""

from dslc.cli import main

raise SystemExit(main())
