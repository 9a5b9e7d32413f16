"""PyTorch calls for each op of the op table (`dslc.ops.OPS`), written from the ops' documented
meaning: the op side of `dslc.ir.to_torch`. Each entry takes the operands (tensors, in parameter
order; optional ones named by the `operands` attr) and the node's attrs with every dim concrete,
and returns the result; the caller converts dtypes. It must never call dslc's numpy references:
it is the independent side of the comparison with them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

Attrs = Mapping[str, Any]
OpFn = Callable[[list[Tensor], Attrs], Tensor]


# ---- pointwise ----------------------------------------------------------------------------------

def _clamp(x: Tensor, a: Attrs) -> Tensor:
    if a["lo"] is None and a["hi"] is None:
        return x
    return torch.clamp(x, a["lo"], a["hi"])


UNARY: dict[str, Callable[[Tensor, Attrs], Tensor]] = {
    "relu": lambda x, a: torch.relu(x),
    "leaky_relu": lambda x, a: F.leaky_relu(x, a["slope"]),
    "clamp": _clamp,
    "gelu": lambda x, a: F.gelu(x),
    "gelu_tanh": lambda x, a: F.gelu(x, approximate="tanh"),
    "silu": lambda x, a: F.silu(x),
    "swish": lambda x, a: x * torch.sigmoid(a["beta"] * x),
    "sigmoid": lambda x, a: torch.sigmoid(x),
    "tanh": lambda x, a: torch.tanh(x),
    "elu": lambda x, a: F.elu(x, a["alpha"]),
    # log(1 + e^x) without overflow (F.softplus's linear tail above its threshold is not exact,
    # and with the threshold raised past it, e^x overflows for x above 88)
    "softplus": lambda x, a: torch.logaddexp(torch.zeros_like(x), x),
    "hardsigmoid": lambda x, a: F.hardsigmoid(x),
    "hardswish": lambda x, a: F.hardswish(x),
    "exp": lambda x, a: torch.exp(x),
    "log": lambda x, a: torch.log(x),
    "sqrt": lambda x, a: torch.sqrt(x),
    "rsqrt": lambda x, a: torch.rsqrt(x),
    "reciprocal": lambda x, a: torch.reciprocal(x),
    "erf": lambda x, a: torch.special.erf(x),
    "sin": lambda x, a: torch.sin(x),
    "cos": lambda x, a: torch.cos(x),
    "floor": lambda x, a: torch.floor(x),
    "ceil": lambda x, a: torch.ceil(x),
    "abs": lambda x, a: torch.abs(x),
    "neg": lambda x, a: torch.neg(x),
}

BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.true_divide,
    "max": torch.maximum, "min": torch.minimum, "pow": torch.pow,
    "cmp_lt": torch.lt, "cmp_le": torch.le, "cmp_gt": torch.gt, "cmp_ge": torch.ge,
    "cmp_eq": torch.eq, "cmp_ne": torch.ne,
}


def _on_axis(b: Tensor, ndim: int, axis: int) -> Tensor:
    """A vector laid along `axis` of a rank-`ndim` tensor; other shapes broadcast as they are."""
    if b.dim() != 1:
        return b
    shape = [1] * ndim
    shape[axis] = b.shape[0]
    return b.reshape(shape)


# ---- convolutions, pooling, resampling ----------------------------------------------------------

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVGPOOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_LINEAR_MODE = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _in_float(fn: OpFn) -> OpFn:
    """PyTorch's window kernels take floats only: integer operands go through float64 (exact
    for the i8 products and sums these ops meet); the caller converts the result back."""
    def run(xs: list[Tensor], a: Attrs) -> Tensor:
        if all(x.is_floating_point() for x in xs):
            return fn(xs, a)
        return fn([x.double() for x in xs], a)

    return run


def _conv(xs: list[Tensor], a: Attrs) -> Tensor:
    x, w = xs
    pre, post = a["pre_pad"], a["post_pad"]
    padding = pre
    if pre != post:  # asymmetric: pad explicitly (F.pad lists the last axis first)
        x = F.pad(x, [p for i in reversed(range(len(pre))) for p in (pre[i], post[i])])
        padding = 0
    return _CONV[x.dim() - 2](x, w, None, a["stride"], padding, a["dilation"], a["groups"])


def _conv_transpose(xs: list[Tensor], a: Attrs) -> Tensor:
    x, w = xs
    return _CONV_T[x.dim() - 2](x, w, None, a["stride"], a["pad"], a["output_pad"], 1,
                                a["dilation"])


def _maxpool(xs: list[Tensor], a: Attrs) -> Tensor:
    # dslc's pads are symmetric and at most half the window, as PyTorch's; floor mode.
    x = xs[0]
    return _MAXPOOL[x.dim() - 2](x, a["window"], a["stride"], a["pad"])


def _avgpool(xs: list[Tensor], a: Attrs) -> Tensor:
    x = xs[0]
    return _AVGPOOL[x.dim() - 2](x, a["window"], a["stride"], a["pad"],
                                 count_include_pad=bool(a["count_pad"]))


def _upsample(xs: list[Tensor], a: Attrs) -> Tensor:
    """Integer factors: nearest repeats each element; bilinear (linear per spatial axis) samples
    at half-pixel centres, clamped at the borders (align_corners=False)."""
    x = xs[0]
    n = x.dim() - 2
    size = [s * f for s, f in zip(x.shape[2:], a["factor"], strict=True)]
    if a["mode"] == "nearest":
        return F.interpolate(x, size=size, mode="nearest")
    return F.interpolate(x, size=size, mode=_LINEAR_MODE[n], align_corners=False)


# ---- norms, attention, reductions ---------------------------------------------------------------

def _named(xs: list[Tensor], a: Attrs, default: tuple[str, ...]) -> dict[str, Tensor]:
    """Operands by parameter name (optional tensors are listed in the `operands` attr)."""
    return dict(zip(a.get("operands") or default, xs, strict=True))


def _batchnorm(xs: list[Tensor], a: Attrs) -> Tensor:
    x, mean, var, scale, bias = xs
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=a["eps"])


def _layernorm(xs: list[Tensor], a: Attrs) -> Tensor:
    t = _named(xs, a, ("x", "scale", "bias"))
    return F.layer_norm(t["x"], tuple(t["scale"].shape), t["scale"], t["bias"], a["eps"])


def _rmsnorm(xs: list[Tensor], a: Attrs) -> Tensor:
    t = _named(xs, a, ("x", "scale"))
    x, scale = t["x"], t["scale"]
    if hasattr(F, "rms_norm"):
        y = F.rms_norm(x, tuple(scale.shape), scale, a["eps"])
    else:  # older PyTorch: written out
        axes = tuple(range(x.dim() - scale.dim(), x.dim()))
        y = x * torch.rsqrt(x.pow(2).mean(axes, keepdim=True) + a["eps"]) * scale
    return y + t["bias"] if "bias" in t else y


def _groupnorm(xs: list[Tensor], a: Attrs) -> Tensor:
    """Written out with var_mean, as `_instancenorm` (F.group_norm refuses a group of one value)."""
    x, scale, bias = xs
    grouped = x.reshape(x.shape[0], int(a["groups"]), -1)
    var, mean = torch.var_mean(grouped, dim=2, keepdim=True, correction=0)
    shape = (1, -1) + (1,) * (x.dim() - 2)
    y = ((grouped - mean) * torch.rsqrt(var + a["eps"])).reshape(x.shape)
    return y * scale.reshape(shape) + bias.reshape(shape)


def _instancenorm(xs: list[Tensor], a: Attrs) -> Tensor:
    """Written out with var_mean: F.instance_norm refuses one spatial element (it checks as if
    training), where the statistics are still defined (the result is the bias)."""
    x, scale, bias = xs
    spatial = tuple(range(2, x.dim()))
    var, mean = torch.var_mean(x, dim=spatial, keepdim=True, correction=0)
    shape = (1, -1) + (1,) * len(spatial)
    return (x - mean) * torch.rsqrt(var + a["eps"]) * scale.reshape(shape) + bias.reshape(shape)


def _sdpa(xs: list[Tensor], a: Attrs) -> Tensor:
    """Heads of k and v repeated for GQA (query head h reads kv head h // group); `causal` keeps
    key j <= query i's place (i top-left, i + Skv - Sq bottom-right, i + L[b] - Sq with
    `kv_len` L), `window` keeps j > place - window, `kv_len` keeps j < L[b]; bias adds to the
    scores.
    A query that keeps no key at all is undefined (PyTorch returns 0 there, numpy NaN)."""
    t = _named(xs, a, ("q", "k", "v"))
    if "descale_q" in t:  # the explicit fp8 form: the operands are fp8 values already
        return _attention_of(t["q"], t["k"], t["v"], a, t["descale_q"] * t["descale_k"],
                             t["descale_v"])
    q, k, v = t["q"], t["k"], t["v"]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask: Tensor | None = t.get("bias")
    lengths = t.get("kv_len")
    if a["causal"] or a["window"] is not None or lengths is not None:
        # bottom-right: query i stands at key i + (Skv - Sq), the last query at the last key;
        # with valid lengths L, at i + (L[b] - Sq), and keys from L[b] on are dropped
        valid = k.shape[2] if lengths is None else lengths.to(torch.int64).view(-1, 1, 1, 1)
        shift = valid - q.shape[2] if a.get("align") == "bottom_right" else 0
        i = torch.arange(q.shape[2], device=q.device)[:, None] + shift
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        keep = j < valid
        if a["causal"]:
            keep = keep & (j <= i)
        if a["window"] is not None:
            keep = keep & (j > i - a["window"])
        if mask is None:
            mask = keep
        else:
            mask = mask.to(q.dtype).masked_fill(~keep, float("-inf"))
    elif mask is not None:
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a["scale"])


def _attention_of(q: Tensor, k: Tensor, v: Tensor, a: Attrs, score_descale: Tensor,
                  v_descale: Tensor) -> Tensor:
    """fp8 attention written out: scores of fp8 values descaled, the causal mask, softmax, the
    probabilities scaled by 448 and rounded to e4m3, times v, descaled."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = a["scale"] if a["scale"] is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * (scale * score_descale.reshape(()))
    if a["causal"]:
        shift = k.shape[2] - q.shape[2] if a.get("align") == "bottom_right" else 0
        i = torch.arange(q.shape[2], device=q.device)[:, None] + shift
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        scores = scores.masked_fill(j > i, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = (probs * 448.0).to(torch.float8_e4m3fn).float()
    return torch.matmul(probs, v) * (v_descale.reshape(()) / 448.0)


def _cache_write(xs: list[Tensor], a: Attrs) -> Tensor:
    """The cache with rows at + s (s < S) of axis 2 taken from `new`, rows outside dropped:
    each cache row picks the new row landing on it, if one does (a select, not an indexed
    store: no host synchronisation, and it traces as one graph)."""
    cache, new, at = xs
    rows = at.reshape(()).to(torch.int64) + torch.arange(new.shape[2], device=new.device)
    landing = torch.arange(cache.shape[2], device=new.device)[:, None] == rows[None, :]
    source = landing.to(torch.int64).argmax(dim=1)
    hit = landing.any(dim=1)[:, None]
    return torch.where(hit, new.index_select(2, source), cache)


def _prod(x: Tensor, axes: tuple[int, ...], keep: bool) -> Tensor:
    for axis in sorted(axes, reverse=True):  # torch.prod takes one axis at a time
        x = torch.prod(x, dim=axis, keepdim=keep)
    return x


REDUCE: dict[str, Callable[[Tensor, tuple[int, ...], bool], Tensor]] = {
    "reduce_sum": lambda x, ax, k: torch.sum(x, dim=ax, keepdim=k),
    "reduce_mean": lambda x, ax, k: torch.mean(x, dim=ax, keepdim=k),
    "reduce_max": lambda x, ax, k: torch.amax(x, dim=ax, keepdim=k),
    "reduce_min": lambda x, ax, k: torch.amin(x, dim=ax, keepdim=k),
    "reduce_amax": lambda x, ax, k: torch.amax(x.abs(), dim=ax, keepdim=k),
    "reduce_prod": _prod,
    "reduce_l1": lambda x, ax, k: torch.linalg.vector_norm(x, 1, dim=ax, keepdim=k),
    "reduce_l2": lambda x, ax, k: torch.linalg.vector_norm(x, 2, dim=ax, keepdim=k),
}


def _genstats(xs: list[Tensor], a: Attrs) -> Tensor:
    """Output 0: per-channel sum; output 1: per-channel sum of squares (kept as [1, C, 1...])."""
    x = xs[0]
    axes = (0, *range(2, x.dim()))
    return torch.sum(x if a.get("output", 0) == 0 else x * x, dim=axes, keepdim=True)


def _gather(xs: list[Tensor], a: Attrs) -> Tensor:
    """index_select along `axis`, the indices' shape in the axis's place; NaN for an index
    outside the axis."""
    x, idx = xs
    axis, n = int(a["axis"]), x.shape[int(a["axis"])]
    rows = torch.index_select(x, axis, idx.clamp(0, n - 1).reshape(-1).to(torch.int64))
    rows = rows.reshape(*x.shape[:axis], *idx.shape, *x.shape[axis + 1:])
    inside = ((idx >= 0) & (idx < n)).reshape(*(1,) * axis, *idx.shape,
                                                *(1,) * (x.dim() - axis - 1))
    return torch.where(inside, rows, torch.full((), float("nan"), dtype=x.dtype, device=x.device))


# ---- fp8: operands quantised, as `precision matmul=f8e4m3` means (LANGUAGE.md 3.4) -------------
# Written from the language's definition with torch's own float8 types: it never sees dslc's
# lowering of it (`dslc.lower.quantize`). An activation is scaled by its own largest magnitude
# (calibrating on the inputs it runs on gives the same), a weight (the operands the translation
# found computed from params alone: `fp8_weights`) per output channel or per tensor.

_FP8 = {"f8e4m3": (torch.float8_e4m3fn, 448.0), "f8e5m2": (torch.float8_e5m2, 57344.0)}
_TINY = 2.0 ** -24  # the smallest amax a scale is made from


def _quantised(x: Tensor, dtype: str, axes: tuple[int, ...] | None) -> tuple[Tensor, Tensor]:
    """x rounded to fp8 after scaling its amax (over `axes`, all when None) to the format's
    largest value, as f32 values, and the descale (amax / largest) that undoes the scaling."""
    kind, top = _FP8[dtype]
    finite = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x))
    amax = finite.amax() if axes is None else finite.amax(dim=axes, keepdim=True)
    amax = amax.float().clamp(min=_TINY)
    scaled = x.float() * (top / amax)
    if dtype == "f8e4m3":  # e4m3 has no infinity: saturate, as the hardware's conversion does
        scaled = scaled.clamp(-top, top)
    return scaled.to(kind).float(), amax / top


def _weight_axes(op: str, index: int, rank: int, per_channel: bool) -> tuple[int, ...]:
    """What a weight's amax is taken over: all but its output channel, or everything."""
    if not per_channel:
        return tuple(range(rank))
    if op == "conv":
        return tuple(range(1, rank))
    return (rank - 2,) if index == 1 else (rank - 1,)


def _fp8_operands(xs: list[Tensor], a: Attrs, op: str) -> tuple[list[Tensor], Tensor]:
    dtype = a["precision"]
    per_channel = a.get("weight_scales", "per_channel") == "per_channel"
    out, descale = [], torch.ones((), dtype=torch.float32, device=xs[0].device)
    for i, x in enumerate(xs):
        weight = i in a.get("fp8_weights", ())
        axes = _weight_axes(op, i, x.dim(), per_channel) if weight else None
        q, d = _quantised(x, dtype, axes)
        if weight and per_channel and op == "conv":
            d = d.reshape(1, -1, *(1,) * (x.dim() - 2))  # along the result's channels
        elif weight and per_channel and i == 1:
            d = d.reshape(*d.shape[:-2], 1, d.shape[-1])  # along the result's columns
        out.append(q)
        descale = descale * d
    return out, descale


def _fp8_matmul(xs: list[Tensor], a: Attrs) -> Tensor:
    (qa, qb), descale = _fp8_operands(xs, a, "matmul")
    return torch.matmul(qa, qb) * descale


def _fp8_conv(xs: list[Tensor], a: Attrs) -> Tensor:
    qs, descale = _fp8_operands(xs, a, "conv")
    return _conv(qs, a) * descale


def _fp8_sdpa(xs: list[Tensor], a: Attrs) -> Tensor:
    """q, k and v quantised per tensor; the probabilities rounded to e4m3 after scaling by 448
    (at most 1 each) before they multiply v, as cuDNN's fp8 attention computes."""
    t = _named(xs, a, ("q", "k", "v"))
    (q, dq), (k, dk), (v, dv) = (_quantised(t[n], a["precision"], None) for n in "qkv")
    return _attention_of(q, k, v, a, dq * dk, dv)


def _precise(fn: OpFn, quantised: OpFn) -> OpFn:
    """`fn`, or `quantised` for a node asking for fp8 operands."""
    def run(xs: list[Tensor], a: Attrs) -> Tensor:
        return quantised(xs, a) if a.get("precision") in _FP8 else fn(xs, a)

    return run


# ---- the table ----------------------------------------------------------------------------------

def _table() -> dict[str, OpFn]:
    ops: dict[str, OpFn] = {}
    for name, unary in UNARY.items():
        ops[name] = lambda xs, a, f=unary: f(xs[0], a)  # type: ignore[misc]
    for name, binary in BINARY.items():
        ops[name] = lambda xs, a, f=binary: f(xs[0], xs[1])  # type: ignore[misc]
    ops.update({
        "select": lambda xs, a: torch.where(xs[0].to(torch.bool), xs[1], xs[2]),
        "bias_add": lambda xs, a: xs[0] + _on_axis(xs[1], xs[0].dim(), a["axis"]),
        "scale_mul": lambda xs, a: xs[0] * _on_axis(xs[1], xs[0].dim(), a["axis"]),
        "cast": lambda xs, a: xs[0],  # the result is converted to the node's dtype by the caller
        "contiguous": lambda xs, a: xs[0].contiguous(),
        "conv": _precise(_in_float(_conv), _fp8_conv),
        "conv_transpose": _in_float(_conv_transpose),
        "matmul": _precise(lambda xs, a: torch.matmul(xs[0], xs[1]), _fp8_matmul),
        "batchnorm": _batchnorm,
        "layernorm": _layernorm,
        "rmsnorm": _rmsnorm,
        "instancenorm": _instancenorm,
        "groupnorm": _groupnorm,
        "sdpa": _precise(_sdpa, _fp8_sdpa),
        "genstats": _genstats,
        "maxpool": _in_float(_maxpool),
        "avgpool": _in_float(_avgpool),
        "upsample": _upsample,
        "concat": lambda xs, a: torch.cat(xs, dim=a["axis"]),
        "expand": lambda xs, a: xs[0].expand(*a["shape"]).contiguous(),
        "gather": _gather,
        "arange": lambda xs, a: torch.arange(int(a["n"]), dtype=torch.int64, device=a.get("device")),
        "cache_write": _cache_write,
        "full": lambda xs, a: torch.full(tuple(int(d) for d in a["shape"]), int(a["value"]),
                                         dtype=torch.int64, device=a.get("device")),
        "reshape": lambda xs, a: xs[0].reshape(a["shape"]),
        "transpose": lambda xs, a: xs[0].permute(a["perm"]),
        "slice": lambda xs, a: xs[0][tuple(slice(s, e) for s, e in
                                          zip(a["starts"], a["ends"], strict=True))],
    })
    for name, reduce in REDUCE.items():
        ops[name] = lambda xs, a, f=reduce: f(xs[0], tuple(a["axes"]), bool(a["keepdims"]))  # type: ignore[misc]
    return ops


OPS: dict[str, OpFn] = _table()
# Ops whose operands keep their own dtypes (their result dtype says nothing of the math).
OWN_OPERAND_DTYPES = {"cast", *(name for name in BINARY if name.startswith("cmp_"))}
