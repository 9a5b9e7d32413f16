"""`sdpa`: scaled dot-product attention (cuDNN SDPA, flash-attention engines).

q [B, Hq, Sq, Dk], k [B, Hk, Skv, Dk], v [B, Hk, Skv, Dv] -> [B, Hq, Sq, Dv], with Hq a
multiple of Hk (MHA, GQA, MQA); f16 or bf16; head dims multiples of 8 up to 256.

`kv_len` (i32 [B]) is the number of valid keys of each batch row (a KV cache filled up to
there): keys at or after it are masked, and a bottom-right diagonal aligns to it. cuDNN's
padding mask takes it with the valid queries per row; lowering adds those as the operand
`q_len` (Sq for every row: `dslc.lower.attention`), which no source can write.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from dslc.core import dims
from dslc.core.types import FP8, TensorType, format_shape
from dslc.diag.diagnostic import Label
from dslc.ops import common, fp8
from dslc.ops.opdef import Args, InferCtx, Kind, LowerCtx, OpDef, Param
from dslc.ops.pointwise import special_functions
from dslc.ops.reference_conv import array_module


def _head_dim(ctx: InferCtx, name: str, d: dims.Dim, step: int) -> bool:
    if not isinstance(d, int):
        ctx.error("E0305", "the head dimension of `sdpa` must be static", at=name,
                  label=f"{dims.format_dim(d)} varies")
        return False
    if d % step != 0 or d > 256:
        ctx.error("E0305", f"head dimension {d} is not supported by `sdpa`", at=name,
                  label=f"head dimension {d}",
                  notes=(f"cuDNN SDPA needs head dimensions that are multiples of {step}"
                         f"{' (fp8)' if step != 8 else ''}, at most 256",))
        return False
    return True


DESCALES = ("descale_q", "descale_k", "descale_v")
# What the probabilities are multiplied by before cuDNN's fp8 attention rounds them to e4m3 (the
# largest e4m3 value: a probability is at most 1); the product with v is divided by it again.
SOFTMAX_SCALE = 448.0


def _fp8_operands(ctx: InferCtx, a: Args) -> tuple[str, ...] | None:
    """The fp8 dtypes q, k and v may have: e4m3, when all three are e4m3 and come with their
    descales (the per-tensor factors that turn their values back into the unscaled ones: the
    form `precision=f8e4m3` lowers to); none otherwise. None once an error is reported."""
    q, k, v = a.t("q"), a.t("k"), a.t("v")
    given = [d for d in DESCALES if a.opt(d) is not None]
    quantised = [t.dtype for t in (q, k, v) if t.dtype in FP8]
    if not quantised and not given:
        return ()
    if quantised != ["f8e4m3"] * 3 or len(given) != 3:
        ctx.error("E0401", "fp8 `sdpa` takes e4m3 q, k and v, each with its descale",
                  at=None, label=f"q, k and v are {q.dtype}/{k.dtype}/{v.dtype}, with "
                  f"{', '.join(f'`{d}`' for d in given) or 'no descales'}",
                  notes=("write the request instead, and let calibration find the scales: "
                         "`sdpa(q, k, v, precision=f8e4m3)`",))
        return None
    for d in DESCALES:
        t = a.t(d)
        if t.dtype != "f32" or any(n != 1 for n in t.shape):
            ctx.error("E0401", f"`{d}` of `sdpa` must be one f32 value", at=d,
                      label=common.fmt(t))
            return None
    return ("f8e4m3",)


def _fp8_plain(ctx: InferCtx, a: Args, dtype: str) -> bool:
    """cuDNN's fp8 attention takes no bias and no sliding window (E0404)."""
    for name, what in (("bias", "a bias"), ("window", "a sliding window"),
                       ("kv_len", "valid key lengths")):
        if a.get(name) is not None:
            ctx.error("E0404", f"`sdpa` cannot compute in {dtype} with {what}", at=name,
                      label=f"`{name}` given", labels=common.asked(ctx, dtype),
                      notes=("cuDNN's fp8 attention supports causal masks only (aligned "
                             "top-left or bottom-right)",),
                      help=("leave this attention unquantised",))
            return False
    return True


def _quantize(ctx: InferCtx, a: Args, dtype: str) -> bool:
    """fp8 attention (cuDNN's sdpa_fp8 on Hopper): f16 or bf16 q, k and v quantised to e4m3,
    head dimensions in multiples of 16, no bias, no window."""
    if dtype != "f8e4m3":
        ctx.error("E0404", f"`sdpa` cannot compute in {dtype}", at=None,
                  label=f"precision={dtype}", labels=common.asked(ctx, dtype),
                  notes=("cuDNN's fp8 attention takes e4m3 operands",),
                  help=("write `precision=f8e4m3`",))
        return False
    q, k, v = a.t("q"), a.t("k"), a.t("v")
    floats = ("f16", "bf16")
    return (all(common.fp8_operand(ctx, "sdpa", n, t, dtype, floats)
                for n, t in (("q", q), ("k", k), ("v", v)))
            and common.fp8_multiple(ctx, "sdpa", "q", q.shape[3], "head dimension", dtype)
            and common.fp8_multiple(ctx, "sdpa", "v", v.shape[3], "head dimension", dtype)
            and _fp8_plain(ctx, a, dtype))


def _sdpa(ctx: InferCtx, a: Args) -> TensorType | None:
    q, k, v = a.t("q"), a.t("k"), a.t("v")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.rank != 4:
            ctx.error("E0301", "`sdpa` expects rank-4 q, k and v: [B, H, S, D]", at=name,
                      label=f"{common.fmt(t)} has rank {t.rank}")
            return None
    fp8 = _fp8_operands(ctx, a)
    if fp8 is None:
        return None
    bad = [t.dtype for t in (q, k, v) if t.dtype not in ("f16", "bf16", "f32", *fp8)]
    if bad:
        ctx.error("E0401", f"`sdpa` does not support {bad[0]} inputs", at=None,
                  label=f"q, k and v are {'/'.join(sorted({q.dtype, k.dtype, v.dtype}))} here",
                  notes=("sdpa takes f16 or bf16 (cuDNN), or f32 (a fallback kernel); fp8 "
                         "operands come with their descales (`descale_q=`, ...)",))
        return None
    if ctx.cudnn and "f32" in (q.dtype, k.dtype, v.dtype):
        # One rule for f32 everywhere: the reference runs it, and so does the GPU, as a fallback
        # kernel (cuDNN SDPA takes f16 or bf16): slower, never refused.
        labels: tuple[Label, ...] = ()
        origin = ctx.precision_origin("io")
        if origin is not None and ctx.precision.io == "f32":
            labels = (Label(origin, "tensors default to f32 because of this"),)
        ctx.error("W0303", "an f32 `sdpa` runs as a fallback kernel on the GPU", at=None,
                  label="q, k and v are f32 here", labels=labels,
                  notes=("cuDNN SDPA takes f16 or bf16; the fallback computes the same attention "
                         "at a fraction of the speed",),
                  help=("use `precision io=bf16`, or cast the inputs: `cast(q, bf16)`",))
    if not common.require_same_dtype(ctx, "sdpa", "q", q, "k", k) or \
            not common.require_same_dtype(ctx, "sdpa", "q", q, "v", v):
        return None
    b, hq, sq, dk = q.shape
    checks = [("k", k.shape[0], b, "batch"), ("v", v.shape[0], b, "batch"),
              ("k", k.shape[3], dk, "head dimension"), ("v", v.shape[1], k.shape[1], "head count"),
              ("v", v.shape[2], k.shape[2], "sequence length")]
    for name, got, want, what in checks:
        if got != want:
            t = a.t(name)
            ctx.error("E0301", f"the {what} of `{name}` does not match", at=name,
                      label=common.fmt(t), labels=(ctx.label("q", common.fmt(q)),),
                      notes=(f"expected {dims.format_dim(want)}, found {dims.format_dim(got)}",))
            return None
    if dims.div_exact(hq, k.shape[1], ctx.env) is None:
        ctx.error("E0301", "the query heads must be a multiple of the key/value heads", at="k",
                  label=common.fmt(k), labels=(ctx.label("q", common.fmt(q)),))
        return None
    step = 16 if fp8 else 8
    if ctx.cudnn and not (_head_dim(ctx, "q", dk, step) and _head_dim(ctx, "v", v.shape[3], step)):
        return None
    large = sorted({d for d in (dk, v.shape[3]) if isinstance(d, int) and d > 128})
    if ctx.cudnn and large:
        ctx.error("W0302", f"head dimension {large[-1]} is above 128",
                  label=f"head dimension {large[-1]}",
                  notes=("cuDNN's flash-attention engines take up to 256, but some architectures "
                         "and modes stop at 128",))
    bias = a.opt("bias")
    out = TensorType(q.dtype, (b, hq, sq, v.shape[3]))
    if fp8:  # cuDNN's fp8 attention writes a 16-bit result: the io dtype where it is one
        io = ctx.precision.io
        out = TensorType(io if io in ("f16", "bf16") else "f16", out.shape)
        if not _fp8_plain(ctx, a, q.dtype):
            return None
    if bias is not None and not _bias_fits(ctx, bias, (b, hq, sq, k.shape[2])):
        return None
    window = a.get("window")
    if window is not None and window < 1:
        ctx.error("E0305", "`window` of `sdpa` must be at least 1", at="window",
                  label=f"{window} here")
        return None
    if not _lengths(ctx, a, b):
        return None
    if a.get("align") == "bottom_right" and a.get("causal") and \
            isinstance(sq, int) and isinstance(k.shape[2], int) and sq > k.shape[2]:
        ctx.error("E0305", f"a bottom-right causal mask leaves the first {sq - k.shape[2]} "
                  "queries no key", at="align", label="more queries than keys",
                  notes=(f"{sq} queries, {k.shape[2]} keys: the last query sees every key, "
                         "each earlier one a key fewer",))
        return None
    if not common.check_compute(ctx, "sdpa", [q, k, v], need_f32=True):
        return None
    scale = a.get("scale")
    ctx.set_attr("scale", float(scale) if scale is not None else None)
    return out


def _bias_fits(ctx: InferCtx, bias: TensorType, scores: tuple[dims.Dim, ...]) -> bool:
    """A bias is added to the scores [B, H, Sq, Skv]: it broadcasts to them (right-aligned,
    each axis equal or 1)."""
    pairs = list(zip(reversed(bias.shape), reversed(scores), strict=False))
    bad = next((len(scores) - 1 - i for i, (d, s) in enumerate(pairs) if d not in (1, s)), None)
    if bias.rank <= len(scores) and bad is None:
        return True
    shown = format_shape(scores)
    why = (f"axis {bad} of the scores is {dims.format_dim(scores[bad])}, the bias has "
           f"{dims.format_dim(bias.shape[bad - len(scores) + bias.rank])}" if bad is not None
           else f"the bias has rank {bias.rank}")
    ctx.error("E0301", f"the bias of `sdpa` does not broadcast to the scores {shown}",
              at="bias", label=common.fmt(bias),
              notes=(f"the scores are [B, H, Sq, Skv]: {why}; each axis must be equal or 1",))
    return False


def _lengths(ctx: InferCtx, a: Args, batch: dims.Dim) -> bool:
    """`kv_len`, and `q_len` where lowering added it: one i32 count per batch row."""
    for name in ("kv_len", "q_len"):
        t = a.opt(name)
        if t is None:
            continue
        if t.dtype != "i32" or t.rank != 1 or t.shape[0] != batch:
            ctx.error("E0301", f"`{name}` of `sdpa` must be i32 [{dims.format_dim(batch)}]: a "
                      "count of valid keys per batch row", at=name, label=common.fmt(t),
                      notes=("cuDNN's padding mask reads one 32-bit length per batch row",),
                      help=("`cast` the lengths to i32, or `expand` one length over the "
                            "batch",))
            return False
    return True


def _last_axis_innermost(types: Mapping[str, TensorType]) -> str | None:
    """cuDNN SDPA reads q, k and v (BHSD or BSHD) with the head dimension contiguous."""
    for name in ("q", "k", "v"):
        t = types[name]
        if t.layout is not None and t.layout.innermost() != 3:
            return f"the last axis of `{name}` must be innermost in memory"
    return None


def _masked(xp: Any, sq: int, skv: int, kv_len: Any, a: Mapping[str, Any]) -> Any:
    """Where a score is masked: [Sq, Skv], or [B, 1, Sq, Skv] with `kv_len` (per batch row:
    keys at or after L[b], and a bottom-right diagonal at L[b] - Sq + i instead of Skv - Sq + i).
    A query left no key gives NaN (softmax over nothing); `q_len` is Sq, so it masks nothing."""
    i = xp.arange(sq)[:, None]
    j = xp.arange(skv)[None, :]
    valid = skv if kv_len is None else kv_len.astype(np.int64).reshape(-1, 1, 1, 1)
    at = i + (valid - sq if a.get("align") == "bottom_right" else 0)
    mask = j >= valid
    if a["causal"]:
        mask = mask | (j > at)
    if a["window"] is not None:
        mask = mask | (j <= at - a["window"])
    return mask


T = TypeVar("T")


def named_operands(attrs: Mapping[str, Any], values: Sequence[T]) -> dict[str, T]:
    """An sdpa's operands by name: `q`, `k`, `v`, or what its `operands` attribute lists (with
    the lengths, lowering's `q_len`, a bias, fp8 descales), each to its value in `values`."""
    return dict(zip(attrs.get("operands") or ("q", "k", "v"), values, strict=True))


def _sdpa_ref(xs: list[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    """softmax(q k^T * scale + bias) v, heads of k and v repeated for GQA; `causal` masks keys
    after the query, `window` keeps only the last `window` keys up to it; aligned top-left
    (query i is at key i) or bottom-right (the last query is at the last (valid) key: a query
    block at the end of a longer key sequence); `kv_len` masks each row's keys from L[b] on."""
    named = named_operands(a, xs)
    q, k, v = named["q"], named["k"], named["v"]
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = a["scale"] if a["scale"] is not None else 1 / math.sqrt(q.shape[-1])
    scores = np.matmul(q, k.swapaxes(-1, -2)) * np.float32(scale)
    if "descale_q" in named:  # fp8 operands: their products descaled
        scores = scores * (named["descale_q"].reshape(()) * named["descale_k"].reshape(()))
    if "bias" in named:
        scores = scores + named["bias"]
    xp = array_module(q)
    scores = np.where(_masked(xp, q.shape[2], k.shape[2], named.get("kv_len"), a), -np.inf,
                      scores)
    special = special_functions(scores)
    probs = special.softmax(scores, axis=-1).astype(q.dtype)
    if "descale_q" not in named:
        return np.matmul(probs, v)
    # cuDNN's fp8 attention multiplies the probabilities by v in fp8 too: they are scaled by
    # SOFTMAX_SCALE (a probability is at most 1) and rounded to e4m3 first.
    probs = fp8.round_fp8(xp, probs * np.float32(SOFTMAX_SCALE), "f8e4m3")
    return np.matmul(probs, v) * (named["descale_v"].reshape(()) / np.float32(SOFTMAX_SCALE))


# Left out of mutation testing: its numbers are checked only on a GPU (tests/gpu).
def _lower_sdpa(ctx: LowerCtx, xs: list[Any], a: Mapping[str, Any]) -> Any:  # pragma: no mutate block
    """cuDNN SDPA (inference: no softmax stats). Causal is the diagonal band with right bound 0,
    top-left aligned; `window` is its left bound."""
    named = named_operands(a, xs)
    q = named["q"]
    if q.get_data_type() == ctx.enum("data_type", "FLOAT"):
        raise ValueError("cuDNN SDPA takes f16 or bf16: an f32 sdpa runs as a fallback kernel")
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(q.get_dim()[-1])
    kwargs: dict[str, Any] = {"q": q, "k": named["k"], "v": named["v"], "attn_scale": float(scale),
                              "generate_stats": False}
    if "bias" in named:
        if list(named["bias"].get_dim()[:2]) != list(q.get_dim()[:2]) or \
                q.get_dim()[1] != named["k"].get_dim()[1]:
            # On the H200 (cuDNN 9.19) a bias broadcast over the batch or the heads ([Sq, Skv]
            # or [1, 1, Sq, Skv]), and one with grouped key/value heads, gave wrong numbers and
            # once an illegal memory access (found by generated programs): such an sdpa runs as
            # a fallback kernel.
            raise ValueError("cuDNN's sdpa with a broadcast bias or grouped key/value heads "
                             "is not used")
        kwargs["bias"] = named["bias"]
    if "descale_q" in named:
        return _lower_sdpa_fp8(ctx, named, kwargs, a)
    if "kv_len" in named:
        # cuDNN's padding mask: both lengths [B, 1, 1, 1] i32 (the group spec shapes them so);
        # the frontend refuses one without the other. A bottom-right diagonal then aligns to
        # seq_len_kv[b] - seq_len_q[b] per row.
        kwargs.update(use_padding_mask=True, seq_len_q=named["q_len"], seq_len_kv=named["kv_len"])
    if a["causal"] or a["window"] is not None:
        kwargs["diagonal_alignment"] = ctx.enum(
            "diagonal_alignment", "BOTTOM_RIGHT" if a.get("align") == "bottom_right" else "TOP_LEFT")
    if a["causal"]:
        kwargs["diagonal_band_right_bound"] = 0
    if a["window"] is not None:
        kwargs["diagonal_band_left_bound"] = int(a["window"])
    out = ctx.g.sdpa(**kwargs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.set_dim(ctx.result_dims()).set_stride(ctx.result_strides())


def _lower_sdpa_fp8(ctx: LowerCtx, named: Mapping[str, Any], kwargs: dict[str, Any],
                    a: Mapping[str, Any]) -> Any:  # pragma: no mutate block
    """cuDNN's fp8 attention: the operands' descales as tensors; the probabilities' scale and
    descale (SOFTMAX_SCALE) and the result's scale (1: it is written in f16 or bf16) as
    pass-by-value scalars. Its amax outputs stay virtual (nothing reads them). The masks are
    this node's flags (its binding has no diagonal band bounds)."""
    for d in DESCALES:
        kwargs[d] = named[d]
    kwargs.update(descale_s=ctx.scalar(1.0 / SOFTMAX_SCALE), scale_s=ctx.scalar(SOFTMAX_SCALE),
                  scale_o=ctx.scalar(1.0))
    if a["causal"]:
        flag = "use_causal_mask_bottom_right" if a.get("align") == "bottom_right" else \
            "use_causal_mask"
        kwargs[flag] = True
    out = ctx.g.sdpa_fp8(**kwargs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.set_dim(ctx.result_dims()).set_stride(ctx.result_strides())


OPS = [
    OpDef("sdpa", "attention",
          (Param("q", Kind.TENSOR), Param("k", Kind.TENSOR), Param("v", Kind.TENSOR),
           Param("scale", Kind.OPT_FLOAT, None), Param("causal", Kind.BOOL, False),
           Param("bias", Kind.OPT_TENSOR, None), Param("window", Kind.OPT_INT, None),
           Param("align", Kind.STR, "top_left", ("top_left", "bottom_right")),
           *(Param(d, Kind.OPT_TENSOR, None) for d in DESCALES),
           Param("kv_len", Kind.OPT_TENSOR, None)),
          _sdpa, "[B, Hq, Sq, Dv]",
          "softmax(q k^T * scale + bias) v; scale defaults to 1/sqrt(Dk); `kv_len` (i32 [B]) masks "
          "each row's keys from its length on", fusion="anchor",
          reference=_sdpa_ref, lower=_lower_sdpa, needs=_last_axis_innermost,
          quantize=_quantize),
]
