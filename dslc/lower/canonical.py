"""Canonical forms: channel-vector adds and multiplies as `bias_add` / `scale_mul`, identity
ops and scalar arithmetic folded, dead values removed; and which values are load-time."""

from __future__ import annotations

from dslc.core.dims import compare
from dslc.core.types import PrecisionSpec, TensorType
from dslc.ir.graph import CALIBRATED, IN_PLACE, Graph, Node
from dslc.lower.rewrite import Rewriter
from dslc.ops import OPS
from dslc.ops.opdef import Kind

SOURCES = ("param", "scalar", CALIBRATED)  # what load time computes from
# ops of the pointwise family of one tensor operand (a cast, an activation): their result at an
# element is f of the operand there (a copy into a layout is not one: its layout is its point)
POINTWISE_UNARY = frozenset(op.name for op in OPS.values() if op.family == "pointwise"
                            and sum(p.kind == Kind.TENSOR for p in op.params) == 1
                            and op.name != "contiguous")


def load_time(graph: Graph) -> set[str]:
    """Values computed from params and constants only (an op of none, `arange` of a static
    size, included): evaluated once, when the weights load. Not a value whose size depends on
    the inputs' (a param expanded to [B, 1, D], `arange(S)`), nor a `full` of a dynamic dim's
    value: it is computed at each size."""
    out: set[str] = set()
    for node in graph.nodes:
        if node.op in SOURCES or (node.op != "input" and all(i in out for i in node.inputs)
                                  and all(isinstance(d, int) for d in node.type.shape)
                                  and isinstance(node.attrs.get("value", 0), int | float)):
            out.add(node.name)
    return out


def _channel_axis(x: TensorType, b: TensorType) -> int | None:
    """The one axis of x that b (right-aligned) varies along, when b is a vector there."""
    if b.rank > x.rank or b.rank == 0:
        return None
    padded = (1,) * (x.rank - b.rank) + b.shape
    varying = [i for i, d in enumerate(padded) if d != 1]
    if len(varying) != 1 or padded[varying[0]] != x.shape[varying[0]]:
        return None
    return varying[0]


def make_bias_rule(graph: Graph):  # type: ignore[no-untyped-def]
    constants = load_time(graph)

    def bias_from_add(rw: Rewriter, node: Node) -> str | None:
        """x + b and x * b with a load-time channel vector b become bias_add / scale_mul: the
        form conv and matmul epilogues fuse, with b stored as a plain [C] vector."""
        if node.op not in ("add", "mul") or len(node.inputs) != 2:
            return None
        for xi, bi in (node.inputs, node.inputs[::-1]):
            x, b = rw.node(xi), rw.node(bi)
            if bi not in constants or x.type.shape != node.type.shape or xi in constants:
                continue
            axis = _channel_axis(x.type, b.type)
            if axis is None:
                continue
            if b.type.rank != 1:
                size = x.type.shape[axis]
                bi = rw.new("reshape", (bi,), {"shape": (size,)},
                            TensorType(b.type.dtype, (size,)), node, f"{bi}.vector",
                            b.precision)
            op = "bias_add" if node.op == "add" else "scale_mul"
            return rw.new(op, (xi, bi), {"axis": axis}, node.type, node, node.name)
        return None

    return bias_from_add


_IDENTITY = {"add": 0.0, "sub": 0.0, "mul": 1.0, "div": 1.0}


def fold_scalars(rw: Rewriter, node: Node) -> str | None:
    """Identities (x + 0, x * 1, a cast to the same dtype, a copy into the same layout) vanish;
    arithmetic on two scalars is done now."""
    if node.op in ("cast", "contiguous"):
        src = rw.node(node.inputs[0])
        if src.type == node.type and (node.op == "cast" or src.type.layout is not None):
            return src.name
        return None
    if node.op in _IDENTITY and len(node.inputs) == 2:
        return _fold_arithmetic(rw, node)
    return None


def _fold_arithmetic(rw: Rewriter, node: Node) -> str | None:
    a, b = rw.node(node.inputs[0]), rw.node(node.inputs[1])
    if a.op == "scalar" and b.op == "scalar":
        u, v = float(a.attrs["value"]), float(b.attrs["value"])
        value = {"add": u + v, "sub": u - v, "mul": u * v,
                 "div": u / v if v else float("nan")}[node.op]
        return rw.new("scalar", (), {"value": value}, node.type, node, node.name)
    # The operand stands in for the result only where it is stored the same way: a result
    # whose layout is fixed (an output's contract) keeps its op when the operand's is not that.
    def same(x: Node) -> bool:
        return (x.type.dtype, x.type.shape) == (node.type.dtype, node.type.shape) and \
            (node.type.layout is None or x.type.layout == node.type.layout)

    if b.op == "scalar" and b.attrs["value"] == _IDENTITY[node.op] and same(a):
        return a.name
    if (node.op in ("add", "mul") and a.op == "scalar" and a.attrs["value"] == _IDENTITY[node.op]
            and same(b)):
        return b.name
    return None


def gather_of_arange(rw: Rewriter, node: Node) -> str | None:
    """`gather(x, arange(n), axis)` picks x's first n rows in order: the slice x[0:n] on that
    axis, which reads the table in place (a view: no index tensor, no kernel), where n never
    exceeds the axis (the dims' ranges prove it; past it the gather gives NaN rows, a slice
    cannot). Position embeddings (BERT's, GPT-2's) read so: two fallback kernels a call fewer."""
    if node.op != "gather":
        return None
    x, idx = rw.node(node.inputs[0]), rw.node(node.inputs[1])
    axis = int(node.attrs["axis"])
    if idx.op != "arange" or compare(idx.type.shape[0], x.type.shape[axis], "<=", rw.env) \
            is not True:
        return None
    ends = tuple(idx.type.shape[0] if i == axis else d for i, d in enumerate(x.type.shape))
    return rw.new("slice", (x.name,), {"starts": (0,) * x.type.rank, "ends": ends}, node.type,
                  node, node.name)


def reshape_before_pointwise(rw: Rewriter, node: Node) -> str | None:
    """`reshape(f(x))` of a model input x and a one-operand pointwise f read by the reshape
    alone -> `f(reshape(x))`: the same values, the reshape a view of the input, and f joins
    the pointwise ops after it in one step (BERT's `reshape(cast(mask), [B, 1, 1, S])` before
    `(1 - keep) * -65504`: two steps apart, one after). Only where x is stored row-major, as
    f's result is: the reshape stays a view."""
    if node.op != "reshape":
        return None
    f = rw.node(node.inputs[0])
    if f.op not in POINTWISE_UNARY or not rw.only_read_by_one(f.name):
        return None
    x = rw.node(f.inputs[0])
    if x.op != "input" or (x.type.layout is not None and not x.type.layout.is_row_major):
        return None
    moved = rw.new("reshape", (x.name,), dict(node.attrs), TensorType(x.type.dtype, node.type.shape),
                   node, f"{node.name}.{f.op}_of")
    return rw.new(f.op, (moved,), dict(f.attrs), node.type.with_shape(node.type.shape), f,
                  node.name)


def residual_before_bias(rw: Rewriter, node: Node) -> str | None:
    """`bias_add(conv) + z` -> `bias_add(conv + z)`: a residual block's end in the order cuDNN's
    precompiled fused convolutions take (conv, add, bias, activation: its CONV_ADD_BIAS_ACT
    form). With the bias first, cuDNN 9.19 proposes no such engine for the H200, only kernels
    compiled at run time (ResNet-50's conv3+bn3+add+relu ran at 36% of the memory bandwidth).
    The same sum in another order; only where the conv and its bias feed nothing else. Where
    both operands are such (a block's last conv plus its shortcut conv), the one computed first
    takes the residual: fusion grows the first conv's group over the sum, and the other keeps
    its bias (a conv + bias cuDNN has engines for)."""
    if node.op != "add" or len(node.inputs) != 2:
        return None
    found = [(bi, zi) for bi, zi in (node.inputs, node.inputs[::-1])
             if _conv_bias_alone(rw, bi, node.type.shape)
             and rw.node(zi).type.shape == node.type.shape]
    if not found:
        return None
    if len(found) == 2 and _position(rw, found[0][0]) > _position(rw, found[1][0]):
        found.reverse()
    bi, zi = found[0]
    bias = rw.node(bi)
    summed = rw.new("add", (bias.inputs[0], zi), {}, node.type, node, f"{node.name}.residual")
    return rw.new("bias_add", (summed, bias.inputs[1]), dict(bias.attrs), node.type, bias,
                  node.name)


def _position(rw: Rewriter, bias: str) -> int:
    """Where the conv under `bias` is in the graph built so far (asked only of a tie)."""
    conv = rw.node(rw.node(bias).inputs[0]).name
    return next(i for i, n in enumerate(rw.nodes) if n.name == conv)


def _conv_bias_alone(rw: Rewriter, name: str, shape: tuple[object, ...]) -> bool:
    """`name` is a conv's bias_add of `shape`, and neither value is read elsewhere."""
    bias = rw.node(name)
    if bias.op != "bias_add" or not rw.only_read_by_one(name) or bias.type.shape != shape:
        return False
    conv = rw.node(bias.inputs[0])
    return conv.op == "conv" and rw.only_read_by_one(conv.name)


def expand_norm_reductions(rw: Rewriter, node: Node) -> str | None:
    """cuDNN's reduction node has no L1 or L2 mode: sum(|x|) and sqrt(sum(x * x)) instead."""
    if node.op not in ("reduce_l1", "reduce_l2"):
        return None
    x = rw.node(node.inputs[0])
    attrs = dict(node.attrs)
    if node.op == "reduce_l1":
        pre = rw.new("abs", (x.name,), {}, x.type.with_shape(x.type.shape), node, f"{node.name}.abs")
        return rw.new("reduce_sum", (pre,), attrs, node.type, node, node.name)
    # The squares and their sum are the norm's own accumulation: held in f32 whatever the
    # model's intermediate dtype (an f16 norm of 300 overflowed as its square, 90,000; a
    # generated program, seed 117 #159), as PyTorch's f16 norm accumulates in f32.
    held = PrecisionSpec(node.precision.io, "f32", node.precision.compute)
    square = TensorType("f32", x.type.shape)
    pre = rw.new("mul", (x.name, x.name), {}, square, node, f"{node.name}.square", held)
    total = rw.new("reduce_sum", (pre,), attrs, TensorType("f32", node.type.shape), node,
                   f"{node.name}.sum", held)
    return rw.new("sqrt", (total,), {}, node.type, node, node.name)


def remove_dead(graph: Graph) -> Graph:
    """Drop every value no output depends on. Inputs and params stay: they are the model's
    interface (the runner takes every declared input, the weights file holds every param), read
    or not; so do writes in place: the caller's cache is their effect, read here or not. An
    amax reads the tensor it names (the calibration runs it), so that tensor lives while it does."""
    live = {v for _, v in graph.outputs} | {n.name for n in graph.nodes
                                             if n.op in ("input", "param", *IN_PLACE)}
    for node in reversed(graph.nodes):
        if node.name in live:
            live.update(node.inputs)
            if node.op == CALIBRATED:
                live.add(str(node.attrs["tensor"]))
    return Graph(tuple(n for n in graph.nodes if n.name in live), graph.outputs)
