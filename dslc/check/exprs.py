"""Expression evaluation: compile-time arithmetic on dims and scalars, and tensor expressions,
which become op nodes (`a + b` is the `add` op, `x[0:4]` the `slice` op)."""

from __future__ import annotations

import operator
from fractions import Fraction
from typing import Any, Protocol

from dslc.check.context import Context, is_dim, is_int
from dslc.check.values import (
    ERROR,
    Absent,
    Binding,
    DType,
    ListVal,
    Scope,
    TensorVal,
    TupleVal,
    kind_of,
    show,
)
from dslc.core import dims
from dslc.core.types import TensorType
from dslc.diag.diagnostic import Label
from dslc.diag.span import Span
from dslc.ops.pointwise import OPERATOR_OPS
from dslc.parse import ast

_PY_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
               "==": operator.eq, "!=": operator.ne}
MAX_NESTING = 200  # levels of calls, brackets and def bodies (LANGUAGE.md, "Limits")
MAX_INT = 2**63 - 1  # compile-time integers are int64, as cuDNN's sizes and attributes


class Calls(Protocol):
    """What expressions need of the call layer (`dslc.check.calls.CallEval`)."""

    def call(self, call: ast.Call, scope: Scope, hint: str) -> Any: ...

    def apply_op(self, name: str, call_span: Span, func_span: Span,
                 pos: list[tuple[Any, Span]], kws: dict[str, tuple[Any, Span]], scope: Scope,
                 hint: str, final: str | None = None) -> Any: ...


class ExprEval:
    """Expressions: names, literals, operators, conditions, indexing and shapes, evaluated in the
    checker's state (`ctx`); calls go to the call layer (`calls`, set by the elaborator)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.calls: Calls

    def final_name(self, expr: ast.Expr) -> str | None:
        """The name for the node `expr` makes, when it is a `let`'s whole expression."""
        naming = self.ctx.naming
        return naming[1] if naming is not None and naming[0] is expr else None

    def lookup(self, name: ast.Name, scope: Scope) -> Any:
        binding = scope.values.get(name.name)
        if binding is None:
            return ERROR  # reported by name resolution
        value = binding.value
        if isinstance(value, TensorVal):
            self.ctx.used.add(value.node)
        if isinstance(value, Absent):
            self.ctx.report("E0207", f"`{name.name}` does not exist here: its `when` condition is "
                            "false", name.span, "used here", (Label(value.guard, "false here"),),
                            help=("choose the value with `a if cond else b`, with the same condition",),
                            frame=scope.frame)
            return ERROR
        return value

    def eval(self, expr: ast.Expr, scope: Scope, hint: str = "") -> Any:
        """The value of `expr`. Nesting is bounded (MAX_NESTING), so the recursion through
        calls, brackets and defs stays within Python's stack; chains of operators and signs are
        walked in loops and count one level."""
        depth = self.ctx.depth = self.ctx.depth + 1
        if depth > MAX_NESTING:
            value = self.nested_too_deeply(expr, scope)
        else:
            value = self.eval_at(expr, scope, hint)
        self.ctx.depth = depth - 1  # an exception ends the whole elaboration: no `finally` needed
        return value

    def nested_too_deeply(self, expr: ast.Expr, scope: Scope) -> Any:
        if not self.ctx.too_deep:
            self.ctx.too_deep = True
            self.ctx.report("E0705", f"nested more than {MAX_NESTING} levels deep", expr.span,
                            "too deep here", frame=scope.frame,
                            notes=("each call, bracket, conditional and def instance around a value "
                                   "is a level; a chain like `a + b + c` or `- - x` is one",),
                            help=("bind inner results with `let` and use their names",))
        return ERROR

    def eval_at(self, expr: ast.Expr, scope: Scope, hint: str) -> Any:
        match expr:  # the common cases first: each case is an isinstance test
            case ast.Name():
                return self.lookup(expr, scope)
            case ast.Call():
                return self.calls.call(expr, scope, hint)
            case ast.Binary():
                return self.binary(expr, scope, hint)
            case ast.Int(value=v):
                return v
            case ast.Float(value=v):
                return v
            case ast.Str(value=v):
                return v
            case ast.Bool(value=v):
                return v
            case ast.DtypeLit(name=n):
                return DType(n)
            case ast.ListExpr(items=items):
                values = []
                for item in items:  # a loop, not tuple(<generator>): no C frame per level
                    values.append(self.eval(item, scope, hint))
                return ERROR if any(v is ERROR for v in values) else ListVal(tuple(values))
            case ast.Logic():
                return self.logic(expr, scope)
            case ast.Not():
                return self.negate_bools(expr, scope)
            case ast.Neg():
                return self.negate(expr, scope, hint)
            case ast.Cond():
                return self.cond(expr, scope, hint)
            case ast.Index():
                return self.index(expr, scope, hint)
            case ast.Member() if (dotted := ast.dotted_name(expr)) is not None and (
                    dotted in scope.values or dotted.split(".")[0] not in scope.values):
                return self.lookup(ast.Name(expr.span, dotted), scope)  # a dotted param
            case ast.Member():
                self.ctx.report("E0209", "a namespace member can only be called", expr.span,
                                "not a value", help=(f"call it: `{_text(expr)}(...)`",),
                                frame=scope.frame)
                return ERROR
        return ERROR

    # -- compile-time checks of kind -------------------------------------------------------------
    def want_bool(self, expr: ast.Expr, scope: Scope) -> Any:
        v = self.eval(expr, scope)
        if v is ERROR or isinstance(v, bool):
            return v
        self.ctx.report("E0209", f"expected a compile-time bool, found {kind_of(v)}", expr.span,
                        f"this is {kind_of(v)}", frame=scope.frame,
                        notes=("conditions are decided at compile time",))
        return ERROR

    def want_dim(self, expr: ast.Expr, scope: Scope, what: str = "a dim") -> Any:
        v = self.eval(expr, scope)
        if v is ERROR or is_dim(v):
            return v
        self.ctx.report("E0209", f"expected {what}, found {kind_of(v)}", expr.span,
                        f"this is {kind_of(v)}", frame=scope.frame)
        return ERROR

    # -- operators -------------------------------------------------------------------------------
    # Operator chains are left-nested (`a + b + c` is `(a + b) + c`) and sign chains right-nested;
    # both are walked in loops, so a sum of a thousand terms takes no more stack than one.
    def cond(self, expr: ast.Cond, scope: Scope, hint: str) -> Any:
        chosen: ast.Expr = expr
        while isinstance(chosen, ast.Cond):  # `a if c else b if d else e`
            t = self.want_bool(chosen.test, scope)
            if t is ERROR:
                return ERROR
            chosen = chosen.then if t else chosen.orelse
        return self.eval(chosen, scope, hint)

    def logic(self, expr: ast.Logic, scope: Scope) -> Any:
        chain: list[ast.Logic] = []
        first: ast.Expr = expr
        while isinstance(first, ast.Logic):
            chain.append(first)
            first = first.left
        value = self.want_bool(first, scope)
        for node in reversed(chain):
            if value is ERROR:
                return ERROR
            if (node.op == "and" and not value) or (node.op == "or" and value):
                continue  # short-circuit: the right operand is not evaluated
            value = self.want_bool(node.right, scope)
        return value

    def negate_bools(self, expr: ast.Not, scope: Scope) -> Any:
        flips = 0
        inner: ast.Expr = expr
        while isinstance(inner, ast.Not):
            flips += 1
            inner = inner.operand
        v = self.want_bool(inner, scope)
        return ERROR if v is ERROR else bool(v) != (flips % 2 == 1)

    def negate(self, expr: ast.Neg, scope: Scope, hint: str) -> Any:
        chain: list[ast.Neg] = []
        inner: ast.Expr = expr
        while isinstance(inner, ast.Neg):
            chain.append(inner)
            inner = inner.operand
        v = self.eval(inner, scope, hint)
        for node in reversed(chain):
            v = self.negate_value(node, v, scope, hint)
        return v

    def negate_value(self, expr: ast.Neg, v: Any, scope: Scope, hint: str) -> Any:
        operand = expr.operand
        if v is ERROR:
            return ERROR
        if isinstance(v, TensorVal):
            return self.calls.apply_op("neg", expr.span, expr.span, [(v, operand.span)], {}, scope, hint)
        if is_dim(v):
            return dims.neg(v)
        if isinstance(v, float):
            return -v
        self.ctx.report("E0209", f"cannot negate {kind_of(v)}", operand.span, f"this is {kind_of(v)}",
                        frame=scope.frame)
        return ERROR

    def binary(self, expr: ast.Binary, scope: Scope, hint: str) -> Any:
        chain: list[ast.Binary] = []
        first: ast.Expr = expr
        while isinstance(first, ast.Binary):
            chain.append(first)
            first = first.left
        a = self.eval(first, scope, hint)
        for node in reversed(chain):
            b = self.eval(node.right, scope, hint)
            a = ERROR if a is ERROR or b is ERROR else self.combine(node, a, b, scope, hint)
        return a

    def combine(self, expr: ast.Binary, a: Any, b: Any, scope: Scope, hint: str) -> Any:
        if expr.op == "//":
            return self.floor_divide(expr, a, b, scope)
        if isinstance(a, TensorVal) or isinstance(b, TensorVal):
            op = OPERATOR_OPS[expr.op]
            return self.calls.apply_op(op, expr.span, expr.op_span,
                                       [(a, expr.left.span), (b, expr.right.span)], {}, scope, hint,
                                       self.final_name(expr))
        if expr.op in _PY_COMPARE:
            return self.compare_scalars(expr, a, b, scope)
        return self.arith(expr, a, b, scope)

    def compare_scalars(self, expr: ast.Binary, a: Any, b: Any, scope: Scope) -> Any:
        if is_dim(a) and is_dim(b):
            result = dims.compare(a, b, expr.op, self.ctx.env)
            if result is None:
                syms = sorted((a.symbols() if isinstance(a, dims.Poly) else set())
                              | (b.symbols() if isinstance(b, dims.Poly) else set()))
                self.ctx.report("E0604", "this condition depends on a dynamic dim", expr.span,
                                f"true for some values of {', '.join(f'`{s}`' for s in syms)} and "
                                "false for others", frame=scope.frame,
                                notes=("conditions are decided once, at compile time",),
                                help=("make the dim static, or narrow its range so the condition "
                                      "holds for all of it",))
                return ERROR
            return result
        numeric = (int, float)
        same = (isinstance(a, numeric) and isinstance(b, numeric) and not isinstance(a, bool)
                and not isinstance(b, bool)) or type(a) is type(b)
        if not same or (expr.op not in ("==", "!=") and not isinstance(a, numeric)):
            self.ctx.report("E0209", f"cannot compare {kind_of(a)} with {kind_of(b)} using "
                            f"`{expr.op}`", expr.op_span, frame=scope.frame)
            return ERROR
        return bool(_PY_COMPARE[expr.op](a, b))

    def arith(self, expr: ast.Binary, a: Any, b: Any, scope: Scope) -> Any:
        if is_dim(a) and is_dim(b):
            if expr.op == "+":
                return self.int64(dims.add(a, b), expr, scope)
            if expr.op == "-":
                return self.int64(dims.sub(a, b), expr, scope)
            if expr.op == "*":
                return self.int64(dims.mul(a, b), expr, scope)
            return self.divide(expr, a, b, scope)
        numbers = (int, float)
        if (isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool)
                and not isinstance(b, bool)):
            if expr.op == "/" and b == 0:
                self.ctx.report("E0305", "division by zero", expr.right.span, frame=scope.frame)
                return ERROR
            result = {"+": operator.add, "-": operator.sub, "*": operator.mul,
                      "/": operator.truediv}[expr.op](float(a), float(b))
            return result
        return self.cannot_combine(expr, a, b, scope)

    def cannot_combine(self, expr: ast.Binary, a: Any, b: Any, scope: Scope,
                       notes: tuple[str, ...] = ()) -> Any:
        """E0209 at the operator, each operand labelled with its kind."""
        self.ctx.report("E0209", f"`{expr.op}` cannot combine {kind_of(a)} and {kind_of(b)}",
                        expr.op_span, labels=(Label(expr.left.span, kind_of(a)),
                                              Label(expr.right.span, kind_of(b))),
                        frame=scope.frame, notes=notes)
        return ERROR

    def int64(self, value: Any, expr: ast.Binary, scope: Scope) -> Any:
        """`value` if it fits in int64 for every admissible value of its dims, else E0306."""
        lo, hi = ((Fraction(value), Fraction(value)) if isinstance(value, int)
                  else dims.interval(value, self.ctx.env))
        if abs(lo) <= MAX_INT and abs(hi) <= MAX_INT:
            return value
        text = self.ctx.program.sources.snippet(expr.span) or _text(expr)
        self.ctx.report("E0306", f"`{text}` overflows 64 bits", expr.span,
                        f"{'is' if lo == hi else 'can reach'} about {float(max(-lo, hi)):.3g}",
                        frame=scope.frame,
                        notes=(f"sizes and other compile-time integers are int64, at most {MAX_INT}, "
                               "as cuDNN takes them",))
        return ERROR

    def floor_divide(self, expr: ast.Binary, a: Any, b: Any, scope: Scope) -> Any:
        """`a // b`: floor division of dims and integers by a positive integer (`pad = k // 2`);
        a symbolic dim's floor is a dim of its own, bounded by the dim's range."""
        if not (is_dim(a) and isinstance(b, int) and not isinstance(b, bool)):
            return self.cannot_combine(expr, a, b, scope, notes=(
                "`//` divides dims and integers by a positive integer; tensors and floats use "
                "`/`",))
        if b <= 0:
            self.ctx.report("E0305", "`//` needs a positive divisor", expr.right.span,
                            frame=scope.frame)
            return ERROR
        return dims.floordiv(a, b, self.ctx.env)

    def divide(self, expr: ast.Binary, a: Any, b: Any, scope: Scope) -> Any:
        if b == 0:
            self.ctx.report("E0305", "division by zero", expr.right.span, frame=scope.frame)
            return ERROR
        q = dims.div_exact(a, b, self.ctx.env)
        if q is not None:
            return q
        text = self.ctx.program.sources.snippet(expr.span) or _text(expr)
        if isinstance(a, int) and isinstance(b, int):
            near = sorted((d for d in range(1, a + 1) if a % d == 0 and b > 0),
                          key=lambda d: (abs(d - b), d))[:2] if 0 < a <= 10**6 else []
            helps = [f"divisors of {a} near {b}: {', '.join(map(str, sorted(near)))}"] if near \
                else []
            helps.append(f"for a fraction, use floats: `{a}.0 / {b}`")
            self.ctx.report("E0602", f"`{text}` is not exact: {a} is not a multiple of {b}",
                            expr.span, "not an integer", frame=scope.frame,
                            notes=("`/` on dims and ints must divide exactly",), help=tuple(helps))
            return ERROR
        syms = sorted(a.symbols() if isinstance(a, dims.Poly) else set())
        ranges = [self.ctx.env.syms[s] for s in syms if s in self.ctx.env.syms]
        where = ", ".join(f"`{r.name}` in {r.lo}..{r.hi}" for r in ranges)
        labels = []
        helps = []
        for r in ranges:
            decl = self.ctx.dim_decls.get(r.name)
            need = _needed_align(a, b, r.name, r.align)
            if decl is not None:
                labels.append(Label(decl, f"`{r.name}` may not be a multiple of {need}"
                                    if need and need != 2 else f"`{r.name}` may be odd"))
            if need:
                helps.append(f"constrain the dim: `dim {r.name} = {r.lo}..{r.hi} align {need}`")
        self.ctx.report("E0602", f"`{text}` is not exact for every {where or 'admissible value'}",
                        expr.span, "not provably an integer", tuple(labels), frame=scope.frame,
                        notes=("`/` on dims must divide exactly for every value in the dim's range",),
                        help=tuple(helps[:1]))
        return ERROR

    dim_decls: dict[str, Span]

    # -- indexing --------------------------------------------------------------------------------
    def index(self, expr: ast.Index, scope: Scope, hint: str) -> Any:
        target = self.eval(expr.target, scope, hint)
        if target is ERROR:
            return ERROR
        if not isinstance(target, TensorVal):
            self.ctx.report("E0209", f"only tensors can be sliced, not {kind_of(target)}",
                            expr.target.span, frame=scope.frame)
            return ERROR
        starts: list[Any] = []
        ends: list[Any] = []
        drop: list[int] = []
        for axis, item in enumerate(expr.items):
            if isinstance(item, ast.Range):
                lo = self.want_dim(item.lo, scope, "a compile-time bound") if item.lo else None
                hi = self.want_dim(item.hi, scope, "a compile-time bound") if item.hi else None
                if lo is ERROR or hi is ERROR:
                    return ERROR
                starts.append(lo)
                ends.append(hi)
            else:
                at = self.want_dim(item, scope, "a compile-time index")
                if at is ERROR:
                    return ERROR
                starts.append(at)
                ends.append(dims.add(at, 1) if not (is_int(at) and at == -1) else None)
                drop.append(axis)
        items = expr.items[0].span.to(expr.items[-1].span)
        sliced = self.calls.apply_op("slice", expr.span, expr.span, [(target, expr.target.span)],
                                     {"starts": (ListVal(tuple(starts)), items),
                                      "ends": (ListVal(tuple(ends)), items)}, scope, hint)
        if not drop or not isinstance(sliced, TensorVal):
            return sliced
        shape = tuple(d for i, d in enumerate(sliced.type.shape) if i not in drop)
        return self.calls.apply_op("reshape", expr.span, expr.span, [(sliced, expr.span)],
                                   {"shape": (ListVal(shape), expr.span)}, scope, hint)

    # -- types -----------------------------------------------------------------------------------
    def eval_shape(self, t: ast.TensorTypeExpr, scope: Scope) -> tuple[Any, ...] | None:
        """The dims of a declared type (no patterns: every name must be bound)."""
        out: list[Any] = []
        ok = True
        for d in t.dims or ():
            if isinstance(d, ast.Variadic):
                v = self.lookup(ast.Name(d.span, d.name), scope)
                if isinstance(v, ListVal) and all(is_dim(x) for x in v.items):
                    out.extend(v.items)
                    continue
                if v is not ERROR:
                    self.ctx.report("E0209", f"`*{d.name}` must name a list of dims", d.span,
                                    frame=scope.frame)
                ok = False
                continue
            v = self.want_dim(d, scope)
            ok = ok and v is not ERROR
            out.append(v)
        return tuple(out) if ok else None


def _text(expr: ast.Expr, depth: int = 0) -> str:
    """An expression back in source syntax (for messages; elided past a few levels)."""
    if depth > 8:
        return "..."
    match expr:
        case ast.Name(name=n):
            return n
        case ast.Int(value=v):
            return str(v)
        case ast.Float(value=v):
            return repr(v)
        case ast.Binary(op=op, left=a, right=b):
            return f"{_text(a, depth + 1)} {op} {_text(b, depth + 1)}"
        case ast.Member(target=t, name=n):
            return f"{_text(t, depth + 1)}.{n.name}"
        case ast.Call(func=f):
            return f"{_text(f, depth + 1)}(...)"
    return "..."


def _needed_align(a: Any, b: Any, name: str, align: int) -> int | None:
    """The alignment of `name` that makes `a / b` exact, when b is an int and a is linear in it."""
    if not (isinstance(b, int) and isinstance(a, dims.Poly)):
        return None
    for mono, c in a.terms:
        if mono == ((name, 1),):
            need = (Fraction(c) / b).denominator
            from math import lcm

            return lcm(align, need)
    return None


__all__ = ["Binding", "ExprEval", "TensorType", "TupleVal", "show"]
