"""Ops that move data or only re-describe it: `reshape`, `transpose`, `slice` (the `x[a:b]`
syntax), `concat`.

On a materialised tensor, reshape, transpose and slice are views (new strides and offset, no
copy). A reshape that merges axes which are not adjacent in memory (of a transposed input, say)
reads a row-major copy of its input, inserted by lowering, as numpy and PyTorch do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dslc.core import dims
from dslc.core.dims import Dim
from dslc.core.types import Layout, TensorType, format_shape
from dslc.ops import common
from dslc.ops.opdef import Args, InferCtx, Kind, OpDef, Param


def _product(shape: tuple[Dim, ...]) -> Dim:
    out: Dim = 1
    for d in shape:
        out = dims.mul(out, d)
    return out


def reshape_groups(old: tuple[Dim, ...], new: tuple[Dim, ...]) -> list[tuple[range, range]] | None:
    """Split a reshape into groups of old axes that become groups of new axes, by matching the
    prefix products; None when the products cannot be matched symbolically."""
    p_old: list[Dim] = [1]
    for d in old:
        p_old.append(dims.mul(p_old[-1], d))
    p_new: list[Dim] = [1]
    for d in new:
        p_new.append(dims.mul(p_new[-1], d))
    groups: list[tuple[range, range]] = []
    i = j = 0
    while i < len(old) or j < len(new):
        found = None
        for i2 in range(i + 1 if i < len(old) else i, len(old) + 1):
            for j2 in range(j + 1 if j < len(new) else j, len(new) + 1):
                if p_old[i2] == p_new[j2]:
                    found = (i2, j2)
                    break
            if found:
                break
        if found is None:
            return None
        groups.append((range(i, found[0]), range(j, found[1])))
        i, j = found
    return groups


def reshape_layout(layout: Layout, old: tuple[Dim, ...], new: tuple[Dim, ...]) -> Layout | None:
    """The layout of `reshape` as a view of a tensor with `layout`, or None if it is no view."""
    groups = reshape_groups(old, new)
    if groups is None:
        return None
    position = {axis: k for k, axis in enumerate(layout.order)}
    placed: list[tuple[float, list[int]]] = []
    for olds, news in groups:
        real = [a for a in olds if old[a] != 1]
        pos = [position[a] for a in real]
        if pos and pos != list(range(pos[0], pos[0] + len(pos))):
            return None
        key = float(pos[0]) if pos else -1.0 + 1e-3 * len(placed)
        placed.append((key, list(news)))
    order = [a for _, axes in sorted(placed, key=lambda t: t[0]) for a in axes]
    return Layout(tuple(order))


def _only_splits(old: tuple[Dim, ...], new: tuple[Dim, ...]) -> bool:
    """Whether a reshape only splits axes or adds and drops axes of size 1 (merges nothing)."""
    groups = reshape_groups(old, new)
    return groups is not None and all(
        sum(1 for i in olds if old[i] != 1) <= 1 for olds, _ in groups)


def _reshape(ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    target: list[Any] = list(a["shape"])
    unknown = [i for i, d in enumerate(target) if isinstance(d, int) and d == -1]
    if len(unknown) > 1:
        ctx.error("E0305", "at most one axis of a reshape may be -1", at="shape",
                  label=f"{len(unknown)} given")
        return None
    for d in target:
        if isinstance(d, int) and d < 1 and d != -1:
            ctx.error("E0305", f"reshape to a size of {d}", at="shape",
                      label="sizes must be positive (or -1, inferred)")
            return None
    total = _product(x.shape)
    if unknown:
        known = _product(tuple(d for i, d in enumerate(target) if i != unknown[0]))
        inferred = dims.div_exact(total, known, ctx.env)
        if inferred is None:
            ctx.error("E0301", "cannot infer the `-1` axis of this reshape", at="shape",
                      label=f"{dims.format_dim(total)} elements do not divide by "
                            f"{dims.format_dim(known)}", labels=(ctx.label("x", common.fmt(x)),))
            return None
        target[unknown[0]] = inferred
    shape = tuple(target)
    if _product(shape) != total:
        ctx.error("E0301", "reshape changes the number of elements", at="shape",
                  label=f"{format_shape(shape)} has {dims.format_dim(_product(shape))} elements",
                  labels=(ctx.label("x", f"{common.fmt(x)} has {dims.format_dim(total)}"),),
                  notes=("the products must be equal for every admissible value of the dims",))
        return None
    ctx.set_attr("shape", shape)
    if x.layout is None or shape == x.shape:
        return TensorType(x.dtype, shape, x.layout if shape == x.shape else None)
    layout = reshape_layout(x.layout, x.shape, shape)
    if ctx.producer("x") == "slice" and not _only_splits(x.shape, shape):
        layout = None  # a sliced tensor is not dense: merging its axes is no view
    # Where the merged axes are not adjacent in memory the result has a free layout: lowering
    # copies the input into row-major order first (numpy/PyTorch semantics; the copy shows as a
    # `contiguous` step in `--dump fused` and `dslc inspect`).
    return TensorType(x.dtype, shape, layout)


def _transpose(ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    perm = common.norm_axes(ctx, "transpose", "perm", a["perm"], x.rank)
    if perm is None:
        return None
    if len(perm) != x.rank:
        ctx.error("E0304", f"`perm` must list all {x.rank} axes once", at="perm",
                  label=f"{len(perm)} axes given")
        return None
    ctx.set_attr("perm", perm)
    shape = tuple(x.shape[p] for p in perm)
    layout = None
    if x.layout is not None:
        layout = Layout(tuple(perm.index(axis) for axis in x.layout.order))
    return TensorType(x.dtype, shape, layout)


def _bound(ctx: InferCtx, value: Dim, size: Dim) -> Dim:
    """A negative bound counts from the end, as in Python."""
    if isinstance(value, int) and value < 0:
        return dims.add(size, value)
    return value


def _slice(ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    starts, ends = list(a["starts"]), list(a["ends"])
    if len(starts) > x.rank or len(ends) != len(starts):
        ctx.error("E0607", f"too many indices for a rank-{x.rank} tensor", at="x",
                  label=common.fmt(x))
        return None
    shape: list[Dim] = []
    new_starts: list[Dim] = []
    new_ends: list[Dim] = []
    for axis, size in enumerate(x.shape):
        if axis >= len(starts):
            shape.append(size)
            new_starts.append(0)
            new_ends.append(size)
            continue
        lo = _bound(ctx, starts[axis] if starts[axis] is not None else 0, size)
        hi = _bound(ctx, ends[axis] if ends[axis] is not None else size, size)
        for test, rel in ((dims.compare(lo, 0, ">=", ctx.env), "0 <= start"),
                          (dims.compare(lo, hi, "<", ctx.env), "start < stop"),
                          (dims.compare(hi, size, "<=", ctx.env), "stop <= size")):
            if test is not True:  # it must hold for every admissible value of the dims
                some = "" if test is False else " for some admissible sizes"
                ctx.error("E0607", f"slice {dims.format_dim(lo)}:{dims.format_dim(hi)} is out of "
                          f"bounds{some} on axis {axis} of size {dims.format_dim(size)}",
                          at="starts", label=f"needs {rel}", labels=(ctx.label("x", common.fmt(x)),),
                          help=("narrow the dim's range so the slice always fits",) if some
                          else ())
                return None
        shape.append(dims.sub(hi, lo))
        new_starts.append(lo)
        new_ends.append(hi)
    ctx.set_attr("starts", tuple(new_starts))
    ctx.set_attr("ends", tuple(new_ends))
    return TensorType(x.dtype, tuple(shape), x.layout)


def _concat(ctx: InferCtx, a: Args) -> TensorType | None:
    xs: list[TensorType] = list(a["xs"])
    if not xs:
        ctx.error("E0204", "`concat` needs at least one tensor", at="xs")
        return None
    first = xs[0]
    axes = common.norm_axes(ctx, "concat", "axis", a["axis"], first.rank)
    if axes is None:
        return None
    axis = axes[0]
    total: Dim = 0
    for i, t in enumerate(xs):
        if t.dtype != first.dtype:
            ctx.error("E0401", "the tensors given to `concat` have different dtypes", at="xs",
                      label=f"item {i} is {t.dtype}, item 0 is {first.dtype}",
                      help=("cast them to one dtype first",))
            return None
        same_rest = t.rank == first.rank and all(
            t.shape[k] == first.shape[k] for k in range(first.rank) if k != axis)
        if not same_rest:
            ctx.error("E0301", "the tensors given to `concat` differ outside the concat axis",
                      at="xs", label=f"item {i} is {common.fmt(t)}, item 0 is {common.fmt(first)}",
                      notes=(f"all axes but axis {axis} must be equal",))
            return None
        total = dims.add(total, t.shape[axis])
    ctx.set_attr("axis", axis)
    shape = tuple(total if k == axis else d for k, d in enumerate(first.shape))
    return TensorType(first.dtype, shape)


def _expand(ctx: InferCtx, a: Args) -> TensorType | None:
    """numpy/PyTorch broadcasting to `shape`: x's axes align with the last ones; each is kept
    (-1 or its own size) or, where x has 1, repeated to the size asked for."""
    x = a.t("x")
    target: list[Any] = list(a["shape"])
    lead = len(target) - x.rank
    if lead < 0:
        ctx.error("E0301", f"`expand` to rank {len(target)} from a tensor of rank {x.rank}",
                  at="shape", labels=(ctx.label("x", common.fmt(x)),),
                  notes=("expand adds leading axes; it never drops one",))
        return None
    for i, d in enumerate(target):
        own = x.shape[i - lead] if i >= lead else None
        if isinstance(d, int) and d == -1 and own is not None:
            target[i] = own
        elif isinstance(d, int) and d < 1:
            ctx.error("E0305", f"`expand` to a size of {d}", at="shape",
                      label="sizes must be positive (or -1 where x has the axis: kept)")
            return None
        elif own is not None and own != 1 and own != d:
            ctx.error("E0301", f"`expand` cannot make axis {i} of size "
                      f"{dims.format_dim(own)} into {dims.format_dim(d)}", at="shape",
                      labels=(ctx.label("x", common.fmt(x)),),
                      notes=("only axes of size 1 are repeated",))
            return None
    shape = tuple(target)
    ctx.set_attr("shape", shape)
    return TensorType(x.dtype, shape)


def _slice_ref(xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    return xs[0][tuple(slice(s, e) for s, e in zip(a["starts"], a["ends"], strict=True))]


OPS = [
    OpDef("reshape", "layout", (Param("x", Kind.TENSOR), Param("shape", Kind.SHAPE)), _reshape,
          "shape", "same elements, new shape (a view where the layout allows; one -1 is inferred)",
          fusion="view", reference=lambda xs, a: xs[0].reshape(a["shape"])),
    OpDef("transpose", "layout", (Param("x", Kind.TENSOR), Param("perm", Kind.AXES)), _transpose,
          "[x.shape[perm[i]]]", "permute axes (a view)", fusion="view",
          reference=lambda xs, a: xs[0].transpose(a["perm"])),
    OpDef("slice", "layout",
          (Param("x", Kind.TENSOR), Param("starts", Kind.SHAPE), Param("ends", Kind.SHAPE)),
          _slice, "[stop - start per axis]", "the sub-tensor x[starts:ends] (a view); also "
          "written `x[a:b, ...]`", fusion="view", reference=_slice_ref),
    OpDef("expand", "layout", (Param("x", Kind.TENSOR), Param("shape", Kind.SHAPE)), _expand,
          "shape", "x repeated along its size-1 axes (broadcast_to; new axes lead; -1 keeps one)",
          reference=lambda xs, a: np.broadcast_to(xs[0], a["shape"]).copy(), lower=common.lower_identity),
    OpDef("concat", "layout", (Param("xs", Kind.TENSORS), Param("axis", Kind.INT, 0)), _concat,
          "axes summed along `axis`", "join tensors along an axis",
          reference=lambda xs, a: np.concatenate(xs, axis=a["axis"])),
]
