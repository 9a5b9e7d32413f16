"""A binary pointwise op reading a concatenation of two parts runs on each part instead:
`op(concat([A, B]), Y)` -> `concat([op(A, Y_a), op(B, Y_b)])`, Y sliced as the parts are (or
whole where it broadcasts along the concatenated axis). Each new op joins its part's group (the
part's producer computes it for the op alone), the parts are written into the concatenation in
place, and no step reads the concatenation back: Llama's `x * cos + rotate_half(x) * sin`,
`rotate_half(x) = concat([-x2, x1])`, becomes two steps where it was the negation, a copy of
`x1` into the concatenation, and the sum of products.

The rewrite never adds a step: it applies where at least one part is a pointwise value only the
concatenation reads (it takes the op into its group) and the other part is one too, or a value
the concatenation would copy (its copy becomes the op's pass over it, which the op's own step
was). A `Y` that is a pointwise value only this op reads is computed on the parts' slices of
its operands rather than sliced after it (so `x * cos` is computed per half, inside each
half's group). Only unannotated layouts (or an output's row-major one, which the new
concatenation takes): a value stored in a chosen memory order keeps it."""

from __future__ import annotations

from dslc.core.dims import Dim, add, sub
from dslc.core.types import TensorType
from dslc.ir.graph import Node
from dslc.lower.rewrite import Rewriter
from dslc.lower.views import VIEW_OPS

BINARY = ("add", "sub", "mul", "div", "max", "min", "pow")
ALONG = ("scale_mul", "bias_add")  # x op b, b a vector along the axis `axis` of x
# Pointwise ops a part or `Y` may be (what a pointwise group takes).
POINTWISE = (*BINARY, *ALONG, "neg", "abs", "relu", "sigmoid", "tanh", "silu", "gelu", "gelu_tanh",
             "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "cast")


def pointwise_through_concat(rw: Rewriter, node: Node) -> str | None:
    layout = node.type.layout  # an output's row-major order, or none chosen yet
    if node.op not in (*BINARY, *ALONG) or (layout is not None and not layout.is_row_major):
        return None
    for side in (0,) if node.op in ALONG else (0, 1):
        c = rw.node(node.inputs[side])
        other = rw.node(node.inputs[1 - side])
        if (c.op == "concat" and len(c.inputs) == 2 and c.type.layout is None
                and c.type.shape == node.type.shape and rw.only_read_by_one(c.name)
                and _pays(rw, c)):
            return _split(rw, node, c, other, side)
    return None


def _pays(rw: Rewriter, c: Node) -> bool:
    """One part at least is a pointwise value only the concatenation reads; the other is one
    too, or not a computed value (a view or an input: the concatenation copies it)."""
    takes = [_only_for(rw, p, c.name) for p in c.inputs]
    copied = [rw.node(p).op in (*VIEW_OPS, "input", "param") for p in c.inputs]
    return any(takes) and all(t or k for t, k in zip(takes, copied, strict=True))


def _only_for(rw: Rewriter, name: str, reader: str) -> bool:
    """`name` is a pointwise value that only `reader` reads (and no output exports). A value
    this pass made (a part of a concatenation it wrote) is read by what it made alone."""
    n = rw.node(name)
    if n.op not in POINTWISE or n.type.layout is not None:
        return False
    if name in rw.old_users:
        return rw.only_read_by_one(name) and rw.users_of(name)[0].name == reader
    return [m.name for m in rw.nodes if name in m.inputs] == [reader]


def _split(rw: Rewriter, node: Node, c: Node, other: Node, side: int) -> str:
    axis = int(c.attrs["axis"]) % node.type.rank
    parts = []
    start: Dim = 0
    for k, name in enumerate(c.inputs):
        part = rw.node(name)
        end = add(start, part.type.shape[axis])
        y = _operand(rw, node, 1 - side, other, axis, start, end, f"{node.name}.part{k}")
        operands = (name, y) if side == 0 else (y, name)
        parts.append(rw.new(node.op, operands, dict(node.attrs),
                            TensorType(node.type.dtype, part.type.shape), node,
                            f"{node.name}.part{k}"))
        start = end
    return rw.new("concat", tuple(parts), dict(c.attrs), node.type, node, node.name)


def _operand(rw: Rewriter, reader: Node, k: int, y: Node, axis: int, start: Dim, end: Dim,
             name: str, top: bool = True) -> str:
    """Operand `k` of `reader`, `y`, where it meets [start, end) of the reader's `axis`: a bias
    or scale vector by the axis it lies along (`_along`), any other operand broadcast
    right-aligned (`_sliced`)."""
    if reader.op in ALONG and k == 1:
        return _along(rw, y, reader, axis, start, end, name)
    return _sliced(rw, y, reader, axis, start, end, name, top)


def _sliced(rw: Rewriter, y: Node, like: Node, axis: int, start: Dim, end: Dim, name: str,
            top: bool) -> str:
    """`y`'s values at [start, end) of `like`'s `axis` (`y` broadcast right-aligned to it):
    `y` itself where it broadcasts along the axis; a pointwise `y` only `like` reads computed
    on its operands' slices (once: their operands are sliced); else a slice."""
    at = axis - (like.type.rank - y.type.rank)
    if at < 0 or y.type.shape[at] == 1:
        return y.name
    shape = tuple(sub(end, start) if i == at else d for i, d in enumerate(y.type.shape))
    if top and y.op in POINTWISE and _only_for(rw, y.name, like.name) \
            and y.type.layout is None:
        operands = tuple(_operand(rw, y, j, rw.node(i), at, start, end, f"{name}.{j}", False)
                         for j, i in enumerate(y.inputs))
        return rw.new(y.op, operands, dict(y.attrs), TensorType(y.type.dtype, shape), y,
                      f"{name}.{y.op}")
    starts = tuple(start if i == at else 0 for i in range(y.type.rank))
    ends = tuple(end if i == at else d for i, d in enumerate(y.type.shape))
    return rw.new("slice", (y.name,), {"starts": starts, "ends": ends},
                  TensorType(y.type.dtype, shape), like, f"{name}.slice")


def _along(rw: Rewriter, vector: Node, like: Node, axis: int, start: Dim, end: Dim,
           name: str) -> str:
    """A bias or scale vector's entries for [start, end) of `like`'s `axis`: its slice where it
    lies along that axis, else all of it."""
    if int(like.attrs["axis"]) % like.type.rank != axis:
        return vector.name
    return rw.new("slice", (vector.name,), {"starts": (start,), "ends": (end,)},
                  TensorType(vector.type.dtype, (sub(end, start),)), like, f"{name}.slice")
