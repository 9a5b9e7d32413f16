"""ONNX's convolutions, pooling, normalisations and resizing as `.cgraph` operations."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dslc.core import dims
from dslc.importer.context import Context, Handler, Node, Unsupported, axis_of
from dslc.importer.graph import Const, Op, Value, const_array
from dslc.importer.ops_math import float_tensor, zero_bias
from dslc.importer.shapes import window_out


def per_axis(values: list[int]) -> int | list[int]:
    """An attribute the language takes as one int for every axis, or one per axis."""
    return values[0] if len(set(values)) == 1 else values


def _spatial(node: Node, x: Op, what: str) -> int:
    n = x.rank - 2
    if not 1 <= n <= 3:
        raise Unsupported(f"{what} over {n} spatial axes", "the language's take 1 to 3")
    return n


def _pads(node: Node, x: Op, n: int, kernel: list[int], strides: list[int],
          dilations: list[int]) -> tuple[list[int], list[int]]:
    """The padding before and after each spatial axis, `auto_pad` worked out."""
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(node.attr("pads", [0] * (2 * n)))
        return pads[:n], pads[n:]
    if auto == "VALID":
        return [0] * n, [0] * n
    pre, post = [], []
    for i in range(n):
        size = x.shape[2 + i]
        if not isinstance(size, int):
            raise Unsupported(f"auto_pad={auto} over a symbolic size",
                              "its padding depends on the size; export with explicit pads")
        out = -(-size // strides[i])
        total = max((out - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - size, 0)
        small, large = total // 2, total - total // 2
        pre.append(small if auto == "SAME_UPPER" else large)
        post.append(large if auto == "SAME_UPPER" else small)
    return pre, post


def _absorb_pad(x: Op, pre: list[int], post: list[int], fill: float) -> tuple[Op, list[int],
                                                                              list[int]]:
    """A `Pad` of the spatial axes right before a window op, taken into its padding (`fill` is
    what the window op pads with: 0 for a convolution)."""
    if x.op != "pad" or x.attrs["value"] != fill:
        return x, pre, post
    before, after = x.attrs["before"], x.attrs["after"]
    n = len(pre)
    if any(before[:2]) or any(after[:2]):
        return x, pre, post
    inner = x.args[0]
    assert isinstance(inner, Op)
    return (inner, [a + b for a, b in zip(pre, before[2:2 + n], strict=True)],
            [a + b for a, b in zip(post, after[2:2 + n], strict=True)])


def conv(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "Conv")
    w = ctx.tensor(node.need(1))
    n = _spatial(node, x, "a convolution")
    kernel = list(node.attr("kernel_shape", w.shape[2:]))
    if not all(isinstance(k, int) for k in kernel):
        raise Unsupported("a kernel of symbolic size")
    strides = list(node.attr("strides", [1] * n))
    dilations = list(node.attr("dilations", [1] * n))
    groups = int(node.attr("group", 1))
    pre, post = _pads(node, x, n, kernel, strides, dilations)
    x, pre, post = _absorb_pad(x, pre, post, 0.0)
    spatial = [window_out(x.shape[2 + i], kernel[i], strides[i], pre[i], post[i], dilations[i],
                          ctx.env) for i in range(n)]
    attrs: dict[str, Any] = {"stride": per_axis(strides) if set(strides) != {1} else None}
    if pre == post:
        attrs["pad"] = per_axis(pre) if any(pre) else None
    else:
        attrs.update(pre_pad=per_axis(pre), post_pad=per_axis(post))
    attrs["dilation"] = per_axis(dilations) if set(dilations) != {1} else None
    attrs["groups"] = groups if groups != 1 else None
    y = ctx.make("conv", [x, w], attrs, shape=(x.shape[0], w.shape[0], *spatial))
    return [_bias(ctx, y, node.input(2))]


def _bias(ctx: Context, y: Op, b: Value | None) -> Op:
    """`bias_add` of a per-channel bias, left out when there is none or it is all zeros (the
    exporters write a zero bias for a convolution without one)."""
    if b is None or zero_bias(b):
        return y
    return ctx.make("bias_add", [y, ctx.tensor(b)])


def conv_transpose(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "ConvTranspose")
    w = ctx.tensor(node.need(1))
    n = _spatial(node, x, "a transposed convolution")
    if int(node.attr("group", 1)) != 1:
        raise Unsupported("a grouped transposed convolution")
    if node.attr("output_shape") is not None:
        raise Unsupported("output_shape", "export with pads and output_padding instead")
    kernel = list(node.attr("kernel_shape", w.shape[2:]))
    strides = list(node.attr("strides", [1] * n))
    dilations = list(node.attr("dilations", [1] * n))
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID"):
        raise Unsupported(f"auto_pad={node.attr('auto_pad')}")
    pads = list(node.attr("pads", [0] * (2 * n)))
    if pads[:n] != pads[n:]:
        raise Unsupported("padding that differs before and after an axis")
    extra = list(node.attr("output_padding", [0] * n))
    spatial = [dims.add(dims.mul(dims.sub(x.shape[2 + i], 1), strides[i]),
                        dilations[i] * (kernel[i] - 1) + 1 - 2 * pads[i] + extra[i])
               for i in range(n)]
    attrs = {"stride": per_axis(strides) if set(strides) != {1} else None,
             "pad": per_axis(pads[:n]) if any(pads) else None,
             "dilation": per_axis(dilations) if set(dilations) != {1} else None,
             "output_pad": per_axis(extra) if any(extra) else None}
    y = ctx.make("conv_transpose", [x, w], attrs, shape=(x.shape[0], w.shape[1], *spatial))
    return [_bias(ctx, y, node.input(2))]


def pool(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), node.op_type)
    n = _spatial(node, x, "pooling")
    kernel = list(node.attr("kernel_shape"))
    strides = list(node.attr("strides", [1] * n))
    if set(node.attr("dilations", [1] * n)) != {1}:
        raise Unsupported("dilated pooling")
    pre, post = _pads(node, x, n, kernel, strides, [1] * n)
    x, pre, post = _absorb_pad(x, pre, post, 0.0 if node.op_type == "AveragePool" else -math.inf)
    if pre != post:
        raise Unsupported("padding that differs before and after an axis")
    if any(2 * p > k for p, k in zip(pre, kernel, strict=True)):
        raise Unsupported("padding wider than half the window")
    spatial = [window_out(x.shape[2 + i], kernel[i], strides[i], pre[i], pre[i], 1, ctx.env)
               for i in range(n)]
    if node.attr("ceil_mode", 0):
        rounded_up = [window_out(x.shape[2 + i], kernel[i], strides[i], pre[i], pre[i], 1,
                                 ctx.env, ceil=True) for i in range(n)]
        if rounded_up != spatial:
            raise Unsupported("ceil_mode=1 where it changes the output size")
    attrs: dict[str, Any] = {"window": per_axis(kernel), "stride": per_axis(strides),
                             "pad": per_axis(pre) if any(pre) else None}
    op = "maxpool"
    if node.op_type == "AveragePool":
        op = "avgpool"
        attrs["count_pad"] = True if node.attr("count_include_pad", 0) and any(pre) else None
    return [ctx.make(op, [x], attrs, shape=(x.shape[0], x.shape[1], *spatial)), None]


def global_pool(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), node.op_type)
    axes = list(range(2, x.rank))
    op = "reduce_mean" if node.op_type == "GlobalAveragePool" else "reduce_max"
    return [ctx.make(op, [x], {"axes": axes, "keepdims": True},
                     shape=(x.shape[0], x.shape[1], *[1] * len(axes)))]


def batchnorm(ctx: Context, node: Node) -> list[Value | None]:
    if node.attr("training_mode", 0):
        raise Unsupported("training mode", "export the model in eval mode")
    x = float_tensor(ctx, node.need(0), "BatchNormalization")
    scale, bias, mean, var = (ctx.tensor(node.need(i)) for i in range(1, 5))
    eps = float(node.attr("epsilon", 1e-5))
    return [ctx.make("batchnorm", [x, mean, var, scale, bias], {"eps": eps}), None, None]


def instancenorm(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "InstanceNormalization")
    scale, bias = ctx.tensor(node.need(1)), ctx.tensor(node.need(2))
    return [ctx.make("instancenorm", [x, scale, bias], {"eps": float(node.attr("epsilon", 1e-5))})]


def _norm_params(ctx: Context, x: Op, axis: int, v: Value, what: str) -> Op:
    """Scale or bias of a norm over the axes from `axis` on: of exactly their shape."""
    p = ctx.tensor(v)
    if p.shape != x.shape[axis:]:
        array = const_array(v)
        sizes = [d for d in x.shape[axis:] if isinstance(d, int)]
        if array is None or len(sizes) != x.rank - axis or array.size != math.prod(sizes):
            raise Unsupported(f"a {what} of shape {list(p.shape)} over the axes "
                              f"{list(x.shape[axis:])}")
        p = ctx.tensor(Const(array.reshape(sizes), v.name if isinstance(v, Const) else None))
    return p


def layernorm(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "LayerNormalization")
    axis = axis_of(int(node.attr("axis", -1)), x.rank)
    scale = _norm_params(ctx, x, axis, node.need(1), "scale")
    given = node.input(2)
    zeros = Const(np.zeros(scale.weights[""].shape, scale.weights[""].dtype))
    bias = _norm_params(ctx, x, axis, given if given is not None else zeros, "bias")
    eps = float(node.attr("epsilon", 1e-5))
    return [ctx.make("layernorm", [x, scale, bias], {"eps": eps}), None, None]


def rmsnorm(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "RMSNormalization")
    axis = axis_of(int(node.attr("axis", -1)), x.rank)
    scale = _norm_params(ctx, x, axis, node.need(1), "scale")
    return [ctx.make("rmsnorm", [x, scale], {"eps": float(node.attr("epsilon", 1e-5))})]


def groupnorm(ctx: Context, node: Node) -> list[Value | None]:
    x = float_tensor(ctx, node.need(0), "GroupNormalization")
    groups = int(node.attr("num_groups"))
    channels = x.shape[1]
    params = []
    for i in (1, 2):
        v = node.need(i)
        array = const_array(v)
        if node.opset < 21 and isinstance(channels, int):
            # opset 18 scales each group (deprecated): repeated over the group's channels
            if array is None:
                raise Unsupported("a per-group scale computed at run time")
            array = np.repeat(array, channels // groups)
            v = Const(array)
        params.append(ctx.tensor(v))
    return [ctx.make("groupnorm", [x, *params], {"groups": groups,
                                                  "eps": float(node.attr("epsilon", 1e-5))})]


def resize(ctx: Context, node: Node) -> list[Value | None]:
    """Nearest or (bi)linear resizing by integer factors, as `upsample`."""
    x = float_tensor(ctx, node.need(0), "Resize")
    mode = node.attr("mode", "nearest")
    transform = node.attr("coordinate_transformation_mode", "half_pixel")
    given = node.input(2)
    scales = const_array(given) if given is not None else None
    if scales is not None and scales.size:
        factors = [float(s) for s in scales.ravel()]
    else:
        sizes = ctx.sizes(node.input(3), "the output sizes")
        factors = []
        for size, d in zip(sizes, x.shape, strict=True):
            q = dims.div_exact(size, d, ctx.env)
            if q is None or not isinstance(q, int):
                raise Unsupported("output sizes that are no whole multiple of the input's")
            factors.append(float(q))
    if len(factors) != x.rank or factors[:2] != [1.0, 1.0] or \
            any(f != int(f) or f < 1 for f in factors):
        raise Unsupported("a resize by factors that are not whole numbers on the spatial axes")
    whole = [int(f) for f in factors[2:]]
    if mode == "nearest" and transform not in ("align_corners", "tf_crop_and_resize"):
        kind = "nearest"
    elif mode == "linear" and transform in ("half_pixel", "pytorch_half_pixel") and \
            x.rank == 4:
        kind = "bilinear"
    else:
        raise Unsupported(f"mode=\"{mode}\" with coordinate_transformation_mode=\"{transform}\"",
                          "the language upsamples nearest, or bilinear with half-pixel centres")
    shape = (x.shape[0], x.shape[1], *(dims.mul(d, f) for d, f in zip(x.shape[2:], whole,
                                                                         strict=True)))
    return [ctx.make("upsample", [x], {"factor": per_axis(whole),
                                        "mode": "bilinear" if kind == "bilinear" else None},
                     shape=shape)]


def pad(ctx: Context, node: Node) -> list[Value | None]:
    """A constant `Pad`: kept for the convolution or pooling that reads it (the language pads
    only inside window ops); any other reader is an error of its own."""
    x = ctx.tensor(node.need(0))
    if node.attr("mode", "constant") != "constant":
        raise Unsupported(f"mode=\"{node.attr('mode')}\"")
    pads = ctx.ints(node.need(1), "the pads")
    value = ctx.scalar(node.input(2), "the padding value", 0.0)
    axes = ctx.ints(node.input(3), "the axes") if node.input(3) is not None else \
        list(range(x.rank))
    before, after = [0] * x.rank, [0] * x.rank
    for i, a in enumerate(axes):
        before[axis_of(a, x.rank)] = pads[i]
        after[axis_of(a, x.rank)] = pads[i + len(axes)]
    if min(before + after) < 0:
        raise Unsupported("negative padding (a crop)")
    shape = tuple(dims.add(d, b + a) for d, b, a in zip(x.shape, before, after, strict=True))
    return [ctx.make("pad", [x], {"before": before, "after": after, "value": value}, shape=shape)]


def dropout(ctx: Context, node: Node) -> list[Value | None]:
    """Inference: the identity (a mask output has no counterpart)."""
    training = node.input(2)
    flag = const_array(training) if training is not None else None
    if flag is not None and bool(flag):
        raise Unsupported("training mode", "export the model in eval mode")
    return [node.need(0), None]


OPS: dict[str, Handler] = {
    "Conv": conv, "ConvTranspose": conv_transpose, "MaxPool": pool, "AveragePool": pool,
    "GlobalAveragePool": global_pool, "GlobalMaxPool": global_pool,
    "BatchNormalization": batchnorm, "InstanceNormalization": instancenorm,
    "LayerNormalization": layernorm, "RMSNormalization": rmsnorm,
    "GroupNormalization": groupnorm, "Resize": resize, "Pad": pad, "Dropout": dropout,
}
