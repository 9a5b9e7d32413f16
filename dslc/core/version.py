"""dslc's version, as pyproject.toml gives it: recorded in bundles and in tuning-database entries
(the runtime records it too, so it lives on the bottom floor)."""

VERSION = "0.1.0"
