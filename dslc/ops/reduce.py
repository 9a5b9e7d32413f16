"""Reductions over chosen axes (cuDNN reduction node), and `genstats` (per-channel sum and sum of
squares, the statistics cuDNN's genstats node produces)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np

from dslc.core.types import TensorType
from dslc.ops import common
from dslc.ops.opdef import Args, InferCtx, Kind, LowerCtx, OpDef, Param

# name -> (cuDNN reduction mode, summary)
REDUCTIONS = {
    "reduce_sum": ("ADD", "sum"),
    "reduce_mean": ("AVG", "mean"),
    "reduce_max": ("MAX", "maximum"),
    "reduce_min": ("MIN", "minimum"),
    "reduce_amax": ("AMAX", "maximum of absolute values"),
    "reduce_prod": ("MUL", "product"),
    "reduce_l1": ("NORM1", "sum of absolute values"),
    "reduce_l2": ("NORM2", "square root of the sum of squares"),
}


_REDUCE_REF = {
    "reduce_sum": lambda x, ax: np.sum(x, axis=ax, keepdims=True),
    "reduce_mean": lambda x, ax: np.mean(x, axis=ax, keepdims=True),
    "reduce_max": lambda x, ax: np.max(x, axis=ax, keepdims=True),
    "reduce_min": lambda x, ax: np.min(x, axis=ax, keepdims=True),
    "reduce_amax": lambda x, ax: np.max(np.abs(x), axis=ax, keepdims=True),
    "reduce_prod": lambda x, ax: np.prod(x, axis=ax, keepdims=True),
    "reduce_l1": lambda x, ax: np.sum(np.abs(x), axis=ax, keepdims=True),
    "reduce_l2": lambda x, ax: np.sqrt(np.sum(x * x, axis=ax, keepdims=True)),
}


def _reduce_ref(op: str, xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    axes = tuple(a["axes"])
    out = _REDUCE_REF[op](xs[0], axes)
    return out if a["keepdims"] else np.squeeze(out, axis=axes)


def _genstats_ref(xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    x = xs[0]
    axes = (0, *range(2, x.ndim))
    return np.sum(x if a.get("output", 0) == 0 else x * x, axis=axes, keepdims=True)


def _lower_reduce(op: str):  # type: ignore[no-untyped-def]  # pragma: no mutate block
    """cuDNN's reduction node, with the reduced dims spelled out (kept as 1s). cuDNN has no
    mean reduction in graphs: a sum, then a multiply by 1/count."""
    mode = REDUCTIONS[op][0]

    def lower(ctx: LowerCtx, xs: list[Any], a: Mapping[str, Any]) -> Any:
        x = xs[0]
        reduced = ctx.g.reduction(input=x, mode=ctx.enum("reduction_mode",
                                                          "ADD" if mode == "AVG" else mode))
        reduced.set_dim(ctx.result_dims()).set_stride(ctx.result_strides())
        if mode != "AVG":
            return reduced
        count = 1
        for axis in a["axes"]:
            count *= x.get_dim()[axis]
        return ctx.g.mul(a=reduced, b=ctx.scalar(1.0 / count))

    return lower


def _reduce(op: str, ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    if not common.require_float(ctx, op, "x", x):
        return None
    axes = common.norm_axes(ctx, op, "axes", a["axes"], x.rank)
    if axes is None:
        return None
    if not axes:
        ctx.error("E0304", f"`{op}` needs at least one axis", at="axes", label="no axis given")
        return None
    if not common.check_compute(ctx, op, [x], need_f32=True):
        return None
    ctx.set_attr("axes", tuple(sorted(axes)))
    if a["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return TensorType(x.dtype, shape)


def _genstats(ctx: InferCtx, a: Args) -> tuple[TensorType, ...] | None:
    x = a.t("x")
    if x.rank < 2:
        ctx.error("E0301", "`genstats` expects x [N, C, *S]", at="x",
                  label=f"{common.fmt(x)} has rank {x.rank}")
        return None
    if not common.require_float(ctx, "genstats", "x", x):
        return None
    stat = TensorType("f32", (1, x.shape[1], *([1] * (x.rank - 2))))
    return (stat, stat)


OPS = [
    OpDef(name, "reduce",
          (Param("x", Kind.TENSOR), Param("axes", Kind.AXES), Param("keepdims", Kind.BOOL, False)),
          partial(_reduce, name), "x without `axes` (kept as 1 with keepdims)", summary, fusion="reduce",
          reference=partial(_reduce_ref, name), lower=_lower_reduce(name))
    for name, (_, summary) in REDUCTIONS.items()
] + [
    OpDef("genstats", "reduce", (Param("x", Kind.TENSOR),), _genstats,
          "(f32[1, C, 1...], f32[1, C, 1...])", "per-channel sum and sum of squares",
          reference=_genstats_ref,
          lower=lambda ctx, xs, a: ctx.g.genstats(input=xs[0])[int(a.get("output", 0))]),
]
