"""Resolve names, elaborate the model symbolically, then re-check every tune bucket
with concrete sizes (parsed program -> `CheckedModel`, or diagnostics).

`CheckedModel` is the elaborated, typed model: every op instance as an IR node with its type,
instance path and span, plus the manifest (inputs, outputs, params, dims, buckets).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from dataclasses import dataclass
from typing import Any

from dslc.check.context import ParamSpec, TooLarge
from dslc.check.elaborate import DimDecl, Elaborator, IOSpec, model_metadata
from dslc.check.exprs import MAX_NESTING
from dslc.check.resolve import Resolved, resolve
from dslc.core.dims import DimEnv
from dslc.core.types import PrecisionSpec
from dslc.diag.diagnostic import Diagnostic, Sink
from dslc.diag.records import collector_paused
from dslc.diag.span import Span
from dslc.ir.graph import Graph
from dslc.parse import ast
from dslc.parse.loader import Program

MAX_BUCKETS = 64  # above this, W0602: each bucket is a graph to build and tune
MAX_RECHECKS = 4096  # beyond this many buckets the concrete re-check is refused (E0606)


@dataclass(frozen=True)
class CheckedModel:
    name: str
    file: str
    span: Span
    metadata: dict[str, Any]
    dims: tuple[DimDecl, ...]
    buckets: tuple[dict[str, int], ...]
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    params: tuple[ParamSpec, ...]
    graph: Graph
    env: DimEnv
    precision: PrecisionSpec

    @property
    def dynamic_dims(self) -> tuple[DimDecl, ...]:
        return tuple(d for d in self.dims if d.dynamic)


# Elaboration recurses once per nesting level of the source, at most MAX_NESTING levels (deeper
# is E0705) of at most 5 Python frames each (a def instance: call, apply_def, instantiate, run_body,
# stmt, let, rhs, eval for 3 levels). Python's default limit of 1000 frames is below that plus
# the caller's frames; the check runs with this much room (pure-Python frames: no C stack).
STACK_FRAMES = 5 * MAX_NESTING + 2000


def check(program: Program, module: ast.Module, sink: Sink,
          precision: PrecisionSpec | None = None, backend: str = "cudnn", fp8: bool = True,
          ) -> CheckedModel | None:
    """Check `module` (and what it imports). Returns None for a library file (no model) or when
    errors were reported. `precision` overrides every `precision` statement (debugging numerics,
    reference runs in f32); dtypes written on values still hold. With backend="reference", the
    limits of cuDNN (e.g. sdpa only in f16/bf16) are not applied. With `fp8` False (`--fp8 off`)
    the model's fp8 requests are not applied: it is the model as if it asked for none."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, STACK_FRAMES))
    try:
        with collector_paused():
            return _check(program, module, sink, precision, backend, fp8)
    finally:
        sys.setrecursionlimit(limit)


def _check(program: Program, module: ast.Module, sink: Sink, precision: PrecisionSpec | None,
           backend: str, fp8: bool) -> CheckedModel | None:
    resolved = resolve(program, sink)
    if not module.models:
        return None
    model = module.models[0]
    el = Elaborator(program, resolved, sink, precision_override=precision, backend=backend,
                    fp8=fp8)
    try:
        scope = el.model(module, model)
        metadata = model_metadata(el, model, scope)
    except TooLarge:
        return None
    if sink.error_count:
        return None
    buckets = enumerate_buckets(el, sink)
    if len(buckets) > MAX_RECHECKS:
        sink.report(Diagnostic(
            "E0606", f"{len(buckets)} buckets are too many to check", el.dims[0].span,
            f"more than {MAX_RECHECKS}", help=("list the combinations you need with "
                                               "`buckets (...) = [...]`",)))
        return None
    for bucket in buckets:
        if bucket:  # a model without dynamic dims was checked with its only sizes already
            recheck(program, resolved, module, model, bucket, sink, precision, backend, fp8)
    if sink.error_count:
        return None
    return CheckedModel(
        name=model.name.name, file=module.file, span=model.name.span, metadata=metadata,
        dims=tuple(el.dims), buckets=tuple(buckets), inputs=tuple(el.inputs),
        outputs=tuple(el.outputs), params=tuple(el.ctx.params.values()),
        graph=Graph(tuple(el.ctx.nodes), tuple((o.name, o.node) for o in el.outputs)),
        env=el.ctx.env, precision=scope.precision,
    )


def enumerate_buckets(el: Elaborator, sink: Sink) -> list[dict[str, int]]:
    """Explicit `buckets` rows, crossed with the `tune` lists of the other dynamic dims (a dim
    without `tune` contributes its upper bound)."""
    dynamic = [d for d in el.dims if d.dynamic]
    if not dynamic:
        return [{}]
    listed: tuple[str, ...] = ()
    rows: list[tuple[int, ...]] = [()]
    if el.bucket_rows is not None:
        listed, rows = el.bucket_rows
    others = [d for d in dynamic if d.name not in listed]
    choices = [list(d.tune) if d.tune else [(d.hi // d.align) * d.align] for d in others]
    out = []
    for row in rows:
        for combo in itertools.product(*choices):
            bucket = dict(zip(listed, row, strict=True))
            bucket.update(zip((d.name for d in others), combo, strict=True))
            out.append({d.name: bucket[d.name] for d in dynamic})
    if len(out) > MAX_BUCKETS:
        first = dynamic[0]
        sink.report(Diagnostic(
            "W0602", f"{len(out)} buckets: each is a graph to build and tune", first.span,
            "the dynamic dims multiply",
            notes=(f"more than {MAX_BUCKETS} graphs make compiles and bundles slow",),
            help=("list the combinations you need with `buckets (...) = [...]`",)))
    return out


def recheck(program: Program, resolved: Resolved, module: ast.Module, model: ast.Model,
            bucket: dict[str, int], sink: Sink, precision: PrecisionSpec | None = None,
            backend: str = "cudnn", fp8: bool = True) -> None:
    """Elaborate again with concrete sizes: a range can hide a bad corner value. Each new
    (code, span) is reported once, for the first bucket that shows it."""
    local = Sink(max_errors=sink.max_errors)
    el = Elaborator(program, resolved, local, bucket=bucket, precision_override=precision,
                    backend=backend, fp8=fp8)
    with contextlib.suppress(TooLarge):
        el.model(module, model)
    seen = {(d.code, d.span) for d in sink.diagnostics}
    for d in local.diagnostics:
        if d.is_error and (d.code, d.span) not in seen:
            sink.report(d)
            seen.add((d.code, d.span))
