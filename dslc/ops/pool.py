"""Pooling and resampling: `maxpool`, `avgpool`, `upsample` (cuDNN's resample node).

Pooling output: O = floor((S + 2 * pad - window) / stride) + 1, as PyTorch (no ceil mode).
"""

from __future__ import annotations

from functools import partial

from dslc.core import dims
from dslc.core.dims import Dim
from dslc.core.types import TensorType
from dslc.ops import common
from dslc.ops import reference_conv as ref
from dslc.ops.conv import conv_out_size, spatial_rank
from dslc.ops.opdef import Args, InferCtx, Kind, OpDef, Param


def _pool(op: str, ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    n = spatial_rank(ctx, op, x)
    if n is None:
        return None
    if x.dtype != "i8" and not common.require_float(ctx, op, "x", x):
        return None
    window = common.per_axis(ctx, op, "window", a["window"], n, 1)
    # the stride defaults to the window: a window refused is not refused again as the stride
    stride = window if a["stride"] is None else \
        common.per_axis(ctx, op, "stride", a["stride"], n, 1)
    pad = common.per_axis(ctx, op, "pad", a["pad"], n, 0)
    if window is None or stride is None or pad is None:
        return None
    for i in range(n):
        if 2 * pad[i] > window[i]:
            ctx.error("E0305", f"the padding of `{op}` must be at most half the window",
                      at="pad", label=f"pad {pad[i]}, window {window[i]}")
            return None
    out: list[Dim] = [x.shape[0], x.shape[1]]
    for i in range(n):
        size = conv_out_size(ctx, x.shape[2 + i], pad[i], pad[i], 1, window[i], stride[i])
        if not common.at_least_one(ctx, op, size, 2 + i, "x"):
            return None
        out.append(size)
    for key, value in (("window", window), ("stride", stride), ("pad", pad)):
        ctx.set_attr(key, value)
    return TensorType(x.dtype, tuple(out))


def _upsample(ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    n = spatial_rank(ctx, "upsample", x)
    if n is None or not common.require_float(ctx, "upsample", "x", x):
        return None
    factor = common.per_axis(ctx, "upsample", "factor", a["factor"], n, 1)
    if factor is None:
        return None
    ctx.set_attr("factor", factor)
    shape = (x.shape[0], x.shape[1], *(dims.mul(x.shape[2 + i], factor[i]) for i in range(n)))
    return TensorType(x.dtype, shape)


_POOL_PARAMS = (Param("x", Kind.TENSOR), Param("window", Kind.INTS),
                Param("stride", Kind.INTS, None), Param("pad", Kind.INTS, 0))
OPS = [
    OpDef("maxpool", "pool", _POOL_PARAMS, partial(_pool, "maxpool"), "[N, C, *O]",
          "maximum over each window (padding never wins)",
          reference=lambda xs, a: ref.pool(xs[0], a, "max")),
    OpDef("avgpool", "pool", (*_POOL_PARAMS, Param("count_pad", Kind.BOOL, False)),
          partial(_pool, "avgpool"), "[N, C, *O]",
          "mean over each window; count_pad counts padded zeros in the divisor",
          reference=lambda xs, a: ref.pool(xs[0], a, "avg")),
    OpDef("upsample", "pool",
          (Param("x", Kind.TENSOR), Param("factor", Kind.INTS),
           Param("mode", Kind.STR, "nearest", ("nearest", "bilinear"))),
          _upsample, "[N, C, *S * factor]", "nearest or bilinear upsampling by an integer factor",
          reference=lambda xs, a: ref.upsample(xs[0], a)),
]
