"""Indexing: `gather`, numpy's `take` (rows of a table picked by integer indices: an embedding
lookup), `arange` (0, 1, ..., n - 1: position ids) and `full` (one integer everywhere: the query
lengths of a padding mask, which may be a dynamic dim). cuDNN's graph API has none of them, so
fallback kernels run them; an index outside the table gives NaN, on the reference as on the GPU
(a kernel that checked would have to stop the stream; NaN cannot pass for a row of the table)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dslc.core.dims import Dim
from dslc.core.types import FLOATS, TensorType
from dslc.ops import common
from dslc.ops.opdef import Args, InferCtx, Kind, OpDef, Param
from dslc.ops.reference_conv import array_module

INDEX_DTYPES = ("i32", "i64")


def _gather(ctx: InferCtx, a: Args) -> TensorType | None:
    x, idx = a.t("x"), a.t("indices")
    if x.dtype not in FLOATS:
        ctx.error("E0401", f"`gather` reads a table of floats, not {x.dtype}", at="x",
                  label=common.fmt(x), notes=("an index outside the table gives NaN, which only "
                                              "a float can hold",))
        return None
    if idx.dtype not in INDEX_DTYPES:
        ctx.error("E0401", f"the indices of `gather` are integers (i32 or i64), not {idx.dtype}",
                  at="indices", label=common.fmt(idx),
                  help=("declare them `i64` (or `cast` them)",))
        return None
    axis = int(a["axis"])
    if not -x.rank <= axis < x.rank:
        ctx.error("E0305", f"`axis` of `gather` is {axis}, but x has rank {x.rank}", at="axis")
        return None
    axis %= x.rank
    ctx.set_attr("axis", axis)
    return TensorType(x.dtype, (*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]))


def _gather_ref(xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    """take(x, indices, axis), NaN where an index is outside [0, size of the axis)."""
    x, idx = xs
    xp = array_module(x)
    axis, n = int(a["axis"]), x.shape[int(a["axis"])]
    out = xp.take(x, xp.clip(idx, 0, n - 1), axis=axis)
    outside = ((idx < 0) | (idx >= n)).reshape((1,) * axis + idx.shape + (1,) * (x.ndim - axis - 1))
    return xp.where(outside, xp.asarray(np.nan, dtype=out.dtype), out)


def _arange(ctx: InferCtx, a: Args) -> TensorType | None:
    n: Dim = a["n"]
    if a["dtype"] not in INDEX_DTYPES:
        ctx.error("E0401", f"`arange` makes i32 or i64 values, not {a['dtype']}", at="dtype",
                  help=("`cast` the result for another dtype",))
        return None
    if isinstance(n, int) and n < 1:
        ctx.error("E0305", f"`arange` of {n} values", at="n", label="n must be at least 1")
        return None
    return TensorType(a["dtype"], (n,))


def _full(ctx: InferCtx, a: Args) -> TensorType | None:
    shape: tuple[Dim, ...] = tuple(a["shape"])
    if a["dtype"] not in INDEX_DTYPES:
        ctx.error("E0401", f"`full` makes i32 or i64 values, not {a['dtype']}", at="dtype",
                  help=("`cast` the result for another dtype",))
        return None
    if any(isinstance(d, int) and d < 1 for d in shape):
        ctx.error("E0305", "`full` of an empty shape", at="shape",
                  label="every size must be at least 1")
        return None
    return TensorType(a["dtype"], shape)


def _full_ref(xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    return np.full(tuple(int(d) for d in a["shape"]), int(a["value"]), dtype=np.int64)


OPS = [
    OpDef("gather", "index",
          (Param("x", Kind.TENSOR), Param("indices", Kind.TENSOR), Param("axis", Kind.INT, 0)),
          _gather, "x.shape[:axis] + indices.shape + x.shape[axis+1:]",
          "x's entries along `axis` at integer indices (numpy take, an embedding lookup); an "
          "index outside the axis gives NaN", reference=_gather_ref),
    OpDef("arange", "index",
          (Param("n", Kind.DIM), Param("dtype", Kind.DTYPE, "i64")),
          _arange, "[n]", "0, 1, ..., n - 1 (position ids)",
          reference=lambda xs, a: np.arange(int(a["n"]), dtype=np.int64)),
    OpDef("full", "index",
          (Param("shape", Kind.SHAPE), Param("value", Kind.DIM), Param("dtype", Kind.DTYPE, "i32")),
          _full, "shape", "`value` (an integer or a dim, static or dynamic) everywhere",
          reference=_full_ref),
]
