"""Concatenation in place: a value that only a `concat` stores is written by its producer
straight into its slice of the concatenation's buffer (as TensorRT eliminates concats), so the
concat copies nothing for it. The value is then stored as a view of the concat: its storage has
the concat's strides and an offset, and its producer writes, and its readers read, through them.

A pure function of the lowered graph (and of which values are load-time), so the compiler, the
runtime and the bundle's readers agree without recording it. An operand stays a buffer of its
own, copied by the concat, when it is an input, a param, a load-time value, a view, another
concat or a write in place (whose memory is the caller's cache), a model output, an operand of
more than one concat (or twice of one), the base of a view (whose strides were planned in its own
memory), in another dtype or memory order than the concat, or when its slice could start off a
16-byte boundary (cuDNN's 16-byte vector stores) or has a stride off 16 bytes (`_aligned`), or
when a convolution computes it and its slice has gaps inside (`_conv_through_workspace`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping

from dslc.core import dims
from dslc.core.dims import Dim
from dslc.ir import views
from dslc.ir.graph import IN_PLACE, SOURCES, Graph, Node
from dslc.ir.interp import ITEMSIZE
from dslc.ops import OPS

NOT_PLACED = (*SOURCES, "view", "concat", *IN_PLACE)  # a write in place has its input's memory

Slice = tuple[str, tuple[Dim, ...], tuple[Dim, ...]]
Placement = Mapping[str, tuple[str, tuple[Slice]]]  # operand -> (concat, its slice there)


def in_place(graph: Graph, load_time: Collection[str]) -> dict[str, tuple[str, tuple[Slice]]]:
    """Operand -> (the concat it is written into, the view steps of its slice there)."""
    return _decided(graph, load_time)[0]


def why_copied(graph: Graph, load_time: Collection[str]) -> dict[str, str]:
    """Operand -> why its concat copies it (`dslc inspect` says so), for every operand of a
    laid-out concat not written in place."""
    return _decided(graph, load_time)[1]


def _decided(graph: Graph, load_time: Collection[str],
             ) -> tuple[dict[str, tuple[str, tuple[Slice]]], dict[str, str]]:
    nodes = graph.by_name()
    outputs = {v for _, v in graph.outputs}
    operand_uses = Counter(i for n in graph.nodes if n.op == "concat" for i in n.inputs)
    viewed = {n.inputs[0] for n in graph.nodes if n.op == "view"}
    readers = Counter(i for n in graph.nodes for i in n.inputs)
    out: dict[str, tuple[str, tuple[Slice]]] = {}
    why: dict[str, str] = {}
    for c in graph.nodes:
        if c.op != "concat" or c.type.layout is None:
            continue
        axis = int(c.attrs["axis"])
        start: Dim = 0
        for name in c.inputs:
            x = nodes[name]
            end = dims.add(start, x.type.shape[axis])
            step: Slice = ("slice", tuple(start if i == axis else 0 for i in range(c.type.rank)),
                           tuple(end if i == axis else d for i, d in enumerate(c.type.shape)))
            start = end
            found = views.strides(c.type.shape, c.type.layout, (step,))
            reason = _kept(x, found, name in load_time, name in outputs, name in viewed,
                           operand_uses[name], c)
            if reason is None and found is not None and \
                    _conv_through_workspace(nodes, readers, x, found[0]):
                reason = ("a convolution's result into a slice with gaps (cuDNN writes it "
                          "through a workspace, slower than this copy)")
            if reason is None:
                out[name] = (c.name, (step,))
            else:
                why.setdefault(name, reason)
    return out, why


_KEPT = {"input": "a model input (the caller's memory)", "view": "a view of another value "
         "(that value's memory)", "concat": "another concat's result", "param": "a weight",
         "scalar": "a constant"}


def _kept(x: Node, found: tuple[tuple[Dim, ...], Dim] | None, load_time: bool, output: bool,
          viewed: bool, uses: int, c: Node) -> str | None:
    """Why `x` keeps a buffer of its own (None: nothing keeps it, so far)."""
    if x.op in NOT_PLACED:
        return _KEPT.get(x.op, "a write in place into another value's memory (a cache)")
    if load_time:
        return "a load-time value"
    if output:
        return "a model output"
    if viewed:
        return "the base of a view"
    if uses != 1:
        return "an operand of another concat too, or twice of this one"
    if not _same_storage(x, c):
        return "in another dtype or memory order than the concat"
    if found is None or not _aligned(x, *found):
        return "its slice could start or step off 16 bytes (cuDNN's vector loads)"
    return None


def _conv_through_workspace(nodes: Mapping[str, Node], readers: Mapping[str, int], x: Node,
                            strides: tuple[Dim, ...]) -> bool:
    """Whether a convolution with a spatial kernel (with its epilogue) computes `x` and the
    slice has gaps inside (a channel slice of NHWC data: each pixel's channels at a pitch past
    their count), where it would cost more than the copy it saves. cuDNN's 3x3 convolutions
    wrote such an output through a workspace of the output's size: in the UNet on an H100
    (session 31, heuristics' plans, the same engine and knobs each pair) a 32-channel 3x3 conv
    at 256x256 took 32.4 us into its slice of the skip concat against 22.8 us for the same conv
    written densely, and a 64-channel one at 128x128 15.5 against 8.5 us, where copying the
    dense result takes 1.5-3 us. A 1x1 conv (a GEMM over the pixels, as an SPPF's first) was
    not measured so and stays in place."""
    return not _dense_but_outermost(x, strides) and _spatial_conv_under(nodes, readers, x, 8)


def _spatial_conv_under(nodes: Mapping[str, Node], readers: Mapping[str, int], at: Node,
                        depth: int) -> bool:
    """Whether `at` is a conv with a spatial kernel, or a pointwise op (an epilogue's) with such
    a conv under it through operands read by it alone (whichever operand: a residual sum may
    take the conv second), within `depth` ops."""
    if at.op == "conv":
        w = nodes[at.inputs[1]].type.shape
        return len(w) > 2 and any(d != 1 for d in w[2:])
    if depth == 0 or at.op not in OPS or OPS[at.op].family != "pointwise":
        return False
    return any(_spatial_conv_under(nodes, readers, nodes[i], depth - 1) for i in at.inputs
               if readers[i] == 1)


def _dense_but_outermost(x: Node, strides: tuple[Dim, ...]) -> bool:
    """Whether the slice's strides are those of `x` stored densely, but for its outermost axis
    of more than one element."""
    assert x.type.layout is not None  # placed operands are laid out (`_same_storage`)
    shape = x.type.shape
    real = [axis for axis in x.type.layout.order if shape[axis] != 1]  # outermost first
    dense = views.layout_strides(shape, x.type.layout)
    return all(strides[a] == dense[a] for a in real[1:])


def _aligned(x: Node, strides: tuple[Dim, ...], offset: Dim) -> bool:
    """Whether the slice starts on 16 bytes and either each of its strides (of an axis of more
    than one element, but the unit one) is a multiple of 16 bytes, or it is dense but for its
    outermost axis, whose stride is then a multiple of 16 bytes (a channel slice of NCHW data:
    a larger batch stride), or dense (a buffer of its own would be no other). On the H200 (cuDNN
    9.19) cuDNN's graphs read or wrote slices with a gap off 16 bytes inside them wrongly where
    the same values dense were right (generated programs found it: a maxpool's 16 channels
    written into 19 of an NHWC concat, read by a conv and its residual add; a conv's 4
    channels written into the first 4 of 6 columns: strides of 38 and 8 bytes)."""
    item = ITEMSIZE[x.type.dtype]
    shape = x.type.shape
    if not views.aligned(offset, item):
        return False
    if all(views.aligned(s, item) for s, d in zip(strides, shape, strict=True) if d != 1 and s != 1):
        return True
    assert x.type.layout is not None  # placed operands are laid out (`_same_storage`)
    real = [axis for axis in x.type.layout.order if shape[axis] != 1]  # outermost first
    dense = views.layout_strides(shape, x.type.layout)
    return _dense_but_outermost(x, strides) and (
        not real or strides[real[0]] == dense[real[0]] or views.aligned(strides[real[0]], item))


def _same_storage(x: Node, c: Node) -> bool:
    return x.type.dtype == c.type.dtype and x.type.layout is not None and \
        c.type.layout is not None and views.same_memory(x.type.shape, x.type.layout.order,
                                                        c.type.layout.order)


def slice_of(c: Node, steps: tuple[Slice]) -> tuple[tuple[Dim, ...], Dim]:
    """(strides, offset) of an operand's slice in the concat `c`'s memory."""
    assert c.type.layout is not None
    found = views.strides(c.type.shape, c.type.layout, steps)
    assert found is not None  # a slice of a laid-out tensor is always a view
    return found


def placed_in(placement: Mapping[str, tuple[str, tuple[Slice]]], concat: str) -> set[str]:
    """The operands of `concat` its producers write in place."""
    return {name for name, (c, _) in placement.items() if c == concat}
