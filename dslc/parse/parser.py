"""Parse one `.cgraph` text: LALR tables from Lark, run by `parse.lalr` -> frozen AST with spans
(source text -> `ast.Module`).

The builder below only builds nodes, one method per grammar rule or alias, each taking the rule's
children in source order (tokens included); it judges nothing but the limits of literals
(E0106). Syntax errors become E01xx diagnostics in `parse.syntax`; placement rules are checked
in `parse.structure`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from lark import UnexpectedInput

from dslc.diag.diagnostic import Diagnostic, Sink
from dslc.diag.span import Span
from dslc.parse import ast
from dslc.parse.grammar import tables
from dslc.parse.lalr import Tok, parse
from dslc.parse.syntax import report_syntax_error

MAX_INT = 2**63 - 1  # integer literals are 64-bit, as every size and attribute in cuDNN


def parse_text(text: str, file: str, sink: Sink, path: str = "",
               tokens: list[Tok] | None = None) -> ast.Module | None:
    """Parse `text` (displayed as `file`); report a syntax error and return None on failure.
    With `tokens`, the tokens read are appended to it (see `parse.lalr.parse`)."""
    builder = _Builder(file, text)
    try:
        version, decls = parse(tables(), text, builder, tokens)
    except UnexpectedInput as err:
        report_syntax_error(err, text, file, sink)
        return None
    if builder.errors:
        for d in builder.errors:
            sink.report(d)
        return None
    return ast.Module(
        file=file,
        path=path,
        version=version,
        imports=tuple(d for d in decls if isinstance(d, ast.Import)),
        defs=tuple(d for d in decls if isinstance(d, ast.Def)),
        models=tuple(d for d in decls if isinstance(d, ast.Model)),
    )


_ESCAPES = {"n": "\n", "t": "\t"}


def _unquote(token: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), token[1:-1])


def _doc_above(lines: list[str], line: int) -> str:
    """The block of full-line comments directly above `line` (1-based), without the `#`."""
    docs: list[str] = []
    n = line - 2
    while n >= 0 and lines[n].lstrip().startswith("#"):
        docs.append(lines[n].lstrip()[1:].strip())
        n -= 1
    return "\n".join(reversed(docs))


# What rules hand to the rules above them, besides tokens (tuples) and AST nodes. Sequences are
# lists, never tuples, so that a tuple child is always a token.


@dataclass(frozen=True, slots=True)
class _Block:
    span: Span  # from `{` to `}`
    open: Span  # the `{`: a def's header ends there
    body: tuple[ast.Stmt, ...]


@dataclass(frozen=True, slots=True)
class _Opt:
    """`align N` or `tune [...]` after a dim range."""

    span: Span
    kind: str
    value: Any


@dataclass(frozen=True, slots=True)
class _Marked:
    """A `repeat K`, `as "path"` or `when cond` clause: its value and the clause's span."""

    span: Span
    value: Any


def _is_tok(x: Any, kind: str | None = None) -> bool:
    return type(x) is tuple and (kind is None or x[0] == kind)


def _nodes(children: list[Any]) -> list[Any]:
    """The children that are not tokens (the items of a comma-separated list)."""
    return [c for c in children if type(c) is not tuple]


class _Builder:
    """Rule children -> AST. Methods are named after the grammar's rules and aliases."""

    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self.text = text
        self.lines = text.split("\n")
        self.errors: list[Diagnostic] = []
        # A parenthesised expression keeps its own span; the rules around it span the parentheses
        # too. Keyed by id(): each such node lives in the tree until the parse ends.
        self.outer: dict[int, tuple[int, int, int, int]] = {}

    # -- positions -------------------------------------------------------------------------
    def tsp(self, tok: Tok) -> Span:
        return Span(self.file, tok[2], tok[3], tok[2], tok[3] + len(tok[1]))

    def _start(self, x: Any) -> tuple[int, int]:
        if type(x) is tuple:
            return x[2], x[3]
        o = self.outer.get(id(x))
        if o is not None:
            return o[0], o[1]
        s = x.span
        return s.line, s.col

    def _end(self, x: Any) -> tuple[int, int]:
        if type(x) is tuple:
            return x[2], x[3] + len(x[1])
        o = self.outer.get(id(x))
        if o is not None:
            return o[2], o[3]
        s = x.span
        return s.end_line, s.end_col

    def sp(self, c: list[Any]) -> Span:
        """From the start of the first child to the end of the last (a token's, or a node's)."""
        first, last = c[0], c[-1]
        if type(first) is tuple:  # the usual case, inline: this runs once per node
            line, col = first[2], first[3]
        else:
            line, col = self._start(first)
        if type(last) is tuple:
            end_line, end_col = last[2], last[3] + len(last[1])
        else:
            end_line, end_col = self._end(last)
        return Span(self.file, line, col, end_line, end_col)

    def ident(self, tok: Tok) -> ast.Ident:
        return ast.Ident(self.tsp(tok), tok[1])

    # -- file ------------------------------------------------------------------------------
    def start(self, c: list[Any]) -> tuple[tuple[Span, str] | None, list[Any]]:
        if c and isinstance(c[0], list):
            return (c[0][0], c[0][1]), c[1:]
        return None, c

    def version(self, c: list[Any]) -> list[Any]:
        return [self.sp(c), c[1][1]]

    def import_decl(self, c: list[Any]) -> ast.Import:
        path = ast.Str(self.tsp(c[1]), _unquote(c[1][1]))
        return ast.Import(self.sp(c), path, self.ident(c[3]) if len(c) > 2 else None)

    def def_decl(self, c: list[Any]) -> ast.Def:
        block: _Block = c[-1]
        params = c[3] if isinstance(c[3], list) else []
        ret = c[-2] if isinstance(c[-2], list) else None
        head = self.sp(c)
        header = Span(self.file, head.line, head.col, block.open.line, block.open.col)
        return ast.Def(head, self.ident(c[1]), tuple(params), tuple(ret) if ret else None,
                       block.body, _doc_above(self.lines, head.line), header)

    def params(self, c: list[Any]) -> list[Any]:
        return _nodes(c)

    def param(self, c: list[Any]) -> ast.DefParam:
        return ast.DefParam(self.sp(c), self.ident(c[0]), c[2], c[4] if len(c) > 3 else None)

    def scalar_type(self, c: list[Any]) -> ast.ScalarTypeExpr:
        return ast.ScalarTypeExpr(self.tsp(c[0]), c[0][1])

    def ret_type(self, c: list[Any]) -> list[Any]:
        return _nodes(c)

    def model_decl(self, c: list[Any]) -> ast.Model:
        block: _Block = c[-1]
        args = c[3] if len(c) == 6 else []
        span = self.sp(c)
        return ast.Model(span, self.ident(c[1]), tuple(args), block.body,
                         _doc_above(self.lines, span.line))

    def block(self, c: list[Any]) -> _Block:
        return _Block(self.sp(c), self.tsp(c[0]), tuple(c[1:-1]))

    # -- statements ------------------------------------------------------------------------
    def dim_fixed(self, c: list[Any]) -> ast.DimFixed:
        return ast.DimFixed(self.sp(c), self.ident(c[1]), c[3])

    def dim_range(self, c: list[Any]) -> ast.DimRange:
        lo, hi = self.int_tok(c[3]), self.int_tok(c[5])
        align = None
        tune = None
        for opt in c[6:]:
            if opt.kind == "align":
                align = opt.value
            else:
                tune = opt.value
        return ast.DimRange(self.sp(c), self.ident(c[1]), lo, hi, lo.span.to(hi.span), align,
                            tune)

    def dim_align(self, c: list[Any]) -> _Opt:
        return _Opt(self.sp(c), "align", self.int_tok(c[1]))

    def dim_tune(self, c: list[Any]) -> _Opt:
        return _Opt(self.sp(c), "tune", c[1].value)

    def buckets_stmt(self, c: list[Any]) -> ast.Buckets:
        names = tuple(self.ident(t) for t in c if _is_tok(t, "NAME"))
        rows = tuple((r[0], r[1]) for r in c if isinstance(r, list))
        return ast.Buckets(self.sp(c), names, rows)

    def bucket_row(self, c: list[Any]) -> list[Any]:
        return [self.sp(c), tuple(self.int_tok(t) for t in c if _is_tok(t, "INT"))]

    def int_list(self, c: list[Any]) -> _Marked:
        return _Marked(self.sp(c), tuple(self.int_tok(t) for t in c if _is_tok(t, "INT")))

    def precision_stmt(self, c: list[Any]) -> ast.Precision:
        return ast.Precision(self.sp(c), tuple(_nodes(c)))

    def layout_stmt(self, c: list[Any]) -> ast.LayoutStmt:
        return ast.LayoutStmt(self.sp(c), self.ident(c[1]))

    def input_stmt(self, c: list[Any]) -> ast.Input:
        return ast.Input(self.sp(c), self.ident(c[1]), c[3])

    def param_stmt(self, c: list[Any]) -> ast.ParamStmt:
        """`param a.b.c: T`: a dotted name is the param's path as written (a checkpoint key)."""
        colon = next(i for i, t in enumerate(c) if _is_tok(t, "COLON"))
        names = [t for t in c[1:colon] if _is_tok(t, "NAME")]
        first, last = self.tsp(names[0]), self.tsp(names[-1])
        name = ast.Ident(first.to(last), ".".join(t[1] for t in names))
        rest = c[colon + 1:]
        return ast.ParamStmt(self.sp(c), name, rest[0], rest[1].value if len(rest) > 1 else None)

    def let_stmt(self, c: list[Any]) -> ast.Let:
        targets: list[ast.Ident] = c[1]
        vtype = c[3] if _is_tok(c[2], "COLON") else None
        rest = c[5:] if vtype is not None else c[3:]
        guard = rest[1].value if len(rest) > 1 else None
        return ast.Let(self.sp(c), tuple(targets), len(targets) > 1, self._vtype(vtype), rest[0],
                       guard)

    def output_stmt(self, c: list[Any]) -> ast.Output:
        vtype = c[3] if len(c) > 2 and _is_tok(c[2], "COLON") else None
        rhs = c[-1] if _is_tok(c[-2], "EQUAL") else None
        return ast.Output(self.sp(c), self.ident(c[1]), self._vtype(vtype), rhs)

    def return_stmt(self, c: list[Any]) -> ast.Return:
        return ast.Return(self.sp(c), tuple(_nodes(c[1:])))

    def _vtype(self, v: Any) -> ast.TensorTypeExpr | None:
        if isinstance(v, ast.DtypeLit):
            return ast.TensorTypeExpr(v.span, v.name, None, None)
        return v

    def target(self, c: list[Any]) -> list[ast.Ident]:
        return [self.ident(t) for t in c if _is_tok(t, "NAME")]

    def rhs(self, c: list[Any]) -> ast.Rhs:
        if len(c) == 1 and id(c[0]) not in self.outer:  # just the expression: its own span
            return ast.Rhs(c[0].span, None, c[0], None)
        repeat = c[0].value if isinstance(c[0], _Marked) else None
        instance = c[-1].value if isinstance(c[-1], _Marked) else None
        expr = c[1] if repeat is not None else c[0]
        return ast.Rhs(self.sp(c), repeat, expr, instance)

    def repeat(self, c: list[Any]) -> _Marked:
        tok = c[1]
        count = self.int_tok(tok) if tok[0] == "INT" else ast.Name(self.tsp(tok), tok[1])
        return _Marked(self.sp(c), count)

    def instance(self, c: list[Any]) -> _Marked:
        return _Marked(self.sp(c), ast.Str(self.tsp(c[1]), _unquote(c[1][1])))

    def guard(self, c: list[Any]) -> _Marked:
        return _Marked(self.sp(c), c[1])

    # -- types -----------------------------------------------------------------------------
    def tensor_type(self, c: list[Any]) -> ast.TensorTypeExpr:
        dtype = c[0] if isinstance(c[0], ast.DtypeLit) else None
        rest = c[1:] if dtype is not None else c
        dims = rest[1] if isinstance(rest[1], list) else []
        layout = rest[-1] if isinstance(rest[-1], ast.Ident) else None
        return ast.TensorTypeExpr(self.sp(c), dtype.name if dtype else None, tuple(dims), layout)

    def dims(self, c: list[Any]) -> list[Any]:
        return _nodes(c)

    def variadic(self, c: list[Any]) -> ast.Variadic:
        return ast.Variadic(self.sp(c), c[1][1])

    def layout(self, c: list[Any]) -> ast.Ident:
        return ast.Ident(self.sp(c), c[1][1])

    # -- expressions -----------------------------------------------------------------------
    def cond(self, c: list[Any]) -> ast.Cond:
        return ast.Cond(self.sp(c), c[0], c[2], c[4])

    def or_(self, c: list[Any]) -> ast.Logic:
        return ast.Logic(self.sp(c), "or", c[0], c[2])

    def and_(self, c: list[Any]) -> ast.Logic:
        return ast.Logic(self.sp(c), "and", c[0], c[2])

    def not_(self, c: list[Any]) -> ast.Not:
        return ast.Not(self.sp(c), c[1])

    def compare(self, c: list[Any]) -> ast.Binary:
        return ast.Binary(self.sp(c), c[1][1], c[0], c[2], self.tsp(c[1]))

    add = sub = mul = div = floordiv = compare

    def neg(self, c: list[Any]) -> ast.Neg:
        return ast.Neg(self.sp(c), c[1])

    def call(self, c: list[Any]) -> ast.Call:
        return ast.Call(self.sp(c), c[0], tuple(c[2]) if len(c) == 4 else ())

    def index(self, c: list[Any]) -> ast.Index:
        return ast.Index(self.sp(c), c[0], tuple(c[2]))

    def member(self, c: list[Any]) -> ast.Member:
        return ast.Member(self.sp(c), c[0], self.ident(c[2]))

    def name(self, c: list[Any]) -> ast.Name:
        return ast.Name(self.tsp(c[0]), c[0][1])

    def int_tok(self, tok: Tok) -> ast.Int:
        text = tok[1]
        digits = text.lstrip("0") or "0"
        if len(digits) > 19 or int(digits) > MAX_INT:  # int() of 4300+ digits would raise
            self.errors.append(Diagnostic(
                "E0106", "integer literal too large", self.tsp(tok),
                f"{len(digits)} digits, above {MAX_INT}",
                notes=("integers are 64-bit: sizes, counts and attributes all reach cuDNN as "
                       "int64",),
                help=("for a large scalar, write a float such as `1e30`",)))
            return ast.Int(self.tsp(tok), 0)
        return ast.Int(self.tsp(tok), int(digits))

    def int_lit(self, c: list[Any]) -> ast.Int:
        return self.int_tok(c[0])

    def float_lit(self, c: list[Any]) -> ast.Float:
        value = float(c[0][1])
        if math.isinf(value):
            self.errors.append(Diagnostic(
                "E0106", "float literal too large", self.tsp(c[0]), "beyond the f64 range",
                notes=("the largest finite f64 is about 1.8e308",)))
        return ast.Float(self.tsp(c[0]), value)

    def string(self, c: list[Any]) -> ast.Str:
        return ast.Str(self.tsp(c[0]), _unquote(c[0][1]))

    def true(self, c: list[Any]) -> ast.Bool:
        return ast.Bool(self.tsp(c[0]), True)

    def false(self, c: list[Any]) -> ast.Bool:
        return ast.Bool(self.tsp(c[0]), False)

    def dtype(self, c: list[Any]) -> ast.DtypeLit:
        return ast.DtypeLit(self.tsp(c[0]), c[0][1])

    def list_expr(self, c: list[Any]) -> ast.ListExpr:
        return ast.ListExpr(self.sp(c), tuple(_nodes(c)))

    def atom(self, c: list[Any]) -> Any:
        """`( expr )`: the expression itself; the parentheses widen the rules around it."""
        inner = c[1]
        (line, col), (end_line, end_col) = self._start(c[0]), self._end(c[2])
        self.outer[id(inner)] = (line, col, end_line, end_col)
        return inner

    def args(self, c: list[Any]) -> list[Any]:
        return _nodes(c)

    def kwarg(self, c: list[Any]) -> ast.Kwarg:
        return ast.Kwarg(self.sp(c), self.ident(c[0]), c[2])

    def slices(self, c: list[Any]) -> list[Any]:
        return _nodes(c)

    def slice_range(self, c: list[Any]) -> ast.Range:
        lo = None if _is_tok(c[0], "COLON") else c[0]
        hi = None if _is_tok(c[-1], "COLON") else c[-1]
        return ast.Range(self.sp(c), lo, hi)
