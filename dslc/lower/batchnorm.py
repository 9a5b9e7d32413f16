"""Batchnorm in inference: folded into the conv before it, or turned into a per-channel scale
and shift. Either way its arithmetic on params becomes a load-time subgraph (see `load_time`)."""

from __future__ import annotations

from dslc.core.types import PrecisionSpec, TensorType
from dslc.ir.graph import Node
from dslc.lower.rewrite import Rewriter

F32 = PrecisionSpec("f32", "f32", "f32")  # folding is done in f32, then cast (LANGUAGE.md 5.3)


def _scale_and_shift(rw: Rewriter, bn: Node, shift_in: str | None) -> tuple[str, str]:
    """s = scale / sqrt(var + eps); t = bias - (mean - shift_in) * s, all [C] in f32."""
    _, mean, var, scale, bias = bn.inputs
    c = rw.node(mean).type.shape
    vec = TensorType("f32", c)
    eps = rw.new("scalar", (), {"value": float(bn.attrs["eps"])}, TensorType("f32", ()), bn,
                 f"{bn.name}.eps", F32)
    var_eps = rw.new("add", (var, eps), {}, vec, bn, f"{bn.name}.var_eps", F32)
    inv = rw.new("rsqrt", (var_eps,), {}, vec, bn, f"{bn.name}.inv_std", F32)
    s = rw.new("mul", (scale, inv), {}, vec, bn, f"{bn.name}.scale", F32)
    centred = mean
    if shift_in is not None:  # a conv bias before the batchnorm moves the mean
        centred = rw.new("sub", (mean, shift_in), {}, vec, bn, f"{bn.name}.centred", F32)
    moved = rw.new("mul", (centred, s), {}, vec, bn, f"{bn.name}.moved", F32)
    t = rw.new("sub", (bias, moved), {}, vec, bn, f"{bn.name}.shift", F32)
    return s, t


def _stored(rw: Rewriter, bn: Node, value: str, dtype: str) -> str:
    """A per-channel vector the kernel reads, stored in the activations' dtype (io): what the
    precompiled conv + bias engines take."""
    if dtype == "f32":
        return value
    node = rw.node(value)
    return rw.new("cast", (value,), {"dtype": dtype}, TensorType(dtype, node.type.shape), bn,
                  f"{value}.{dtype}", F32)


def fold_batchnorm(rw: Rewriter, node: Node) -> str | None:
    """conv(x, w) [+ bias_add(b)] -> batchnorm becomes conv(x, w * s) + bias_add(t): the weight
    transform runs once at load time, and the conv keeps a plain bias epilogue to fuse."""
    if node.op != "batchnorm":
        return None
    x = rw.node(node.inputs[0])
    conv_bias = None
    conv = x
    if x.op == "bias_add" and x.attrs["axis"] == 1 and rw.only_read_by_one(x.name):
        conv_bias, conv = x.inputs[1], rw.node(x.inputs[0])
    # The conv's own result must not be needed elsewhere (another op, or an output): folding
    # changes it.
    if conv.op != "conv" or not rw.only_read_by_one(conv.name):
        return None
    weight = rw.node(conv.inputs[1])
    if weight.op != "param":
        return None
    s, t = _scale_and_shift(rw, node, conv_bias)
    k = weight.type.shape[0]
    rank = weight.type.rank
    s_col = rw.new("reshape", (s,), {"shape": (k,) + (1,) * (rank - 1)},
                   TensorType("f32", (k,) + (1,) * (rank - 1)), node, f"{node.name}.scale_col", F32)
    w32 = TensorType("f32", weight.type.shape)
    folded = rw.new("mul", (weight.name, s_col), {}, w32, node, f"{conv.name}.folded_weight", F32)
    if weight.type.dtype != "f32":  # fold in f32, then store in the weight's dtype
        folded = rw.new("cast", (folded,), {"dtype": weight.type.dtype}, weight.type, node,
                        f"{conv.name}.folded_weight.{weight.type.dtype}", F32)
    t = _stored(rw, node, t, conv.type.dtype)
    for old in (x.name, conv.name) if conv_bias is not None else (conv.name,):
        rw.drop(old)
    new_conv = rw.new("conv", (conv.inputs[0], folded), dict(conv.attrs), conv.type, conv,
                      conv.name)
    return rw.new("bias_add", (new_conv, t), {"axis": 1}, node.type, node, node.name)


def batchnorm_to_affine(rw: Rewriter, node: Node) -> str | None:
    """A batchnorm that cannot fold: x * s + t per channel, s and t computed at load time."""
    if node.op != "batchnorm":
        return None
    s, t = _scale_and_shift(rw, node, None)
    dtype = node.type.dtype
    s, t = _stored(rw, node, s, dtype), _stored(rw, node, t, dtype)
    scaled = rw.new("scale_mul", (node.inputs[0], s), {"axis": 1}, node.type, node,
                    f"{node.name}.scaled")
    return rw.new("bias_add", (scaled, t), {"axis": 1}, node.type, node, node.name)
