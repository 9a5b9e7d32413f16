"""Views and layouts: reshape / transpose / slice chains become one `view` of a materialised
base; every other value gets a memory layout (fixed by the user, or chosen: channels-last for
convolution chains, BSHD for attention outputs, row-major elsewhere); each view gets its strides
in its base, with a row-major copy inserted where a reshape cannot be a view."""

from __future__ import annotations

from dataclasses import replace

from dslc.core.dims import Dim
from dslc.core.types import FP8, Layout, TensorType, format_shape
from dslc.ir import views
from dslc.ir.graph import Attrs, Node
from dslc.ir.interp import ITEMSIZE
from dslc.ir.verify import effective_type
from dslc.lower.rewrite import Rewriter
from dslc.ops import OPS
from dslc.ops.layout import reshape_layout
from dslc.ops.opdef import Kind
from dslc.ops.pointwise import COMPARE

VIEW_OPS = ("reshape", "transpose", "slice")
CHANNELS_LAST = {3: (0, 2, 1), 4: (0, 2, 3, 1), 5: (0, 2, 3, 4, 1)}
_SPATIAL = ("conv", "conv_transpose", "maxpool", "avgpool", "upsample")


def _step(node: Node) -> tuple[object, ...]:
    if node.op == "transpose":
        return ("transpose", tuple(node.attrs["perm"]))
    if node.op == "reshape":
        return ("reshape", tuple(node.attrs["shape"]))
    return ("slice", tuple(node.attrs["starts"]), tuple(node.attrs["ends"]))


def make_views(rw: Rewriter, node: Node) -> str | None:
    """A view op becomes a `view` of the nearest value that is not itself a view."""
    if node.op not in VIEW_OPS:
        return None
    x = rw.node(node.inputs[0])
    base, steps = (x.inputs[0], x.attrs["steps"]) if x.op == "view" else (x.name, ())
    typ = TensorType(node.type.dtype, node.type.shape, None)
    return rw.new("view", (base,), {"steps": (*steps, _step(node))}, typ, node, node.name)


def _chosen_layout(rw: Rewriter, node: Node) -> Layout:
    rank = node.type.rank
    if node.op in _SPATIAL and rank in CHANNELS_LAST:
        return Layout(CHANNELS_LAST[rank])
    if node.op == "sdpa":
        return Layout((0, 2, 1, 3), "BSHD")  # the merge of the heads back is then a view
    if node.op not in ("matmul", "reduce_sum", "concat") and node.inputs:
        # A pointwise op writes in the memory order its first operand is read in, a view's
        # included (its order in its base): ConvNeXt's layer scale, on the channels-first view
        # of a channels-last matmul result, was written row-major and so could not fuse with
        # the residual add of the channels-last input (a group in one memory order, see
        # `fuse.patterns`): two steps where one does.
        pointwise = OPS[node.op].fusion == "epilogue"
        seen = _seen_as(rw, node.inputs[0]) if pointwise else rw.node(node.inputs[0]).type
        if seen.shape == node.type.shape and seen.layout is not None:
            return seen.layout
    if node.op == "concat":
        # in the memory order its first part is read in, a view's included (a UNet's upsample,
        # a view of a matmul's result, joined with the skip connection for a conv: channels-
        # last, where row-major cost a second copy for the conv)
        first = _seen_as(rw, node.inputs[0])
        if first.layout is not None and first.rank == rank:
            return first.layout
    return Layout.row_major(rank)


def assign_layouts(rw: Rewriter, node: Node) -> str | None:
    if node.op == "view":
        return _place_view(rw, node, node.inputs[0], tuple(node.attrs["steps"]))
    node = replace(node, inputs=tuple(_aligned(rw, i) for i in node.inputs))
    fixed = node.type.layout is not None  # an output's contract, an ascription
    if not fixed:
        layout = _chosen_layout(rw, node)
        node = replace(node, type=TensorType(node.type.dtype, node.type.shape, layout))
    new = fp8_operands_k_major(rw, conv_in_one_memory_order(rw, select_in_one_memory_order(
        rw, copy_for_layout_rules(rw, node))))
    if new.op == "matmul" and not matmul_writes(new.type):
        new = replace(new, type=TensorType(new.type.dtype, new.type.shape,
                                           Layout.row_major(new.type.rank)))
    if not fixed or new.type.layout == node.type.layout:
        return rw.emit(new)
    # The op writes in the order it needs; the value keeps the layout it was given, via a copy.
    suffix = "channels_last_out" if new.op in ("conv", "conv_transpose") else "row_major_out"
    inner = rw.emit(replace(new, name=f"{node.name}.{suffix}"))
    return rw.new("contiguous", (inner,), {}, node.type, node, node.name)


def matmul_writes(t: TensorType) -> bool:
    """Whether a matmul can write its result in `t`'s memory order: cuDNN's matmul writes its
    batch axes outermost, in order, and its last two axes innermost (either way round); axes of
    size 1 may stand anywhere. An output held to another order (a rank-4 value of a `layout
    NHWC` model) is written row-major and copied: else cuDNN had no form for the matmul, and an
    fp8 one no fallback either (generated program 179 of seed 103)."""
    if t.layout is None:
        return True
    rank = t.rank
    order = [a for a in t.layout.order if t.shape[a] != 1]
    batch = [a for a in order if a < rank - 2]
    return order[:len(batch)] == sorted(batch)  # the matrix axes, then, come last


def _copy_into(rw: Rewriter, name: str, order: tuple[int, ...], like: Node, key: str) -> str:
    """`name` copied into memory order `order` (a node named `key`, derived from `like`), made
    once for all its readers."""
    if key not in rw.memo:
        t = rw.node(name).type
        rw.memo[key] = rw.new("contiguous", (name,), {},
                              TensorType(t.dtype, t.shape, Layout(order)), like, key)
    return rw.memo[key]


def select_in_one_memory_order(rw: Rewriter, node: Node) -> Node:
    """A `select` reads its full-size operands in its result's memory order: on the H200, cuDNN's
    three-operand select computed wrongly when its condition and values were stored in different
    orders (NHWC and NCHW), in f32 as in f16, where a two-operand add of the same tensors was
    right (generated programs found it). Operands in another order are read through copies;
    a mask is compared again in that order instead (`_mask_in_order`)."""
    if node.op != "select" or node.type.layout is None:
        return node
    order = node.type.layout.order
    inputs = []
    for i in node.inputs:
        if _in_order(rw, i, node.type.shape, order):
            inputs.append(i)
        elif i == node.inputs[0] and rw.node(i).op in COMPARE:
            inputs.append(_mask_in_order(rw, rw.node(i), order))
        else:
            inputs.append(_copy_into(rw, i, order, node, f"{i}.{_order_name(order)}"))
    return replace(node, inputs=tuple(inputs))


def _in_order(rw: Rewriter, name: str, shape: tuple[object, ...], order: tuple[int, ...]) -> bool:
    """Whether `name` is read in memory order `order` as it is (or is broadcast: no order)."""
    seen = _seen_as(rw, name)
    return seen.shape != shape or seen.layout is None or \
        views.same_memory(seen.shape, seen.layout.order, order)


def _mask_in_order(rw: Rewriter, mask: Node, order: tuple[int, ...]) -> str:
    """The comparison `mask` again, written in memory order `order` from its operands read in
    that order. cuDNN stores a bool tensor as bits, eight to a byte (seen on the H200: a mask of
    1,056 values filled 132 bytes), so a copy of a mask into another order, where each element
    sets one bit of a byte that others write too, came out wrong; comparing again costs what a
    copy costs."""
    inputs = tuple(i if _in_order(rw, i, mask.type.shape, order)
                   else _copy_into(rw, i, order, mask, f"{i}.{_order_name(order)}")
                   for i in mask.inputs)
    name = f"{mask.name}.{_order_name(order)}"
    if name not in rw.memo:
        rw.memo[name] = rw.new(mask.op, inputs, dict(mask.attrs),
                               TensorType(mask.type.dtype, mask.type.shape, Layout(order)), mask,
                               name)
    return rw.memo[name]


def _order_name(order: tuple[int, ...]) -> str:
    if order == tuple(range(len(order))):
        return "row_major"
    return "channels_last" if order == CHANNELS_LAST.get(len(order)) else \
        "order_" + "".join(map(str, order))


def conv_in_one_memory_order(rw: Rewriter, node: Node) -> Node:
    """A convolution reads its data and writes its result channels-last: on the H200, cuDNN
    computed convolutions whose data and result are in different memory orders (NCHW in, NHWC
    out, or the reverse) wrongly, in f32 as in f16 (generated programs found it). Data in
    another order is read through a channels-last copy, made once for all its readers; a
    result whose layout is fixed otherwise is written channels-last and copied (the caller).
    Data that is a view with gaps (a slice of the image's rows) is copied too: cuDNN computed
    a conv over such a view wrongly on the H200 (program 164 of seed 13, shrunk to a 3x3 conv
    over `x[:, :, 0:2, :]`, 77% off)."""
    order = CHANNELS_LAST.get(node.type.rank)
    if node.op not in ("conv", "conv_transpose") or order is None:
        return node
    x = node.inputs[0]
    seen = _seen_as(rw, x).layout
    data = rw.node(x)
    gaps = data.op == "view" and not views.dense(data.type.shape, data.attrs["strides"], order)
    if gaps or seen is None or not views.same_memory(data.type.shape, seen.order, order):
        x = _copy_into(rw, x, order, node, f"{x}.channels_last")
    typ = TensorType(node.type.dtype, node.type.shape, Layout(order))
    return replace(node, inputs=(x, *node.inputs[1:]), type=typ)


def fp8_operands_k_major(rw: Rewriter, node: Node) -> Node:
    """An fp8 matmul reads both operands with the axis it contracts innermost (a [.., M, K] by
    rows, b [.., K, N] by columns): the only layout Hopper's fp8 GEMMs take ("TN"). An operand
    in another order is read through a copy (a weight's, made once at load time)."""
    if node.op != "matmul" or rw.node(node.inputs[0]).type.dtype not in FP8:
        return node
    inputs = []
    for index, name in enumerate(node.inputs):
        seen = _seen_as(rw, name)
        rank = seen.rank
        order = tuple(range(rank)) if index == 0 else (*range(rank - 2), rank - 1, rank - 2)
        if seen.layout is None or not views.same_memory(seen.shape, seen.layout.order, order):
            name = _copy_into(rw, name, order, node, f"{name}.{_order_name(order)}")
        inputs.append(name)
    return replace(node, inputs=tuple(inputs))


def _aligned(rw: Rewriter, name: str) -> str:
    """What an op reads for `name`: a view starting off a 16-byte boundary is read through a
    row-major copy (made once, by a CuPy kernel: see `compile.stage`), since cuDNN's kernels load
    16-byte vectors. An output that is such a view stays a view: nothing of cuDNN reads it."""
    x = rw.node(name)
    if x.op != "view" or views.aligned(x.attrs["offset"], ITEMSIZE[x.type.dtype]):
        return name
    return _copy_into(rw, name, tuple(range(x.type.rank)), x, f"{name}.aligned")


def copy_for_layout_rules(rw: Rewriter, node: Node) -> Node:
    """An op that needs a memory order its operand does not have (a layernorm over axes that are
    not innermost, an sdpa operand whose last axis is not contiguous: `OpDef.needs`) reads a
    row-major copy of it, and writes its result row-major too."""
    op = OPS.get(node.op)
    if op is None or op.needs is None:
        return node
    types = {i: _seen_as(rw, i) for i in node.inputs}
    names = node.attrs.get("operands") or tuple(p.name for p in op.tensor_params
                                                if p.kind is Kind.TENSOR)
    if op.needs(dict(zip(names, (types[i] for i in node.inputs), strict=True))) is None:
        return node
    inputs = []
    for i in node.inputs:
        t = types[i]
        if t.rank == 0 or (t.layout is not None and t.layout.is_row_major and rw.node(i).op != "view"):
            inputs.append(i)
            continue
        inputs.append(rw.new("contiguous", (i,), {}, TensorType(t.dtype, t.shape,
                                                                 Layout.row_major(t.rank)),
                             node, f"{i}.row_major"))
    typ = TensorType(node.type.dtype, node.type.shape, Layout.row_major(node.type.rank))
    return replace(node, inputs=tuple(inputs), type=typ)


def full_size_attention_bias(rw: Rewriter, node: Node) -> str | None:
    """An sdpa bias broadcast over the batch or the heads (a padding mask [B, 1, 1, Skv]) is read
    as a copy of full size [B, H, Sq, Skv], made once for every layer that reads it: cuDNN 9.19
    computed a broadcast bias wrongly on the H200 (`dslc.ops.attention`), and the fallback sdpa
    that ran instead cost BERT's front 4.08 ms against PyTorch's 1.55 (B8, S128). The copy is
    no larger than the scores the fallback kernel holds."""
    if node.op != "sdpa":
        return None
    operands = tuple(node.attrs.get("operands", ()))  # no bias without them
    if "bias" not in operands:
        return None
    named = dict(zip(operands, node.inputs, strict=True))
    q, k, bias = (rw.node(named[n]).type for n in ("q", "k", "bias"))
    if q.shape[1] != k.shape[1]:  # grouped key/value heads: cuDNN's bias is not used anyway
        return None
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if ((1,) * (4 - bias.rank) + bias.shape)[:2] == full[:2]:
        return None
    # One copy per bias and size: attentions of other query lengths reading one mask (a
    # cross-attention beside a self-attention) each need their own.
    key = f"{named['bias']}.full.{format_shape(full)}"
    if key not in rw.memo:
        rw.memo[key] = rw.new("expand", (named["bias"],), {"shape": full},
                              TensorType(bias.dtype, full), node, f"{named['bias']}.full")
    inputs = tuple(rw.memo[key] if n == "bias" else i
                   for n, i in zip(operands, node.inputs, strict=True))
    return rw.emit(replace(node, inputs=inputs))


def _seen_as(rw: Rewriter, name: str) -> TensorType:
    """A value's type with its memory order (a view's order in its base)."""
    x = rw.node(name)
    return effective_type(x, {x.inputs[0]: rw.node(x.inputs[0]).type} if x.op == "view" else {})


def weights_like_inputs(rw: Rewriter, node: Node) -> str | None:
    """A conv on channels-last data reads channels-last (KRSC) weights: the layout of the fast
    tensor-core kernels, and the one memory order cuDNN computes right (see
    `conv_in_one_memory_order`). Load-time weights are copied once, when they load."""
    if node.op not in ("conv", "conv_transpose"):
        return None
    x, w = _seen_as(rw, node.inputs[0]), _seen_as(rw, node.inputs[1])
    order = CHANNELS_LAST.get(x.rank)
    if x.layout is None or x.layout.order != order or w.layout is None \
            or w.layout.order == order:
        return None
    weight = node.inputs[1]
    copy = _copy_into(rw, weight, order, rw.node(weight), f"{weight}.channels_last")
    return rw.emit(replace(node, inputs=(node.inputs[0], copy)))


def _place_view(rw: Rewriter, node: Node, base: str, steps: tuple[tuple[object, ...], ...],
                ) -> str:
    """Emit the view with strides; where a step is no view of the base's memory, copy the
    longest prefix that is (`_copy_order`: row-major, or the order its reader wants) and
    continue from the copy."""
    b = rw.node(base)
    assert b.type.layout is not None, b.name
    for cut in range(len(steps), -1, -1):
        found = views.strides(b.type.shape, b.type.layout, steps[:cut])
        if found is None:
            continue
        if cut == len(steps):
            st, offset = found
            # `steps` are what remains after any copy below: the copy already holds the rest.
            attrs = {**dict(node.attrs), "steps": steps, "strides": st, "offset": offset}
            return rw.emit(replace(node, inputs=(base,), attrs=Attrs(attrs)))
        head = base
        shape = views.view_shape(b.type.shape, steps[:cut])
        if cut:
            st, offset = found
            head = rw.new("view", (base,), {"steps": steps[:cut], "strides": st,
                                            "offset": offset},
                          TensorType(b.type.dtype, shape), node, f"{node.name}.part")
        copy = rw.new("contiguous", (head,), {},
                      TensorType(b.type.dtype, shape, _copy_order(rw, node, shape, steps[cut:])),
                      node, f"{node.name}.copy")
        return _place_view(rw, node, copy, steps[cut:])
    raise AssertionError("an empty chain of steps is always a view")


def _copy_order(rw: Rewriter, node: Node, shape: tuple[Dim, ...],
                rest: tuple[views.Step, ...]) -> Layout:
    """The memory order of the copy a view chain needs (of `shape`, `rest` the steps after it):
    where every reader of the view is a convolution, the order in which the rest of the chain
    ends channels-last, so the conv reads the copy in place, data or weights (a space-to-depth,
    reshape, transpose, reshape, is one copy, not a row-major copy and a channels-last one:
    `conv_in_one_memory_order`, `weights_like_inputs`); else row-major, where any reshape after
    it is a view."""
    row_major = Layout.row_major(len(shape))
    want = CHANNELS_LAST.get(node.type.rank)
    readers = rw.users_of(node.name)
    if want is None or not readers or any(r.op not in ("conv", "conv_transpose")
                                          for r in readers):
        return row_major
    shapes = [shape]
    for step in rest:
        shapes.append(views.step_shape(shapes[-1], step))
    layout: Layout | None = Layout(want)
    for step, before, after in reversed(list(zip(rest, shapes[:-1], shapes[1:], strict=True))):
        if layout is not None and step[0] == "transpose":
            layout = Layout(tuple(step[1][axis] for axis in layout.order))
        elif layout is not None and step[0] == "reshape":
            layout = reshape_layout(layout, after, before)
        else:  # a slice: its view has gaps, which conv reads through a copy of its own
            return row_major
    if layout is None or views.strides(shape, layout, rest) is None:
        return row_major
    return layout
