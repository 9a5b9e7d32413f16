"""ONNX's shape, layout, indexing and sequence ops as `.cgraph` operations (views where the
language makes them views), and the sizes ONNX computes at run time (`Shape`, `Size`) as dims."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from dslc.core import dims
from dslc.core.dims import Dim
from dslc.importer.context import Context, Handler, Node, Unsupported, axis_of
from dslc.importer.fold import sym_result
from dslc.importer.graph import Const, Op, Seq, Sym, Value, const_array
from dslc.importer.ops_math import FLOATS, reshape_to, transpose_of
from dslc.importer.shapes import ShapeError, broadcast, product

BIG = 1 << 62  # an end past this counts as "to the end" (exporters write INT64_MAX)

Spec = None | tuple[Dim, Dim] | int  # an axis of an `index` op: all of it, a range, one entry


def index(ctx: Context, x: Op, spec: list[Spec]) -> Op:
    """`x[...]`: ranges keep their axis, an integer index drops it."""
    if x.op == "index" and not any(isinstance(s, int) for s in x.attrs["spec"]):
        # a slice of a slice of other axes: one slice
        inner = list(x.attrs["spec"]) + [None] * (x.rank - len(x.attrs["spec"]))
        if all(a is None or b is None for a, b in zip(inner, spec, strict=False)):
            spec = [a if a is not None else b for a, b in
                    zip(inner, list(spec) + [None] * (len(inner) - len(spec)), strict=True)]
            x = x.args[0]  # type: ignore[assignment]
    while spec and spec[-1] is None:
        spec = spec[:-1]
    if not spec:
        return x
    shape: list[Dim] = []
    for axis, d in enumerate(x.shape):
        s = spec[axis] if axis < len(spec) else None
        if s is None:
            shape.append(d)
        elif isinstance(s, tuple):
            shape.append(dims.sub(s[1], s[0]))
    return ctx.make("index", [x], {"spec": spec}, shape=tuple(shape))


def reshape(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    target = list(ctx.sizes(node.need(1), "the new shape"))
    if node.attr("allowzero", 0) and 0 in target:
        raise Unsupported("a reshape to an empty tensor")
    for i, d in enumerate(target):
        if d == 0:
            if i >= x.rank:
                raise Unsupported("a 0 in the new shape past the input's rank")
            target[i] = x.shape[i]
    return [reshape_to(ctx, x, infer_shape(ctx, x, target))]


def infer_shape(ctx: Context, x: Op, target: list[Dim]) -> tuple[Dim, ...]:
    """`target` with its -1 worked out from the number of values of `x`."""
    unknown = [i for i, d in enumerate(target) if d == -1]
    if len(unknown) > 1:
        raise Unsupported("a new shape with more than one -1")
    if unknown:
        known = product([d for d in target if d != -1])
        size = dims.div_exact(product(x.shape), known, ctx.env)
        if size is None:
            raise Unsupported("a -1 in the new shape that cannot be worked out exactly")
        target[unknown[0]] = size
    return tuple(target)


def flatten(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    axis = int(node.attr("axis", 1))
    axis = axis + x.rank if axis < 0 else axis
    return [reshape_to(ctx, x, (product(x.shape[:axis]), product(x.shape[axis:])))]


def _axes(ctx: Context, node: Node, rank: int) -> list[int] | None:
    given = node.input(1) if node.opset >= 13 else None
    axes = ctx.ints(given, "the axes") if given is not None else node.attr("axes")
    return None if axes is None else sorted({axis_of(int(a), rank) for a in axes})


def squeeze(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    axes = _axes(ctx, node, x.rank)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    if any(x.shape[a] != 1 for a in axes):
        raise Unsupported("a squeeze of an axis that is not of size 1")
    return [reshape_to(ctx, x, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


def unsqueeze(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    given = node.input(1)
    raw = ctx.ints(given, "the axes") if given is not None else list(node.attr("axes", []))
    rank = x.rank + len(raw)
    axes = {axis_of(a, rank) for a in raw}
    rest = iter(x.shape)
    return [reshape_to(ctx, x, tuple(1 if i in axes else next(rest) for i in range(rank)))]


def transpose(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    perm = list(node.attr("perm", list(range(x.rank))[::-1]))
    return [transpose_of(ctx, x, [axis_of(p, x.rank) for p in perm])]


def concat_of(ctx: Context, xs: list[Op], axis: int) -> Op:
    if len(xs) == 1:
        return xs[0]
    rank = xs[0].rank
    axis = axis_of(axis, rank)
    for x in xs:
        if x.rank != rank or any(a != b for i, (a, b) in enumerate(zip(x.shape, xs[0].shape,
                                                                       strict=True)) if i != axis):
            raise Unsupported("operands of a concatenation whose other axes differ")
    size = dims.add(0, 0)
    for x in xs:
        size = dims.add(size, x.shape[axis])
    shape = tuple(size if i == axis else d for i, d in enumerate(xs[0].shape))
    return ctx.make("concat", xs, {"axis": axis}, shape=shape)


def concat(ctx: Context, node: Node) -> list[Value | None]:
    xs = [ctx.tensor(v) for v in node.inputs if v is not None]
    return [concat_of(ctx, xs, int(node.attr("axis")))]


def _bound(i: Dim, size: Dim, end: bool) -> Dim:
    """An ONNX slice bound as an index in 0..size (negative counts from the end)."""
    if isinstance(i, int):
        if i >= BIG or (isinstance(size, int) and i > size):
            return size
        if i < 0:
            if i <= -BIG:
                return 0
            return dims.add(size, i) if not isinstance(size, int) else max(size + i, 0)
        return i
    return i


def split_points(ctx: Context, x: Op, axis: int, sizes: list[Dim]) -> list[Op]:
    out, start = [], 0
    for s in sizes:
        end = dims.add(start, s)
        spec: list[Spec] = [None] * x.rank
        spec[axis] = (start, end)
        out.append(index(ctx, x, spec) if (start, end) != (0, x.shape[axis]) else x)
        start = end  # type: ignore[assignment]
    return out


def _split_sizes(ctx: Context, x: Op, axis: int, given: Value | None, parts: int) -> list[Dim]:
    if given is not None:
        return list(ctx.ints(given, "the split sizes"))
    size = dims.div_exact(x.shape[axis], parts, ctx.env)
    if size is not None:
        return [size] * parts
    whole = x.shape[axis]
    if not isinstance(whole, int):
        raise Unsupported("a split of a symbolic size into unequal parts")
    step = -(-whole // parts)  # ONNX 18: the last part smaller
    return [min(step, whole - i * step) for i in range(parts)]


def split(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    axis = axis_of(int(node.attr("axis", 0)), x.rank)
    parts = int(node.attr("num_outputs", len(node.proto.output)))
    sizes = _split_sizes(ctx, x, axis, node.input(1), parts)
    return list(split_points(ctx, x, axis, sizes))


def slice_(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    starts = ctx.sizes(node.need(1), "the starts")
    ends = ctx.sizes(node.need(2), "the ends")
    axes = ctx.ints(node.input(3), "the axes") if node.input(3) is not None else \
        list(range(len(starts)))
    steps = ctx.ints(node.input(4), "the steps") if node.input(4) is not None else \
        [1] * len(starts)
    if any(s != 1 for s in steps):
        raise Unsupported("a slice with a step", "the language slices contiguous ranges")
    spec: list[Spec] = [None] * x.rank
    for a, s, e in zip(axes, starts, ends, strict=True):
        axis = axis_of(a, x.rank)
        size = x.shape[axis]
        lo, hi = _bound(s, size, False), _bound(e, size, True)
        if dims.compare(hi, size, "<=", ctx.env) is not True or \
                dims.compare(lo, hi, "<", ctx.env) is not True:
            raise _outside(ctx, lo, hi, size)
        if (lo, hi) != (0, size):
            spec[axis] = (lo, hi)
    return [index(ctx, x, spec)]


def _outside(ctx: Context, lo: Dim, hi: Dim, size: Dim) -> Unsupported:
    """Why a slice `lo:hi` of an axis of `size` may not fit, and the ranges that would do."""
    text = ctx.writer_dim
    symbols = sorted({s for d in (lo, hi, size) if isinstance(d, dims.Poly) for s in d.symbols()
                      if s in ctx.env.syms})
    ranges = ", ".join(f"`{s}` is {ctx.env.syms[s].lo}..{ctx.env.syms[s].hi}" for s in symbols)
    reason = (f"the slice {text(lo)}:{text(hi)} may not lie inside its axis of {text(size)}"
              + (f" ({ranges})" if ranges else ""))
    return Unsupported(reason, "give the dims the ranges the model is made for, e.g. "
                       f"`--dim {symbols[0]}=1..{text(size)}`" if symbols and
                       isinstance(size, int) else None)


def gather(ctx: Context, node: Node) -> list[Value | None]:
    data, indices = node.need(0), node.need(1)
    picked = const_array(indices)
    x = ctx.tensor(data)
    axis = axis_of(int(node.attr("axis", 0)), x.rank)
    if picked is not None and picked.dtype.kind in "iu":
        size = x.shape[axis]
        if picked.ndim == 0:
            i = int(picked)
            if i < 0:
                if not isinstance(size, int):
                    raise Unsupported("a negative index into a symbolic size")
                i += size
            spec: list[Spec] = [None] * x.rank
            spec[axis] = i
            return [index(ctx, x, spec)]
        flat = [int(i) for i in picked.ravel()]
        if picked.ndim == 1 and flat == list(range(flat[0], flat[0] + len(flat))) and \
                flat[0] >= 0:  # consecutive entries: a slice
            spec = [None] * x.rank
            spec[axis] = (flat[0], flat[0] + len(flat))
            return [index(ctx, x, spec)]
        if isinstance(size, int):
            picked = np.where(picked < 0, picked + size, picked)
            indices = Const(picked.astype(np.int64))
    if x.dtype not in FLOATS:
        raise Unsupported(f"a gather from {x.dtype} values", "the language gathers from float "
                          "tables (an embedding)")
    ids = ctx.tensor(indices)
    if ids.dtype not in ("i32", "i64"):
        raise Unsupported(f"{ids.dtype} indices")
    shape = x.shape[:axis] + ids.shape + x.shape[axis + 1:]
    return [ctx.make("gather", [x, ids], {"axis": axis if axis else None}, shape=shape)]


def expand(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    target = ctx.sizes(node.need(1), "the shape")
    try:
        shape = broadcast(x.shape, tuple(target))
    except ShapeError as err:
        raise Unsupported(str(err)) from err
    if shape == x.shape:
        return [x]
    return [ctx.make("expand", [x], {"shape": list(shape)}, shape=shape)]


def tile(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    repeats = ctx.ints(node.need(1), "the repeats")
    for axis, r in enumerate(repeats):
        if r > 1:
            x = concat_of(ctx, [x] * r, axis)
    return [x]


def shape(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    start, end = int(node.attr("start", 0)), node.attr("end")
    sizes = x.shape[start if start >= 0 else max(start + x.rank, 0):
                    None if end is None else (end if end >= 0 else end + x.rank)]
    return [sym_result(sizes)]


def size(ctx: Context, node: Node) -> list[Value | None]:
    return [sym_result([product(ctx.tensor(node.need(0)).shape)], scalar=True)]


def identity(ctx: Context, node: Node) -> list[Value | None]:
    return [node.need(0)]


def range_(ctx: Context, node: Node) -> list[Value | None]:
    """Range(0, n, 1) for a symbolic n: `arange(n)` (position ids)."""
    start, delta = const_array(node.need(0)), const_array(node.need(2))
    if start is None or delta is None or start.item() != 0 or delta.item() != 1:
        raise Unsupported("a range that does not count 0, 1, ... up to a size")
    n = ctx.sizes(node.need(1), "the limit")[0]
    dtype = "i32" if start.dtype == np.int32 else "i64"
    ids = ctx.make("arange", [], {"n": n, "dtype": "i32" if dtype == "i32" else None},
                   dtype=dtype, shape=(n,))
    if start.dtype.kind == "f":
        return [ctx.make("cast", [ids], {"dtype": "f32"}, dtype="f32")]
    return [ids]


def constant_of_shape(ctx: Context, node: Node) -> list[Value | None]:
    sizes = ctx.sizes(node.need(0), "the shape")
    fill = node.attr("value")
    array = np.zeros(1, np.float32) if fill is None else numpy_helper.to_array(fill).reshape(1)
    one = ctx.tensor(Const(array.reshape([1] * len(sizes))))
    return [ctx.make("expand", [one], {"shape": list(sizes)}, shape=tuple(sizes))]


def depth_to_space(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    b = int(node.attr("blocksize"))
    n, c, h, w = x.shape
    inner = dims.div_exact(c, b * b, ctx.env)
    if inner is None:
        raise Unsupported("channels that are no multiple of the block's area")
    if node.op_type == "SpaceToDepth":
        hb, wb = dims.div_exact(h, b, ctx.env), dims.div_exact(w, b, ctx.env)
        if hb is None or wb is None:
            raise Unsupported("a size that is no multiple of the block")
        y = reshape_to(ctx, x, (n, c, hb, b, wb, b))
        y = transpose_of(ctx, y, [0, 3, 5, 1, 2, 4])
        return [reshape_to(ctx, y, (n, dims.mul(c, b * b), hb, wb))]
    if node.attr("mode", "DCR") == "DCR":
        y = reshape_to(ctx, x, (n, b, b, inner, h, w))
        y = transpose_of(ctx, y, [0, 3, 4, 1, 5, 2])
    else:
        y = reshape_to(ctx, x, (n, inner, b, b, h, w))
        y = transpose_of(ctx, y, [0, 1, 4, 2, 5, 3])
    return [reshape_to(ctx, y, (n, inner, dims.mul(h, b), dims.mul(w, b)))]


def split_to_sequence(ctx: Context, node: Node) -> list[Value | None]:
    x = ctx.tensor(node.need(0))
    axis = axis_of(int(node.attr("axis", 0)), x.rank)
    given = node.input(1)
    if given is None:
        whole = x.shape[axis]
        if not isinstance(whole, int):
            raise Unsupported("a split into single entries of a symbolic size")
        items = split_points(ctx, x, axis, [1] * whole)
        if not node.attr("keepdims", 1):
            items = [reshape_to(ctx, t, t.shape[:axis] + t.shape[axis + 1:]) for t in items]
        return [Seq(tuple(items))]
    array = const_array(given)
    if array is None:
        raise Unsupported("split sizes computed at run time")
    if array.ndim == 0:
        whole = x.shape[axis]
        if not isinstance(whole, int):
            raise Unsupported("a split of a symbolic size into parts of a given size")
        step = int(array)
        sizes: list[Dim] = [min(step, whole - i) for i in range(0, whole, step)]
    else:
        sizes = [int(s) for s in array]
    return [Seq(tuple(split_points(ctx, x, axis, sizes)))]


def _sequence(node: Node) -> Seq:
    seq = node.need(0)
    if not isinstance(seq, Seq):
        raise Unsupported("a sequence that is not built from tensors the model knows")
    return seq


def sequence_at(ctx: Context, node: Node) -> list[Value | None]:
    seq = _sequence(node)
    at = ctx.ints(node.need(1), "the position")[0]
    if not -len(seq.items) <= at < len(seq.items):
        raise Unsupported(f"position {at} in a sequence of {len(seq.items)}")
    return [seq.items[at]]


def sequence_construct(ctx: Context, node: Node) -> list[Value | None]:
    items: list[Op | Const | Sym] = []
    for v in node.inputs:
        if isinstance(v, Seq):
            raise Unsupported("a sequence of sequences")
        if v is not None:
            items.append(v)
    return [Seq(tuple(items))]


def sequence_length(ctx: Context, node: Node) -> list[Value | None]:
    return [Const(np.array(len(_sequence(node).items), np.int64))]


def concat_from_sequence(ctx: Context, node: Node) -> list[Value | None]:
    xs = [ctx.tensor(v) for v in _sequence(node).items]
    axis = int(node.attr("axis"))
    if node.attr("new_axis", 0):
        rank = xs[0].rank + 1
        axis = axis_of(axis, rank)
        xs = [reshape_to(ctx, x, (*x.shape[:axis], 1, *x.shape[axis:])) for x in xs]
    return [concat_of(ctx, xs, axis)]


OPS: dict[str, Handler] = {
    "Reshape": reshape, "Flatten": flatten, "Squeeze": squeeze, "Unsqueeze": unsqueeze,
    "Transpose": transpose, "Concat": concat, "Split": split, "Slice": slice_,
    "Gather": gather, "Expand": expand, "Tile": tile, "Shape": shape, "Size": size,
    "Identity": identity, "Range": range_, "ConstantOfShape": constant_of_shape,
    "DepthToSpace": depth_to_space, "SpaceToDepth": depth_to_space,
    "SplitToSequence": split_to_sequence, "SequenceAt": sequence_at,
    "SequenceConstruct": sequence_construct, "SequenceLength": sequence_length,
    "ConcatFromSequence": concat_from_sequence,
}
