"""What a step of the schedule must do, counted from the IR at concrete dims: its floating-point
operations and the bytes it moves, for a roofline (`dslc bench`).

Bytes are the physical limit of the fusion as built: a step reads each value it takes from
outside once (inputs, weights, a residual) and writes each value it stores once; what stays
inside a fused group (cuDNN's virtual tensors) moves no bytes. A view is read for its distinct
elements (a broadcast axis, stride 0, is read once); a `gather` reads the rows it picks; a
write in place (`cache_write`) reads the new rows and stores them, none of the rest of the cache.

FLOPs count a multiply-add as two. Tensor-core ops: `conv` 2 x out x (C/groups x window),
`conv_transpose` 2 x in x (K x window), `matmul` 2 x out x K, `sdpa` 2 x (D + Dv) per query-key
pair that the mask keeps (softmax not counted). Element-wise ops are one operation per output
element, whatever the function (a GELU is one); copies (`cast`, `contiguous`) and layout or index
ops none; reductions one per input element; pooling one per window element of each output;
norms a fixed count per element (`NORM_FLOPS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import prod

from dslc.core import dims as dimlib
from dslc.core.dims import Dim, DimEnv
from dslc.ir.graph import IN_PLACE, Node
from dslc.ir.interp import ITEMSIZE
from dslc.ops import OPS

TENSOR_OPS = ("conv", "conv_transpose", "matmul", "sdpa")
COPIES = ("cast", "contiguous")
# Per element: layernorm sums x and (x - mean)^2, subtracts, squares, scales by the inverse
# deviation, then the affine scale and shift (7); rmsnorm squares, sums, scales, and the affine
# scale (4); the others as layernorm.
NORM_FLOPS = {"layernorm": 7, "rmsnorm": 4, "batchnorm": 4, "instancenorm": 7, "groupnorm": 7}


@dataclass(frozen=True)
class Cost:
    flops: int
    bytes: int
    tensor_dtype: str | None  # the operand dtype of its tensor-core op; None: no such op

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else 0.0


class Sizes:
    """Concrete shapes of the graph's values at one binding of the dims."""

    def __init__(self, nodes: Mapping[str, Node], values: Mapping[str, int],
                 env: DimEnv | None = None) -> None:
        self.nodes, self.values, self.env = nodes, dict(values), env

    def value(self, d: Dim) -> int:
        return dimlib.evaluate(d, self.values, self.env)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.value(d) for d in self.nodes[name].type.shape)

    def numel(self, name: str) -> int:
        return prod(self.shape(name))

    def distinct(self, name: str) -> int:
        """Elements a read of `name` touches: a view's axes of stride 0 count once."""
        node = self.nodes[name]
        shape = self.shape(name)
        if node.op != "view":
            return prod(shape)
        strides = [self.value(s) for s in node.attrs["strides"]]
        return prod(n for n, s in zip(shape, strides, strict=True) if s != 0)

    def nbytes(self, name: str, elements: int | None = None) -> int:
        count = self.distinct(name) if elements is None else elements
        return count * ITEMSIZE[self.nodes[name].type.dtype]


def node_flops(node: Node, sizes: Sizes) -> int:
    """The floating-point operations of one node (see the module's doc for the counts)."""
    op, family = node.op, OPS[node.op].family if node.op in OPS else ""
    out = sizes.numel(node.name)
    if op == "conv":
        w = sizes.shape(node.inputs[1])
        return 2 * out * prod(w[1:])
    if op == "conv_transpose":
        w = sizes.shape(node.inputs[1])
        return 2 * sizes.numel(node.inputs[0]) * prod(w[1:])
    if op == "matmul":
        return 2 * out * sizes.shape(node.inputs[0])[-1]
    if op == "sdpa":
        return _sdpa_flops(node, sizes)
    if op in COPIES or family in ("layout", "index"):
        return 0
    if family == "pointwise":
        return out
    if family == "norm":
        return NORM_FLOPS.get(op, 7) * out
    if family == "reduce":
        return (2 if op == "genstats" else 1) * sizes.numel(node.inputs[0])
    if op in ("maxpool", "avgpool"):
        window = node.attrs["window"]
        rank = len(sizes.shape(node.name)) - 2
        counts = window if isinstance(window, tuple) else (window,) * rank
        return out * prod(sizes.value(w) for w in counts)
    if op == "upsample":
        return 0 if node.attrs.get("mode", "nearest") == "nearest" else 8 * out
    return out


def _sdpa_flops(node: Node, sizes: Sizes) -> int:
    operands = dict(zip(node.attrs.get("operands") or ("q", "k", "v"), node.inputs,
                        strict=False))
    b, h, sq, d = sizes.shape(operands["q"])
    skv = sizes.shape(operands["k"])[2]
    dv = sizes.shape(operands["v"])[3]
    window = node.attrs.get("window")
    pairs = kept_pairs(sq, skv, bool(node.attrs.get("causal")),
                       None if window is None else sizes.value(window),
                       node.attrs.get("align") == "bottom_right")
    return 2 * b * h * pairs * (d + dv)


def kept_pairs(sq: int, skv: int, causal: bool, window: int | None, bottom_right: bool) -> int:
    """Query-key pairs an attention mask keeps: query i sits at key i (top-left) or at
    i + skv - sq (bottom-right); `causal` drops the keys after it, `window` keeps the last
    `window` keys up to it."""
    if not causal and window is None:
        return sq * skv
    shift = skv - sq if bottom_right else 0
    total = 0
    for i in range(sq):
        at = i + shift
        hi = min(at, skv - 1) if causal else skv - 1
        lo = 0 if window is None else max(at - window + 1, 0)
        total += max(hi - lo + 1, 0)
    return total


def step_cost(sizes: Sizes, members: Iterable[str], inputs: Iterable[str],
              outputs: Iterable[str]) -> Cost:
    """The cost of one step: its nodes' FLOPs; the bytes of what it reads from outside (scalars
    are passed by value) and of what it stores."""
    nodes = [sizes.nodes[m] for m in members]
    flops = sum(node_flops(n, sizes) for n in nodes)
    # A write in place (`cache_write`) reads none of the cache and stores only the new rows.
    untouched = {n.inputs[0] for n in nodes if n.op in IN_PLACE}
    read = 0
    for name in inputs:
        if sizes.nodes[name].op == "scalar" or name in untouched:
            continue
        read += sizes.nbytes(name, _gathered(nodes, name, sizes))
    written = sum(sizes.nbytes(sizes.nodes[name].inputs[1]) if sizes.nodes[name].op in IN_PLACE
                  else sizes.nbytes(name) for name in outputs)
    tensor = next((n for n in nodes if n.op in TENSOR_OPS), None)
    dtype = sizes.nodes[tensor.inputs[0]].type.dtype if tensor is not None else None
    return Cost(flops, read + written, dtype)


def _gathered(nodes: list[Node], name: str, sizes: Sizes) -> int | None:
    """The elements a `gather` of the table `name` reads (the rows it picks), if only gathers
    read it in this step; None: read whole."""
    readers = [n for n in nodes if name in n.inputs]
    if not readers or any(n.op != "gather" or n.inputs[0] != name for n in readers):
        return None
    return min(sizes.distinct(name), sum(sizes.numel(n.name) for n in readers))
