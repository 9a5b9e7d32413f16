"""Shapes of imported values: ONNX's numpy broadcasting and size formulas over symbolic dims
(`dslc.core.dims`, the checker's own arithmetic), and dims written in source syntax."""

from __future__ import annotations

from collections.abc import Sequence

from dslc.core import dims
from dslc.core.dims import Dim, DimEnv

Shape = tuple[Dim, ...]


class ShapeError(Exception):
    """A shape the importer cannot prove (a symbolic size broadcast against another)."""


def broadcast(*shapes: Shape) -> Shape:
    """numpy broadcasting: shapes aligned on the right, a 1 stretched to the other size. Two
    different sizes neither of which is 1 cannot both hold (the language never broadcasts a
    symbolic size, so neither may the importer)."""
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for axis in range(rank):
        sizes = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        wide = {d for d in sizes if d != 1}
        if len(wide) > 1:
            raise ShapeError("cannot broadcast " + " and ".join(shape_text(s) for s in shapes))
        out.append(wide.pop() if wide else 1)
    return tuple(out)


def product(values: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for v in values:
        out = dims.mul(out, v)
    return out


def window_out(size: Dim, window: int, stride: int, pre: int, post: int, dilation: int,
               env: DimEnv, ceil: bool = False) -> Dim:
    """The output size of a convolution or pooling window along one axis (ONNX's formula, as
    the language's `conv` and pools compute it)."""
    span = dims.sub(dims.add(size, pre + post), dilation * (window - 1) + 1)
    if ceil:
        span = dims.add(span, stride - 1)
    return dims.add(dims.floordiv(span, stride, env), 1)


def dim_text(d: Dim, env: DimEnv) -> str:
    """A dim in source syntax: `N`, `S * 12`, and a floor as `((H - 1) // 2) + 1` (the checker
    names its floors `⌊(H - 1) / 2⌋`, which is no source); a floor in brackets, so a factor
    before it stays outside it."""
    text = dims.format_dim(d)
    if isinstance(d, int):
        return text
    for name in sorted(d.symbols() & env.floors.keys(), key=len, reverse=True):
        inner, div = env.floors[name]
        text = text.replace(name, f"(({dim_text(inner, env)}) // {div})")
    return text


def shape_text(shape: Shape) -> str:
    return "[" + ", ".join(dims.format_dim(d) for d in shape) + "]"
