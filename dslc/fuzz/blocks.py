"""Families that go through defs: calls of the standard library (`linear`, `conv2d`,
`batchnorm2d`, `layer_norm`, `softmax`: instances, parameter paths, shape patterns) and generated
defs of residual blocks, called once or stacked with `repeat` (`as "layers.{i}"`), one of them
declaring an input of its own per instance (a decoder layer's cache)."""

from __future__ import annotations

from dslc.core.types import TensorType
from dslc.fuzz.families import flat_rows, is_float, size, static, tame
from dslc.fuzz.program import Expr, Stmt
from dslc.fuzz.state import Gen

ACTIVATIONS = ["relu", "gelu", "silu", "tanh"]


def _io(g: Gen, e: Expr) -> bool:
    """A value in the model's `io` dtype: the std library's params are declared in it. Not a
    cast's result: its dtype stays when the f32 oracle runs the model in f32, where a block's
    results (computed with f32 params) would then change the type `repeat` carries (E0303:
    program 569 of seed 500)."""
    return is_float(e) and e.type.dtype == g.precision.io and e.op != "cast"


def _call(g: Gen, text: str, x: Expr, typ: TensorType, scale: float, op: str,
          defs: tuple[str, ...] = (), reads: frozenset[str] = frozenset()) -> Expr:
    name = g.fresh("v")
    g.stats.ops[op] += 1
    g.stats.pairs[(x.op or "input", op)] += 1
    value = Expr(name, typ, frozenset({name}), False, scale, op)
    return g.declare(Stmt((name,), f"  let {name} = {text}", x.reads | reads, defs), value)


def std_call(g: Gen) -> bool:
    g.prog.uses_std = True
    which = g.ch.pick(["linear", "softmax", "conv2d", "layer_norm"])
    if which == "softmax":
        x = g.pick(lambda e: is_float(e) and e.type.rank >= 1)
        if x is None:
            return False
        x = tame(g, x, 4.0)
        _call(g, f"softmax({x.text})", x, TensorType(x.type.dtype, x.type.shape), 1.0, "std.softmax")
        return True
    if which in ("linear", "layer_norm"):
        # linear's matmul needs rank 2 or more (as `matmul` does); layer_norm takes any rank
        least = 2 if which == "linear" else 1
        x = g.pick(lambda e: _io(g, e) and e.type.rank >= least and static(e.type.shape[-1]))
        if x is None:
            return False
        if which == "layer_norm":
            if flat_rows(x, range(x.type.rank - 1, x.type.rank)):
                return False
            _call(g, f"layer_norm({x.text}, eps=1e-5)", x, TensorType(x.type.dtype, x.type.shape),
                  2.0, "std.layer_norm")
            return True
        out = g.ch.pick([8, 16, 4, 32])
        bias = "" if g.ch.coin(0.7) else ", has_bias=false"
        typ = TensorType(x.type.dtype, (*x.type.shape[:-1], out))
        x = tame(g, x)
        _call(g, f"linear({x.text}, out={out}{bias})", x, typ, max(x.scale, 1.0), "std.linear")
        return True
    x = g.pick(lambda e: _io(g, e) and e.type.rank == 4 and static(e.type.shape[1]))
    if x is None:
        return False
    k, r, stride = g.ch.pick([8, 4, 16]), g.ch.pick([3, 1]), g.ch.pick([1, 2])
    pad = (r - 1) // 2
    c = size(x.type.shape[1])
    found = g.infer("conv", {"x": x, "w": TensorType(x.type.dtype, (k, c, r, r))},
                    {"stride": stride, "pad": pad})
    if not isinstance(found, TensorType):
        return False
    conv = _call(g, f"conv2d({x.text}, out={k}, k={r}, stride={stride}, pad={pad})", x, found,
                 max(x.scale, 1.0), "std.conv2d")
    if g.ch.coin(0.6):
        _call(g, f"batchnorm2d({conv.text})", conv, found, 2.0, "std.batchnorm2d")
    return True


SEQ_BLOCK = """def {name}(x: [*L, D], hidden: int) -> [*L, D] {{
{precision}  let h = linear(x, out=hidden)
  let o = linear({act}(h), out=D)
{ret}
}}"""

# A pre-norm block that carries the hidden state and the residual (`repeat` over a tuple).
PAIR_BLOCK = """def {name}(x: [*L, D], res: [*L, D], hidden: int) -> ([*L, D], [*L, D]) {{
{precision}  let r = x + res
  let h = linear(r, out=hidden)
  let o = linear({act}(h), out=D)
  return o, r
}}"""

# The residual is x, or x through a 1x1 conv with its bias (a projection shortcut: the sum of
# two convs with their biases, `lower.canonical.residual_before_bias`'s choice between them).
CONV_BLOCK = """def {name}(x: [N, C, H, W]) -> [N, C, H, W] {{
{precision}  let c = conv2d(x, out=C, k=3, pad=1)
  let b = batchnorm2d(c)
{shortcut}  return {act}(b + {residual})
}}"""
SHORTCUT = "  let s = conv2d(x, out=C, k=1, has_bias=true)\n"


# A layer with a cache of its own: `input` in a def, one model input per instance, written in
# place at a position the model receives.
CACHE_BLOCK = """def {name}(x: [B, H, S, D], at: i32[1]) -> [B, H, S, D] {{
{precision}  input cache: [B, H, {rows}, D]
  let k = cache_write(cache, x, at=at)
  return x + reduce_mean(k, axes=[2], keepdims=true)
}}"""


def block(g: Gen) -> bool:
    """A generated residual block (a def), called once or stacked with `repeat`."""
    x = g.pick(lambda e: _io(g, e) and e.type.rank >= 2 and static(e.type.shape[-1])
               and (e.type.rank != 4 or static(e.type.shape[1])))
    if x is None:
        return False
    g.prog.uses_std = True
    name = g.fresh("block")
    act = g.ch.pick(ACTIVATIONS)
    reads: frozenset[str] = frozenset()  # what the call reads besides x
    precision = "  precision intermediate=f32\n" if g.ch.coin(0.3) else ""
    if x.type.rank == 4 and static(x.type.shape[2]) and g.ch.coin(0.2):
        rows = size(x.type.shape[2]) + g.ch.between(0, 4)
        g.prog.defs[name] = CACHE_BLOCK.format(name=name, precision=precision, rows=rows)
        at = g.new_input((1,), dtype="i32")
        g.pool.remove(at)
        g.prog.index_bounds[at.text] = rows + 2  # some writes reach past the end (dropped)
        g.stats.features["an input declared in a def"] += 1
        args, reads = f", {at.text}", at.reads
    elif x.type.rank == 4 and g.ch.coin(0.6):
        shortcut = SHORTCUT if g.ch.coin(0.5) else ""
        if shortcut:
            g.stats.features["a conv block with a projection shortcut"] += 1
        g.prog.defs[name] = CONV_BLOCK.format(name=name, precision=precision, act=act,
                                              shortcut=shortcut, residual="s" if shortcut else "x")
        args = ""
    else:
        ret = g.ch.pick(["  return x + o", "  let n = layer_norm(x + o)\n  return n", "pair"])
        if ret == "pair":
            return _pair_block(g, x, name, act, precision)
        g.prog.defs[name] = SEQ_BLOCK.format(name=name, precision=precision, act=act, ret=ret)
        args = f", hidden={g.ch.pick([16, 8, 32])}"
    x = tame(g, x, 2.0)
    times = g.ch.between(1, 3)
    g.stats.features["repeat" if times > 1 else "def"] += 1
    _call(g, _stacked(name, f"{x.text}{args}", times), x, TensorType(x.type.dtype, x.type.shape),
          2.0 ** times, "block", (name,), reads)
    return True


def _stacked(name: str, args: str, times: int) -> str:
    return f'repeat {times} {name}({args}) as "{name}.{{i}}"' if times > 1 else f"{name}({args})"


def _pair_block(g: Gen, x: Expr, name: str, act: str, precision: str) -> bool:
    """`let (o, r) = repeat K block(x, res, ...)`: both results carried to the next instance."""
    res = g.pick(lambda e: e.type.shape == x.type.shape and _io(g, e))
    assert res is not None  # x itself qualifies
    g.prog.defs[name] = PAIR_BLOCK.format(name=name, precision=precision, act=act)
    x, res = tame(g, x, 2.0), tame(g, res, 2.0)
    times = g.ch.between(1, 3)
    g.stats.features["repeat_tuple" if times > 1 else "def"] += 1
    g.stats.ops["block"] += 1
    text = _stacked(name, f"{x.text}, {res.text}, hidden={g.ch.pick([16, 8, 32])}", times)
    outs = (g.fresh("v"), g.fresh("v"))
    g.prog.stmts.append(Stmt(outs, f"  let ({outs[0]}, {outs[1]}) = {text}", x.reads | res.reads,
                             (name,)))
    for out, scale in zip(outs, (2.0, 2.0 ** times), strict=True):
        g.pool.append(Expr(out, TensorType(x.type.dtype, x.type.shape), frozenset({out}), False,
                           scale, "block"))
    return True
