"""The syntax tree as indented text (`dslc compile --dump ast`): one line per node, its fields
inline, source positions as `@line:col` (left out on request: `dslc fmt` compares the trees of a
file before and after, which differ only in positions)."""

from __future__ import annotations

import dataclasses
from typing import Any

from dslc.diag.span import Span
from dslc.parse import ast


def _is_leaf(v: Any) -> bool:
    return not dataclasses.is_dataclass(v) and not (isinstance(v, tuple) and any(
        dataclasses.is_dataclass(x) or isinstance(x, tuple) for x in v))


def _format(root: Any, out: list[str], positions: bool) -> None:
    """Append the lines of `root` to `out`: a walk with its own stack, so that an expression
    nested ten thousand deep (a chain of signs) prints like any other."""
    work: list[tuple[Any, int, str] | str] = [(root, 0, "")]
    while work:
        item = work.pop()
        if isinstance(item, str):  # the closing bracket of a tuple
            out.append(item)
            continue
        node, indent, label = item
        if not positions and isinstance(node, Span):  # a bucket row's span, inside a tuple
            continue
        pad = "  " * indent + (f"{label}: " if label else "")
        if isinstance(node, ast.Ident):
            out.append(f"{pad}{node.name}")
        elif isinstance(node, tuple):
            if node:
                out.append(f"{pad}[")
                work.append("  " * indent + "]")
                work.extend((x, indent + 1, "") for x in reversed(node))
        elif not dataclasses.is_dataclass(node):
            out.append(f"{pad}{node!r}")
        else:
            out.append(pad + _head(node, positions))
            fields = _fields(node)
            work.extend((v, indent + 1, k) for k, v in reversed(fields)
                        if not _is_leaf(v) and not isinstance(v, ast.Ident))


def _fields(node: Any) -> list[tuple[str, Any]]:
    return [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)
            if not isinstance(getattr(node, f.name), Span) and f.name not in ("file", "path")]


def _head(node: Any, positions: bool) -> str:
    """`Name @3:5 name='x'`: the type, the position and the inline fields."""
    fields = _fields(node)
    leaves = [(k, v) for k, v in fields if _is_leaf(v) and not isinstance(v, ast.Ident | Span)]
    idents = [(k, v.name) for k, v in fields if isinstance(v, ast.Ident)]
    span = getattr(node, "span", None)
    where = f" @{span.line}:{span.col}" if positions and isinstance(span, Span) else ""
    inline = ", ".join(f"{k}={v!r}" for k, v in [*idents, *leaves] if v not in (None, (), ""))
    return f"{type(node).__name__}{where}" + (f" {inline}" if inline else "")


def format_module(module: ast.Module, positions: bool = True) -> str:
    out: list[str] = [f"# {module.file}"]
    for item in (*module.imports, *module.defs, *module.models):
        _format(item, out, positions)
    return "\n".join(out) + "\n"
