"""Elaboration of a model, statement by statement: dims, precision, layout, inputs, params, lets
(`repeat`, `when`, instance paths, ascriptions), outputs. Defs are expanded inline through the
call layer; the result is a typed op graph plus the model's manifest (`model` -> `Elaborated`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from dslc.check.calls import QUANTIZE_KEYS, Arg, CallEval
from dslc.check.context import Context, ParamSpec, is_dim, is_int
from dslc.check.defs import conform, instantiate, layout_of
from dslc.check.expansion import estimate
from dslc.check.exprs import ExprEval
from dslc.check.inplace import check_in_place
from dslc.check.resolve import DefRef, Resolved, suggest
from dslc.check.values import (
    ERROR,
    Absent,
    Binding,
    DType,
    Frame,
    ListVal,
    Scope,
    TensorVal,
    TupleVal,
    kind_of,
)
from dslc.core import dims
from dslc.core.dims import SymInfo
from dslc.core.types import (
    DTYPES,
    FP8,
    INTS,
    WEIGHT_SCALES,
    Layout,
    PrecisionSpec,
    TensorType,
    format_type,
    is_float,
)
from dslc.diag.diagnostic import Label, Sink
from dslc.diag.span import Span
from dslc.ir.graph import IN_PLACE
from dslc.parse import ast
from dslc.parse.loader import Program

MAX_REPEAT = 10_000


@dataclass(frozen=True)
class DimDecl:
    name: str
    span: Span
    value: Any = None  # static dims: int (or a dim expression of dynamic dims)
    lo: int = 0
    hi: int = 0
    align: int = 1
    tune: tuple[int, ...] | None = None

    @property
    def dynamic(self) -> bool:
        return self.value is None


@dataclass(frozen=True)
class IOSpec:
    name: str
    type: TensorType
    node: str
    span: Span


class Elaborator:
    """Statements, def bodies and the model: the checker's state (`ctx`), its expressions
    (`exprs`) and calls (`calls`) as parts, each calling the others through these references."""

    def __init__(self, program: Program, resolved: Resolved, sink: Sink,
                 bucket: dict[str, int] | None = None,
                 precision_override: PrecisionSpec | None = None, backend: str = "cudnn",
                 fp8: bool = True) -> None:
        self.ctx = Context(program, resolved, sink, bucket, precision_override, backend, fp8)
        self.exprs = ExprEval(self.ctx)
        self.calls = CallEval(self.ctx, self.exprs, self)
        self.exprs.calls = self.calls
        self.dims: list[DimDecl] = []
        self.bucket_rows: tuple[tuple[str, ...], list[tuple[int, ...]]] | None = None
        self.inputs: list[IOSpec] = []
        self.outputs: list[IOSpec] = []
        self.model_layout: Layout | None = None
        self.lets: list[tuple[str, str, Span]] = []  # (value node, let name, span) for W0201

    # -- bodies ----------------------------------------------------------------------------------
    def apply_def(self, ref: DefRef, call: ast.Call, pos: list[Arg], kws: dict[str, Arg],
                  scope: Scope, hint: str) -> Any:
        return instantiate(self.calls, ref, call, pos, kws, scope, hint)

    def run_body(self, body: tuple[ast.Stmt, ...], scope: Scope) -> Any:
        result = None
        for stmt in body:
            r = self.stmt(stmt, scope)
            if isinstance(stmt, ast.Return):
                result = r
        return result

    def stmt(self, stmt: ast.Stmt, scope: Scope) -> Any:
        if type(stmt) is ast.Let:  # most statements: one type test, not a `match` of ten
            self.let(stmt, scope)
            return None
        match stmt:
            case ast.DimFixed():
                self.dim_fixed(stmt, scope)
            case ast.DimRange():
                self.dim_range(stmt, scope)
            case ast.Buckets():
                self.buckets(stmt, scope)
            case ast.Precision():
                self.precision(stmt, scope)
            case ast.LayoutStmt(tag=tag):
                layout = layout_of(self.calls, tag, 4, scope)
                if layout is not None and not tag.name.startswith("N"):
                    self.ctx.report("E0501", "`layout` sets the default of image tensors: use "
                                    "`NCHW` or `NHWC`", tag.span, frame=scope.frame)
                elif layout is not None:
                    self.model_layout = layout
            case ast.Input():
                self.input(stmt, scope)
            case ast.ParamStmt():
                self.param(stmt, scope)
            case ast.Output():
                self.output(stmt, scope)
            case ast.Return(values=values):
                out = [self.exprs.eval(v, scope, "ret" if len(values) > 1 else "") for v in values]
                if any(v is ERROR for v in out):
                    return ERROR
                return out[0] if len(out) == 1 else TupleVal(tuple(out))
        return None

    def bind(self, ident: ast.Ident, value: Any, scope: Scope, kind: str) -> None:
        if ident.name in scope.values:  # bound twice (E0202): which one is meant is unknown
            value = ERROR
        scope.values[ident.name] = Binding(value, ident.span, kind)

    # -- dims and settings -----------------------------------------------------------------------
    def at_least_one(self, d: Any, span: Span, scope: Scope) -> bool:
        """E0606 when a size can be below 1 for an admissible value of its dims."""
        if not is_dim(d):
            return True
        lo, _ = dims.interval(d, self.ctx.env)
        if lo >= 1:
            return True
        text = self.ctx.program.sources.snippet(span)
        where = "" if is_int(d) else f" (it can be as small as {lo})"
        self.ctx.report("E0606", f"the size `{text}` can be below 1{where}", span,
                        "sizes are at least 1", frame=scope.frame,
                        help=("narrow the range of the dims it uses",) if not is_int(d) else ())
        return False

    def dim_fixed(self, stmt: ast.DimFixed, scope: Scope) -> None:
        value = self.exprs.want_dim(stmt.value, scope)
        if value is not ERROR and not self.at_least_one(value, stmt.value.span, scope):
            value = ERROR
        self.bind(stmt.name, value, scope, "dim")
        if scope.is_model and value is not ERROR:
            self.dims.append(DimDecl(stmt.name.name, stmt.span, value=value))

    def dim_range(self, stmt: ast.DimRange, scope: Scope) -> None:
        name = stmt.name.name
        lo, hi = stmt.lo.value, stmt.hi.value
        align = stmt.align.value if stmt.align is not None else 1
        tune = tuple(t.value for t in stmt.tune) if stmt.tune is not None else None
        bad: tuple[Span, str, *tuple[str, ...]] | None = None
        if lo < 1:
            bad = (stmt.lo.span, f"`{name}` must be at least 1")
        elif lo > hi:
            bad = (stmt.range_span, f"the range of `{name}` is empty: {lo} > {hi}",
                   f"write `{hi}..{lo}`")
        elif align < 1:
            bad = (stmt.align.span if stmt.align else stmt.span, "`align` must be at least 1")
        elif -(-lo // align) * align > hi:
            bad = (stmt.range_span, f"no multiple of {align} lies in {lo}..{hi}")
        if bad is not None:
            self.ctx.report("E0606", bad[1], bad[0], frame=scope.frame, help=tuple(bad[2:]))
            self.bind(stmt.name, ERROR, scope, "dim")
            return
        for t in stmt.tune or ():
            if not lo <= t.value <= hi:
                self.ctx.report("E0601", f"tune bucket {t.value} is outside the range of `{name}`",
                                t.span, f"not in {lo}..{hi}", (Label(stmt.range_span,
                                                                    "range declared here"),),
                                help=(f"widen the range to `{min(lo, t.value)}..{max(hi, t.value)}`, "
                                      "or drop the bucket",), frame=scope.frame)
            elif t.value % align:
                self.ctx.report("E0601", f"tune bucket {t.value} is not a multiple of {align}",
                                t.span, f"`{name}` has align {align}", frame=scope.frame,
                                help=(f"use {t.value - t.value % align or align}, or drop it",))
        if tune is not None and len(set(tune)) != len(tune):
            self.ctx.report("E0606", f"a tune bucket of `{name}` is listed twice", stmt.span,
                            frame=scope.frame)
        self.ctx.dim_decls[name] = stmt.range_span
        self.dims.append(DimDecl(name, stmt.span, None, lo, hi, align, tune))
        if self.ctx.bucket is not None and name in self.ctx.bucket:
            self.bind(stmt.name, self.ctx.bucket[name], scope, "dim")
            return
        self.ctx.env.add(SymInfo(name, lo, hi, align))
        self.bind(stmt.name, dims.sym(name), scope, "dim")

    def buckets(self, stmt: ast.Buckets, scope: Scope) -> None:
        if self.bucket_rows is not None:
            self.ctx.report("E0606", "a model holds one `buckets` statement", stmt.span,
                            frame=scope.frame)
            return
        decls = {d.name: d for d in self.dims if d.dynamic}
        names = []
        for ident in stmt.names:
            d = decls.get(ident.name)
            if d is None:
                self.ctx.report("E0606", f"`{ident.name}` is not a dynamic dim", ident.span,
                                "buckets list dynamic dims only", frame=scope.frame)
                return
            if d.tune is not None:
                self.ctx.report("E0606", f"`{ident.name}` has a `tune` list and appears in `buckets`",
                                ident.span, "listed here", (Label(d.span, "tune list here"),),
                                help=("keep one of the two",), frame=scope.frame)
                return
            names.append(ident.name)
        if len(set(names)) != len(names):
            self.ctx.report("E0606", "a dim is listed twice in `buckets`", stmt.span,
                            frame=scope.frame)
            return
        rows: list[tuple[int, ...]] = []
        for span, items in stmt.rows:
            if len(items) != len(names):
                self.ctx.report("E0606", f"this bucket has {len(items)} values for {len(names)} dims",
                                span, f"expected ({', '.join(names)})", frame=scope.frame)
                return
            for dim_name, item in zip(names, items, strict=True):
                d = decls[dim_name]
                if not d.lo <= item.value <= d.hi or item.value % d.align:
                    self.ctx.report("E0601", f"bucket value {item.value} does not fit `{dim_name}`",
                                    item.span, f"`{dim_name}` is {d.lo}..{d.hi}"
                                    + (f" align {d.align}" if d.align > 1 else ""),
                                    (Label(self.ctx.dim_decls[dim_name], "range declared here"),),
                                    frame=scope.frame)
                    return
            rows.append(tuple(i.value for i in items))
        self.bucket_rows = (tuple(names), rows)

    def precision(self, stmt: ast.Precision, scope: Scope) -> None:
        """The precision triple (ignored under `--precision`, which overrides it) and the
        operand precision of the ops that compute in fp8 (`matmul=`, `conv=`, `sdpa=`,
        `weight_scales=`), which `--fp8 off` turns off (`CallEval` then applies none)."""
        override = self.ctx.precision_override is not None
        current = {"io": scope.precision.io, "intermediate": scope.precision.intermediate,
                   "compute": scope.precision.compute}
        for kw in stmt.settings:
            key = kw.name.name
            if key not in current and key not in QUANTIZE_KEYS:
                hint = suggest(key, [*current, *QUANTIZE_KEYS])
                self.ctx.report("E0204", f"unknown precision setting `{key}`", kw.name.span,
                                "expected io, intermediate, compute, or an op that computes in "
                                "fp8: " + ", ".join(QUANTIZE_KEYS),
                                help=(f"did you mean `{hint}`?",) if hint else (), frame=scope.frame)
                continue
            value = self.exprs.eval(kw.value, scope)
            if key == "weight_scales":
                if value is not ERROR and value not in WEIGHT_SCALES:
                    self.ctx.report("E0209", "`weight_scales` takes "
                                    + " or ".join(f'"{w}"' for w in WEIGHT_SCALES) + ", found "
                                    + (f'"{value}"' if isinstance(value, str) else kind_of(value)),
                                    kw.value.span, frame=scope.frame,
                                    help=('per output channel (the default), or one scale per '
                                          'weight: `weight_scales="per_tensor"`',))
                elif value is not ERROR:
                    scope.quantize[key] = value
                    scope.precision_origin[key] = kw.span
                continue
            if not isinstance(value, DType):
                if value is not ERROR:
                    self.ctx.report("E0209", f"`{key}` takes a dtype, found {kind_of(value)}",
                                    kw.value.span, frame=scope.frame,
                                    help=(f"one of {', '.join(DTYPES)}",))
                continue
            if key in current:
                if not override:
                    current[key] = value.name
                    scope.precision_origin[key] = kw.span
            elif value.name in FP8 or is_float(value.name):
                scope.quantize[key] = value.name
                scope.precision_origin[key] = kw.span
            else:
                self.ctx.report("E0209", f"`{key}` takes an fp8 or a float dtype, found "
                                f"{value.name}", kw.value.span, frame=scope.frame,
                                help=(f"`{key}=f8e4m3` quantises its operands; a float dtype "
                                      "(their own) leaves them as they are",))
        scope.precision = PrecisionSpec(**current)

    # -- declarations ----------------------------------------------------------------------------
    def declared_type(self, t: ast.TensorTypeExpr, scope: Scope, default_layout: Layout | None,
                      ) -> TensorType | None:
        shape = self.exprs.eval_shape(t, scope)
        if shape is None:
            return None
        for d, expr in zip(shape, t.dims or (), strict=False):
            if not self.at_least_one(d, expr.span, scope):
                return None
        if not self.ctx.fits(TensorType(t.dtype or scope.precision.io, shape), t.span, scope.frame,
                             None):
            return None
        layout: Layout | None = Layout.row_major(len(shape))
        if t.layout is not None:
            layout = layout_of(self.calls, t.layout, len(shape), scope)
            if layout is None:
                return None
        elif default_layout is not None and len(shape) == 4:
            layout = default_layout
        return TensorType(t.dtype or scope.precision.io, shape, layout)

    def input(self, stmt: ast.Input, scope: Scope) -> None:
        """A model's input; in a def, one input per instance, named by its path as a param is
        (`model.layers.3.k_cache`): `repeat` then gives each layer a cache of its own."""
        t = self.declared_type(stmt.type, scope, self.model_layout)
        if t is None:
            self.bind(stmt.name, ERROR, scope, "input")
            return
        name = f"{scope.frame.instance}.{stmt.name.name}" if scope.frame.instance else \
            stmt.name.name
        value = self.ctx.add_node("input", (), {"name": name}, t, stmt.span, scope.frame,
                                  scope.precision, name)
        self.inputs.append(IOSpec(name, t, value.node, stmt.span))
        self.bind(stmt.name, value, scope, "input")

    def param(self, stmt: ast.ParamStmt, scope: Scope) -> None:
        if stmt.guard is not None:
            cond = self.exprs.want_bool(stmt.guard, scope)
            if cond is not True:
                self.bind(stmt.name, ERROR if cond is ERROR else Absent(stmt.name.name,
                                                                        stmt.guard.span),
                          scope, "param")
                return
        t = self.declared_type(stmt.type, scope, None)
        name = stmt.name.name
        path = f"{scope.frame.instance}.{name}" if scope.frame.instance else name
        if t is None:
            self.bind(stmt.name, ERROR, scope, "param")
            return
        dynamic = [d for d in t.shape if not is_int(d)]
        if dynamic:
            self.ctx.report("E0605", f"the shape of param `{path}` depends on a dynamic dim",
                            stmt.type.span, f"{format_type(t)}", frame=scope.frame,
                            notes=("weights have one fixed shape, whatever the input size",),
                            help=("size the param with static dims (`dim D = 64`) or def arguments",))
            self.bind(stmt.name, ERROR, scope, "param")
            return
        first = self.ctx.params.get(path)
        if first is not None:
            if self.ctx.bucket is None and scope.frame.instance not in self.ctx.duplicate_instances:
                self.ctx.report("E0208", f"the parameter path `{path}` is declared twice",
                                stmt.name.span, "declared again here",
                                (Label(first.span, "first declared here"),), frame=scope.frame,
                                help=('give the instances distinct names with `as "..."`',))
            self.bind(stmt.name, ERROR, scope, "param")
            return
        assert t.layout is not None
        shape = tuple(d for d in t.shape if isinstance(d, int))  # all static: checked above
        self.ctx.params[path] = ParamSpec(path, t.dtype, shape, t.layout, stmt.span)
        value = self.ctx.add_node("param", (), {"path": path}, t, stmt.span, scope.frame,
                                  scope.precision, path)
        self.bind(stmt.name, value, scope, "param")

    # -- lets and outputs ------------------------------------------------------------------------
    def let(self, stmt: ast.Let, scope: Scope) -> None:
        if stmt.guard is not None:
            cond = self.exprs.want_bool(stmt.guard, scope)
            if cond is not True:
                for ident in stmt.targets:
                    self.bind(ident, ERROR if cond is ERROR else Absent(ident.name,
                                                                        stmt.guard.span),
                              scope, "let")
                return
        hint = stmt.targets[0].name if not stmt.is_tuple else "_".join(
            t.name for t in stmt.targets)
        before = len(self.ctx.nodes)
        final = None  # the name the value's node gets at once, when it is new and free
        if stmt.type is None and not stmt.is_tuple and stmt.rhs.repeat is None:
            final = self.ctx.node_name(scope.frame, stmt.targets[0].name)
            final = final if final not in self.ctx.producers else None
            self.ctx.naming = (stmt.rhs.expr, final) if final is not None else None
        value = self.rhs(stmt.rhs, scope, hint, stmt.targets[0].name)
        self.ctx.naming = None
        fresh = isinstance(value, TensorVal) and (
            value.node == final or self.node_index(value.node) >= before)
        if stmt.type is not None and value is not ERROR:
            value = conform(self.calls, value, stmt.type, scope,
                            f"`{stmt.targets[0].name}`", fresh=fresh)
        if stmt.is_tuple:
            self.bind_tuple(stmt, value, scope)
            return
        if fresh and isinstance(value, TensorVal):
            value = self.ctx.rename(value, self.ctx.node_name(scope.frame, stmt.targets[0].name))
        self.bind(stmt.targets[0], value, scope, "let")
        if isinstance(value, TensorVal):
            self.lets.append((value.node, stmt.targets[0].name, stmt.targets[0].span))

    def bind_tuple(self, stmt: ast.Let, value: Any, scope: Scope) -> None:
        items: tuple[Any, ...]
        if value is ERROR:
            items = (ERROR,) * len(stmt.targets)
        elif not isinstance(value, TupleVal) or len(value.items) != len(stmt.targets):
            n = len(value.items) if isinstance(value, TupleVal) else 1
            names = stmt.targets[0].span.to(stmt.targets[-1].span)
            self.ctx.report("E0210", f"{len(stmt.targets)} names for {n} value{'s' if n != 1 else ''}",
                            names, f"{len(stmt.targets)} names", (Label(stmt.rhs.span,
                                                                        f"gives {kind_of(value)}"),),
                            frame=scope.frame)
            items = (ERROR,) * len(stmt.targets)
        else:
            items = value.items
        for ident, item in zip(stmt.targets, items, strict=True):
            self.bind(ident, item, scope, "let")

    def node_index(self, name: str) -> int:
        node = self.ctx.producers.get(name)
        if node is None:
            return -1
        for i in range(len(self.ctx.nodes) - 1, -1, -1):
            if self.ctx.nodes[i] is node:
                return i
        return -1

    def rhs(self, rhs: ast.Rhs, scope: Scope, hint: str, let_name: str) -> Any:
        """Evaluate a right-hand side, naming the one instance it may create (E0205 for two)."""
        instances = self.ctx.resolved.instance_calls(rhs.expr, scope.module)
        if len(instances) > 1:
            self.ctx.report("E0205", "two instances in one `let` cannot share its name",
                            instances[1].span, "second instance",
                            (Label(instances[0].span, "first instance"),), frame=scope.frame,
                            help=("split them into separate `let`s, one instance each",))
            return ERROR
        if rhs.repeat is not None:
            return self.repeat(rhs, scope, hint, let_name)
        if instances:
            name = rhs.instance.value if rhs.instance is not None else let_name
            if not self.valid_path(name, rhs.instance.span if rhs.instance else rhs.span, scope):
                return ERROR
            self.ctx.pending_instance = (name, rhs.instance.span if rhs.instance else rhs.span)
        try:
            return self.exprs.eval(rhs.expr, scope, hint)
        finally:
            self.ctx.pending_instance = None

    def valid_path(self, name: str, span: Span, scope: Scope) -> bool:
        parts = name.split(".")
        if not name or any(not p or not all(c.isalnum() or c in "_-" for c in p) for p in parts):
            self.ctx.report("E0208", f'invalid instance path "{name}"', span,
                            "use names and numbers separated by `.`", frame=scope.frame,
                            help=('for example `as "layer1.0"`',))
            return False
        return True

    def repeat(self, rhs: ast.Rhs, scope: Scope, hint: str, let_name: str) -> Any:
        assert rhs.repeat is not None
        count = self.exprs.want_dim(rhs.repeat, scope, "a repeat count")
        if count is ERROR:
            return ERROR
        if not is_int(count) or not 1 <= count <= MAX_REPEAT:
            self.ctx.report("E0305", f"the repeat count must be a static int in 1..{MAX_REPEAT}",
                            rhs.repeat.span, f"{kind_of(count) if not is_int(count) else count}",
                            frame=scope.frame)
            return ERROR
        call = rhs.expr
        if not isinstance(call, ast.Call) or not call.args or isinstance(call.args[0], ast.Kwarg):
            self.ctx.report("E0204", "`repeat` applies a call whose first argument is the value "
                            "passed from one instance to the next", rhs.expr.span,
                            "not such a call", frame=scope.frame,
                            help=("write `repeat K f(x, ...)`",))
            return ERROR
        template = rhs.instance.value if rhs.instance is not None else f"{let_name}.{{i}}"
        paths = self.repeat_paths(template, count, rhs, scope)
        if paths is None:
            return ERROR
        callee = self.ctx.resolved.namespaces[scope.module.path].lookup(call.func)
        if isinstance(callee, DefRef):
            est = estimate(self.ctx.resolved, callee, self.ctx.resolved.estimates)
            self.ctx.expansion_limit(count * est.ops, rhs.span, scope.frame, "this `repeat`",
                                     callee)
        # The leading positional arguments, evaluated once. An instance that returns n values
        # passes them on as the next instance's first n (`repeat K f(x, ...)` carries one).
        leading = [a for a in itertools.takewhile(lambda a: not isinstance(a, ast.Kwarg),
                                                  call.args) if not isinstance(a, ast.Kwarg)]
        given = [(self.exprs.eval(a, scope, hint), a.span) for a in leading]
        if any(v is ERROR for v, _ in given):
            return ERROR
        rest = ast.Call(call.span, call.func, call.args[len(leading):])
        carried = given
        start = len(self.ctx.nodes)
        current: Any = ERROR
        for i in range(count):
            if i == 1:  # instances are alike: the first one tells what the others will cost
                self.ctx.expansion_limit((count - 1) * (len(self.ctx.nodes) - start), rhs.span,
                                         scope.frame, "this `repeat`", None)
            self.ctx.pending_instance = (paths[i], rhs.span)
            try:
                current = self.call_with(rest, carried, scope, f"{hint}.{i}")
            finally:
                self.ctx.pending_instance = None
            if current is ERROR:
                return ERROR
            passed = list(current.items) if isinstance(current, TupleVal) else [current]
            if not self.repeat_carries(passed, given, call, scope):
                return ERROR
            carried = [(v, span) for v, (_, span) in zip(passed, given)] + given[len(passed):]
        return current

    def repeat_carries(self, passed: list[Any], given: list[Arg], call: ast.Call,
                       scope: Scope) -> bool:
        """E0303 unless an instance's results can stand for the arguments they replace: as many
        as there are leading positional arguments at most, each of the type it replaces."""
        if len(passed) > len(given):
            self.ctx.report("E0303", f"this `repeat` passes {len(passed)} values on, but its call "
                            f"has {len(given)} positional argument{'s' if len(given) != 1 else ''}"
                            " to take them", call.span, f"returns {len(passed)} values",
                            notes=("an instance's results are the next instance's first "
                                   "positional arguments",),
                            help=("give the first instance a value for each result",),
                            frame=scope.frame)
            return False
        for value, (arg, span) in zip(passed, given):
            if _carried_type(value) != _carried_type(arg):
                what = format_type(value.type) if isinstance(value, TensorVal) else kind_of(value)
                took = format_type(arg.type) if isinstance(arg, TensorVal) else kind_of(arg)
                self.ctx.report("E0303", "the body of this `repeat` changes the type it passes on",
                                call.span, f"returns {what}", (Label(span, f"takes {took}"),),
                                notes=("each instance's results are the next instance's first "
                                       "arguments, so their types must be equal",),
                                help=("repeat only shape-preserving blocks; write the first, "
                                      "changing block separately",), frame=scope.frame)
                return False
        return True

    def repeat_paths(self, template: str, count: int, rhs: ast.Rhs, scope: Scope,
                     ) -> list[str] | None:
        import re

        span = rhs.instance.span if rhs.instance is not None else rhs.span
        holes = re.findall(r"\{([^}]*)\}", template)
        ok = len(holes) == 1 and re.fullmatch(r"\s*i\s*([+-]\s*\d+)?\s*", holes[0]) is not None
        if not ok:
            self.ctx.report("E0208", "a repeated instance path needs one `{i}` or `{i+c}`", span,
                            f'"{template}"', frame=scope.frame,
                            help=('for example `as "layer1.{i+1}"`',))
            return None
        offset = int(holes[0].replace(" ", "")[1:] or 0)
        paths = [re.sub(r"\{[^}]*\}", str(i + offset), template) for i in range(count)]
        if not all(self.valid_path(p, span, scope) for p in paths[:1]):
            return None
        return paths

    def call_with(self, rest: ast.Call, carried: list[Arg], scope: Scope, hint: str) -> Any:
        """A call whose first positional arguments are already evaluated (`repeat`)."""
        ns = self.ctx.resolved.namespaces[scope.module.path]
        callee = ns.lookup(rest.func)
        if callee is None:
            return ERROR
        args = self.calls.eval_args(rest, carried, scope, hint)
        if args is None:
            return ERROR
        pos, kws = args
        if isinstance(callee, str):
            return self.calls.apply_op(callee, rest.span, rest.func.span, pos, kws, scope, hint)
        return self.apply_def(callee, rest, pos, kws, scope, hint)

    def output(self, stmt: ast.Output, scope: Scope) -> None:
        name = stmt.name.name
        if stmt.rhs is not None:
            before = len(self.ctx.nodes)
            value = self.rhs(stmt.rhs, scope, name, name)
            fresh = isinstance(value, TensorVal) and self.node_index(value.node) >= before
        else:
            binding = scope.values.get(name)
            value = self.exprs.lookup(ast.Name(stmt.name.span, name), scope) if binding else ERROR
            fresh = False
        if value is ERROR:
            return
        if not isinstance(value, TensorVal):
            self.ctx.report("E0209", f"output `{name}` must be a tensor, found {kind_of(value)}",
                            stmt.span, frame=scope.frame)
            return
        # An output is a contract with the caller: row-major unless tagged (or the model's
        # `layout` for rank-4 tensors), whatever layout the value had inside the model.
        default_layout = self.model_layout if value.type.rank == 4 else None
        declared = stmt.type or ast.TensorTypeExpr(stmt.span, None, None, None)
        before_conform = len(self.ctx.nodes)
        # Undeclared, an output is stored in the model's io dtype, but an integer keeps its own
        # (integers and floats are never converted implicitly: ids past 2,048 do not survive
        # f16; a mask's 0 and 1 do).
        integer = value.type.dtype in INTS
        out = conform(self.calls, value, declared, scope, f"output `{name}`", fresh=fresh,
                      default_dtype=None if integer else scope.precision.io,
                      default_layout=default_layout or Layout.row_major(value.type.rank))
        if out is ERROR:
            return
        # Name after the output only a node this statement made: an existing value keeps its
        # name, which the ops that read it use (`output z = a` where `a` also feeds `b`).
        if fresh or self.node_index(out.node) >= before_conform:
            out = self.ctx.rename(out, name)
        self.ctx.used.add(out.node)
        self.ctx.used.add(value.node)
        self.outputs.append(IOSpec(name, out.type, out.node, stmt.span))
        if stmt.rhs is not None:
            self.bind(stmt.name, out, scope, "output")

    # -- the model -------------------------------------------------------------------------------
    def model(self, module: ast.Module, model: ast.Model) -> Scope:
        frame = Frame(None, model.name.name, None, "", "")
        scope = Scope(module, frame, f"model `{model.name.name}`",
                      self.ctx.precision_override or PrecisionSpec(), is_model=True)
        self.run_body(model.body, scope)
        if not self.outputs and self.ctx.bucket is None and self.ctx.sink.error_count == 0:
            self.ctx.report("E0704", f"model `{model.name.name}` has no output", model.name.span,
                            "nothing is computed", help=("declare one: `output y = ...`",))
        if self.ctx.bucket is None and self.ctx.sink.error_count == 0:  # after errors it would mislead
            self.warn_unused()
            self.dims_read_off_inputs()
            check_in_place(self.ctx, self.ctx.nodes, ((o.name, o.node) for o in self.outputs))
        return scope

    def dims_read_off_inputs(self) -> None:
        """E0606 for a dynamic dim no input's shape names: a run reads each dim's value off the
        shapes of the inputs it is given, and would have none for it (`arange(S)` alone)."""
        named = {sym for i in self.inputs for sym in _symbols(i.type.shape)}
        used = {sym for node in self.ctx.nodes for v in (*node.type.shape, *node.attrs.values())
                for sym in _symbols(v)}
        for d in self.dims:
            if d.dynamic and d.name in used and d.name not in named:
                self.ctx.report(
                    "E0606", f"the dynamic dim `{d.name}` is the size of no input's axis", d.span,
                    "a run could not know its value",
                    notes=("a run reads every dynamic dim off the shapes of the inputs it is "
                           "given",),
                    help=(f"give an input of that size (`input positions: i64[{d.name}]`), or "
                          f"make the dim static (`dim {d.name} = {d.hi}`)",))

    def warn_unused(self) -> None:
        """W0201 for a `let` whose value no op or output reads, in every instance of its def."""
        used = set(self.ctx.used)
        for node in self.ctx.nodes:
            used.update(node.inputs)
            if node.op in IN_PLACE:  # its effect is the caller's buffer, read here or not
                used.add(node.name)
        by_statement: dict[Span, tuple[str, bool]] = {}
        for node_name, let_name, span in self.lets:
            _, seen = by_statement.get(span, (let_name, False))
            by_statement[span] = (let_name, seen or node_name in used)
        for span, (let_name, seen) in by_statement.items():
            if not seen:
                self.ctx.report("W0201", f"the value `{let_name}` is never used", span,
                                "computed here but not used",
                                help=(f"use it, or remove it (a model can export it with `output "
                                      f"{let_name}`)",))


def _carried_type(v: Any) -> Any:
    """What must stay the same from one `repeat` instance to the next: a tensor's shape and
    dtype (its layout may change), another value's kind."""
    return (v.type.shape, v.type.dtype) if isinstance(v, TensorVal) else kind_of(v)


def _symbols(v: Any) -> set[str]:
    """The dims a shape entry or an attribute value names (tuples searched)."""
    if isinstance(v, dims.Poly):
        return set(v.symbols())
    if isinstance(v, tuple):
        return {s for x in v for s in _symbols(x)}
    return set()


def model_metadata(el: Elaborator, model: ast.Model, scope: Scope) -> dict[str, Any]:
    """The model's `(key=value, ...)` arguments: compile-time values, kept in the bundle."""
    out: dict[str, Any] = {}
    for a in model.args:
        if not isinstance(a, ast.Kwarg):
            el.ctx.report("E0204", "model arguments are metadata written `key=value`", a.span)
            continue
        v = el.exprs.eval(a.value, scope)
        if isinstance(v, (str, int, float, bool)) and not isinstance(v, dims.Poly):
            out[a.name.name] = v
        elif isinstance(v, ListVal) and all(isinstance(x, (str, int, float)) for x in v.items):
            out[a.name.name] = list(v.items)
        elif v is not ERROR:
            el.ctx.report("E0209", f"model metadata must be a string, number or bool, found "
                          f"{kind_of(v)}", a.value.span)
    return out


__all__ = ["DimDecl", "Elaborator", "IOSpec", "is_dim", "model_metadata"]
