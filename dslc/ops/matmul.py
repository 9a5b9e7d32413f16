"""`matmul`: a [*Ba, M, K] x b [*Bb, K, N] -> [broadcast(Ba, Bb), M, N] (cuDNN matmul, rank padded
to 3). The last two axes of either operand may be row- or column-major, so a transposed param or
input folds into its strides."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dslc.core import dims
from dslc.core.types import FP8, TensorType
from dslc.ops import common
from dslc.ops.opdef import Args, InferCtx, Kind, OpDef, Param


def _batch_outermost(types: Mapping[str, TensorType]) -> str | None:
    """cuDNN multiplies [batch, M, K] by [batch, K, N]: the batch axes (those not of size 1)
    must be outermost in memory, in order, to merge into one (a conv's NHWC output read as
    [N, C, H, W] batches is not)."""
    for name in ("a", "b"):
        t = types[name]
        if t.layout is None:
            continue
        batch = [a for a in range(t.rank - 2) if t.shape[a] != 1]
        order = [a for a in t.layout.order if t.shape[a] != 1]
        if order[:len(batch)] != batch:
            return f"the batch axes of `{name}` must be outermost in memory"
    return None


def _swap_last(rank: int) -> list[int]:
    return [*range(rank - 2), rank - 1, rank - 2]


def _matmul(ctx: InferCtx, a: Args) -> TensorType | None:
    x, y = a.t("a"), a.t("b")
    for name, t in (("a", x), ("b", y)):
        if t.rank < 2:
            ctx.error("E0301", "`matmul` needs operands of rank 2 or more", at=name,
                      label=f"{common.fmt(t)} has rank {t.rank}",
                      help=("reshape a vector to a matrix first, e.g. `reshape(v, [1, K])`",))
            return None
    if x.shape[-1] != y.shape[-2]:
        kx, ky = dims.format_dim(x.shape[-1]), dims.format_dim(y.shape[-2])
        ctx.error("E0302", "the inner dimensions of `matmul` differ", at="b",
                  label=f"{common.fmt(y)}: K = {ky} (axis {y.rank - 2})",
                  labels=(ctx.label("a", f"{common.fmt(x)}: K = {kx} (last axis)"),),
                  notes=(f"a is [.., M, K] and b is [.., K, N]; here {kx} vs {ky}",),
                  help=(f"if `{ctx.text('b')}` is stored [.., N, K] (as PyTorch's Linear "
                        f"weight), use `transpose({ctx.text('b')}, {_swap_last(y.rank)})`, "
                        "which costs nothing",))
        return None
    if x.dtype == "i8" and y.dtype == "i8":
        dtype = "i32"
    elif x.dtype in FP8 and y.dtype in FP8:
        dtype = "f32"
    elif common.refuse_fp8_mix(ctx, "matmul", "a", x, "b", y):
        return None
    else:
        if not (common.require_float(ctx, "matmul", "a", x)
                and common.require_same_dtype(ctx, "matmul", "a", x, "b", y)):
            return None
        dtype = x.dtype
    if not common.check_compute(ctx, "matmul", [x, y], need_f32=dtype != "i32"):
        return None
    batch = common.broadcast(ctx, TensorType(x.dtype, x.shape[:-2]), TensorType(y.dtype, y.shape[:-2]),
                             "a", "b", "matmul")
    if batch is None:
        return None
    return TensorType(dtype, (*batch, x.shape[-2], y.shape[-1]))


def _quantize(ctx: InferCtx, a: Args, dtype: str) -> bool:
    """fp8 matmul (cuBLASLt's fp8 GEMMs on Hopper): float operands, the contraction K and the
    output's N in multiples of 16."""
    x, y = a.t("a"), a.t("b")
    return (common.fp8_operand(ctx, "matmul", "a", x, dtype)
            and common.fp8_operand(ctx, "matmul", "b", y, dtype)
            and common.fp8_multiple(ctx, "matmul", "a", x.shape[-1], "inner dimension K", dtype)
            and common.fp8_multiple(ctx, "matmul", "b", y.shape[-1], "output width N", dtype))


OPS = [
    OpDef("matmul", "matmul", (Param("a", Kind.TENSOR), Param("b", Kind.TENSOR)), _matmul,
          "[*B, M, N]", "matrix product, batched over leading axes", fusion="anchor",
          reference=lambda xs, a: np.matmul(xs[0], xs[1]),
          lower=lambda ctx, xs, a: ctx.g.matmul(A=xs[0], B=xs[1]), needs=_batch_outermost,
          quantize=_quantize),
]
