"""Numpy references of the window ops: convolution, transposed convolution, pooling, resampling.

Written for clarity over speed (windows as strided views, then one matmul per group), and
checked against PyTorch in the tests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Array = np.ndarray


def array_module(x: Any) -> Any:
    """numpy, or CuPy for CuPy arrays (the fallback kernels and the tuner run these on the GPU)."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _windows(xp: Array, eff: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> Array:
    """Windows of a padded [N, C, *S] array: [N, C, *O, *R], strided and dilated."""
    mod = array_module(xp)
    full = tuple(s - e + 1 for s, e in zip(xp.shape[2:], eff, strict=True))
    win = mod.lib.stride_tricks.as_strided(xp, (*xp.shape[:2], *full, *eff),
                                           (*xp.strides, *xp.strides[2:]))
    index = (slice(None), slice(None), *(slice(None, None, s) for s in stride),
             *(slice(None, None, d) for d in dilation))
    return win[index]


def conv(x: Array, w: Array, stride: Sequence[int], pre: Sequence[int], post: Sequence[int],
         dilation: Sequence[int], groups: int) -> Array:
    n = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0), *zip(pre, post, strict=True)])
    kernel = w.shape[2:]
    eff = [d * (r - 1) + 1 for d, r in zip(dilation, kernel, strict=True)]
    win = _windows(xp, eff, stride, dilation)  # N, C, *O, *R
    batch, channels = x.shape[:2]
    out_sizes = win.shape[2:2 + n]
    k = w.shape[0]
    cg, kg = channels // groups, k // groups
    # [N, g, cg, *O, *R] -> [g, N * prod(O), cg * prod(R)]
    win = win.reshape(batch, groups, cg, *out_sizes, *kernel)
    order = [1, 0, *range(3, 3 + n), 2, *range(3 + n, 3 + 2 * n)]
    cols = win.transpose(order).reshape(groups, batch * math.prod(out_sizes), cg * math.prod(kernel))
    wg = w.reshape(groups, kg, cg * math.prod(kernel))
    out = np.matmul(cols, wg.transpose(0, 2, 1))  # g, N * prod(O), kg
    out = out.reshape(groups, batch, *out_sizes, kg)
    out = np.moveaxis(out, 0, -2).reshape(batch, *out_sizes, k)  # N, *O, K
    return np.moveaxis(out, -1, 1)


def conv_transpose(x: Array, w: Array, stride: Sequence[int], pad: Sequence[int],
                   dilation: Sequence[int], output_pad: Sequence[int]) -> Array:
    """The gradient of `conv` with respect to its input: zero-insert the input by the stride,
    then convolve with the spatially flipped, channel-swapped kernel."""
    n = x.ndim - 2
    sizes = [(s - 1) * st + 1 for s, st in zip(x.shape[2:], stride, strict=True)]
    xd = array_module(x).zeros((*x.shape[:2], *sizes), dtype=x.dtype)
    xd[(slice(None), slice(None), *(slice(None, None, st) for st in stride))] = x
    kernel = w.shape[2:]
    pre = [d * (r - 1) - p for d, r, p in zip(dilation, kernel, pad, strict=True)]
    post = [a + op for a, op in zip(pre, output_pad, strict=True)]
    # Negative padding crops.
    crop = tuple(slice(max(-a, 0), xd.shape[2 + i] - max(-b, 0)) for i, (a, b) in
                 enumerate(zip(pre, post, strict=True)))
    xd = xd[(slice(None), slice(None), *crop)]
    wf = np.flip(w, axis=tuple(range(2, 2 + n))).swapaxes(0, 1)
    return conv(xd, array_module(x).ascontiguousarray(wf), [1] * n, [max(a, 0) for a in pre],
                [max(b, 0) for b in post], dilation, 1)


def pool(x: Array, a: Mapping[str, Any], mode: str) -> Array:
    window, stride, pad = a["window"], a["stride"], a["pad"]
    lowest = int(np.iinfo(x.dtype).min) if np.issubdtype(x.dtype, np.integer) else -np.inf
    fill = lowest if mode == "max" else 0
    pads = [(0, 0), (0, 0), *((p, p) for p in pad)]
    xp = np.pad(x, pads, constant_values=fill)
    win = _windows(xp, window, stride, [1] * len(window))
    axes = tuple(range(-len(window), 0))
    if mode == "max":
        return win.max(axis=axes)
    total = win.sum(axis=axes)
    if a.get("count_pad"):
        return total / math.prod(window)
    ones = np.pad(array_module(x).ones(x.shape[2:], dtype=x.dtype), [(p, p) for p in pad])
    counts = _windows(ones[None, None], window, stride, [1] * len(window)).sum(axis=axes)
    return total / counts


def upsample(x: Array, a: Mapping[str, Any]) -> Array:
    factors = a["factor"]
    out = x
    for i, f in enumerate(factors):
        axis = 2 + i
        if a["mode"] == "nearest":
            out = np.repeat(out, f, axis=axis)
            continue
        # Bilinear with half-pixel centres (PyTorch's align_corners=False).
        size = out.shape[axis]
        xp = array_module(x)
        dst = xp.arange(size * f)
        src = xp.maximum((dst + 0.5) / f - 0.5, 0)
        i0 = xp.minimum(xp.floor(src).astype(np.int64), size - 1)
        i1 = xp.minimum(i0 + 1, size - 1)
        lam = (src - i0).astype(out.dtype)
        shape = [1] * out.ndim
        shape[axis] = -1
        lam = lam.reshape(shape)
        out = xp.take(out, i0, axis=axis) * (1 - lam) + xp.take(out, i1, axis=axis) * lam
    return out
