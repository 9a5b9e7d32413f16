"""`cache_write`: a key/value cache of decoding, written in place. cache [B, H, MAX, D] (a model
input the caller owns and passes at every step), new [B, H, S, D], at i32 [1] (the offset, a
run-time value: one plan and one CUDA graph serve every position) -> the cache with `new` at
rows [at, at + S). Rows outside [0, MAX) are not written (a GPU kernel cannot stop the stream to
report them; the reference drops them too).

The reference is functional (a copy with the rows replaced), so the interpreter stays pure. At
run time the result IS the cache: its storage is the input's (`dslc.runtime.schedule`), and a
fallback kernel writes the S rows into the caller's buffer, reading `at` on the device. That is
only sound where nothing else reads the cache input (it would see the new rows or not,
depending on the order of the steps): the type rule asks for a model input (E0211), and the
checker that no other op or output reads it (`dslc.check.inplace`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dslc.core import dims
from dslc.core.types import TensorType
from dslc.ops import common
from dslc.ops.opdef import Args, InferCtx, Kind, OpDef, Param

# What a cache may hold: what the fallback kernels store (bf16 as its bits).
CACHE_DTYPES = ("f32", "f16", "bf16")


def _cache_write(ctx: InferCtx, a: Args) -> TensorType | None:
    cache, new, at = a.t("cache"), a.t("new"), a.t("at")
    made = ctx.producer("cache")
    if made != "input":
        what = "a param (weights)" if made == "param" else "computed here"
        ctx.error("E0211", f"`cache_write` writes in place into a model input, and `cache` is "
                  f"{what}", at="cache", label=f"{common.fmt(cache)}, made by `{made}`",
                  notes=("the caller owns the cache and passes the same buffer at every step; "
                         "its result is that buffer",),
                  help=("declare the cache an input (`input k_cache: [B, H, MAX, D]`) and pass "
                        "it to `cache_write` as it is",))
        return None
    for name, t in (("cache", cache), ("new", new)):
        if t.rank != 4:
            ctx.error("E0301", f"`{name}` of `cache_write` must be rank 4: [B, H, S, D]",
                      at=name, label=f"{common.fmt(t)} has rank {t.rank}")
            return None
    if cache.dtype not in CACHE_DTYPES:
        ctx.error("E0401", f"`cache_write` keeps f32, f16 or bf16 caches, not {cache.dtype}",
                  at="cache", label=common.fmt(cache))
        return None
    if not common.require_same_dtype(ctx, "cache_write", "cache", cache, "new", new):
        return None
    for axis, what in ((0, "batch"), (1, "head count"), (3, "head dimension")):
        if new.shape[axis] != cache.shape[axis]:
            ctx.error("E0301", f"the {what} of `new` is not the cache's", at="new",
                      label=common.fmt(new), labels=(ctx.label("cache", common.fmt(cache)),),
                      notes=(f"expected {dims.format_dim(cache.shape[axis])}, found "
                             f"{dims.format_dim(new.shape[axis])}",))
            return None
    rows, room = new.shape[2], cache.shape[2]
    if isinstance(rows, int) and isinstance(room, int) and rows > room:
        ctx.error("E0301", f"`cache_write` of {rows} rows into a cache of {room}", at="new",
                  label=common.fmt(new), labels=(ctx.label("cache", common.fmt(cache)),))
        return None
    if at.dtype != "i32" or at.shape != (1,):
        ctx.error("E0301", "`at` of `cache_write` must be one i32 offset: i32[1]", at="at",
                  label=common.fmt(at),
                  notes=("the offset is read on the device at run time, so one plan and one "
                         "CUDA graph serve every position",))
        return None
    return TensorType(cache.dtype, cache.shape, cache.layout)


def _cache_write_ref(xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    """A copy of the cache with rows [at, at + S) of axis 2 replaced by `new` (rows outside the
    cache dropped)."""
    cache, new, at = xs
    out = np.array(cache, copy=True)
    rows = int(np.asarray(at).reshape(-1)[0]) + np.arange(new.shape[2])
    inside = (rows >= 0) & (rows < cache.shape[2])
    out[:, :, rows[inside]] = new[:, :, inside]
    return out


OPS = [
    OpDef("cache_write", "index",
          (Param("cache", Kind.TENSOR), Param("new", Kind.TENSOR), Param("at", Kind.TENSOR)),
          _cache_write, "[B, H, MAX, D] (the cache, updated in place)",
          "the cache (a model input) with `new` [B, H, S, D] written at rows [at, at + S), in "
          "place: at an i32[1] offset read at run time", reference=_cache_write_ref),
]
