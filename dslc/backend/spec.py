"""A group at concrete sizes, as plain data: its tensors (cuDNN dims, strides, dtype, uid, role)
and its ops (attrs with every dim evaluated). A `GroupSpec` is what `build` turns into a cuDNN
graph; it is stored in the bundle, so the runtime can rebuild any graph without the compiler.

Tensors are shaped in the group's cuDNN form: broadcast operands padded to the group's rank,
a bias vector placed on its axis, the dims a reduction drops kept as 1s, and two rank
conventions of cuDNN: a matmul group in rank 3 ([batch, M, N]), a layernorm or rmsnorm group as
rows ([prod(L), D, 1, 1]), and a 1-d convolution's group as a 2-d one over a single row ([N, C, T]
as [N, C, 1, T], its window, stride and padding given the row's). Uids follow the order of the
tensors, so groups with one signature get identical specs up to names and share one plan.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dslc.core.dims import DimEnv
from dslc.core.types import Layout
from dslc.ir.graph import Graph, Node, compute_dtype, stored_dtype
from dslc.ir.groups import Group
from dslc.ir.interp import concrete
from dslc.ir.placement import Placement, slice_of
from dslc.ir.serial import plain
from dslc.ir.views import layout_strides
from dslc.ops import OPS
from dslc.ops.attention import named_operands

ROWS_OPS = ("layernorm", "rmsnorm")
NORM_OPS = ("layernorm", "rmsnorm", "instancenorm", "batchnorm")
CONV_OPS = ("conv", "conv_transpose")


class SpecError(Exception):
    """The group cannot be put in cuDNN's form (e.g. rows that are not contiguous)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str  # the IR value name (the cuDNN tensor name)
    uid: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    role: str  # input | output | virtual | scalar
    value: float = 0.0  # for scalars (pass-by-value)

    def data(self) -> dict[str, Any]:
        return {"name": self.name, "uid": self.uid, "dims": list(self.dims),
                "strides": list(self.strides), "dtype": self.dtype, "role": self.role,
                "value": self.value}


@dataclass(frozen=True)
class OpSpec:
    node: str
    op: str
    inputs: tuple[str, ...]
    attrs: dict[str, Any]
    compute: str

    def data(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "inputs": list(self.inputs),
                "attrs": plain(self.attrs), "compute": self.compute}


@dataclass(frozen=True)
class GroupSpec:
    signature: str
    tensors: tuple[TensorSpec, ...]
    ops: tuple[OpSpec, ...]
    io: str
    intermediate: str
    compute: str

    def tensor(self, name: str) -> TensorSpec:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def bound(self, names: Sequence[str]) -> list[tuple[int, str]]:
        """(uid, value) of each input and output tensor: a tensor's uid is its value's position
        in `names` (a step's inputs, then its nodes) plus one."""
        return [(t.uid, names[t.uid - 1]) for t in self.tensors if t.role in ("input", "output")]

    def data(self) -> dict[str, Any]:
        return {"signature": self.signature, "tensors": [t.data() for t in self.tensors],
                "ops": [o.data() for o in self.ops], "io": self.io,
                "intermediate": self.intermediate, "compute": self.compute}

    @staticmethod
    def from_data(d: Mapping[str, Any]) -> GroupSpec:
        return GroupSpec(
            d["signature"],
            tuple(TensorSpec(t["name"], t["uid"], tuple(t["dims"]), tuple(t["strides"]),
                             t["dtype"], t["role"], t.get("value", 0.0)) for t in d["tensors"]),
            tuple(OpSpec(o["node"], o["op"], tuple(o["inputs"]), dict(o["attrs"]), o["compute"])
                  for o in d["ops"]),
            d["io"], d["intermediate"], d["compute"])



def storage(graph_nodes: Mapping[str, Node], name: str, values: Mapping[str, int],
            env: DimEnv | None = None, placement: Placement | None = None,
            ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Concrete (shape, strides, element offset) of a stored value, in its base's memory (a
    concat operand written in place: in the concat's, `placement`)."""
    node = graph_nodes[name]
    shape = tuple(int(concrete(d, values, env)) for d in node.type.shape)
    if placement and name in placement:
        concat, steps = placement[name]
        st, offset = slice_of(graph_nodes[concat], steps)
        return (shape, tuple(int(concrete(s, values, env)) for s in st),
                int(concrete(offset, values, env)))
    if node.op == "view":
        strides = tuple(int(concrete(s, values, env)) for s in node.attrs["strides"])
        return shape, strides, int(concrete(node.attrs["offset"], values, env))
    assert node.type.layout is not None, name
    return shape, tuple(_strides(list(shape), node.type.layout)), 0


def _strides(shape: list[int], layout: Layout) -> list[int]:
    out = []
    for s in layout_strides(tuple(shape), layout):
        assert isinstance(s, int)  # concrete shape, concrete strides
        out.append(s)
    return out


def own_strides(shape: list[int], layout: Layout | None) -> list[int]:
    """The strides of a value a group computes (not read from a storage): dense in its layout's
    order, row-major without one. A graph writes them, and a split group's scratch holds its
    anchor's result so (`runtime.split`)."""
    return _strides(shape, layout) if layout is not None else _dense(shape)


def _dense(shape: list[int]) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return strides


def _insert_axes(shape: list[int], strides: list[int], axes: list[int]) -> tuple[list[int],
                                                                                 list[int]]:
    """Put back size-1 axes (a reduction's dropped axes), with strides a dense tensor would have."""
    for axis in sorted(axes):
        inner = strides[axis] * shape[axis] if axis < len(shape) else 1
        shape.insert(axis, 1)
        strides.insert(axis, inner)
    return shape, strides


def _pad(shape: list[int], strides: list[int], rank: int) -> tuple[list[int], list[int]]:
    while len(shape) < rank:
        strides.insert(0, (strides[0] * shape[0]) if shape else 1)
        shape.insert(0, 1)
    return shape, strides


def _merge(shape: list[int], strides: list[int], lo: int, hi: int) -> tuple[int, int]:
    """Axes lo..hi-1 as one axis, if their strides chain (size-1 axes are free)."""
    real = [i for i in range(lo, hi) if shape[i] != 1]
    for a, b in itertools.pairwise(real):
        if strides[a] != strides[b] * shape[b]:
            raise SpecError("axes that cuDNN needs merged are not contiguous in memory")
    size = math.prod(shape[lo:hi])
    return size, (strides[real[-1]] if real else size)


class _Shaper:
    """The cuDNN form of every tensor of one group (see the module docstring)."""

    def __init__(self, group: Group, nodes: Mapping[str, Node], values: Mapping[str, int],
                 env: DimEnv | None, placement: Placement | None = None) -> None:
        self.group = group
        self.placement = placement or {}
        self.nodes = nodes
        self.values = values
        self.env = env
        anchor = nodes[group.anchor]
        self.rank = max(len(nodes[n].type.shape) for n in group.nodes)
        self.dropped: dict[str, list[int]] = {}  # value -> axes a reduction dropped upstream
        for name in group.nodes:
            node = nodes[name]
            if node.op.startswith("reduce_") and not node.attrs.get("keepdims"):
                self.dropped[name] = list(node.attrs["axes"])
                self.rank = max(self.rank, len(nodes[node.inputs[0]].type.shape))
            elif node.inputs and node.inputs[0] in self.dropped:
                self.dropped[name] = self.dropped[node.inputs[0]]
        self.form = ("rows" if anchor.op in ROWS_OPS else "rank3" if anchor.op == "matmul"
                     else "channels" if anchor.op == "instancenorm"
                     else "one_row" if over_one_row(anchor)
                     else "natural")
        if self.form == "rank3" and not self._batch_merges(anchor):
            self.form = "batched"

    def _batch_merges(self, anchor: Node) -> bool:
        """Whether each matmul operand's batch axes are all the result's or all 1, so they merge
        into cuDNN's one batch axis. An operand broadcast along some of them (a [B, 1, M, K]
        times a [2, K, N]: a transposed convolution as a matmul) keeps the axes apart: cuDNN
        broadcasts per batch axis."""
        out = [int(concrete(d, self.values, self.env)) for d in anchor.type.shape][:-2]
        for name in anchor.inputs:
            dims = [int(concrete(d, self.values, self.env))
                    for d in self.nodes[name].type.shape][:-2]
            dims = [1] * (len(out) - len(dims)) + dims
            if dims != out and math.prod(dims) != 1:
                return False
        return True

    def shape(self, name: str, used_by: Node | None = None) -> tuple[list[int], list[int]]:
        node = self.nodes[name]
        if node.op == "scalar":
            return [1] * max(self.rank, 1), [1] * max(self.rank, 1)
        if node.name in self.group.nodes and node.name not in self.placement:
            shape = [int(concrete(d, self.values, self.env)) for d in node.type.shape]
            layout = node.type.layout
            strides = own_strides(shape, layout)
        else:  # read from (or, written in place into a concat, written to) its storage
            s, st, _ = storage(self.nodes, name, self.values, self.env, self.placement)
            shape, strides = list(s), list(st)
        if name in self.dropped:
            shape, strides = _insert_axes(shape, strides, self.dropped[name])
        if used_by is not None and used_by.op in ("bias_add", "scale_mul") and \
                used_by.inputs[1] == name and len(shape) == 1:
            axis = int(used_by.attrs["axis"])
            full = len(self.nodes[used_by.inputs[0]].type.shape)
            shape = [shape[0] if i == axis else 1 for i in range(full)]
            strides = self._fill_ones(shape, [strides[0] if i == axis else 1 for i in range(full)])
        if used_by is not None and used_by.op == "sdpa" and name in _lengths_of(used_by):
            return [shape[0], 1, 1, 1], [1, 1, 1, 1]  # cuDNN's padding-mask lengths
        shape, strides = _pad(shape, strides, self.rank)
        return self._form(shape, strides)

    @staticmethod
    def _fill_ones(shape: list[int], strides: list[int]) -> list[int]:
        out = list(strides)
        for i in range(len(shape) - 1, -1, -1):
            if shape[i] == 1:
                out[i] = out[i + 1] * shape[i + 1] if i + 1 < len(shape) else 1
        return out

    def _form(self, shape: list[int], strides: list[int]) -> tuple[list[int], list[int]]:
        if self.form in ("rank3", "batched"):
            if len(shape) < 3 or self.form == "batched":
                return _pad(shape, strides, max(3, len(shape)))
            batch, bstride = _merge(shape, strides, 0, len(shape) - 2)
            return [batch, *shape[-2:]], [bstride, *strides[-2:]]
        if self.form == "rows":
            anchor = self.nodes[self.group.anchor]
            norm_axes = len(anchor.attrs["axes"])
            lead = len(shape) - norm_axes
            rows, rstride = _merge(shape, strides, 0, lead)
            cols, cstride = _merge(shape, strides, lead, len(shape))
            return [rows, cols, 1, 1], [rstride, cstride, cstride, cstride]
        if self.form == "one_row":
            # cuDNN's convolutions are 2-d and 3-d (a rank-3 [1, N, C, T] was refused, `xDimA[1]
            # != wDimA[0]`, and the conv ran as a fallback kernel): the unit axis is the height
            return [*shape[:2], 1, shape[2]], [*strides[:2], strides[2] * shape[2], strides[2]]
        if self.form == "channels" and len(shape) < 4:
            # An instance norm reads axis 0 as the batch and 1 as the channels: size-1 axes go
            # after the spatial ones ([N, C, L] as [N, C, L, 1]), not before (generated
            # programs found [1, N, C, L] normalising the wrong axes on the H200).
            pad = 4 - len(shape)
            return [*shape, *[1] * pad], [*strides, *[1] * pad]
        # cuDNN pointwise and reduction graphs take rank 3 and up, and on the H200 a rank-3
        # pointwise graph read a broadcast operand (a [1, 1, C] vector) wrongly where the same
        # graph at rank 4 is right: pad to 4 (generated programs found it).
        if len(shape) < 4:
            return _pad(shape, strides, 4)
        return shape, strides


# A 1-d convolution's window attributes, and what the unit height axis adds to each.
_ONE_ROW = {"stride": 1, "dilation": 1, "pad": 0, "pre_pad": 0, "post_pad": 0, "output_pad": 0}


def over_one_row(anchor: Node) -> bool:
    """Whether a group anchored at this node takes the 2-d form of a 1-d convolution."""
    return anchor.op in CONV_OPS and anchor.type.rank == 3


def one_row_attrs(op: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes of an op of a 1-d convolution's group in the 2-d form ([N, C, 1, T]): the
    window's over the unit height, an epilogue's axis past it moved one on."""
    out = dict(attrs)
    if op in CONV_OPS:
        out.update({k: (unit, *out[k]) for k, unit in _ONE_ROW.items() if out.get(k) is not None})
    elif "axis" in out and int(out["axis"]) >= 2:
        out["axis"] = int(out["axis"]) + 1
    return out


def _lengths_of(sdpa: Node) -> set[str]:
    """The values an sdpa reads as sequence lengths (`kv_len`, and the `q_len` lowering adds)."""
    return {i for n, i in named_operands(sdpa.attrs, sdpa.inputs).items()
            if n in ("kv_len", "q_len")}


def _broadcastable(tensors: list[TensorSpec], ops: tuple[OpSpec, ...], anchor: str) -> None:
    """Every operand an epilogue reads from outside the group is 1 or the anchor's size on each
    axis, and a full-size one has the anchor result's strides. Merging axes into cuDNN's form
    (a matmul's batch, a norm's rows) can break the first: a bias along one of the merged axes
    is 8 where the merged batch is N * 8. Such a group is split (SpecError), not run wrong."""
    by_name = {t.name: t for t in tensors}
    sizes, strides = by_name[anchor].dims, by_name[anchor].strides
    anchor_op = next(op.op for op in ops if op.node == anchor)
    epilogue = [op.node for op in ops][[op.node for op in ops].index(anchor) + 1:]
    for op in ops:
        # the epilogue: the ops after the anchor (before it, in a step of the few-row matmul
        # kernel, a norm of its input or a second matmul: `backend.gemv`, never cuDNN's)
        if op.node not in epilogue:
            continue
        for name in op.inputs:
            t = by_name[name]
            if t.role != "input" or len(t.dims) != len(sizes):
                continue
            # A norm graph whose epilogue reads a second full-size tensor (rmsnorm, then max
            # with the norm's own input) ended in an illegal memory access on the H200
            # (generated programs found it): the epilogue runs as its own graph.
            if anchor_op in NORM_OPS and math.prod(t.dims) == math.prod(sizes):
                raise SpecError(f"a norm's epilogue reads the full-size tensor `{name}`")
            # A channels-last convolution whose epilogue reads an operand broadcast along a
            # spatial or the batch axis (a scale along W, a [1, 1, H, W] residual) computed
            # wrongly on the H200, NaN in f16 (generated programs found it): split.
            if anchor_op in CONV_OPS and strides[1] == 1 and tuple(t.dims) != tuple(sizes) and \
                    any(d > 1 for i, d in enumerate(t.dims) if i != 1):
                raise SpecError(f"`{name}` broadcasts along a spatial axis of a channels-last "
                                f"convolution ({list(t.dims)} against {list(sizes)})")
            if any(d not in (1, n) for d, n in zip(t.dims, sizes, strict=True)):
                raise SpecError(f"`{name}` broadcasts over part of axes cuDNN merges "
                                f"({list(t.dims)} against {list(sizes)})")
            # A full-size operand in another memory order than the anchor's result (an NCHW
            # residual added to an NHWC conv output) was read wrongly by a fused f16 epilogue on
            # the H200: the add runs as its own graph instead.
            if tuple(t.dims) == tuple(sizes) and any(
                    n > 1 and a != b for n, a, b in zip(sizes, t.strides, strides, strict=True)):
                raise SpecError(f"`{name}` is laid out unlike the result it is combined with")


def _base(nodes: Mapping[str, Node], name: str) -> str:
    while nodes[name].op == "view":
        name = nodes[name].inputs[0]
    return name


def _operands_apart(nodes: Mapping[str, Node], group: Group) -> None:
    """On the H200 (cuDNN 9.19) a matmul whose two operands are one tensor's memory
    (`matmul(x, x)`, `matmul(x, transpose(x))`) computed wrongly once an epilogue was fused
    (`* 0.316`, `sin`, `abs(..) + 0.5`), in f32, f16 and bf16, where the matmul alone is right
    (generated programs found it): its epilogue runs as a graph of its own."""
    anchor = nodes[group.anchor]
    if anchor.op == "matmul" and len(group.nodes) > 1 and \
            _base(nodes, anchor.inputs[0]) == _base(nodes, anchor.inputs[1]):
        raise SpecError(f"both operands of `{anchor.name}` are the memory of "
                        f"`{_base(nodes, anchor.inputs[0])}`")


def _window_inside_image(tensors: list[TensorSpec], ops: tuple[OpSpec, ...], anchor: str) -> None:
    """A convolution of a kernel wider than one pixel over a one-pixel image (a 3x3 over
    [N, C, 1, 1]) runs its reference as a fallback kernel (the split ends there). On the H200 a
    3x3 conv over genstats' per-channel sums, a [1, C, 1, 1] value in the arena, was 7% off
    (generated programs 3 and 147 of seed 15, 356 of seed 16, 484 of seed 17; an earlier one
    ended in an illegal memory access), whether genstats ran on cuDNN or on CuPy, while the same
    conv over a model input was right: the cause is not pinned down (a read past the image
    where padding should be would explain it). This rule has not run on the H200 yet."""
    op = next(o for o in ops if o.node == anchor)
    if op.op != "conv":
        return
    by_name = {t.name: t for t in tensors}
    x, w = by_name[op.inputs[0]], by_name[op.inputs[1]]
    spatial = range(2, len(x.dims))
    if any(x.dims[i] == 1 and w.dims[i] > 1 for i in spatial):
        raise SpecError(f"`{anchor}` convolves a {list(w.dims[2:])} window over a one-pixel image")


def _broadcast_outermost(tensors: list[TensorSpec], ops: tuple[OpSpec, ...]) -> None:
    """An `expand` runs on cuDNN (an identity over the broadcast operand) only where the axes it
    broadcasts lie outside the others in memory (a class token repeated over the batch); else
    a fallback kernel copies it. cuDNN's identity broadcasting the innermost axis of a
    channels-last result was wrong on the H200 (program 137 of seed 17, shrunk to
    expand(relu(conv(x)), [2, 2, 4, 4]) with x [2, 1, 4, 4] NHWC: 100% off)."""
    by_name = {t.name: t for t in tensors}
    for op in ops:
        if op.op != "expand":
            continue
        x, y = by_name[op.inputs[0]], by_name[op.node]
        order = sorted(range(len(y.dims)), key=lambda i: -y.strides[i])
        spread = [x.dims[i] == 1 and y.dims[i] > 1 for i in order if y.dims[i] > 1]
        if any(not a and b for a, b in itertools.pairwise(spread)):
            raise SpecError(f"`{op.node}` broadcasts an axis inside another in memory")


def _batch_outermost_kept(tensors: list[TensorSpec], ops: tuple[OpSpec, ...]) -> None:
    """A pointwise op (a copy included) runs on cuDNN only where the first axis (the batch),
    if longer than 1, is outermost in memory (the largest stride, axes of size 1 aside) in both
    an operand it reads from memory at its own shape and its result, or in neither; else a
    fallback kernel runs it. cuDNN's pointwise kernels computed such transposes wrongly on the
    H200: the copy of `transpose(x, perm=[1, 0, 2, 3])` of an NHWC [2, 3, 4, 5] into
    channels-last was 161% off, relu of it 100%, a conv over an NCHW transpose read through its
    channels-last copy 210% (programs 81 and 304 of seed 14). Every permutation probed: from
    NHWC [1, 0, 2, 3] and [2, 0, 3, 1], into channels-last from NCHW [1, 0, 2, 3] and
    [3, 0, 1, 2] were wrong, the other 136 right. Each wrong one takes the batch from outermost
    in the result to inside in the operand; the rule is wider than them (which of such moves
    cuDNN gets right is not understood), and models keep the batch outermost: the layout copies
    of a batch of one (NCHW to NHWC at N = 1) stay on cuDNN."""
    by_name = {t.name: t for t in tensors}

    def batch_outermost(t: TensorSpec) -> bool:
        return max((i for i, d in enumerate(t.dims) if d > 1), key=lambda i: t.strides[i],
                   default=-1) == 0

    for op in ops:
        if OPS[op.op].family != "pointwise" or op.node not in by_name:
            continue
        result = by_name[op.node]
        for name in op.inputs:
            x = by_name.get(name)
            if x is not None and x.role == "input" and x.dims == result.dims and \
                    x.dims[:1] != (1,) and batch_outermost(x) != batch_outermost(result):
                raise SpecError(f"`{op.node}` moves the batch axis of `{name}` from outermost "
                                f"in memory or to it (strides {list(x.strides)} to "
                                f"{list(result.strides)})")


def _copied_size_one_axes_outermost(tensors: list[TensorSpec], ops: tuple[OpSpec, ...],
                                    ) -> list[TensorSpec]:
    """The operand of a copy with a size-1 axis whose stride ties another axis's (a transposed
    [2, 1, 12, 7] read as [1, 2, 12, 7], strides [84, 84, 7, 1]) gets that axis the outermost
    stride: the same addresses, and no tie. cuDNN's copy from such a view into channels-last
    was 60% off on the H200 (program 116 of seed 18), where a copy of the packed tensor was
    right."""
    copied = {op.inputs[0] for op in ops if op.op == "contiguous"}
    out = []
    for t in tensors:
        if t.name in copied and t.role == "input" and 1 in t.dims:
            top = max((s * d for s, d in zip(t.strides, t.dims, strict=True)), default=1)
            strides = tuple(top if d == 1 and any(s == o for j, o in enumerate(t.strides)
                                                  if j != i) else s
                            for i, (d, s) in enumerate(zip(t.dims, t.strides, strict=True)))
            t = replace(t, strides=strides)
        out.append(t)
    return out


def group_spec(graph: Graph, group: Group, values: Mapping[str, int], env: DimEnv | None = None,
               placement: Placement | None = None) -> GroupSpec:
    """The cuDNN form of `group` at the dim values `values` (raises SpecError); `placement`:
    the concat operands written in place (`dslc.ir.placement.in_place`)."""
    nodes = graph.by_name()
    shaper = _Shaper(group, nodes, values, env, placement)
    users: dict[str, Node] = {}
    for name in group.nodes:
        for i in nodes[name].inputs:
            users.setdefault(i, nodes[name])
    tensors: list[TensorSpec] = []
    for name in group.inputs:
        node = nodes[name]
        dims_, strides = shaper.shape(name, users.get(name))
        role = "scalar" if node.op == "scalar" else "input"
        value = float(node.attrs["value"]) if node.op == "scalar" else 0.0
        tensors.append(TensorSpec(name, len(tensors) + 1, tuple(dims_), tuple(strides),
                                  node.type.dtype, role, value))
    anchor = nodes[group.anchor]
    for name in group.nodes:
        node = nodes[name]
        dims_, strides = shaper.shape(name)
        role = "output" if name in group.outputs else "virtual"
        dtype = stored_dtype(node, role == "virtual")
        tensors.append(TensorSpec(name, len(tensors) + 1, tuple(dims_), tuple(strides), dtype,
                                  role))
    ops = tuple(OpSpec(name, nodes[name].op, nodes[name].inputs,
                       {k: concrete(v, values, env) for k, v in nodes[name].attrs.items()},
                       compute_dtype(nodes[name]))
                for name in group.nodes)
    if shaper.form == "one_row":
        ops = tuple(replace(op, attrs=one_row_attrs(op.op, op.attrs)) for op in ops)
    _broadcastable(tensors, ops, group.anchor)
    _operands_apart(nodes, group)
    _window_inside_image(tensors, ops, group.anchor)
    _broadcast_outermost(tensors, ops)
    tensors = _copied_size_one_axes_outermost(tensors, ops)
    _batch_outermost_kept(tensors, ops)
    # cuDNN's attention with f16 or bf16 intermediates and a window or a bias gave wrong
    # numbers on the H200 (generated programs; f32 intermediates are right): an sdpa graph has
    # no virtual tensors of dslc's, so f32 there changes nothing the reference rounds.
    intermediate = "f32" if anchor.op == "sdpa" else anchor.precision.intermediate
    return GroupSpec(group.signature, tuple(tensors), ops, anchor.precision.io, intermediate,
                     anchor.precision.compute)

