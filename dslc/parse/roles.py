"""What each token of a parsed file is, for the formatter (`parse.fmt`), read off the syntax tree
(AST + tokens -> `Roles`): a `-` is a sign or a minus, a `(` opens a call or a group, an `=`
belongs to a keyword argument or to a statement. Tokens are those `parse.lalr` read, indexed in
source order; a token is found by where it starts, as the tree's spans say.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from dslc.diag.span import Span
from dslc.parse import ast
from dslc.parse.lalr import Tok

# What a unit is: a run of tokens that starts a line of its own.
TOP, DECL, STMT, CLOSE = "top", "decl", "stmt", "close"


@dataclass(frozen=True, slots=True)
class Unit:
    kind: str  # TOP (the version line, an import), DECL (a def's or model's header), STMT, CLOSE
    depth: int  # 0 at file level, 1 inside a def or model


@dataclass
class Roles:
    units: dict[int, Unit] = field(default_factory=dict)  # the first token of each unit
    tight_before: set[int] = field(default_factory=set)  # a call's `(`, an index's `[`, `f16[`
    tight_after: set[int] = field(default_factory=set)  # a sign, a variadic `*`
    binary: set[int] = field(default_factory=set)  # operators between two operands
    keyword_eq: set[int] = field(default_factory=set)  # `out=64`: written without spaces
    slice_colon: set[int] = field(default_factory=set)  # `x[1:3]`, as against `x: [N]`
    lets: dict[int, tuple[int, int]] = field(default_factory=dict)  # see `_let`


class _Finder:
    def __init__(self, tokens: list[Tok]) -> None:
        self.starts = [(t[2], t[3]) for t in tokens]
        self.index = {p: i for i, p in enumerate(self.starts)}
        self.tokens = tokens

    def at(self, line: int, col: int) -> int:
        return self.index[(line, col)]

    def start(self, span: Span) -> int:
        return self.index[(span.line, span.col)]

    def after(self, span: Span, text: str) -> int:
        """The first token `text` at or after the end of `span` (parentheses may come between)."""
        i = bisect_left(self.starts, (span.end_line, span.end_col))
        while self.tokens[i][1] != text:
            i += 1
        return i


def roles(module: ast.Module, tokens: list[Tok]) -> Roles:
    """The roles of `tokens`, the tokens `module` was parsed from."""
    out = Roles()
    find = _Finder(tokens)
    if module.version is not None:
        out.units[find.start(module.version[0])] = Unit(TOP, 0)
    for imp in module.imports:
        out.units[find.start(imp.span)] = Unit(TOP, 0)
    decls: list[ast.Def | ast.Model] = [*module.defs, *module.models]
    for decl in decls:
        _decl(decl, find, out)
    return out


def _decl(decl: ast.Def | ast.Model, find: _Finder, out: Roles) -> None:
    out.units[find.start(decl.span)] = Unit(DECL, 0)
    name = find.start(decl.name.span)
    if find.tokens[name + 1][1] == "(":  # `def f(`, `model m(`
        out.tight_before.add(name + 1)
    close = find.at(decl.span.end_line, decl.span.end_col - 1)
    out.units[close] = Unit(CLOSE, 0)
    if isinstance(decl, ast.Def):
        for p in decl.params:
            _type(p.type, find, out)
            if p.default is not None:
                _expr(p.default, find, out)
        for t in decl.ret or ():
            _type(t, find, out)
    else:
        for a in decl.args:
            _expr(a, find, out)
    for stmt in decl.body:
        out.units[find.start(stmt.span)] = Unit(STMT, 1)
        _stmt(stmt, find, out)


def _stmt(stmt: ast.Stmt, find: _Finder, out: Roles) -> None:
    if isinstance(stmt, ast.Precision):  # `io=f16`: keyword arguments
        for k in stmt.settings:
            _expr(k, find, out)
        return
    if isinstance(stmt, ast.Let):
        _let(stmt, find, out)
        _type(stmt.type, find, out)
    elif isinstance(stmt, ast.Input | ast.ParamStmt | ast.Output):
        _type(stmt.type, find, out)
    for e in ast.stmt_exprs(stmt):
        _expr(e, find, out)


def _let(stmt: ast.Let, find: _Finder, out: Roles) -> None:
    """`let NAME = ...` (one name, no type): its `=` is aligned with its neighbours'. Kept as
    the statement's first token -> (the `=`, the length of the name)."""
    if stmt.is_tuple or stmt.type is not None:
        return
    name = find.start(stmt.targets[0].span)
    out.lets[find.start(stmt.span)] = (name + 1, len(stmt.targets[0].name))


def _type(t: ast.TensorTypeExpr | ast.ScalarTypeExpr | None, find: _Finder, out: Roles) -> None:
    if not isinstance(t, ast.TensorTypeExpr) or t.dims is None:
        return
    if t.dtype is not None:  # `f16[N]`: the bracket hugs the dtype
        out.tight_before.add(find.start(t.span) + 1)
    for d in t.dims:
        if isinstance(d, ast.Variadic):
            out.tight_after.add(find.start(d.span))
        else:
            _expr(d, find, out)


def _expr(root: ast.Expr | ast.Kwarg, find: _Finder, out: Roles) -> None:
    for e in ast.walk(root):
        if isinstance(e, ast.Neg):
            out.tight_after.add(find.start(e.span))
        elif isinstance(e, ast.Binary):
            out.binary.add(find.start(e.op_span))
        elif isinstance(e, ast.Logic):
            out.binary.add(find.after(e.left.span, e.op))
        elif isinstance(e, ast.Call):
            out.tight_before.add(find.after(e.func.span, "("))
        elif isinstance(e, ast.Index):
            out.tight_before.add(find.after(e.target.span, "["))
        elif isinstance(e, ast.Kwarg):
            out.keyword_eq.add(find.start(e.name.span) + 1)
        elif isinstance(e, ast.Range):
            colon = find.after(e.lo.span, ":") if e.lo is not None else find.start(e.span)
            out.slice_colon.add(colon)
