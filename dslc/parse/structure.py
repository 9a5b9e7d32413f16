"""Placement rules the grammar leaves open on purpose (better messages here than from the parser):
which statements a block may hold (E0103), argument order (E0104), the version line (E0105), one
model per file (E0704), the length of a model's name (E0106).
"""

from __future__ import annotations

from dslc.diag.diagnostic import Diagnostic, Label, Sink
from dslc.parse import ast

SUPPORTED_VERSIONS = ("0.1",)
# A model's name names its output files (`<name>.bundle`, `<name>_runner.py`); file systems take
# 255 bytes a name, so this leaves room for the suffixes and for what a build adds.
MAX_MODEL_NAME = 128

_MODEL_ONLY = {
    ast.DimRange: ("a dynamic `dim`", "only a model's inputs can vary in size; give the def a "
                   "shape pattern such as `x: [N, D]` instead"),
    ast.Buckets: ("`buckets`", "declare the buckets in the model"),
    ast.LayoutStmt: ("`layout`", "set the layout in the model, or tag a def parameter's type, "
                     "e.g. `x: [N, C, H, W] @NHWC`"),
    ast.Output: ("`output`", "a def gives its result with `return`"),
}


def check_structure(module: ast.Module, sink: Sink) -> None:
    if module.version is not None and module.version[1] not in SUPPORTED_VERSIONS:
        span, text = module.version
        sink.report(Diagnostic(
            "E0105", f"unsupported language version `{text}`", span, "not supported",
            notes=(f"this dslc reads `.cgraph` version {', '.join(SUPPORTED_VERSIONS)}",),
            help=("write `cgraph 0.1`",),
        ))
    for model in module.models[1:]:
        sink.report(Diagnostic(
            "E0704", "a file holds at most one `model`", model.name.span, "second model",
            (Label(module.models[0].name.span, "first model here"),),
            help=("move each model into a file of its own; share defs through `import`",),
        ))
    for d in module.defs:
        _check_def_body(d, sink)
        for p in d.params:
            if p.default is not None:
                _check_calls(p.default, sink)
    for m in module.models:
        if len(m.name.name) > MAX_MODEL_NAME:
            sink.report(Diagnostic(
                "E0106", f"the model name is too long: {len(m.name.name)} characters",
                m.name.span, f"more than {MAX_MODEL_NAME}",
                notes=("the name names the output files, `<name>.bundle` and `<name>_runner.py`, "
                       "and file systems take 255 bytes a name",),
                help=(f"use at most {MAX_MODEL_NAME} characters",)))
        _check_args(m.args, sink)
        for stmt in m.body:
            if isinstance(stmt, ast.Return):
                sink.report(Diagnostic(
                    "E0103", "`return` is not allowed in a model", stmt.span, "not in a def",
                    help=("a model exports results with `output NAME = expr`",),
                ))
            _check_stmt_calls(stmt, sink)


def _check_def_body(d: ast.Def, sink: Sink) -> None:
    returns = [s for s in d.body if isinstance(s, ast.Return)]
    for stmt in d.body:
        kind = _MODEL_ONLY.get(type(stmt))
        if kind is not None:
            what, hint = kind
            sink.report(Diagnostic(
                "E0103", f"{what} is not allowed in a def", stmt.span, "only in a model",
                (Label(d.name.span, f"in `def {d.name.name}`"),), help=(hint,),
            ))
        _check_stmt_calls(stmt, sink)
    if returns and returns[0] is not d.body[-1]:
        sink.report(Diagnostic(
            "E0103", "`return` must be the last statement of a def", returns[0].span,
            "statements follow this `return`",
            help=("move the `return` to the end of the def",),
        ))


def _check_stmt_calls(stmt: ast.Stmt, sink: Sink) -> None:
    for expr in ast.stmt_exprs(stmt):
        _check_calls(expr, sink)


def _check_calls(expr: ast.Expr, sink: Sink) -> None:
    for e in ast.walk(expr):
        if isinstance(e, ast.Call):
            _check_args(e.args, sink)


def _check_args(args: tuple[ast.Expr | ast.Kwarg, ...], sink: Sink) -> None:
    seen: dict[str, ast.Kwarg] = {}
    first_kw: ast.Kwarg | None = None
    for a in args:
        if isinstance(a, ast.Kwarg):
            first_kw = first_kw or a
            if a.name.name in seen:
                sink.report(Diagnostic(
                    "E0104", f"keyword `{a.name.name}` is given twice", a.name.span,
                    "given again here", (Label(seen[a.name.name].name.span, "first given here"),),
                    help=("remove one of them",),
                ))
            seen[a.name.name] = a
        elif first_kw is not None:
            sink.report(Diagnostic(
                "E0104", "a positional argument follows a keyword argument", a.span,
                "positional argument", (Label(first_kw.span, "keyword argument here"),),
                help=("put the positional arguments first",),
            ))
