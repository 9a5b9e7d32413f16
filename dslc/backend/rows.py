"""A copy between two strided arrays that are both rows of contiguous elements at a fixed pitch
(a channel slice of an NHWC concat from a dense NHWC part): one kernel moving 16, 8, 4, 2 or 1
bytes a thread, at the memory's speed. CuPy's strided `y[...] = x` took 0.034 ms for the UNet's
4 MB upsample on an H200 (session 30), about a tenth of the bandwidth."""

from __future__ import annotations

from functools import cache
from typing import Any

from dslc.backend.cuda import grid_blocks

_WORDS = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}


def rows_of(a: Any, order: list[int]) -> tuple[int, int, int] | None:
    """(rows, elements a row, pitch in elements) of `a` read in axis `order` (outermost first,
    its axes of more than one element): the last contiguous, the others merging into one axis
    of rows; None where they do not."""
    if not order:
        return 1, 1, 1
    shape = [int(a.shape[i]) for i in order]
    strides = [int(a.strides[i]) // a.itemsize for i in order]
    if strides[-1] != 1 or any(s <= 0 for s in strides):
        return None
    for i in range(len(order) - 2):
        if strides[i] != strides[i + 1] * shape[i + 1]:
            return None
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows, shape[-1], strides[-2] if len(order) > 1 else shape[-1]


def copy(x: Any, y: Any) -> bool:
    """x into y (same shape and dtype) as rows, if both are rows in y's memory order: whether it
    ran (else the caller copies another way)."""
    if x.shape != y.shape or x.dtype != y.dtype or x.size == 0:
        return False
    axes = [i for i in range(y.ndim) if y.shape[i] != 1]
    order = sorted(axes, key=lambda i: -int(y.strides[i]))
    src, dst = rows_of(x, order), rows_of(y, order)
    if src is None or dst is None:
        return False
    rows, width, item = src[0], src[1], x.itemsize
    word = next(w for w in _WORDS if all(v % w == 0 for v in (
        width * item, src[2] * item, dst[2] * item, int(x.data.ptr), int(y.data.ptr))))
    per_row = width * item // word
    total = rows * per_row
    _kernel(_WORDS[word])((grid_blocks(total),), (256,), (
        x, y, _i64(total), _i64(per_row), _i64(src[2] * item // word),
        _i64(dst[2] * item // word)))
    return True


def _i64(v: int) -> Any:
    import numpy as np

    return np.int64(v)


@cache
def _kernel(word: str) -> Any:
    import cupy

    return cupy.RawKernel(source(word), "dslc_copy_rows")


def source(word: str) -> str:
    """The copy's CUDA source, moving one `word` (a C type of `_WORDS`) a thread."""
    return r"""
extern "C" __global__ void dslc_copy_rows(const WORD* __restrict__ x, WORD* __restrict__ y,
    const long long total, const long long per_row, const long long xp, const long long yp) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / per_row, c = i - r * per_row;
    y[r * yp + c] = x[r * xp + c];
  }
}""".replace("WORD", word)
