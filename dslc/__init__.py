"""dslc: compile `.cgraph` model descriptions into tuned cuDNN artifacts."""

__version__ = "0.1.0"  # the one place it is written: pyproject.toml reads it (tool.hatch.version)
