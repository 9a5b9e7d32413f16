"""Def instantiation: bind the arguments, unify the shape patterns left to right, elaborate the
body in the instance's frame, and check the declared result type. Also `conform`, which checks a
value against a written type (def results, `let` ascriptions, outputs) and inserts the cast or
layout copy an ascription asks for."""

from __future__ import annotations

from typing import Any

from dslc.check.calls import Arg, CallEval
from dslc.check.context import is_dim
from dslc.check.expansion import estimate
from dslc.check.exprs import MAX_NESTING
from dslc.check.resolve import DefRef, suggest
from dslc.check.values import ERROR, Binding, DType, ListVal, Scope, TensorVal, TupleVal, kind_of, show
from dslc.core import dims
from dslc.core.types import FAMILIES, FP8, Layout, TensorType, format_type
from dslc.diag.diagnostic import Label
from dslc.diag.span import Span
from dslc.ops.pointwise import SCALING_OPS
from dslc.parse import ast

DEF_LEVELS = 2  # nesting levels a def body adds (its frames: instantiate, run_body, stmt, let...)
_SCALAR_OK = {
    "int": lambda v: is_dim(v),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "dtype": lambda v: isinstance(v, DType),
}


def signature(d: ast.Def, sources: Any) -> str:
    return sources.snippet(d.header_span).rstrip(" {")


def instantiate(el: CallEval, ref: DefRef, call: ast.Call, pos: list[Arg], kws: dict[str, Arg],
                scope: Scope, hint: str) -> Any:
    d = ref.node
    name = d.name.name
    if ref.key in el.ctx.active_defs:
        return ERROR  # a call cycle: reported as E0701 by name resolution
    est = estimate(el.ctx.resolved, ref, el.ctx.resolved.estimates)
    el.ctx.expansion_limit(est.ops, call.span, scope.frame, "this call", ref)
    el.ctx.instances += 1
    tensors = [p for p in d.params if isinstance(p.type, ast.TensorTypeExpr)]
    scalars = [p for p in d.params if isinstance(p.type, ast.ScalarTypeExpr)]
    given = _bind(el, d, call, pos, kws, tensors, scope)
    if given is None:
        return ERROR
    inner = Scope(ref.module, scope.frame, f"def `{name}`", scope.precision,
                  dict(scope.precision_origin))
    for p in scalars:
        if p.name.name in given:
            value, span = given[p.name.name]
        else:
            assert p.default is not None
            value, span = el.exprs.eval(p.default, inner), p.default.span
            if value is ERROR:
                return ERROR
        assert isinstance(p.type, ast.ScalarTypeExpr)
        kind = p.type.name
        if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not _SCALAR_OK[kind](value):
            el.ctx.report("E0209", f"`{p.name.name}` of `{name}` is {_a(kind)}, found {kind_of(value)}",
                          span, f"this is {kind_of(value)}", (Label(p.span, "declared here"),),
                          frame=scope.frame)
            return ERROR
        inner.values[p.name.name] = Binding(value, p.span, "arg")
    args_text = ", ".join(f"{p.name.name}={show(inner.values[p.name.name].value)}" for p in scalars)
    inner.frame = el.frame_for(ref, call, scope, hint, args_text)
    for p in tensors:
        value, span = given[p.name.name]
        if not isinstance(value, TensorVal):
            el.ctx.report("E0209", f"`{p.name.name}` of `{name}` is a tensor, found {kind_of(value)}",
                          span, f"this is {kind_of(value)}", frame=scope.frame)
            return ERROR
        assert isinstance(p.type, ast.TensorTypeExpr)
        value = _match(el, p, value, span, inner, scope, name)
        if value is ERROR:
            return ERROR
        inner.values[p.name.name] = Binding(value, p.span, "arg")
    el.ctx.active_defs.append(ref.key)
    el.ctx.depth += DEF_LEVELS
    try:
        if el.ctx.depth > MAX_NESTING:
            result = el.exprs.nested_too_deeply(call, scope)
        else:
            result = el.bodies.run_body(d.body, inner)
    finally:
        el.ctx.depth -= DEF_LEVELS
        el.ctx.active_defs.pop()
    if result is None:
        el.ctx.report("E0704", f"def `{name}` has no `return`", d.name.span, "returns nothing",
                      help=("end the def with `return <value>`",))
        return ERROR
    if result is ERROR or d.ret is None:
        return result
    values = list(result.items) if isinstance(result, TupleVal) else [result]
    if len(values) != len(d.ret):
        el.ctx.report("E0301", f"`{name}` returns {len(values)} values but declares {len(d.ret)}",
                      d.ret[0].span, "declared here", frame=inner.frame)
        return ERROR
    checked = [conform(el, v, t, inner, f"the result of `{name}`") for v, t in zip(values, d.ret,
                                                                                 strict=True)]
    if any(c is ERROR for c in checked):
        return ERROR
    return TupleVal(tuple(checked)) if isinstance(result, TupleVal) else checked[0]


def _a(kind: str) -> str:
    return "an int" if kind == "int" else f"a {kind}"


def _bind(el: CallEval, d: ast.Def, call: ast.Call, pos: list[Arg], kws: dict[str, Arg],
          tensors: list[ast.DefParam], scope: Scope) -> dict[str, Arg] | None:
    name = d.name.name
    given: dict[str, Arg] = {}
    if len(pos) > len(tensors):
        extra = pos[len(tensors)]
        scalars = [p for p in d.params if isinstance(p.type, ast.ScalarTypeExpr)
                   and p.name.name not in kws]
        helps: tuple[str, ...] = ()
        if scalars:
            first = scalars[0].name.name
            helps = (f"pass it by keyword, e.g. `{first}={el.ctx.program.sources.snippet(extra[1])}`",)
        el.ctx.report("E0204", f"`{name}` takes {len(tensors)} tensor argument"
                      f"{'s' if len(tensors) != 1 else ''}; scalar arguments are passed by keyword",
                      extra[1], "unexpected positional argument",
                      notes=(f"signature: {signature(d, el.ctx.program.sources)}",),
                      help=helps, frame=scope.frame)
        return None
    for p, arg in zip(tensors, pos, strict=False):
        given[p.name.name] = arg
    names = [p.name.name for p in d.params]
    for key, arg in kws.items():
        if key not in names:
            hint = suggest(key, names)
            el.ctx.report("E0204", f"`{name}` has no parameter `{key}`", arg[1], "unknown keyword",
                          notes=(f"signature: {signature(d, el.ctx.program.sources)}",),
                          help=(f"did you mean `{hint}`?",) if hint else (), frame=scope.frame)
            return None
        if key in given:
            el.ctx.report("E0204", f"`{key}` is given twice to `{name}`", arg[1],
                          "given again by keyword", (Label(given[key][1], "given here"),),
                          frame=scope.frame)
            return None
        given[key] = arg
    missing = [p for p in d.params if p.name.name not in given
               and (isinstance(p.type, ast.TensorTypeExpr) or p.default is None)]
    if missing:
        n_given = sum(1 for p in tensors if p.name.name in given)
        if isinstance(missing[0].type, ast.TensorTypeExpr):
            message = (f"`{name}` takes {len(tensors)} tensor argument"
                       f"{'s' if len(tensors) != 1 else ''} but {n_given} "
                       f"{'was' if n_given == 1 else 'were'} supplied")
        else:
            message = f"`{name}` needs the argument `{missing[0].name.name}`"
        el.ctx.report("E0204", message, call.span,
                      "missing argument " + ", ".join(f"`{p.name.name}`" for p in missing),
                      notes=(f"signature: {signature(d, el.ctx.program.sources)}",), frame=scope.frame)
        return None
    return given


def _match(el: CallEval, p: ast.DefParam, value: TensorVal, span: Span, inner: Scope,
           caller: Scope, def_name: str) -> Any:
    """Unify a tensor argument with its parameter's pattern; binds the pattern's new names."""
    pattern = p.type
    assert isinstance(pattern, ast.TensorTypeExpr)
    t = value.type
    what = f"argument `{p.name.name}` of `{def_name}`"
    if pattern.dtype is not None and pattern.dtype != t.dtype:
        el.ctx.report("E0401", f"{what} must be {pattern.dtype}, found {t.dtype}", span,
                      format_type(t), (Label(pattern.span, f"declared {pattern.dtype}"),),
                      help=(f"convert it: `cast(..., {pattern.dtype})`",), frame=caller.frame)
        return ERROR
    items = list(pattern.dims or ())
    variadic = [i for i, x in enumerate(items) if isinstance(x, ast.Variadic)]
    if len(variadic) > 1:
        el.ctx.report("E0301", "a shape pattern may hold at most one `*` item", pattern.span,
                      "two here", frame=caller.frame)
        return ERROR
    fixed = len(items) - len(variadic)
    if (t.rank < fixed) if variadic else (t.rank != fixed):
        expected = f"at least {fixed}" if variadic else str(fixed)
        el.ctx.report("E0301", f"{what} must have rank {expected}, found rank {t.rank}", span,
                      format_type(t), (Label(pattern.span, "expected by this pattern"),),
                      frame=caller.frame)
        return ERROR
    cut = variadic[0] if variadic else len(items)
    tail = len(items) - cut - (1 if variadic else 0)
    pairs: list[tuple[ast.Expr | ast.Variadic, Any]] = list(zip(items[:cut], t.shape[:cut],
                                                                 strict=True))
    if variadic:
        v = items[cut]
        middle = ListVal(tuple(t.shape[cut:t.rank - tail]))
        pairs.append((v, middle))
        pairs.extend(zip(items[cut + 1:], t.shape[t.rank - tail:], strict=True))
    for axis, (item, actual) in enumerate(pairs):
        if isinstance(item, ast.Variadic) and item.name not in inner.values:
            inner.values[item.name] = Binding(actual, item.span, "shape")
            continue
        if isinstance(item, ast.Variadic):  # bound by an earlier parameter: the same axes
            bound = inner.values[item.name].value
            if bound != actual:
                found = ", ".join(dims.format_dim(d) for d in actual.items)
                shown = (f"[{', '.join(dims.format_dim(d) for d in bound.items)}]"
                         if isinstance(bound, ListVal) else kind_of(bound))
                el.ctx.report("E0301", f"{what} does not match its shape pattern", span,
                              format_type(t), (Label(item.span, f"expects {shown} here"),),
                              notes=(f"`*{item.name}` is {shown}, found [{found}]",),
                              frame=caller.frame)
                return ERROR
            continue
        if isinstance(item, ast.Name) and item.name not in inner.values:
            inner.values[item.name] = Binding(actual, item.span, "shape")
            continue
        expected = el.exprs.want_dim(item, inner)
        if expected is ERROR:
            return ERROR
        if expected != actual:
            el.ctx.report("E0301", f"{what} does not match its shape pattern", span, format_type(t),
                          (Label(item.span, f"expects {dims.format_dim(expected)} here"),),
                          notes=(f"axis {axis}: expected {dims.format_dim(expected)}, found "
                                 f"{dims.format_dim(actual)}",),
                          frame=caller.frame)
            return ERROR
    if pattern.layout is not None:
        return _relayout(el, value, pattern.layout, pattern.span, caller)
    return value


def layout_of(el: CallEval, tag: ast.Ident, rank: int, scope: Scope) -> Layout | None:
    """A layout tag checked against the rank (E0501)."""
    layout = Layout.from_tag(tag.name)
    if layout is None:
        el.ctx.report("E0501", f"unknown layout tag `@{tag.name}`", tag.span, "not a layout",
                      notes=("tags: NCHW/NHWC (also NCW/NWC, NCDHW/NDHWC), KCRS/KRSC for filters, "
                             "BHSD/BSHD for attention",),
                      help=(f"did you mean `@{suggest(tag.name, ['NCHW', 'NHWC', 'BHSD', 'BSHD'])}`?",)
                      if suggest(tag.name, ["NCHW", "NHWC", "BHSD", "BSHD"]) else (),
                      frame=scope.frame)
        return None
    if len(layout.order) != rank:
        fitting = sorted(t for t in FAMILIES if len(t) == rank)
        el.ctx.report("E0501", f"the layout `@{tag.name}` has rank {len(layout.order)}, but the "
                      f"tensor has rank {rank}", tag.span, "does not fit", frame=scope.frame,
                      help=(f"tags of rank {rank}: " + ", ".join(f"@{t}" for t in fitting),)
                      if fitting else (f"a rank-{rank} tensor takes no layout tag; leave it out",))
        return None
    return layout


def _relayout(el: CallEval, value: TensorVal, tag: ast.Ident, span: Span, scope: Scope) -> Any:
    layout = layout_of(el, tag, value.type.rank, scope)
    if layout is None:
        return ERROR
    if value.type.layout == layout:
        return value
    t = TensorType(value.type.dtype, value.type.shape, layout)
    return el.ctx.add_node("contiguous", (value.node,), {}, t, span, scope.frame, scope.precision,
                           f"{value.node}.{tag.name.lower()}")


def conform(el: CallEval, value: Any, t: ast.TensorTypeExpr, scope: Scope, what: str,
            fresh: bool = False, default_dtype: str | None = None,
            default_layout: Layout | None = None) -> Any:
    """Check `value` against the written type `t`. A different dtype or layout is a conversion:
    `fresh` values (made by this statement) are retyped, others get a cast or copy node."""
    if value is ERROR:
        return ERROR
    if not isinstance(value, TensorVal):
        el.ctx.report("E0209", f"{what} must be a tensor, found {kind_of(value)}", t.span,
                      frame=scope.frame)
        return ERROR
    if t.dims is not None:
        shape = el.exprs.eval_shape(t, scope)
        if shape is None:
            return ERROR
        if shape != value.type.shape:
            el.ctx.report("E0301", f"{what} has shape {format_type(value.type)}, not the declared "
                          f"{format_type(TensorType(value.type.dtype, shape))}", t.span,
                          f"declared {dims_text(shape)}", frame=scope.frame,
                          notes=(_first_difference(shape, value.type.shape),))
            return ERROR
    dtype = t.dtype or default_dtype or value.type.dtype
    layout = value.type.layout
    if t.layout is not None:
        layout = layout_of(el, t.layout, value.type.rank, scope)
        if layout is None:
            return ERROR
    elif default_layout is not None:
        layout = default_layout
    if dtype == value.type.dtype and layout == value.type.layout:
        return value
    new = TensorType(dtype, value.type.shape, layout)
    producer = el.ctx.producers[value.node].op
    if dtype in FP8 and value.type.dtype not in FP8 and producer not in SCALING_OPS:
        el.ctx.report("W0401", f"narrowing {value.type.dtype} to {dtype} without a scale", t.span,
                      "stored as fp8 here", frame=scope.frame,
                      help=("multiply by a scale first, e.g. `x * s`",))
    if fresh and (value.type.layout is None or layout == value.type.layout):
        return el.ctx.retype(value, new)
    if value.type.layout is None and dtype == value.type.dtype:
        # A free layout is dslc's to choose: choose the one asked for here, no copy needed.
        return el.ctx.retype(value, new)
    op = "cast" if dtype != value.type.dtype else "contiguous"
    return el.ctx.add_node(op, (value.node,), {"dtype": dtype} if op == "cast" else {}, new, t.span,
                           scope.frame, scope.precision, f"{value.node}.{op}")


def dims_text(shape: tuple[Any, ...]) -> str:
    return "[" + ", ".join(dims.format_dim(d) for d in shape) + "]"


def _first_difference(a: tuple[Any, ...], b: tuple[Any, ...]) -> str:
    if len(a) != len(b):
        return f"rank {len(a)} declared, rank {len(b)} found"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return f"axis {i}: {dims.format_dim(x)} declared, {dims.format_dim(y)} found"
    return "the shapes differ"
