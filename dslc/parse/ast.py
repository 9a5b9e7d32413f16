"""The `.cgraph` syntax tree: frozen dataclasses, each with the `Span` it was parsed from.

Built by `parse.parser` and judged by `check`; nothing here validates anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dslc.diag.records import quick_init
from dslc.diag.span import Span


@quick_init
@dataclass(frozen=True, slots=True)
class Ident:
    span: Span
    name: str


# ---- expressions ---------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class Name:
    span: Span
    name: str


@quick_init
@dataclass(frozen=True, slots=True)
class Int:
    span: Span
    value: int


@quick_init
@dataclass(frozen=True, slots=True)
class Float:
    span: Span
    value: float


@quick_init
@dataclass(frozen=True, slots=True)
class Str:
    span: Span
    value: str


@quick_init
@dataclass(frozen=True, slots=True)
class Bool:
    span: Span
    value: bool


@quick_init
@dataclass(frozen=True, slots=True)
class DtypeLit:
    span: Span
    name: str


@quick_init
@dataclass(frozen=True, slots=True)
class ListExpr:
    span: Span
    items: tuple[Expr, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class Binary:
    """`+ - * /` and the comparisons; `op` is the operator's spelling."""

    span: Span
    op: str
    left: Expr
    right: Expr
    op_span: Span


@quick_init
@dataclass(frozen=True, slots=True)
class Logic:
    """`and` / `or` on compile-time booleans."""

    span: Span
    op: str
    left: Expr
    right: Expr


@quick_init
@dataclass(frozen=True, slots=True)
class Not:
    span: Span
    operand: Expr


@quick_init
@dataclass(frozen=True, slots=True)
class Neg:
    span: Span
    operand: Expr


@quick_init
@dataclass(frozen=True, slots=True)
class Cond:
    span: Span
    then: Expr
    test: Expr
    orelse: Expr


@quick_init
@dataclass(frozen=True, slots=True)
class Kwarg:
    span: Span
    name: Ident
    value: Expr


@quick_init
@dataclass(frozen=True, slots=True)
class Call:
    span: Span
    func: Expr  # a Name, or a Member for `ns.name`
    args: tuple[Expr | Kwarg, ...]  # in source order; checked for order after parsing


@quick_init
@dataclass(frozen=True, slots=True)
class Range:
    """`a:b` inside an index; either bound may be absent."""

    span: Span
    lo: Expr | None
    hi: Expr | None


@quick_init
@dataclass(frozen=True, slots=True)
class Index:
    span: Span
    target: Expr
    items: tuple[Expr | Range, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class Member:
    span: Span
    target: Expr
    name: Ident


Expr = (Name | Int | Float | Str | Bool | DtypeLit | ListExpr | Binary | Logic | Not | Neg | Cond | Call
        | Index | Member)


# ---- types ---------------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class Variadic:
    """`*L` in a shape pattern."""

    span: Span
    name: str


@quick_init
@dataclass(frozen=True, slots=True)
class TensorTypeExpr:
    """`f16[N, 64] @NHWC`. `dims` is None for a dtype-only ascription (`let h: bf16 = ...`)."""

    span: Span
    dtype: str | None
    dims: tuple[Expr | Variadic, ...] | None
    layout: Ident | None


@quick_init
@dataclass(frozen=True, slots=True)
class ScalarTypeExpr:
    span: Span
    name: str  # int, float, str, bool, dtype


# ---- statements ----------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class DimFixed:
    span: Span
    name: Ident
    value: Expr


@quick_init
@dataclass(frozen=True, slots=True)
class DimRange:
    span: Span
    name: Ident
    lo: Int
    hi: Int
    range_span: Span
    align: Int | None
    tune: tuple[Int, ...] | None


@quick_init
@dataclass(frozen=True, slots=True)
class Buckets:
    span: Span
    names: tuple[Ident, ...]
    rows: tuple[tuple[Span, tuple[Int, ...]], ...]


@quick_init
@dataclass(frozen=True, slots=True)
class Precision:
    span: Span
    settings: tuple[Kwarg, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class LayoutStmt:
    span: Span
    tag: Ident


@quick_init
@dataclass(frozen=True, slots=True)
class Input:
    span: Span
    name: Ident
    type: TensorTypeExpr


@quick_init
@dataclass(frozen=True, slots=True)
class ParamStmt:
    span: Span
    name: Ident
    type: TensorTypeExpr
    guard: Expr | None


@quick_init
@dataclass(frozen=True, slots=True)
class Rhs:
    span: Span
    repeat: Expr | None  # Int or Name
    expr: Expr
    instance: Str | None


@quick_init
@dataclass(frozen=True, slots=True)
class Let:
    span: Span
    targets: tuple[Ident, ...]
    is_tuple: bool
    type: TensorTypeExpr | None
    rhs: Rhs
    guard: Expr | None


@quick_init
@dataclass(frozen=True, slots=True)
class Output:
    span: Span
    name: Ident
    type: TensorTypeExpr | None
    rhs: Rhs | None


@quick_init
@dataclass(frozen=True, slots=True)
class Return:
    span: Span
    values: tuple[Expr, ...]


Stmt = DimFixed | DimRange | Buckets | Precision | LayoutStmt | Input | ParamStmt | Let | Output | Return


# ---- declarations --------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class Import:
    span: Span
    path: Str
    alias: Ident | None


@quick_init
@dataclass(frozen=True, slots=True)
class DefParam:
    span: Span
    name: Ident
    type: TensorTypeExpr | ScalarTypeExpr
    default: Expr | None


@quick_init
@dataclass(frozen=True, slots=True)
class Def:
    span: Span
    name: Ident
    params: tuple[DefParam, ...]
    ret: tuple[TensorTypeExpr, ...] | None
    body: tuple[Stmt, ...]
    doc: str
    header_span: Span  # `def name(...) -> type`, for labels that point at the signature


@quick_init
@dataclass(frozen=True, slots=True)
class Model:
    span: Span
    name: Ident
    args: tuple[Expr | Kwarg, ...]
    body: tuple[Stmt, ...]
    doc: str


@quick_init
@dataclass(frozen=True, slots=True)
class Module:
    """One parsed file. `file` is its display name; `path` the resolved path on disk."""

    file: str
    path: str
    version: tuple[Span, str] | None
    imports: tuple[Import, ...]
    defs: tuple[Def, ...]
    models: tuple[Model, ...]


_CHILDREN: dict[type, Any] = {
    ListExpr: lambda e: e.items,
    Binary: lambda e: (e.left, e.right),
    Logic: lambda e: (e.left, e.right),
    Not: lambda e: (e.operand,),
    Neg: lambda e: (e.operand,),
    Cond: lambda e: (e.then, e.test, e.orelse),
    Kwarg: lambda e: (e.value,),
    Call: lambda e: (e.func, *e.args),
    Range: lambda e: tuple(x for x in (e.lo, e.hi) if x is not None),
    Index: lambda e: (e.target, *e.items),
    Member: lambda e: (e.target,),
}


def children(expr: Expr | Range | Kwarg) -> tuple[Expr | Range | Kwarg, ...]:
    """The direct sub-expressions of `expr`, in source order."""
    get = _CHILDREN.get(type(expr))
    return get(expr) if get is not None else ()


def dotted_name(expr: Expr) -> str | None:
    """`a.b.c` written as names and members only (a dotted param's name), else None."""
    parts: list[str] = []
    while isinstance(expr, Member):
        parts.append(expr.name.name)
        expr = expr.target
    if not isinstance(expr, Name) or not parts:
        return None
    return ".".join([expr.name, *reversed(parts)])


def walk(expr: Expr | Range | Kwarg) -> list[Expr | Range | Kwarg]:
    """`expr` and all its sub-expressions, pre-order."""
    out: list[Expr | Range | Kwarg] = []
    stack = [expr]
    table = _CHILDREN
    while stack:
        e = stack.pop()
        out.append(e)
        get = table.get(type(e))
        if get is not None:
            stack.extend(reversed(get(e)))
    return out


def stmt_exprs(stmt: Stmt) -> list[Expr]:
    """The expressions written in a statement (types included), for walks over a body."""
    out: list[Expr] = []
    match stmt:  # `let` first: most statements are
        case Let(type=t, rhs=rhs):
            out.extend(type_exprs(t))
            out.extend(rhs_exprs(rhs))
        case DimFixed(value=v):
            out.append(v)
        case Precision(settings=kws):
            out.extend(k.value for k in kws)
        case Input(type=t) | ParamStmt(type=t):
            out.extend(type_exprs(t))
        case Output(type=t, rhs=rhs):
            out.extend(type_exprs(t))
            if rhs is not None:
                out.extend(rhs_exprs(rhs))
        case Return(values=vals):
            out.extend(vals)
    if isinstance(stmt, (ParamStmt, Let)) and stmt.guard is not None:
        out.append(stmt.guard)
    return out


def rhs_exprs(rhs: Rhs) -> list[Expr]:
    return ([rhs.repeat] if rhs.repeat is not None else []) + [rhs.expr]


def type_exprs(t: TensorTypeExpr | ScalarTypeExpr | None) -> list[Expr]:
    if not isinstance(t, TensorTypeExpr) or t.dims is None:
        return []
    return [d for d in t.dims if not isinstance(d, Variadic)]
