"""The spine of the compiler: parse -> check -> lower -> fuse -> compile -> tune -> emit.

Each stage is one function named after it; this module chains them and owns nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dslc.check.checker import CheckedModel, check
from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Failed, Sink
from dslc.fuse import FusionPlan, fuse
from dslc.ir.graph import Graph
from dslc.lower import lower
from dslc.parse import ast
from dslc.parse.loader import Program, load


@dataclass
class Options:
    include_dirs: list[Path] = field(default_factory=list)
    precision: PrecisionSpec | None = None  # overrides the model's precision statements
    backend: str = "cudnn"  # "reference" lifts cuDNN's support limits (any well-typed model runs)


@dataclass
class FrontEnd:
    """What parse and check produced for one file."""

    program: Program
    module: ast.Module | None
    model: CheckedModel | None


def front_end(path: Path, options: Options, sink: Sink) -> FrontEnd:
    """`.cgraph` file -> parsed program and checked model (None for a library, or on errors)."""
    program = Program()
    try:
        return _front_end(path, options, sink, program)
    except Failed:  # --max-errors reached: report what was collected
        return FrontEnd(program, None, None)


def _front_end(path: Path, options: Options, sink: Sink, program: Program) -> FrontEnd:
    _, module = load(path, options.include_dirs, sink, program)
    # A file that did not parse, or an import not found, would make every name it should have
    # provided an error too; other errors (statement placement) still let checking go on, so
    # all errors of the file are reported at once.
    blocking = {"E0101", "E0102", "E0702", "E0703"}
    if module is None or any(d.code in blocking for d in sink.diagnostics):
        return FrontEnd(program, module, None)
    model = check(program, module, sink, options.precision, options.backend)
    return FrontEnd(program, module, model)


def middle_end(model: CheckedModel) -> tuple[Graph, FusionPlan]:
    """Checked model -> lowered IR and its fusion plan."""
    lowered = lower(model.graph)
    return lowered, fuse(lowered)
