"""Pointwise ops, as tables: unary activations and math, binary arithmetic, comparisons, select,
bias and scale along an axis, casts. One row per op; the type rules are shared."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from dslc.core import dims
from dslc.core.types import DTYPES, FP8, TensorType
from dslc.ops import common
from dslc.ops.opdef import REQUIRED, Args, InferCtx, Kind, LowerCtx, LowerFn, OpDef, Param

Array = np.ndarray
_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


def special_functions(x: Any) -> Any:
    """scipy.special, or CuPy's for CuPy arrays (the fallback kernels run these references on
    the GPU); imported on first use: scipy costs start-up time."""
    if type(x).__module__.startswith("cupy"):
        from cupyx.scipy import special as gpu_special

        return gpu_special
    from scipy import special

    return special


def _sigmoid(x: Array) -> Array:
    return special_functions(x).expit(x).astype(x.dtype)


def _erf(x: Array) -> Array:
    return special_functions(x).erf(x)


def _hardsigmoid(x: Array) -> Array:
    """relu6(x + 3) / 6, as x / 6 + 1/2 clipped to [0, 1] (the form cuDNN computes)."""
    return np.clip(x * np.float32(1 / 6) + np.float32(0.5), 0, 1).astype(x.dtype)


def _clamp(x: Array, a: Mapping[str, Any]) -> Array:
    lo = -np.inf if a["lo"] is None else a["lo"]
    hi = np.inf if a["hi"] is None else a["hi"]
    return np.clip(x, lo, hi).astype(x.dtype)


# name -> numpy reference of the unary ops (x in the compute dtype, attrs).
UNARY_REF: dict[str, Callable[[Array, Mapping[str, Any]], Array]] = {
    "relu": lambda x, a: np.maximum(x, 0),
    "leaky_relu": lambda x, a: np.where(x > 0, x, x * a["slope"]),
    "clamp": _clamp,
    "gelu": lambda x, a: 0.5 * x * (1 + _erf(x / np.sqrt(2.0))),
    "gelu_tanh": lambda x, a: 0.5 * x * (1 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))),
    "silu": lambda x, a: x * _sigmoid(x),
    "swish": lambda x, a: x * _sigmoid(x * a["beta"]),
    "sigmoid": lambda x, a: _sigmoid(x),
    "tanh": lambda x, a: np.tanh(x),
    "elu": lambda x, a: np.where(x > 0, x, a["alpha"] * np.expm1(np.minimum(x, 0))),
    "softplus": lambda x, a: np.logaddexp(0, x),
    "hardsigmoid": lambda x, a: _hardsigmoid(x),
    "hardswish": lambda x, a: x * _hardsigmoid(x),
    "exp": lambda x, a: np.exp(x),
    "log": lambda x, a: np.log(x),
    "sqrt": lambda x, a: np.sqrt(x),
    "rsqrt": lambda x, a: 1 / np.sqrt(x),
    "reciprocal": lambda x, a: 1 / x,
    "erf": lambda x, a: _erf(x),
    "sin": lambda x, a: np.sin(x),
    "cos": lambda x, a: np.cos(x),
    "floor": lambda x, a: np.floor(x),
    "ceil": lambda x, a: np.ceil(x),
    "abs": lambda x, a: np.abs(x),
    "neg": lambda x, a: -x,
}

BINARY_REF: dict[str, Callable[[Array, Array], Array]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "pow": np.power,
    "cmp_lt": np.less, "cmp_le": np.less_equal, "cmp_gt": np.greater, "cmp_ge": np.greater_equal,
    "cmp_eq": np.equal, "cmp_ne": np.not_equal,
}


def _unary_ref(name: str, xs: list[Array], a: Mapping[str, Any]) -> Array:
    # Keep the compute dtype (numpy and scipy promote to float64 in places).
    return UNARY_REF[name](xs[0], a).astype(xs[0].dtype, copy=False)


def _binary_ref(name: str, xs: list[Array], a: Mapping[str, Any]) -> Array:
    return BINARY_REF[name](xs[0], xs[1])


def along_axis(v: Array, ndim: int, axis: int) -> Array:
    """A vector placed on `axis` of a rank-`ndim` tensor (other shapes broadcast as they are)."""
    if v.ndim != 1:
        return v
    shape = [1] * ndim
    shape[axis] = v.shape[0]
    return v.reshape(shape)


def _along_ref(fn: Callable[[Array, Array], Array], xs: list[Array], a: Mapping[str, Any]) -> Array:
    return fn(xs[0], along_axis(xs[1], xs[0].ndim, a["axis"]))

# Unary ops: name -> (extra scalar params, float only, summary).
UNARY: dict[str, tuple[tuple[Param, ...], bool, str]] = {
    "relu": ((), True, "max(x, 0)"),
    "leaky_relu": ((Param("slope", Kind.FLOAT, 0.01),), True, "x if x > 0 else slope * x"),
    "clamp": ((Param("lo", Kind.OPT_FLOAT, None), Param("hi", Kind.OPT_FLOAT, None)), True,
              "min(max(x, lo), hi)"),
    "gelu": ((), True, "x * Phi(x), erf form"),
    "gelu_tanh": ((), True, "gelu, tanh approximation"),
    "silu": ((), True, "x * sigmoid(x)"),
    "swish": ((Param("beta", Kind.FLOAT, 1.0),), True, "x * sigmoid(beta * x)"),
    "sigmoid": ((), True, "1 / (1 + exp(-x))"),
    "tanh": ((), True, "tanh(x)"),
    "elu": ((Param("alpha", Kind.FLOAT, 1.0),), True, "x if x > 0 else alpha * (exp(x) - 1)"),
    "softplus": ((), True, "log(1 + exp(x))"),
    "hardsigmoid": ((), True, "relu6(x + 3) / 6"),
    "hardswish": ((), True, "x * relu6(x + 3) / 6"),
    "exp": ((), True, "e ** x"),
    "log": ((), True, "natural logarithm"),
    "sqrt": ((), True, "square root"),
    "rsqrt": ((), True, "1 / sqrt(x)"),
    "reciprocal": ((), True, "1 / x"),
    "erf": ((), True, "error function"),
    "sin": ((), True, "sine"),
    "cos": ((), True, "cosine"),
    "floor": ((), True, "round down"),
    "ceil": ((), True, "round up"),
    "abs": ((), False, "absolute value"),
    "neg": ((), False, "-x"),
}

# Binary ops: name -> (operator spelling or None, float only, summary).
BINARY: dict[str, tuple[str | None, bool, str]] = {
    "add": ("+", False, "a + b"),
    "sub": ("-", False, "a - b"),
    "mul": ("*", False, "a * b"),
    "div": ("/", False, "a / b"),
    "max": (None, False, "elementwise maximum"),
    "min": (None, False, "elementwise minimum"),
    "pow": (None, True, "a ** b"),
}

COMPARE: dict[str, str] = {"cmp_lt": "<", "cmp_le": "<=", "cmp_gt": ">", "cmp_ge": ">=",
                           "cmp_eq": "==", "cmp_ne": "!="}
OPERATOR_OPS = {spelling: name for name, (spelling, _, _) in BINARY.items() if spelling}
OPERATOR_OPS.update({spelling: name for name, spelling in COMPARE.items()})


# The type rules and references shared by several ops take the op's row first and are bound with
# `partial` in `_ops`: plain functions, so that each is one unit to test (and to mutate).
def _unary_rule(name: str, float_only: bool, ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    if not (common.no_fp8(ctx, name, "x", x) and common.no_bool_arithmetic(ctx, name, "x", x)):
        return None
    if float_only and not common.require_float(ctx, name, "x", x):
        return None
    if name == "clamp" and a["lo"] is not None and a["hi"] is not None and a["lo"] > a["hi"]:
        ctx.error("E0305", "`clamp` needs lo <= hi", at="hi",
                  label=f"hi={a['hi']} is below lo={a['lo']}")
        return None
    if not common.check_compute(ctx, name, [x]):
        return None
    return TensorType(x.dtype, x.shape)


def _binary_rule(name: str, float_only: bool, compare: bool, ctx: InferCtx, a: Args,
                 ) -> TensorType | None:
    what = OPERATOR_OPS_INV.get(name, name)
    x, y = a.t("a"), a.t("b")
    if not (common.no_fp8(ctx, what, "a", x) and common.no_fp8(ctx, what, "b", y)):
        return None
    if not compare and not (common.no_bool_arithmetic(ctx, what, "a", x)
                            and common.no_bool_arithmetic(ctx, what, "b", y)):
        return None
    if not common.check_mixed_numeric(ctx, what, [("a", x), ("b", y)]):
        return None
    if float_only and not common.require_float(ctx, name, "a", x):
        return None  # b is a float then too: check_mixed_numeric refused an integer beside a float
    shape = common.broadcast(ctx, x, y, "a", "b", what)
    if shape is None:
        return None
    _warn_width_bias(ctx, x, y)
    if not common.check_compute(ctx, what, [x, y]):
        return None
    dtype = "bool" if compare else common.result_dtype(ctx, [x, y])
    return TensorType(dtype, shape)  # a result's layout is dslc's choice (LANGUAGE 3.5)


OPERATOR_OPS_INV = {v: k for k, v in OPERATOR_OPS.items()}

_CONV_FAMILY = {"conv", "conv_transpose", "maxpool", "avgpool", "batchnorm", "upsample",
                "instancenorm", "bias_add"}


def _warn_width_bias(ctx: InferCtx, x: TensorType, y: TensorType) -> None:
    """W0301: `conv_out + bias` with a rank-1 bias broadcasts onto W, not C."""
    for big, small, small_name, big_name in ((x, y, "b", "a"), (y, x, "a", "b")):
        if small.rank == 1 and big.rank >= 3 and ctx.producer(big_name) in _CONV_FAMILY:
            c, w = big.shape[1], big.shape[-1]
            if small.shape[0] == c != 1 and w in (c, 1):
                ctx.error(
                    "W0301", "rank-1 operand lines up with the width axis, not the channel axis",
                    at=small_name, label=f"{common.fmt(small)}: broadcast onto W",
                    labels=(ctx.label(big_name, f"{common.fmt(big)}  (N, C, H, W)"),),
                    notes=(("this broadcast is only legal because W == C in this instance; "
                            "another input size would fail",) if w == c else
                           (f"W is 1 here: the result is [N, C, H, {dims.format_dim(c)}], one "
                            "copy of the image per value, not a per-channel bias",)),
                    help=("use `bias_add(x, b)`, or declare the bias as `[C, 1, 1]`",),
                )


def _select(ctx: InferCtx, a: Args) -> TensorType | None:
    mask, x, y = a.t("mask"), a.t("a"), a.t("b")
    if mask.dtype != "bool":
        ctx.error("E0401", "the mask of `select` must be bool", at="mask", label=mask.dtype,
                  help=("build the mask with a comparison, e.g. `x > 0`",))
        return None
    if not common.check_mixed_numeric(ctx, "select", [("a", x), ("b", y)]):
        return None
    shape = common.broadcast_all(ctx, [("mask", mask), ("a", x), ("b", y)], "select")
    if shape is None:
        return None
    return TensorType(common.result_dtype(ctx, [x, y]), shape)


def _along_axis(name: str, ctx: InferCtx, a: Args) -> TensorType | None:
    x, b = a.t("x"), a.t("b")
    axes = common.norm_axes(ctx, name, "axis", a["axis"], x.rank)
    if axes is None:
        return None
    axis = axes[0]
    if not (common.require_float(ctx, name, "x", x) and common.require_float(ctx, name, "b", b)):
        return None
    if b.rank == 1:
        if b.shape[0] != x.shape[axis] and b.shape[0] != 1:
            ctx.error("E0301", f"`{name}` needs a vector of {dims.format_dim(x.shape[axis])} "
                      f"values along axis {axis}", at="b", label=common.fmt(b),
                      labels=(ctx.label("x", common.fmt(x)),),
                      notes=(f"axis {axis} of x has size {dims.format_dim(x.shape[axis])}",))
            return None
    elif common.broadcast(ctx, x, b, "x", "b", name) is None:
        return None
    ctx.set_attr("axis", axis)
    return TensorType(x.dtype, x.shape)


SCALING_OPS = ("mul", "div", "scale_mul")


def _cast(ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    if a["dtype"] in FP8 and x.dtype not in FP8 and ctx.producer("x") not in SCALING_OPS:
        ctx.error("W0401", f"narrowing {x.dtype} to {a['dtype']} without a scale", at="x",
                  label="not scaled first",
                  notes=(f"{a['dtype']} has a narrow range: larger values saturate (e4m3) or "
                         "become infinite (e5m2)",),
                  help=(f"multiply by a scale before the cast: `cast({_times_s(ctx.text('x'))}, "
                        f"{a['dtype']})`",))
    return TensorType(a["dtype"], x.shape)


def _times_s(text: str) -> str:
    """`TEXT * s` as source: a name or one call as it is, anything else in parentheses."""
    head, _, rest = text.partition("(")
    depth, closed = 1, len(rest)  # where the call's parenthesis closes
    for i, ch in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            closed = i
            break
    plain = head.replace(".", "_").isidentifier() and (not rest or closed == len(rest) - 1)
    return f"{text} * s" if plain else f"({text}) * s"


def _contiguous(ctx: InferCtx, a: Args) -> TensorType | None:
    x = a.t("x")
    return TensorType(x.dtype, x.shape)  # no layout: a fresh row-major copy


# ---- cuDNN lowering: the pointwise op of the same name, or a short composition ----------------
# (Left out of mutation testing: its numbers are checked only on a GPU, tests/gpu.)

# dslc name -> the cuDNN pygraph method, for unary ops that map one to one.
_CUDNN_UNARY = {
    "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_approx_tanh", "sigmoid": "sigmoid",
    "tanh": "tanh", "softplus": "softplus", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "reciprocal": "reciprocal", "erf": "erf", "sin": "sin", "cos": "cos",
    "floor": "floor", "ceil": "ceil", "abs": "abs", "neg": "neg",
}
_CUDNN_BINARY = {"add": ("add", "a", "b"), "sub": ("sub", "a", "b"), "mul": ("mul", "a", "b"),
                 "div": ("div", "a", "b"), "max": ("max", "input0", "input1"),
                 "min": ("min", "input0", "input1"), "pow": ("pow", "input0", "input1"),
                 **{name: (name.replace("cmp_ne", "cmp_neq"), "input", "comparison")
                    for name in COMPARE}}


def _lower_unary(name: str) -> LowerFn:  # pragma: no mutate block
    def lower(ctx: LowerCtx, xs: list[Any], a: Mapping[str, Any]) -> Any:
        g, x = ctx.g, xs[0]
        if name in _CUDNN_UNARY:
            return getattr(g, _CUDNN_UNARY[name])(input=x)
        if name == "leaky_relu":
            # max(x, slope * x) (min for a slope above 1): cuDNN's leaky relu in a matmul
            # epilogue was 19% off on the H200 in f32 (program 245 of seed 15, shrunk to
            # leaky_relu(matmul(relu(x), w))), where the same op alone was right.
            slope = float(a["slope"])
            scaled = g.mul(a=x, b=ctx.scalar(slope))
            return g.max(input0=x, input1=scaled) if slope <= 1 else \
                g.min(input0=x, input1=scaled)
        if name == "clamp":  # min(max(x, lo), hi), either bound optional
            if a["lo"] is not None:
                x = g.max(input0=x, input1=ctx.scalar(float(a["lo"])))
            if a["hi"] is not None:
                x = g.min(input0=x, input1=ctx.scalar(float(a["hi"])))
            return x
        if name in ("silu", "swish"):
            return g.swish(input=x, swish_beta=float(a.get("beta", 1.0)))
        if name in ("hardsigmoid", "hardswish"):  # min(max(x / 6 + 1/2, 0), 1) (times x)
            h = g.add(a=g.mul(a=x, b=ctx.scalar(1 / 6)), b=ctx.scalar(0.5))
            h = g.min(input0=g.max(input0=h, input1=ctx.scalar(0.0)), input1=ctx.scalar(1.0))
            return h if name == "hardsigmoid" else g.mul(a=x, b=h)
        # elu(alpha) = x if x > 0 else alpha * (exp(x) - 1): cuDNN's elu has alpha 1 only.
        assert name == "elu", name
        if float(a["alpha"]) == 1.0:
            return g.elu(input=x)
        neg = g.mul(a=g.sub(a=g.exp(input=x), b=ctx.scalar(1.0)), b=ctx.scalar(float(a["alpha"])))
        return g.binary_select(input0=x, input1=neg,
                               mask=g.cmp_gt(input=x, comparison=ctx.scalar(0.0)))

    return lower


def _lower_binary(name: str) -> LowerFn:  # pragma: no mutate block
    method, first, second = _CUDNN_BINARY[name]

    def lower(ctx: LowerCtx, xs: list[Any], a: Mapping[str, Any]) -> Any:
        return getattr(ctx.g, method)(**{first: xs[0], second: xs[1]})

    return lower


def _lower_along(method: str) -> LowerFn:  # pragma: no mutate block
    # The vector was placed on its axis when the group's tensors were shaped.
    def lower(ctx: LowerCtx, xs: list[Any], a: Mapping[str, Any]) -> Any:
        return getattr(ctx.g, method)(input=xs[0], **{method: xs[1]})

    return lower


def _ops() -> list[OpDef]:  # pragma: no mutate block (run once, at import)
    out = []
    for name, (extra, float_only, summary) in UNARY.items():
        out.append(OpDef(name, "pointwise", (Param("x", Kind.TENSOR), *extra),
                         partial(_unary_rule, name, float_only), "shape of x", summary,
                         fusion="epilogue", reference=partial(_unary_ref, name),
                         lower=_lower_unary(name)))
    for name, (_, float_only, summary) in BINARY.items():
        out.append(OpDef(name, "pointwise", (Param("a", Kind.TENSOR), Param("b", Kind.TENSOR)),
                         partial(_binary_rule, name, float_only, False), "broadcast(a, b)", summary,
                         scalars_as_tensors=True, fusion="epilogue",
                         reference=partial(_binary_ref, name),
                         lower=_lower_binary(name)))
    for name, spelling in COMPARE.items():
        out.append(OpDef(name, "pointwise", (Param("a", Kind.TENSOR), Param("b", Kind.TENSOR)),
                         partial(_binary_rule, name, False, True), "bool broadcast(a, b)",
                         f"a {spelling} b", scalars_as_tensors=True,
                         reference=partial(_binary_ref, name),
                         lower=_lower_binary(name)))
    out.append(OpDef("select", "pointwise",
                     (Param("mask", Kind.TENSOR), Param("a", Kind.TENSOR), Param("b", Kind.TENSOR)),
                     _select, "broadcast(mask, a, b)", "a where mask else b",
                     scalars_as_tensors=True,
                     reference=lambda xs, a: np.where(xs[0].astype(bool), xs[1], xs[2]),
                     lower=lambda ctx, xs, a: ctx.g.binary_select(input0=xs[1], input1=xs[2],
                                                                  mask=xs[0])))
    for name, summary, fn, method in (("bias_add", "x + b along `axis`", np.add, "bias"),
                                      ("scale_mul", "x * b along `axis`", np.multiply, "scale")):
        out.append(OpDef(name, "pointwise",
                         (Param("x", Kind.TENSOR), Param("b", Kind.TENSOR), Param("axis", Kind.INT, 1)),
                         partial(_along_axis, name), "shape of x", summary, fusion="epilogue",
                         reference=partial(_along_ref, fn), lower=_lower_along(method)))
    out.append(OpDef("cast", "pointwise",
                     (Param("x", Kind.TENSOR), Param("dtype", Kind.DTYPE, REQUIRED, DTYPES)),
                     _cast, "shape of x", "convert to another dtype", fusion="epilogue",
                     reference=lambda xs, a: xs[0],  # the caller rounds to the new dtype
                     lower=common.lower_identity))
    out.append(OpDef("contiguous", "pointwise", (Param("x", Kind.TENSOR),), _contiguous,
                     "shape of x", "copy into a new layout",
                     reference=lambda xs, a: xs[0], lower=common.lower_identity))
    return out


OPS = _ops()
