"""Views: a chain of transpose / reshape / slice steps read straight from a materialised base.

The steps keep the logical meaning (what the interpreter applies); `strides` turns them into
element strides and an offset into the base's memory, given the base's layout, or says that a
reshape step cannot be a view of that memory.
"""

from __future__ import annotations

import itertools
from typing import Any

from dslc.core import dims
from dslc.core.dims import Dim
from dslc.core.types import Layout

Step = tuple[Any, ...]  # ("transpose", perm) | ("reshape", shape) | ("slice", starts, ends)


def layout_strides(shape: tuple[Dim, ...], layout: Layout) -> tuple[Dim, ...]:
    """Dense strides of a tensor stored in `layout` order (outermost axis first)."""
    strides: list[Dim] = [0] * len(shape)
    running: Dim = 1
    for axis in reversed(layout.order):
        strides[axis] = running
        running = dims.mul(running, shape[axis])
    return tuple(strides)


def step_shape(shape: tuple[Dim, ...], step: Step) -> tuple[Dim, ...]:
    if step[0] == "transpose":
        return tuple(shape[p] for p in step[1])
    if step[0] == "reshape":
        return tuple(step[1])
    return tuple(dims.sub(e, s) for s, e in zip(step[1], step[2], strict=True))


def view_shape(shape: tuple[Dim, ...], steps: tuple[Step, ...]) -> tuple[Dim, ...]:
    for step in steps:
        shape = step_shape(shape, step)
    return shape


def _reshape_strides(shape: tuple[Dim, ...], strides: tuple[Dim, ...], new: tuple[Dim, ...],
                     ) -> tuple[Dim, ...] | None:
    """Strides of `new` as a view of (shape, strides), or None (PyTorch's computeStride,
    on symbolic dims: within each group of merged axes the old strides must chain)."""
    from dslc.ops.layout import reshape_groups  # here: importing dslc.ops registers every op

    groups = reshape_groups(shape, new)
    if groups is None:
        return None
    out: list[Dim] = [0] * len(new)
    for olds, news in groups:
        real = [a for a in olds if shape[a] != 1]
        for outer, inner in itertools.pairwise(real):
            if strides[outer] != dims.mul(strides[inner], shape[inner]):
                return None
        running: Dim = strides[real[-1]] if real else 1
        for axis in reversed(news):
            out[axis] = running
            running = dims.mul(running, new[axis])
    # A size-1 axis may have any stride; give it the dense one, as a contiguous tensor would.
    for axis in range(len(new) - 2, -1, -1):
        if new[axis] == 1:
            out[axis] = dims.mul(out[axis + 1], new[axis + 1])
    return tuple(out)


def strides(shape: tuple[Dim, ...], layout: Layout, steps: tuple[Step, ...],
            ) -> tuple[tuple[Dim, ...], Dim] | None:
    """(strides, offset) of the view in the base's memory; None if some reshape is no view."""
    st = layout_strides(shape, layout)
    offset: Dim = 0
    for step in steps:
        if step[0] == "transpose":
            st = tuple(st[p] for p in step[1])
        elif step[0] == "slice":
            for s, stride in zip(step[1], st, strict=True):
                offset = dims.add(offset, dims.mul(s, stride))
        else:
            found = _reshape_strides(shape, st, tuple(step[1]))
            if found is None:
                return None
            st = found
        shape = step_shape(shape, step)
    return st, offset


def view_layout(layout: Layout, shape: tuple[Dim, ...], steps: tuple[Step, ...]) -> Layout | None:
    """The memory order a view's axes have in its base (what an op's layout rule sees), as the
    type rules of transpose, reshape and slice compute it; None where a reshape is no view."""
    from dslc.ops.layout import reshape_layout  # here: importing dslc.ops registers every op

    for step in steps:
        if step[0] == "transpose":
            layout = Layout(tuple(step[1].index(axis) for axis in layout.order))
        elif step[0] == "reshape":
            found = reshape_layout(layout, shape, tuple(step[1]))
            if found is None:
                return None
            layout = found
        shape = step_shape(shape, step)
    return layout


def aligned(offset: Dim, itemsize: int, to: int = 16) -> bool:
    """Whether an element offset is a multiple of `to` bytes for every value of its dims (cuDNN's
    kernels read 16-byte vectors: a view starting off such a boundary must not reach them)."""
    if isinstance(offset, int):
        return offset * itemsize % to == 0
    return all((c * itemsize) % to == 0 for _, c in offset.terms)


def dense(shape: tuple[Dim, ...], strides: tuple[Dim, ...], order: tuple[int, ...]) -> bool:
    """Whether `strides` lay `shape` out packed in memory order `order` (a slice that leaves a
    gap between rows is not); axes of size 1 may have any stride."""
    want = layout_strides(shape, Layout(order))
    return all(n == 1 or s == w for n, s, w in zip(shape, strides, want, strict=True))


def same_memory(shape: tuple[object, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether two memory orders lay out a dense tensor of `shape` alike: axes of size 1 take
    no place in memory ([2, 1, 7, 9] is the same bytes NCHW and NHWC)."""
    def real(order: tuple[int, ...]) -> list[int]:
        return [axis for axis in order if shape[axis] != 1]
    return real(a) == real(b)
