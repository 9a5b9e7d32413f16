"""Convolutions: `conv` (cuDNN conv_fprop) and `conv_transpose` (cuDNN conv_dgrad).

Shapes follow PyTorch: x [N, C, *S], w [K, C/groups, *R] -> [N, K, *O] with
O = floor((S + pre + post - d*(R-1) - 1) / s) + 1; transposed: O = (S-1)*s - pre - post +
d*(R-1) + 1 + output_pad.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dslc.core import dims
from dslc.core.dims import Dim
from dslc.core.types import FP8, TensorType, format_shape, is_float
from dslc.ops import common
from dslc.ops import reference_conv as ref
from dslc.ops.opdef import Args, InferCtx, Kind, LowerCtx, OpDef, Param


def spatial_rank(ctx: InferCtx, op: str, x: TensorType, what: str = "x [N, C, *S]") -> int | None:
    n = x.rank - 2
    if not 1 <= n <= 3:
        ctx.error("E0301", f"`{op}` expects {what} with 1 to 3 spatial axes", at="x",
                  label=f"{common.fmt(x)} has rank {x.rank}",
                  notes=("the first two axes are batch and channels",))
        return None
    return n


def conv_out_size(ctx: InferCtx, size: Dim, pre: int, post: int, dilation: int, kernel: Dim,
                  stride: int) -> Dim:
    """floor((S + pre + post - d*(R-1) - 1) / s) + 1, simplified symbolically."""
    span = dims.sub(dims.add(size, pre + post), dims.add(dims.mul(dilation, dims.sub(kernel, 1)), 1))
    return dims.add(dims.floordiv(span, stride, ctx.env), 1)


def _pads(ctx: InferCtx, op: str, a: Args, n: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    # After checking, `pad` is recorded as None and the sides as pre_pad and post_pad.
    pad = common.per_axis(ctx, op, "pad", a["pad"] if a["pad"] is not None else 0, n, 0)
    pre = pad if a.get("pre_pad") is None else common.per_axis(ctx, op, "pre_pad", a["pre_pad"], n, 0)
    post = pad if a.get("post_pad") is None else common.per_axis(ctx, op, "post_pad", a["post_pad"], n, 0)
    if pre is None or post is None:
        return None
    return pre, post


def _conv_dtypes(ctx: InferCtx, op: str, x: TensorType, w: TensorType) -> str | None:
    """The result dtype: floats keep theirs, fp8 gives the io dtype, i8 gives i32."""
    if x.dtype == "i8" and w.dtype == "i8":
        return "i32"
    if x.dtype in FP8 and w.dtype in FP8:
        return ctx.precision.io if is_float(ctx.precision.io) and ctx.precision.io not in FP8 else "f32"
    if common.refuse_fp8_mix(ctx, op, "x", x, "w", w):
        return None
    if not common.require_float(ctx, op, "x", x) or not common.require_same_dtype(ctx, op, "x", x, "w", w):
        return None
    return x.dtype


def _warn_nchw(ctx: InferCtx, op: str, x: TensorType) -> None:
    if x.rank == 4 and x.layout is not None and x.layout.is_row_major and x.dtype in ("f16", "bf16", *FP8):
        ctx.error("W0501", f"{x.dtype} `{op}` on NCHW data", at="x", label=f"{common.fmt(x)} is NCHW",
                  notes=("tensor-core convolutions run on channels-last data; NCHW costs a "
                         "transpose or a slower engine",),
                  help=("declare the input `@NHWC`, or set `layout NHWC` in the model",))


def _conv(ctx: InferCtx, a: Args) -> TensorType | None:
    x, w = a.t("x"), a.t("w")
    n = spatial_rank(ctx, "conv", x)
    if n is None:
        return None
    if w.rank != x.rank:
        ctx.error("E0301", f"the weight of `conv` must have rank {x.rank}", at="w",
                  label=common.fmt(w), labels=(ctx.label("x", common.fmt(x)),),
                  notes=("w is [K, C / groups, *R], one kernel axis per spatial axis of x",))
        return None
    dtype = _conv_dtypes(ctx, "conv", x, w)
    if dtype is None or not common.check_compute(ctx, "conv", [x, w], need_f32=dtype != "i32"):
        return None
    groups = a["groups"]
    if not isinstance(groups, int) or groups < 1:
        ctx.error("E0305", "`groups` of `conv` must be at least 1", at="groups",
                  label=f"{groups} here")
        return None
    c, k = x.shape[1], w.shape[0]
    per_group = dims.div_exact(c, groups, ctx.env)
    if per_group is None or dims.div_exact(k, groups, ctx.env) is None:
        ctx.error("E0301", f"`groups={groups}` must divide both the input and output channels",
                  at="groups", labels=(ctx.label("x", common.fmt(x)), ctx.label("w", common.fmt(w))),
                  notes=(f"C = {dims.format_dim(c)}, K = {dims.format_dim(k)}",))
        return None
    if w.shape[1] != per_group:
        ctx.error("E0301", "the weight's input channels do not match the input", at="w",
                  label=common.fmt(w), labels=(ctx.label("x", common.fmt(x)),),
                  notes=(f"axis 1 of w must be C / groups = {dims.format_dim(per_group)}, "
                         f"found {dims.format_dim(w.shape[1])}",))
        return None
    stride = common.per_axis(ctx, "conv", "stride", a["stride"], n, 1)
    dilation = common.per_axis(ctx, "conv", "dilation", a["dilation"], n, 1)
    pads = _pads(ctx, "conv", a, n)
    if stride is None or dilation is None or pads is None:
        return None
    pre, post = pads
    out: list[Dim] = [x.shape[0], k]
    for i in range(n):
        size = conv_out_size(ctx, x.shape[2 + i], pre[i], post[i], dilation[i], w.shape[2 + i], stride[i])
        if not common.at_least_one(ctx, "conv", size, 2 + i, "x"):
            return None
        out.append(size)
    _warn_nchw(ctx, "conv", x)
    for key, value in (("stride", stride), ("dilation", dilation), ("pre_pad", pre), ("post_pad", post)):
        ctx.set_attr(key, value)
    ctx.set_attr("pad", None)
    return TensorType(dtype, tuple(out))


def _conv_transpose(ctx: InferCtx, a: Args) -> TensorType | None:
    x, w = a.t("x"), a.t("w")
    n = spatial_rank(ctx, "conv_transpose", x, "x [N, K, *S]")
    if n is None:
        return None
    if w.rank != x.rank:
        ctx.error("E0301", f"the weight of `conv_transpose` must have rank {x.rank}", at="w",
                  label=common.fmt(w), notes=("w is [K, C, *R] (PyTorch's ConvTranspose layout)",))
        return None
    dtype = _conv_dtypes(ctx, "conv_transpose", x, w)
    if dtype is None or not common.check_compute(ctx, "conv_transpose", [x, w], need_f32=True):
        return None
    if w.shape[0] != x.shape[1]:
        ctx.error("E0301", "the weight's first axis must match the input channels", at="w",
                  label=common.fmt(w), labels=(ctx.label("x", common.fmt(x)),),
                  notes=(f"x has {dims.format_dim(x.shape[1])} channels, w.shape[0] is "
                         f"{dims.format_dim(w.shape[0])}",))
        return None
    stride = common.per_axis(ctx, "conv_transpose", "stride", a["stride"], n, 1)
    dilation = common.per_axis(ctx, "conv_transpose", "dilation", a["dilation"], n, 1)
    pad = common.per_axis(ctx, "conv_transpose", "pad", a["pad"], n, 0)
    opad = common.per_axis(ctx, "conv_transpose", "output_pad", a["output_pad"], n, 0)
    if stride is None or dilation is None or pad is None or opad is None:
        return None
    for i in range(n):
        if opad[i] >= max(stride[i], dilation[i]):
            ctx.error("E0305", "`output_pad` must be smaller than the stride or the dilation",
                      at="output_pad", label=f"{opad[i]} here")
            return None
    out: list[Dim] = [x.shape[0], w.shape[1]]
    for i in range(n):
        # (S - 1) * s - 2 * pad + d * (R - 1) + 1 + output_pad
        size = dims.add(dims.mul(dims.sub(x.shape[2 + i], 1), stride[i]),
                        dims.mul(dilation[i], dims.sub(w.shape[2 + i], 1)))
        size = dims.add(size, 1 + opad[i] - 2 * pad[i])
        if not common.at_least_one(ctx, "conv_transpose", size, 2 + i, "x"):
            return None
        out.append(size)
    for key, value in (("stride", stride), ("dilation", dilation), ("pad", pad), ("output_pad", opad)):
        ctx.set_attr(key, value)
    return TensorType(dtype, tuple(out))


def _quantize(ctx: InferCtx, a: Args, dtype: str) -> bool:
    """fp8 convolution (cuDNN's fp8 conv_fprop on Hopper): a 2-d convolution of float operands,
    ungrouped, with input and output channels in multiples of 16."""
    x, w = a.t("x"), a.t("w")
    if not (common.fp8_operand(ctx, "conv", "x", x, dtype)
            and common.fp8_operand(ctx, "conv", "w", w, dtype)):
        return False
    if x.rank != 4 or a["groups"] != 1:
        what = f"groups={a['groups']}" if a["groups"] != 1 else f"{x.rank - 2} spatial axes"
        ctx.error("E0404", f"`conv` cannot compute in {dtype} with {what}", at="x",
                  label=common.fmt(x), labels=common.asked(ctx, dtype),
                  notes=("cuDNN's fp8 convolutions are 2-d and ungrouped",),
                  help=("leave this convolution unquantised",))
        return False
    if any(x.shape[i] == 1 and w.shape[i] != 1 for i in (2, 3)):
        # cuDNN does not run such a window (backend.spec._window_inside_image): its fallback
        # kernel computes the reference, which has no fp8.
        ctx.error("E0404", f"`conv` cannot compute in {dtype} with a "
                  f"{format_shape(w.shape[2:])} window over a one-pixel image", at="x",
                  label=common.fmt(x), labels=common.asked(ctx, dtype),
                  notes=("a window wider than the image runs outside cuDNN, where no fp8 "
                         "convolution exists",),
                  help=("leave this convolution unquantised",))
        return False
    return (common.fp8_multiple(ctx, "conv", "x", x.shape[1], "input channels C", dtype)
            and common.fp8_multiple(ctx, "conv", "w", w.shape[0], "output channels K", dtype))


def depthwise_taps(x: tuple[Any, ...], w: tuple[Any, ...], groups: int) -> int | None:
    """A 2-d conv with one filter per channel (`groups` = channels, w [C, 1, kh, kw]; channels
    and filters static), given its operands' shapes: its filter's taps kh * kw; None for any
    other conv."""
    if len(x) != 4 or len(w) != 4:
        return None
    c, (k, per_group, kh, kw) = x[1], w
    if not isinstance(kh, int) or not isinstance(kw, int) or not isinstance(c, int) \
            or groups != c or k != c or per_group != 1:
        return None
    return kh * kw


# The cuDNN lowerings are left out of mutation testing: their numbers are checked only on a GPU.
def _lower_conv(ctx: LowerCtx, xs: list[Any], a: Mapping[str, Any]) -> Any:  # pragma: no mutate block
    return ctx.g.conv_fprop(image=xs[0], weight=xs[1], pre_padding=list(a["pre_pad"]),
                            post_padding=list(a["post_pad"]), stride=list(a["stride"]),
                            dilation=list(a["dilation"]))


def _lower_conv_transpose(ctx: LowerCtx, xs: list[Any], a: Mapping[str, Any],
                          ) -> Any:  # pragma: no mutate block
    """conv_dgrad of the conv that maps the output back to the input: its padding after is
    `pad - output_pad`, and the output dims are set (they are ambiguous for a strided conv)."""
    post = [p - o for p, o in zip(a["pad"], a["output_pad"], strict=True)]
    y = ctx.g.conv_dgrad(loss=xs[0], filter=xs[1], pre_padding=list(a["pad"]), post_padding=post,
                         stride=list(a["stride"]), dilation=list(a["dilation"]))
    return y.set_dim(ctx.result_dims()).set_stride(ctx.result_strides())


OPS = [
    OpDef("conv", "conv",
          (Param("x", Kind.TENSOR), Param("w", Kind.TENSOR), Param("stride", Kind.INTS, 1),
           Param("pad", Kind.INTS, 0), Param("pre_pad", Kind.INTS, None),
           Param("post_pad", Kind.INTS, None), Param("dilation", Kind.INTS, 1),
           Param("groups", Kind.INT, 1)),
          _conv, "[N, K, *O]", "convolution (cross-correlation, as PyTorch)", fusion="anchor",
          reference=lambda xs, a: ref.conv(xs[0], xs[1], a["stride"], a["pre_pad"], a["post_pad"],
                                           a["dilation"], a["groups"]),
          lower=_lower_conv, quantize=_quantize),
    OpDef("conv_transpose", "conv",
          (Param("x", Kind.TENSOR), Param("w", Kind.TENSOR), Param("stride", Kind.INTS, 1),
           Param("pad", Kind.INTS, 0), Param("dilation", Kind.INTS, 1),
           Param("output_pad", Kind.INTS, 0)),
          _conv_transpose, "[N, C, *O]", "transposed convolution (gradient of conv wrt its input)",
          fusion="anchor",
          reference=lambda xs, a: ref.conv_transpose(xs[0], xs[1], a["stride"], a["pad"],
                                                     a["dilation"], a["output_pad"]),
          lower=_lower_conv_transpose),
]
