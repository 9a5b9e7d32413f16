"""The syntax tree as indented text (`dslc compile --dump ast`): one line per node, its fields
inline, source positions as `@line:col`."""

from __future__ import annotations

import dataclasses
from typing import Any

from dslc.diag.span import Span
from dslc.parse import ast


def _is_leaf(v: Any) -> bool:
    return not dataclasses.is_dataclass(v) and not (isinstance(v, tuple) and any(
        dataclasses.is_dataclass(x) or isinstance(x, tuple) for x in v))


def _format(node: Any, indent: int, label: str, out: list[str]) -> None:
    pad = "  " * indent + (f"{label}: " if label else "")
    if isinstance(node, ast.Ident):
        out.append(f"{pad}{node.name}")
        return
    if isinstance(node, tuple):
        if not node:
            return
        out.append(f"{pad}[")
        for item in node:
            _format(item, indent + 1, "", out)
        out.append("  " * indent + "]")
        return
    if not dataclasses.is_dataclass(node):
        out.append(f"{pad}{node!r}")
        return
    fields = [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)
              if not isinstance(getattr(node, f.name), Span) and f.name not in ("file", "path")]
    leaves = [(k, v) for k, v in fields if _is_leaf(v) and not isinstance(v, ast.Ident | Span)]
    idents = [(k, v.name) for k, v in fields if isinstance(v, ast.Ident)]
    span = getattr(node, "span", None)
    where = f" @{span.line}:{span.col}" if isinstance(span, Span) else ""
    inline = ", ".join(f"{k}={v!r}" for k, v in [*idents, *leaves] if v not in (None, (), ""))
    out.append(f"{pad}{type(node).__name__}{where}" + (f" {inline}" if inline else ""))
    for k, v in fields:
        if not _is_leaf(v) and not isinstance(v, ast.Ident):
            _format(v, indent + 1, k, out)


def format_module(module: ast.Module) -> str:
    out: list[str] = [f"# {module.file}"]
    for item in (*module.imports, *module.defs, *module.models):
        _format(item, 0, "", out)
    return "\n".join(out) + "\n"
