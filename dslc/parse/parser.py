"""Parse one `.cgraph` text: Lark LALR -> frozen AST with spans (source text -> `ast.Module`).

The transformer only builds nodes; it judges nothing (Lark would wrap any error it raised).
Syntax errors become E01xx diagnostics in `parse.syntax`; placement rules in `parse.structure`.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from lark import Lark, Token, Transformer, UnexpectedInput
from lark.tree import Meta

from dslc.diag.diagnostic import Sink
from dslc.diag.span import Span
from dslc.parse import ast

GRAMMAR_NAME = "cgraph.lark"


def grammar_text() -> str:
    """The grammar: packaged inside the wheel as `dslc/grammar/`, or `grammar/` in a checkout."""
    packaged = resources.files("dslc").joinpath("grammar", GRAMMAR_NAME)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parents[2] / "grammar" / GRAMMAR_NAME).read_text(encoding="utf-8")


@cache
def lark_parser() -> Lark:
    # cache=True keeps the LALR tables in the temp folder: building them costs ~0.2 s a process.
    return Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
        cache=True,
    )


def parse_text(text: str, file: str, sink: Sink, path: str = "") -> ast.Module | None:
    """Parse `text` (displayed as `file`); report a syntax error and return None on failure."""
    from dslc.parse.syntax import report_syntax_error

    try:
        tree = lark_parser().parse(text)
    except UnexpectedInput as err:
        report_syntax_error(err, text, file, sink)
        return None
    items = _Builder(file, text).transform(tree)
    version, decls = items
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


class _Builder(Transformer[Token, Any]):
    """Lark tree -> AST. One method per grammar rule or alias, in grammar order; each takes the
    node's position (`meta`) and its transformed children."""

    def __init__(self, file: str, text: str) -> None:
        super().__init__()
        self.file = file
        self.text = text
        self.lines = text.split("\n")

    def _call_userfunc(self, tree: Any, new_children: Any = None) -> Any:
        # What `v_args(meta=True)` does, without its per-call wrapper (a third of parse time).
        children = new_children if new_children is not None else tree.children
        return getattr(self, tree.data)(tree.meta, children)

    # -- positions -------------------------------------------------------------------------
    def sp(self, meta: Meta) -> Span:
        return Span(self.file, meta.line, meta.column, meta.end_line, meta.end_column)

    def tsp(self, tok: Token) -> Span:
        assert tok.line is not None and tok.column is not None
        assert tok.end_line is not None and tok.end_column is not None
        return Span(self.file, tok.line, tok.column, tok.end_line, tok.end_column)

    def ident(self, tok: Token) -> ast.Ident:
        return ast.Ident(self.tsp(tok), str(tok))

    def _op_span(self, left: Any, right: Any, op: str) -> Span:
        """Where the operator between two operands was written."""
        a, b = left.span, right.span
        if a.end_line == b.line:
            segment = self.lines[a.end_line - 1][a.end_col - 1 : b.col - 1]
            at = segment.find(op)
            if at >= 0:
                col = a.end_col + at
                return Span(self.file, a.end_line, col, a.end_line, col + len(op))
        return a.to(b)

    # -- file ------------------------------------------------------------------------------
    def start(self, meta: Meta, children: list[Any]) -> Any:
        version = None
        if children and isinstance(children[0], tuple):
            version = children[0]
            children = children[1:]
        return version, children

    def version(self, meta: Meta, children: list[Token]) -> tuple[Span, str]:
        return (self.sp(meta), str(children[0]))

    def import_decl(self, meta: Meta, c: list[Any]) -> ast.Import:
        path = ast.Str(self.tsp(c[0]), _unquote(str(c[0])))
        return ast.Import(self.sp(meta), path, self.ident(c[1]) if c[1] is not None else None)

    def def_decl(self, meta: Meta, c: list[Any]) -> ast.Def:
        name, params, ret, body = c
        header = self.sp(meta)
        header = Span(header.file, header.line, header.col, body[0].line, body[0].col)
        return ast.Def(self.sp(meta), self.ident(name), tuple(params or ()), ret, body[1],
                       _doc_above(self.lines, meta.line), header)

    def params(self, meta: Meta, c: list[Any]) -> tuple[Any, ...]:
        return tuple(c)

    def param(self, meta: Meta, c: list[Any]) -> ast.DefParam:
        return ast.DefParam(self.sp(meta), self.ident(c[0]), c[1], c[2])

    def scalar_type(self, meta: Meta, c: list[Token]) -> ast.ScalarTypeExpr:
        return ast.ScalarTypeExpr(self.sp(meta), str(c[0]))

    def ret_type(self, meta: Meta, c: list[Any]) -> tuple[Any, ...]:
        return tuple(c)

    def model_decl(self, meta: Meta, c: list[Any]) -> ast.Model:
        name, args, body = c
        return ast.Model(self.sp(meta), self.ident(name), tuple(args or ()), body[1],
                         _doc_above(self.lines, meta.line))

    def block(self, meta: Meta, c: list[Any]) -> tuple[Span, tuple[Any, ...]]:
        # The opening brace's position lets `def_decl` end its header span there.
        return (Span(self.file, meta.line, meta.column, meta.line, meta.column + 1), tuple(c))

    # -- statements ------------------------------------------------------------------------
    def dim_fixed(self, meta: Meta, c: list[Any]) -> ast.DimFixed:
        return ast.DimFixed(self.sp(meta), self.ident(c[0]), c[1])

    def dim_range(self, meta: Meta, c: list[Any]) -> ast.DimRange:
        name, lo, hi, *opts = c
        lo_i, hi_i = self.int_tok(lo), self.int_tok(hi)
        align = None
        tune = None
        for kind, value in opts:
            if kind == "align":
                align = value
            else:
                tune = value
        return ast.DimRange(self.sp(meta), self.ident(name), lo_i, hi_i, lo_i.span.to(hi_i.span),
                            align, tune)

    def dim_align(self, meta: Meta, c: list[Token]) -> tuple[str, ast.Int]:
        return ("align", self.int_tok(c[0]))

    def dim_tune(self, meta: Meta, c: list[Any]) -> tuple[str, tuple[ast.Int, ...]]:
        return ("tune", c[0])

    def buckets_stmt(self, meta: Meta, c: list[Any]) -> ast.Buckets:
        names = tuple(self.ident(t) for t in c if isinstance(t, Token))
        rows = tuple(t for t in c if not isinstance(t, Token))
        return ast.Buckets(self.sp(meta), names, rows)

    def bucket_row(self, meta: Meta, c: list[Token]) -> tuple[Span, tuple[ast.Int, ...]]:
        return (self.sp(meta), tuple(self.int_tok(t) for t in c))

    def int_list(self, meta: Meta, c: list[Token]) -> tuple[ast.Int, ...]:
        return tuple(self.int_tok(t) for t in c)

    def precision_stmt(self, meta: Meta, c: list[ast.Kwarg]) -> ast.Precision:
        return ast.Precision(self.sp(meta), tuple(c))

    def layout_stmt(self, meta: Meta, c: list[Token]) -> ast.LayoutStmt:
        return ast.LayoutStmt(self.sp(meta), self.ident(c[0]))

    def input_stmt(self, meta: Meta, c: list[Any]) -> ast.Input:
        return ast.Input(self.sp(meta), self.ident(c[0]), c[1])

    def param_stmt(self, meta: Meta, c: list[Any]) -> ast.ParamStmt:
        return ast.ParamStmt(self.sp(meta), self.ident(c[0]), c[1], c[2])

    def let_stmt(self, meta: Meta, c: list[Any]) -> ast.Let:
        targets, vtype, rhs, guard = c
        return ast.Let(self.sp(meta), targets, len(targets) > 1, self._vtype(vtype), rhs, guard)

    def output_stmt(self, meta: Meta, c: list[Any]) -> ast.Output:
        return ast.Output(self.sp(meta), self.ident(c[0]), self._vtype(c[1]), c[2])

    def return_stmt(self, meta: Meta, c: list[Any]) -> ast.Return:
        return ast.Return(self.sp(meta), tuple(c))

    def _vtype(self, v: Any) -> ast.TensorTypeExpr | None:
        if isinstance(v, ast.DtypeLit):
            return ast.TensorTypeExpr(v.span, v.name, None, None)
        return v

    def target(self, meta: Meta, c: list[Token]) -> tuple[ast.Ident, ...]:
        return tuple(self.ident(t) for t in c)

    def rhs(self, meta: Meta, c: list[Any]) -> ast.Rhs:
        return ast.Rhs(self.sp(meta), c[0], c[1], c[2])

    def repeat(self, meta: Meta, c: list[Token]) -> ast.Expr:
        tok = c[0]
        return self.int_tok(tok) if tok.type == "INT" else ast.Name(self.tsp(tok), str(tok))

    def instance(self, meta: Meta, c: list[Token]) -> ast.Str:
        return ast.Str(self.tsp(c[0]), _unquote(str(c[0])))

    def guard(self, meta: Meta, c: list[Any]) -> Any:
        return c[0]

    # -- types -----------------------------------------------------------------------------
    def tensor_type(self, meta: Meta, c: list[Any]) -> ast.TensorTypeExpr:
        dtype, dims, layout = c
        return ast.TensorTypeExpr(self.sp(meta), dtype.name if dtype else None,
                                  tuple(dims or ()), layout)

    def dims(self, meta: Meta, c: list[Any]) -> tuple[Any, ...]:
        return tuple(c)

    def variadic(self, meta: Meta, c: list[Token]) -> ast.Variadic:
        return ast.Variadic(self.sp(meta), str(c[0]))

    def layout(self, meta: Meta, c: list[Token]) -> ast.Ident:
        return ast.Ident(self.sp(meta), str(c[0]))

    # -- expressions -----------------------------------------------------------------------
    def cond(self, meta: Meta, c: list[Any]) -> ast.Cond:
        return ast.Cond(self.sp(meta), c[0], c[1], c[2])

    def or_(self, meta: Meta, c: list[Any]) -> ast.Logic:
        return ast.Logic(self.sp(meta), "or", c[0], c[1])

    def and_(self, meta: Meta, c: list[Any]) -> ast.Logic:
        return ast.Logic(self.sp(meta), "and", c[0], c[1])

    def not_(self, meta: Meta, c: list[Any]) -> ast.Not:
        return ast.Not(self.sp(meta), c[0])

    def compare(self, meta: Meta, c: list[Any]) -> ast.Binary:
        left, op, right = c
        return ast.Binary(self.sp(meta), str(op), left, right, self.tsp(op))

    def _binary(self, meta: Meta, c: list[Any], op: str) -> ast.Binary:
        return ast.Binary(self.sp(meta), op, c[0], c[1], self._op_span(c[0], c[1], op))

    def add(self, meta: Meta, c: list[Any]) -> ast.Binary:
        return self._binary(meta, c, "+")

    def sub(self, meta: Meta, c: list[Any]) -> ast.Binary:
        return self._binary(meta, c, "-")

    def mul(self, meta: Meta, c: list[Any]) -> ast.Binary:
        return self._binary(meta, c, "*")

    def div(self, meta: Meta, c: list[Any]) -> ast.Binary:
        return self._binary(meta, c, "/")

    def neg(self, meta: Meta, c: list[Any]) -> ast.Expr:
        return ast.Neg(self.sp(meta), c[0])

    def call(self, meta: Meta, c: list[Any]) -> ast.Call:
        return ast.Call(self.sp(meta), c[0], tuple(c[1] or ()))

    def index(self, meta: Meta, c: list[Any]) -> ast.Index:
        return ast.Index(self.sp(meta), c[0], c[1])

    def member(self, meta: Meta, c: list[Any]) -> ast.Member:
        return ast.Member(self.sp(meta), c[0], self.ident(c[1]))

    def name(self, meta: Meta, c: list[Token]) -> ast.Name:
        return ast.Name(self.tsp(c[0]), str(c[0]))

    def int_tok(self, tok: Token) -> ast.Int:
        return ast.Int(self.tsp(tok), int(str(tok)))

    def int_lit(self, meta: Meta, c: list[Token]) -> ast.Int:
        return self.int_tok(c[0])

    def float_lit(self, meta: Meta, c: list[Token]) -> ast.Float:
        return ast.Float(self.tsp(c[0]), float(str(c[0])))

    def string(self, meta: Meta, c: list[Token]) -> ast.Str:
        return ast.Str(self.tsp(c[0]), _unquote(str(c[0])))

    def true(self, meta: Meta, c: list[Any]) -> ast.Bool:
        return ast.Bool(self.sp(meta), True)

    def false(self, meta: Meta, c: list[Any]) -> ast.Bool:
        return ast.Bool(self.sp(meta), False)

    def dtype(self, meta: Meta, c: list[Token]) -> ast.DtypeLit:
        return ast.DtypeLit(self.tsp(c[0]), str(c[0]))

    def list_expr(self, meta: Meta, c: list[Any]) -> ast.ListExpr:
        return ast.ListExpr(self.sp(meta), tuple(x for x in c if x is not None))

    def args(self, meta: Meta, c: list[Any]) -> tuple[Any, ...]:
        return tuple(c)

    def kwarg(self, meta: Meta, c: list[Any]) -> ast.Kwarg:
        return ast.Kwarg(self.sp(meta), self.ident(c[0]), c[1])

    def slices(self, meta: Meta, c: list[Any]) -> tuple[Any, ...]:
        return tuple(c)

    def slice_range(self, meta: Meta, c: list[Any]) -> ast.Range:
        return ast.Range(self.sp(meta), c[0], c[1])
