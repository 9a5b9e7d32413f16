"""The op families the generator draws from. Each family proposes one op application (or a short
pattern) on values already in the program, with attributes drawn from the op's parameter space;
`Gen.apply` keeps it only if the op's type rule accepts it. A family returns whether it added a
value. Values are kept where every op is well-conditioned: domain-restricted ops read `|x| + 0.5`,
`exp` reads a tamed value, discontinuous ops (floor, ceil, comparisons) read exact values only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from dslc.core import dims
from dslc.core.types import FLOATS
from dslc.fuzz.program import Expr
from dslc.fuzz.state import Gen

Family = Callable[[Gen], bool]

PLAIN_UNARY = ["relu", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu", "abs", "neg", "erf",
               "sin", "cos", "softplus", "leaky_relu", "clamp", "swish", "elu", "hardsigmoid",
               "hardswish"]
DOMAIN_UNARY = ["log", "sqrt", "rsqrt", "reciprocal"]  # read |x| + 0.5
STEP_UNARY = ["floor", "ceil"]  # exact operands only


def is_float(e: Expr) -> bool:
    return e.type.dtype in FLOATS


def static(d: dims.Dim) -> bool:
    return isinstance(d, int)


def printable(d: dims.Dim) -> bool:
    """A dim the source can spell: an int or a polynomial of declared dims (no floor atoms)."""
    return isinstance(d, int) or not any("⌊" in s for s in d.symbols())


def size(d: dims.Dim) -> int:
    """A dim the caller checked is static."""
    assert isinstance(d, int), d
    return d


def tame(g: Gen, e: Expr, limit: float = 3.0) -> Expr:
    """`e` scaled to magnitude about 1 when it strays (f16 and bf16 stay finite and precise)."""
    if e.scale <= limit and e.scale >= 0.05:
        return e
    factor = float(f"{1.0 / e.scale:.3g}")
    out = g.apply("mul", {"a": e, "b": factor}, scale=1.0, infix=True)
    return out if out is not None else e


def positive(g: Gen, e: Expr) -> Expr | None:
    """|e| + 0.5: a value every domain-restricted op may read."""
    a = g.apply("abs", {"x": e})
    return None if a is None else g.apply("add", {"a": a, "b": 0.5}, scale=a.scale + 0.5,
                                          infix=True)


def unary(g: Gen) -> bool:
    kind = g.ch.pick(["plain", "plain", "domain", "step", "exp"])
    if kind == "step":
        x = g.pick(lambda e: is_float(e) and e.exact)
    else:
        x = g.pick(is_float)
    if x is None:
        return False
    attrs: dict[str, object] = {}
    if kind == "plain":
        op = g.ch.pick(PLAIN_UNARY)
        if op == "leaky_relu":
            attrs["slope"] = g.ch.pick([0.01, 0.2, 0.5])
        elif op == "clamp":
            lo = g.ch.pick([None, -0.5, -1.0])
            attrs.update(lo=lo, hi=g.ch.pick([None, 0.5, 2.0] if lo is not None else [0.5, 2.0]))
        elif op == "swish":
            attrs["beta"] = g.ch.pick([1.0, 1.5, 0.5])
        elif op == "elu":
            attrs["alpha"] = g.ch.pick([1.0, 0.5])
        scale = 1.0 if op in ("tanh", "sigmoid", "erf", "sin", "cos") else x.scale
        out = g.apply(op, {"x": x}, attrs, scale=scale)
    elif kind == "domain":
        op = g.ch.pick(DOMAIN_UNARY)
        p = positive(g, x)
        scale = {"log": math.log(x.scale + 1) + 1, "sqrt": math.sqrt(x.scale + 0.5)}.get(op, 2.0)
        out = None if p is None else g.apply(op, {"x": p}, scale=scale)
    elif kind == "step":
        out = g.apply(g.ch.pick(STEP_UNARY), {"x": x}, scale=x.scale + 1)
    else:
        # At most 1, and clamped at 3: products of normal values have heavy tails (a conv of a
        # matmul of x by itself reached 5 times its scale, a conv_transpose of one 54 times:
        # program 78 of seed 13), exp of 11 overflows an f16 output, and exp turns an input's
        # rounding (TF32 on the GPU) into a relative error of the same size.
        tamed = tame(g, x, 1.0)
        bounded = g.apply("clamp", {"x": tamed}, {"lo": None, "hi": 3.0})
        out = g.apply("exp", {"x": bounded if bounded is not None else tamed}, scale=8.0)
    if out is None:
        return False
    g.bind(out)
    return True


def _broadcast_partner(g: Gen, a: Expr) -> Expr | float | None:
    """Something `a` can be combined with: a value of its shape, a param broadcast along
    trailing axes or along channels, or a number."""
    how = g.ch.pick(["same", "number", "trailing", "channel"])
    if how == "same":
        return g.pick(lambda e: is_float(e) and e.type.shape == a.type.shape and e is not a)
    if how == "number":
        return g.ch.pick([0.5, 2.0, -1.5, 3.0])
    shape = a.type.shape
    if how == "trailing":
        k = g.ch.between(1, len(shape)) if shape else 0
        tail = tuple(shape[len(shape) - k:])
        if not tail or not all(static(d) for d in tail):
            return None
        return g.new_param(tuple(size(d) for d in tail), "shift")
    if len(shape) < 3 or not static(shape[1]):
        return None
    return g.new_param((size(shape[1]),) + (1,) * (len(shape) - 2), "scale")


def binary(g: Gen) -> bool:
    a = g.pick(is_float)
    if a is None:
        return False
    b = _broadcast_partner(g, a)
    if b is None:
        return False
    op = g.ch.pick(["add", "mul", "sub", "max", "min", "div", "pow"])
    bs = b.scale if isinstance(b, Expr) else abs(b)
    if op == "div":
        b = positive(g, b) if isinstance(b, Expr) else abs(b) + 0.5
        scale = a.scale * 2
    elif op == "pow":
        base = positive(g, tame(g, a))
        if base is None:
            return False
        a = base
        b = g.ch.pick([2.0, 0.5, 1.5, -0.5])
        scale = (a.scale + 0.5) ** 2
    else:
        scale = {"add": a.scale + bs, "sub": a.scale + bs, "mul": a.scale * bs}.get(
            op, max(a.scale, bs))
    if b is None:
        return False
    out = g.apply(op, {"a": a, "b": b}, scale=scale, infix=op in ("add", "sub", "mul", "div")
                  and g.ch.coin(0.8))
    if out is None:
        return False
    g.bind(tame(g, out, 30.0))
    return True


def compare_select(g: Gen) -> bool:
    """select(a <cmp> b, a, other), its mask sometimes a model input, named (so it may be an
    output too), or read through a transpose (the values then transposed alike, or a scalar):
    masks are where cuDNN's bits meet everyone else's bytes."""
    a = g.pick(lambda e: is_float(e) and e.exact)
    if a is None:
        return False
    b: Expr | float | None = g.pick(lambda e: e.exact and is_float(e) and e.type.shape == a.type.shape
                                    and e is not a) if g.ch.coin(0.5) else None
    if b is None:
        b = g.ch.pick([0.0, 0.5, -0.25])
    op = g.ch.pick(["cmp_gt", "cmp_lt", "cmp_ge", "cmp_le", "cmp_eq", "cmp_ne"])
    if g.ch.coin(0.1):
        mask: Expr | None = g.new_input(a.type.shape, dtype="bool")
        g.stats.features["mask input"] += 1
    else:
        mask = g.apply(op, {"a": a, "b": b}, infix=True)
    other: Expr | float | None = g.pick(lambda e: is_float(e) and e.type.shape == a.type.shape
                                        and e is not a)
    if mask is None or other is None:
        return False
    if mask.op != "input" and g.ch.coin(0.2):
        mask = g.bind(mask)
        g.stats.features["mask named"] += 1
    value: Expr | None = a
    if a.type.rank >= 2 and g.ch.coin(0.15):
        perm = list(range(a.type.rank))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        seen, value = (g.apply("transpose", {"x": e}, {"perm": perm}) for e in (mask, a))
        if seen is None or value is None:
            return False
        mask, other = seen, g.ch.pick([0.5, -1.0])
        g.stats.features["mask through a view"] += 1
    out = g.apply("select", {"mask": mask, "a": value, "b": other})
    if out is None:
        return False
    g.bind(out)
    return True


def bias_scale(g: Gen) -> bool:
    x = g.pick(lambda e: is_float(e) and e.type.rank >= 2)
    if x is None:
        return False
    axis = g.ch.pick([1, x.type.rank - 1, -1])
    if not static(x.type.shape[axis]):
        return False
    op = g.ch.pick(["bias_add", "scale_mul"])
    b = g.new_param((size(x.type.shape[axis]),), "shift" if op == "bias_add" else "scale")
    out = g.apply(op, {"x": x, "b": b}, {"axis": axis})
    if out is None:
        return False
    g.bind(out)
    return True


def cast(g: Gen) -> bool:
    x = g.pick(is_float)
    if x is None:
        return False
    dtype = g.ch.pick([d for d in FLOATS if d != x.type.dtype])
    out = g.apply("cast", {"x": tame(g, x, 100.0)}, {"dtype": dtype})
    if out is None:
        return False
    g.bind(out)
    return True


def matmul(g: Gen) -> bool:
    a = g.pick(lambda e: is_float(e) and e.type.rank >= 2 and static(e.type.shape[-1]))
    if a is None:
        return False
    k = size(a.type.shape[-1])
    a = tame(g, a)
    form = g.ch.pick(["param", "linear", "self", "value"])
    if form == "param":
        b: Expr | None = g.new_param((k, g.ch.pick([8, 16, 4, 32, 1, 3])))
    elif form == "linear":
        w = g.new_param((g.ch.pick([8, 16, 5, 32]), k))
        b = g.apply("transpose", {"x": w}, {"perm": (1, 0)})
    elif form == "self":
        perm = (*range(a.type.rank - 2), a.type.rank - 1, a.type.rank - 2)
        b = g.apply("transpose", {"x": a}, {"perm": perm})
    else:
        b = g.pick(lambda e: is_float(e) and e.type.rank >= 2 and e.type.shape[-2] == k)
    if b is None:
        return False
    # a @ a^T sums K squares (correlated: K * scale^2); a value times another grows by sqrt(K).
    scale = {"self": k * a.scale * a.scale, "value": a.scale * b.scale * math.sqrt(k)}.get(form)
    out = g.apply("matmul", {"a": a, "b": b}, scale=scale)
    if out is None:
        return False
    n = out.type.shape[-1]
    if k % 16 == 0 and static(n) and size(n) % 16 == 0:  # the fp8 forms cuDNN takes (E0404)
        out = in_fp8(g, out)
    g.bind(tame(g, out, 30.0))
    return True


def gated(g: Gen) -> bool:
    """A gated MLP's two projections of one input, `silu(x @ Wg^T) * (x @ Wu^T)`, with PyTorch
    linears' `[N, K]` weights, the input sometimes an RMS norm's value: the few-row matmul
    kernel computes the two in one and the norm inside them (`tune.joins.pairs`, `norms`;
    the GPU oracle forces every join it can make)."""
    x = g.pick(lambda e: is_float(e) and e.type.rank >= 2 and static(e.type.shape[-1]))
    if x is None:
        return False
    k = size(x.type.shape[-1])
    x = tame(g, x)
    if g.ch.coin(0.5) and not flat_rows(x, range(x.type.rank - 1, x.type.rank)):
        normed = g.apply("rmsnorm", {"x": x, "scale": g.new_param((k,), "scale")},
                         {"eps": 1e-5}, scale=2.0)
        if normed is None:
            return False
        x = g.bind(normed)
    width = g.ch.pick([8, 16, 24, 12])

    def project() -> Expr | None:
        w = g.apply("transpose", {"x": g.new_param((width, k))}, {"perm": (1, 0)})
        return None if w is None else g.apply("matmul", {"a": x, "b": w})

    gate, up = project(), project()
    act = None if gate is None else g.apply("silu", {"x": gate})
    out = None if act is None or up is None else g.apply("mul", {"a": act, "b": up}, infix=True)
    if out is None:
        return False
    g.stats.features["gated projections"] += 1
    g.bind(tame(g, out, 30.0))
    return True


def in_fp8(g: Gen, out: Expr) -> Expr:
    """Sometimes the call asks to compute in fp8 (`precision=f8e4m3`): its operands quantised,
    the oracles then hold it to fp8's tolerance."""
    if not g.ch.coin(0.5):
        return out
    g.stats.features[f"fp8 {out.op}"] += 1
    return replace(out, text=f"{out.text[:-1]}, precision=f8e4m3)", exact=False)


def _pads(g: Gen, r: int, n: int, attrs: dict[str, object], asym: bool) -> None:
    kind = g.ch.pick(["none", "same", "list", "asym"] if asym else ["none", "same", "list"])
    if kind == "same":
        attrs["pad"] = (r - 1) // 2
    elif kind == "list":
        attrs["pad"] = [g.ch.between(0, r - 1) for _ in range(n)]
    elif kind == "asym":
        attrs["pre_pad"] = [g.ch.between(0, r - 1) for _ in range(n)]
        attrs["post_pad"] = [g.ch.between(0, r - 1) for _ in range(n)]


def conv(g: Gen) -> bool:
    """conv (stride, dilation, groups, symmetric or asymmetric padding) or conv_transpose, then
    sometimes a bias."""
    x = g.pick(lambda e: is_float(e) and 3 <= e.type.rank <= 5 and static(e.type.shape[1]))
    if x is None:
        return False
    c = size(x.type.shape[1])
    n = x.type.rank - 2
    # an image network's stem: stride 2 over few channels, ungrouped (cuDNN's engines read
    # channels in vectors: such convs get engines of their own)
    stem = n == 2 and c <= 4 and g.ch.coin(0.2)
    r = g.ch.pick([3, 7, 5, 4]) if stem else g.ch.pick([1, 3, 2, 5])
    stride = 2 if stem else g.ch.pick([1, 2, 3])
    attrs: dict[str, object] = {"stride": stride, "dilation": 1 if stem else g.ch.pick([1, 1, 2])}
    if not stem and g.ch.coin(0.25):  # transposed: x [N, K, *S], w [K, C, *R] -> [N, C, *O]
        # a learned upsample: the kernel its stride, unpadded (a matmul per kernel row: `lower.upconv`)
        upsample = g.ch.coin(0.4)
        if upsample:
            r = stride = g.ch.pick([2, 3, 1])
            attrs.update(stride=stride, dilation=1, pad=0, output_pad=0)
        else:
            _pads(g, r, n, attrs, asym=False)
            attrs["output_pad"] = g.ch.between(0, stride - 1)
        w = g.new_param((c, g.ch.between(1, 16)) + (r,) * n)
        out = g.apply("conv_transpose", {"x": tame(g, x), "w": w}, attrs)
        if out is not None and upsample and n == 2:
            g.stats.features["transposed conv with kernel = stride"] += 1
    else:
        fp8_form = n == 2 and c % 16 == 0 and g.ch.coin(0.4)  # ungrouped (below)
        groups = 1 if fp8_form or stem else \
            g.ch.pick([1] + [d for d in (2, 3, 4, c) if c % d == 0 and d > 1])
        attrs["groups"] = groups
        _pads(g, r, n, attrs, asym=True)
        k = groups * g.ch.between(1, max(1, 16 // groups))
        if fp8_form or (groups == 1 and n == 2 and g.ch.coin(0.3)):
            k = 16  # 16 channels: an fp8 form, here (below) or in the conv reading it
        w = g.new_param((k, c // groups) + (r,) * n)
        out = g.apply("conv", {"x": tame(g, x), "w": w}, attrs)
        if out is not None and n == 2 and r == 5 and groups == c == w.type.shape[0]:
            g.stats.features["depthwise 5x5 conv"] += 1  # compiled apart from its bias
        if out is not None and stem:
            g.stats.features["stem conv (stride 2 over at most 4 channels)"] += 1
        one_pixel = r > 1 and any(d == 1 for d in x.type.shape[2:])
        if out is not None and n == 2 and groups == 1 and c % 16 == 0 and \
                k % 16 == 0 and not one_pixel:  # the fp8 forms cuDNN takes (E0404)
            out = in_fp8(g, out)
    if out is None:
        return False
    if g.ch.coin(0.5):
        bias = g.new_param((size(out.type.shape[1]),), "shift")
        out = g.apply("bias_add", {"x": g.bind(out), "b": bias})
        if out is None:
            return False
    g.bind(tame(g, out, 30.0))
    return True


def reduce(g: Gen) -> bool:
    x = g.pick(is_float)
    if x is None or x.type.rank == 0:
        return False
    op = g.ch.pick(["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_amax",
                    "reduce_l1", "reduce_l2", "reduce_prod"])
    axes = g.ch.subset(list(range(x.type.rank)))
    if g.ch.coin(0.2):
        axes = [a - x.type.rank for a in axes]  # negative axes count from the end
    count = math.prod(size(x.type.shape[a]) if static(x.type.shape[a]) else 64 for a in axes)
    if op == "reduce_prod":
        if count > 4:
            return False
        x = tame(g, x, 1.5)
    scale = {"reduce_sum": x.scale * math.sqrt(count) * 2, "reduce_l1": x.scale * count,
             "reduce_l2": x.scale * math.sqrt(count), "reduce_prod": 2.0}.get(op, x.scale * 2)
    out = g.apply(op, {"x": x}, {"axes": axes, "keepdims": g.ch.coin(0.4)}, scale=scale)
    if out is None:
        return False
    g.bind(tame(g, out, 30.0))
    return True


def norm(g: Gen) -> bool:
    op = g.ch.pick(["layernorm", "rmsnorm", "batchnorm", "instancenorm", "groupnorm"])
    if op in ("layernorm", "rmsnorm"):
        x = g.pick(lambda e: is_float(e) and e.type.rank >= 2 and static(e.type.shape[-1]))
        if x is None:
            return False
        r = 2 if x.type.rank >= 3 and static(x.type.shape[-2]) and g.ch.coin(0.3) else 1
        if flat_rows(x, range(x.type.rank - r, x.type.rank)):
            return False
        shape = tuple(size(d) for d in x.type.shape[x.type.rank - r:])
        tensors = {"x": x, "scale": g.new_param(shape, "scale")}
        if op == "layernorm" or g.ch.coin(0.3):
            tensors["bias"] = g.new_param(shape, "shift")
        out = g.apply(op, tensors, {"eps": g.ch.pick([1e-5, 1e-6, 0.001])}, scale=2.0)
    else:
        x = g.pick(lambda e: is_float(e) and e.type.rank >= 3 and static(e.type.shape[1]))
        if x is None:
            return False
        c = (size(x.type.shape[1]),)
        if op == "batchnorm":
            tensors = {"x": x, "mean": g.new_param(c, "mean", "f32"),
                       "var": g.new_param(c, "var", "f32"), "scale": g.new_param(c, "scale", "f32"),
                       "bias": g.new_param(c, "shift", "f32")}
            out = g.apply(op, tensors, {"eps": 1e-5}, scale=x.scale * 2)
        else:
            if flat_rows(x, range(2, x.type.rank)):
                return False
            tensors = {"x": x, "scale": g.new_param(c, "scale"), "bias": g.new_param(c, "shift")}
            attrs: dict[str, object] = {"eps": 1e-5}
            if op == "groupnorm":
                attrs["groups"] = g.ch.pick([d for d in range(1, c[0] + 1) if c[0] % d == 0])
            out = g.apply(op, tensors, attrs, scale=4.0)
    if out is None:
        return False
    g.bind(out)
    return True


def flat_rows(x: Expr, axes: range) -> bool:
    """Whether the values a norm would normalise over may be (nearly) equal: all equal (zero
    variance: the result is rounding noise over sqrt(eps), different in every implementation),
    or only 2 or 3 of them (a dynamic extent may run that small): two random values 1e-3 apart
    have a variance below eps, which a one-pass variance, as cuDNN's, loses (an f32 instance norm
    over 2 values was 2% off on the H200 for that reason alone)."""
    sizes = [x.type.shape[a] for a in axes]
    if all(s == 1 or a in x.constant for a, s in zip(axes, sizes, strict=True)) and \
            any(s != 1 for s in sizes):
        return True
    known = math.prod(size(s) for s in sizes if static(s))
    return known < 4 and (known > 1 or not all(static(s) for s in sizes))


def pool(g: Gen) -> bool:
    x = g.pick(lambda e: is_float(e) and e.type.rank == 4)
    if x is None:
        return False
    if g.ch.coin(0.3):
        factor = g.ch.pick([2, 1, 3])
        mode = g.ch.pick(["nearest", "bilinear"])
        out = g.apply("upsample", {"x": x}, {"factor": factor, "mode": mode})
    else:
        window = g.ch.pick([2, 3, 1, 4])
        attrs: dict[str, object] = {"window": window}
        if g.ch.coin(0.6):
            attrs["stride"] = g.ch.between(1, window)
        if g.ch.coin(0.5):
            attrs["pad"] = g.ch.between(0, window // 2)
        op = g.ch.pick(["maxpool", "avgpool"])
        if op == "avgpool" and g.ch.coin(0.4):
            attrs["count_pad"] = True
        out = g.apply(op, {"x": x}, attrs)
    if out is None:
        return False
    g.bind(out)
    return True


def _bias(g: Gen, sq: int, s: int) -> Expr:
    """A bias [Sq, Skv] of its own, or a mask over the keys alone [1, Skv] that every attention
    over Skv keys may read, whatever its query count (lowering copies a broadcast bias to the
    full size of each attention's scores: one copy per size)."""
    if s not in g.masks:
        if g.ch.coin(0.5):
            return g.new_param((sq, s), "shift")
        g.masks[s] = g.new_param((1, s), "shift")
    return g.masks[s]


def _padding_mask(g: Gen, b: dims.Dim, s: int) -> Expr | None:
    """BERT's padding mask: token flags [B, S] of 0 or 1 (an i64 input), cast, reshaped to
    [B, 1, 1, S] and made `(1 - keep) * -10000`: lowering moves the reshape before the cast and
    broadcasts the bias to the scores' size, in the kernel that computes it."""
    flags = g.new_input((b, s), dtype="i64")
    g.prog.index_bounds[flags.text] = 2
    keep = g.apply("cast", {"x": flags}, {"dtype": "f32"})
    keep = None if keep is None else g.apply("reshape", {"x": keep}, {"shape": (b, 1, 1, s)})
    dropped = None if keep is None else g.apply("sub", {"a": 1.0, "b": keep}, infix=True)
    if dropped is None:
        return None
    g.stats.features["attention with a padding mask"] += 1
    return g.apply("mul", {"a": dropped, "b": -10000.0}, infix=True)


def attention(g: Gen) -> bool:
    # Its reshapes spell the batch and sequence dims: no floor atoms (a conv's output size).
    x = g.pick(lambda e: is_float(e) and e.type.rank == 3 and e.type.dtype == g.precision.io
               and static(e.type.shape[2]) and all(printable(d) for d in e.type.shape))
    heads = g.ch.pick([1, 2, 4])
    head_dim = g.ch.pick([8, 16, 32])
    width = heads * head_dim
    kv_heads = g.ch.pick([h for h in (heads, 1, 2) if heads % h == 0])
    if x is None:
        return False
    b, s = x.type.shape[0], x.type.shape[1]
    # Sometimes a query block: the last t positions attend to all s keys (decoding, chunked
    # prefill), masks aligned bottom-right (the last query at the last key) or top-left.
    sq, queries = s, x
    # (more often where a key mask over s keys exists: it is then read at two query counts)
    if static(s) and size(s) >= 2 and g.ch.coin(0.6 if size(s) in g.masks else 0.25):
        sq = g.ch.between(1, size(s) - 1)
        block = g.apply("slice", {"x": x}, {"starts": (0, size(s) - sq, 0),
                                            "ends": (b, s, x.type.shape[2])})
        if block is None:
            return False
        queries = block
        g.stats.features["attention of a query block"] += 1
    qkv: list[Expr] = []
    for name, h in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
        w = g.new_param((size(x.type.shape[2]), h * head_dim))
        proj = g.apply("matmul", {"a": tame(g, queries if name == "q" else x), "b": w})
        if proj is None:
            return False
        length = sq if name == "q" else s
        split = g.apply("reshape", {"x": g.bind(proj, name)}, {"shape": (b, length, h, head_dim)})
        t = None if split is None else g.apply("transpose", {"x": split}, {"perm": (0, 2, 1, 3)})
        if t is None:
            return False
        qkv.append(t)
    attrs: dict[str, object] = {"causal": g.ch.coin(0.4)}
    if g.ch.coin(0.3):
        attrs["scale"] = g.ch.pick([0.125, 0.5])
    if g.ch.coin(0.2):  # every query keeps at least the key it stands at
        attrs["window"] = g.ch.pick([1, 2, 4])
    if g.ch.coin(0.5 if sq != s else 0.1):
        attrs["align"] = g.ch.pick(["bottom_right", "top_left"])
    tensors: dict[str, Expr | None] = dict(zip("qkv", qkv, strict=True))
    if static(s) and ((size(s) in g.masks and g.ch.coin(0.6)) or g.ch.coin(0.2)):
        tensors["bias"] = _bias(g, size(sq), size(s))
    elif static(s) and g.ch.coin(0.15):
        tensors["bias"] = _padding_mask(g, b, size(s))
        if tensors["bias"] is None:
            return False
    if static(s) and g.ch.coin(0.15):
        # Valid key lengths (a cache filled up to L): L >= Sq leaves every query a key, aligned
        # either way and under any window (query i stands at L - Sq + i >= 0 at the latest).
        lengths = g.apply("full", {}, {"shape": (b,), "value": g.ch.between(size(sq), size(s)),
                                       "dtype": "i32"})
        if lengths is None:
            return False
        tensors["kv_len"] = lengths
        g.stats.features["attention over valid key lengths"] += 1
    out = g.apply("sdpa", tensors, attrs)
    first = None if out is None else _merged(g, out, b, sq, width)
    if first is None:
        return False
    mask = tensors.get("bias")
    if mask is not None and mask.type.shape[0] == 1 and size(sq) >= 2 and g.ch.coin(0.5):
        # The last queries again, reading the same key mask (lowering copies it to the full
        # size of each attention's scores): their result added to the first's last rows.
        last = g.ch.between(1, size(sq) - 1)
        block = g.apply("slice", {"x": qkv[0]}, {"starts": (0, 0, size(sq) - last, 0),
                                                 "ends": (b, heads, sq, head_dim)})
        again = None if block is None else g.apply("sdpa", {**tensors, "q": block}, attrs)
        second = None if again is None else _merged(g, again, b, last, width)
        rows = None if second is None else g.apply(
            "slice", {"x": first}, {"starts": (0, size(sq) - last, 0), "ends": (b, sq, width)})
        both = None if rows is None or second is None else g.apply("add", {"a": rows, "b": second})
        if both is None:
            return False
        g.bind(both)
        g.stats.features["a key mask read by attentions of two query counts"] += 1
    return True


def _merged(g: Gen, out: Expr, b: dims.Dim, sq: dims.Dim, width: int) -> Expr | None:
    """An attention's heads merged back, [B, Sq, H * D], bound."""
    merged = g.apply("transpose", {"x": g.bind(out)}, {"perm": (0, 2, 1, 3)})
    merged = None if merged is None else g.apply("reshape", {"x": merged},
                                                 {"shape": (b, sq, width)})
    return None if merged is None else g.bind(merged)
