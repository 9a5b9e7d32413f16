"""Norms cuDNN has no node for, spelled with the ops it has.

`groupnorm(x, scale, bias, groups)` over x [N, C, *S]: x seen as [N, G, (C / G) * prod(S)]
(a view: no copy where x is row-major), its mean and variance over the last axis (two reductions,
the variance of the centred values, as the reference computes it), normalised, seen as
[N, C, *S] again, then the per-channel scale and shift. The statistics and the centred values
are f32 whatever x's dtype, also inside a fused group whose intermediate dtype is narrower (a
mean rounded to bf16 left x - mean at 1e-4 where it is 0, and 1/sqrt(eps) made that 0.1).
"""

from __future__ import annotations

from dataclasses import replace

from dslc.core import dims
from dslc.core.types import TensorType
from dslc.ir.graph import Node
from dslc.lower.rewrite import Rewriter


def expand_group_norm(rw: Rewriter, node: Node) -> str | None:
    """groupnorm -> reshape, reduce_mean, sub, mul, reduce_mean, add eps, rsqrt, mul, reshape,
    scale_mul, bias_add."""
    if node.op != "groupnorm":
        return None
    x, scale, bias = node.inputs
    shape = node.type.shape
    groups = int(node.attrs["groups"])
    c = shape[1]
    assert isinstance(c, int) and c % groups == 0, c  # the type rule says so
    members: dims.Dim = c // groups
    for d in shape[2:]:
        members = dims.mul(members, d)
    grouped = (shape[0], groups, members)
    stat = (shape[0], groups, 1)
    dtype = node.type.dtype
    wide = replace(node.precision, intermediate="f32", compute="f32")

    def new(op: str, inputs: tuple[str, ...], attrs: dict[str, object], size: tuple[dims.Dim, ...],
            suffix: str, of: str = "f32") -> str:
        return rw.new(op, inputs, attrs, TensorType(of, size), node, f"{node.name}.{suffix}",
                      wide if of == "f32" else None)

    mean_of = {"axes": (2,), "keepdims": True}
    seen = new("reshape", (x,), {"shape": grouped}, grouped, "grouped", dtype)
    mean = new("reduce_mean", (seen,), mean_of, stat, "mean")
    centred = new("sub", (seen, mean), {}, grouped, "centred")
    squared = new("mul", (centred, centred), {}, grouped, "squared")
    var = new("reduce_mean", (squared,), mean_of, stat, "var")
    eps = rw.new("scalar", (), {"value": float(node.attrs["eps"])}, TensorType("f32", ()), node,
                 f"{node.name}.eps", wide)
    inv = new("rsqrt", (new("add", (var, eps), {}, stat, "var_eps"),), {}, stat, "inv_std")
    normal = new("mul", (centred, inv), {}, grouped, "normal", dtype)
    back = new("reshape", (normal,), {"shape": tuple(shape)}, tuple(shape), "normal_nchw", dtype)
    scaled = new("scale_mul", (back, scale), {"axis": 1}, tuple(shape), "scaled", dtype)
    return rw.new("bias_add", (scaled, bias), {"axis": 1}, node.type, node, node.name)


__all__ = ["expand_group_norm"]
