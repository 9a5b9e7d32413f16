"""GELU as exporters without a `Gelu` op spell it (opsets before 20, the legacy exporter), found
and written as the language's `gelu` / `gelu_tanh`:
`x * 0.5 * (1 + erf(x / sqrt(2)))`, and `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))`,
the factors in any order and grouping."""

from __future__ import annotations

import math

import numpy as np

from dslc.importer.graph import Arg, Lit, Op
from dslc.importer.patterns import Recogniser

SQRT_HALF = math.sqrt(0.5)
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
CUBIC = 0.044715


def _near(value: float, want: float) -> bool:
    """Equal as the f32 constants an exporter writes (within a few units in the last place)."""
    return bool(np.isclose(np.float32(value), np.float32(want), rtol=1e-6, atol=0.0))


def factors(r: Recogniser, x: Arg, root: bool = True) -> tuple[list[Arg], float]:
    """`x` as a product: its tensor factors and the number they are multiplied by, through
    products and quotients by numbers that nothing else reads."""
    if isinstance(x, Lit):
        return [], float(x.value)
    if not isinstance(x, Op) or x.op not in ("mul", "div") or (not root and not r.single(x)):
        return [x], 1.0
    a, b = x.args
    left, c = factors(r, a, False)
    if x.op == "div":
        if not isinstance(b, Lit) or float(b.value) == 0.0:
            return [x], 1.0
        return left, c / float(b.value)
    right, d = factors(r, b, False)
    return left + right, c * d


def _one_plus(r: Recogniser, a: Arg, fn: str) -> Arg | None:
    """The argument of `fn` in `1 + fn(t)` (either order), both read only here."""
    if not isinstance(a, Op) or a.op != "add" or not r.single(a):
        return None
    for one, f in (a.args, a.args[::-1]):
        if isinstance(one, Lit) and float(one.value) == 1.0 and isinstance(f, Op) and \
                f.op == fn and r.single(f):
            return f.args[0]
    return None


def _scaled_x(r: Recogniser, t: Arg, x: Op, want: float) -> bool:
    tensors, c = factors(r, t, False)
    return tensors == [x] and _near(c, want)


def _cubic_term(r: Recogniser, t: Arg, x: Op) -> bool:
    """`x + 0.044715 x^3`, the cube a product of three x or `pow(x, 3)`."""
    if not isinstance(t, Op) or t.op != "add" or not r.single(t):
        return False
    for lone, term in (t.args, t.args[::-1]):
        if lone is not x:
            continue
        tensors, c = factors(r, term, False)
        if len(tensors) == 1 and isinstance(tensors[0], Op) and tensors[0].op == "pow":
            base, power = tensors[0].args
            cube = base is x and isinstance(power, Lit) and float(power.value) == 3.0
        else:
            cube = len(tensors) == 3 and all(f is x for f in tensors)
        if cube and _near(c, CUBIC):
            return True
    return False


def gelu(r: Recogniser, op: Op) -> Op | None:
    if op.op != "mul":
        return None
    tensors, c = factors(r, op)
    if len(tensors) != 2 or not _near(c, 0.5):
        return None
    for x, rest in (tensors, tensors[::-1]):
        if not isinstance(x, Op):
            continue
        inner = _one_plus(r, rest, "erf")
        if inner is not None and _scaled_x(r, inner, x, SQRT_HALF):
            return Op("gelu", [x], {}, op.dtype, op.shape, op.origin, onnx_name=op.onnx_name)
        inner = _one_plus(r, rest, "tanh")
        if inner is not None:
            cubic, scale = factors(r, inner, False)
            if len(cubic) == 1 and _near(scale, SQRT_2_OVER_PI) and _cubic_term(r, cubic[0], x):
                return Op("gelu_tanh", [x], {}, op.dtype, op.shape, op.origin,
                          onnx_name=op.onnx_name)
    return None
