"""Normalisations: batchnorm (inference statistics), layernorm, rmsnorm, instancenorm, groupnorm.

All need compute=f32. `layernorm`'s normalised axes are the trailing axes covered by `scale`, and
they must be innermost in memory (cuDNN sees the tensor as [prod(L), prod(D), 1, 1]).
`groupnorm` has no cuDNN node: it runs as a kernel of its own (`backend.groupnorm`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np

from dslc.core.dims import format_dim
from dslc.core.types import TensorType
from dslc.ops import common
from dslc.ops.opdef import Args, InferCtx, Kind, LowerCtx, OpDef, Param


def _stats(ctx: InferCtx, op: str, x: TensorType, a: Args, names: tuple[str, ...]) -> bool:
    c = x.shape[1]
    for name in names:  # each a required operand
        t = a.t(name)
        if not common.require_float(ctx, op, name, t):
            return False
        if t.shape != (c,):
            ctx.error("E0301", f"`{name}` of `{op}` must be a vector of the {c} channels", at=name,
                      label=common.fmt(t), labels=(ctx.label("x", common.fmt(x)),),
                      notes=("per-channel statistics have shape [C], C being axis 1 of x",))
            return False
    return True


def _batchnorm(ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    if x.rank < 2:
        ctx.error("E0301", "`batchnorm` expects x [N, C, *S]", at="x", label=common.fmt(x))
        return None
    if not common.require_float(ctx, "batchnorm", "x", x):
        return None
    if not _stats(ctx, "batchnorm", x, a, ("mean", "var", "scale", "bias")):
        return None
    if not common.check_compute(ctx, "batchnorm", [x], need_f32=True):
        return None
    return TensorType(x.dtype, x.shape)


def _instancenorm(ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    if x.rank < 3:
        ctx.error("E0301", "`instancenorm` expects x [N, C, *S] with spatial axes", at="x",
                  label=common.fmt(x))
        return None
    if not common.require_float(ctx, "instancenorm", "x", x):
        return None
    if not _stats(ctx, "instancenorm", x, a, ("scale", "bias")):
        return None
    if not common.check_compute(ctx, "instancenorm", [x], need_f32=True):
        return None
    return TensorType(x.dtype, x.shape)


def _groupnorm(ctx: InferCtx, a: Args) -> TensorType | None:
    x, groups = a.t("x"), int(a["groups"])
    if x.rank < 2:
        ctx.error("E0301", "`groupnorm` expects x [N, C, *S]", at="x", label=common.fmt(x))
        return None
    if not common.require_float(ctx, "groupnorm", "x", x):
        return None
    c = x.shape[1]
    if groups < 1:
        ctx.error("E0305", "`groups` of `groupnorm` must be at least 1", at="groups")
        return None
    if not isinstance(c, int) or c % groups:
        ctx.error("E0301", f"`groupnorm` splits the {format_dim(c)} channels into {groups} "
                  "groups: the channels must be a multiple of `groups`", at="groups",
                  labels=(ctx.label("x", common.fmt(x)),))
        return None
    if not _stats(ctx, "groupnorm", x, a, ("scale", "bias")):
        return None
    if not common.check_compute(ctx, "groupnorm", [x], need_f32=True):
        return None
    return TensorType(x.dtype, x.shape)


def _feature_norm(op: str, ctx: InferCtx, a: Args) -> TensorType | None:
    x, scale = a.t("x"), a.t("scale")
    if not common.require_float(ctx, op, "x", x):
        return None
    r = scale.rank
    if r < 1 or r > x.rank or x.shape[x.rank - r:] != scale.shape:
        ctx.error("E0301", f"the scale of `{op}` must match the trailing axes of x", at="scale",
                  label=common.fmt(scale), labels=(ctx.label("x", common.fmt(x)),),
                  notes=("the rank of `scale` picks the normalised axes: x [*L, *D], "
                         "scale [*D]",))
        return None
    bias = a.opt("bias")
    if bias is not None and bias.shape != scale.shape:
        ctx.error("E0301", f"the bias of `{op}` must have the shape of its scale", at="bias",
                  label=common.fmt(bias), labels=(ctx.label("scale", common.fmt(scale)),))
        return None
    if not common.check_compute(ctx, op, [x], need_f32=True):
        return None
    ctx.set_attr("axes", tuple(range(x.rank - r, x.rank)))
    return TensorType(x.dtype, x.shape)


def _innermost(types: Mapping[str, TensorType]) -> str | None:
    """cuDNN normalises a [rows, features] view: the normalised axes innermost in memory."""
    x, r = types["x"], types["scale"].rank
    if x.layout is None or tuple(sorted(x.layout.order[x.rank - r:])) == tuple(
            range(x.rank - r, x.rank)):
        return None
    return f"the last {r} axes must be innermost in memory"


def _channel(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape([1, -1] + [1] * (ndim - 2))


def _batchnorm_ref(xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    x, mean, var, scale, bias = xs
    inv = 1 / np.sqrt(var + np.float32(a["eps"]))
    return (x - _channel(mean, x.ndim)) * _channel(inv * scale, x.ndim) + _channel(bias, x.ndim)


def _normalise(x: np.ndarray, axes: tuple[int, ...], eps: float, rms: bool) -> np.ndarray:
    if rms:
        return x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + np.float32(eps))
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(eps))


def _feature_norm_ref(rms: bool, xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    operands = a.get("operands") or ("x", "scale", "bias")
    named = dict(zip(operands, xs, strict=True))
    y = _normalise(named["x"], tuple(a["axes"]), a["eps"], rms) * named["scale"]
    return y + named["bias"] if "bias" in named else y


def _instancenorm_ref(xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    x, scale, bias = xs
    y = _normalise(x, tuple(range(2, x.ndim)), a["eps"], rms=False)
    return y * _channel(scale, x.ndim) + _channel(bias, x.ndim)


def _groupnorm_ref(xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    x, scale, bias = xs
    grouped = x.reshape(x.shape[0], int(a["groups"]), -1)
    y = _normalise(grouped, (2,), a["eps"], rms=False).reshape(x.shape)
    return y * _channel(scale, x.ndim) + _channel(bias, x.ndim)


def _lower_feature_norm(method: str):  # type: ignore[no-untyped-def]  # pragma: no mutate block
    """cuDNN's inference-phase norm; the group shapes [*L, D] as rows [prod(L), D, 1, 1]."""
    def lower(ctx: LowerCtx, xs: list[Any], a: Mapping[str, Any]) -> Any:
        operands = a.get("operands") or ("x", "scale", "bias")
        named = dict(zip(operands, xs, strict=True))
        phase = ctx.enum("norm_forward_phase", "INFERENCE")
        kwargs = {"input": named["x"], "scale": named["scale"], "epsilon": ctx.scalar(a["eps"]),
                  "norm_forward_phase": phase}
        if "bias" in named:
            kwargs["bias"] = named["bias"]
        return getattr(ctx.g, method)(**kwargs)[0]

    return lower


EPS = Param("eps", Kind.FLOAT, 1e-5)
OPS = [
    OpDef("batchnorm", "norm",
          (Param("x", Kind.TENSOR), Param("mean", Kind.TENSOR), Param("var", Kind.TENSOR),
           Param("scale", Kind.TENSOR), Param("bias", Kind.TENSOR), EPS),
          _batchnorm, "shape of x", "batch normalisation with running statistics (inference)",
          fusion="norm", reference=_batchnorm_ref),
    OpDef("layernorm", "norm",
          (Param("x", Kind.TENSOR), Param("scale", Kind.TENSOR), Param("bias", Kind.TENSOR), EPS),
          partial(_feature_norm, "layernorm"), "shape of x", "layer normalisation over the trailing axes",
          fusion="norm", reference=partial(_feature_norm_ref, False),
          lower=_lower_feature_norm("layernorm"), needs=_innermost),
    OpDef("rmsnorm", "norm",
          (Param("x", Kind.TENSOR), Param("scale", Kind.TENSOR), EPS,
           Param("bias", Kind.OPT_TENSOR, None)),
          partial(_feature_norm, "rmsnorm"), "shape of x", "root-mean-square normalisation", fusion="norm",
          reference=partial(_feature_norm_ref, True), lower=_lower_feature_norm("rmsnorm"),
          needs=_innermost),
    OpDef("instancenorm", "norm",
          (Param("x", Kind.TENSOR), Param("scale", Kind.TENSOR), Param("bias", Kind.TENSOR), EPS),
          _instancenorm, "shape of x", "normalisation over the spatial axes of each channel",
          fusion="norm", reference=_instancenorm_ref, lower=_lower_feature_norm("instancenorm")),
    OpDef("groupnorm", "norm",
          (Param("x", Kind.TENSOR), Param("scale", Kind.TENSOR), Param("bias", Kind.TENSOR),
           Param("groups", Kind.INT), EPS),
          _groupnorm, "shape of x",
          "normalisation over each group of channels and the spatial axes (GroupNorm)",
          reference=_groupnorm_ref),
]
