"""Symbolic dim arithmetic: a dim is an `int` or a `Poly`, an integer-valued polynomial over the
model's dynamic dims with rational coefficients (so `H / 2` is exactly `1/2 * H`).

Static dims are folded to ints, so most shapes never leave the `int` fast path. `floor(p / c)`
(conv and pool output sizes) simplifies when alignment makes the division exact, and otherwise
becomes an opaque atom `⌊p/c⌋` with an interval of its own. Two dims are equal iff their
normal forms are equal; `N` and `B` are never equal, whatever their ranges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

Coeff = int | Fraction
Monomial = tuple[tuple[str, int], ...]  # ((symbol, power), ...) sorted; () is the constant


@dataclass(frozen=True, slots=True)
class SymInfo:
    """What the checker knows of a dynamic dim: its range and alignment."""

    name: str
    lo: int
    hi: int
    align: int = 1


class DimEnv:
    """The dynamic dims in scope, and the floor atoms created while checking (by printed name)."""

    def __init__(self) -> None:
        self.syms: dict[str, SymInfo] = {}
        self.floors: dict[str, tuple[Poly, int]] = {}

    def add(self, info: SymInfo) -> None:
        self.syms[info.name] = info

    def align(self, name: str) -> int:
        info = self.syms.get(name)
        return info.align if info else 1

    def bounds(self, name: str) -> tuple[Fraction, Fraction]:
        if name in self.floors:
            inner, c = self.floors[name]
            lo, hi = interval(inner, self)
            return Fraction(math.floor(lo / c)), Fraction(math.floor(hi / c))
        info = self.syms.get(name)
        if info is None:  # a symbol of unknown range: nothing can be proved about it
            return Fraction(-(10**18)), Fraction(10**18)
        a = info.align
        return Fraction(-(-info.lo // a) * a), Fraction((info.hi // a) * a)


def _norm(c: Coeff) -> Coeff:
    if isinstance(c, Fraction) and c.denominator == 1:
        return c.numerator
    return c


class Poly:
    """A non-constant polynomial; build through `make`, which folds constants back to `int`."""

    __slots__ = ("_hash", "terms")

    def __init__(self, terms: tuple[tuple[Monomial, Coeff], ...]) -> None:
        self.terms = terms
        self._hash = hash(terms)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Poly) and self.terms == other.terms

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Poly({format_dim(self)})"

    def symbols(self) -> set[str]:
        return {s for mono, _ in self.terms for s, _ in mono}

    def constant(self) -> Coeff:
        for mono, c in self.terms:
            if mono == ():
                return c
        return 0


Dim = int | Poly


def make(terms: dict[Monomial, Coeff]) -> Dim | Fraction:
    items = tuple(sorted((m, _norm(c)) for m, c in terms.items() if c != 0))
    if not items:
        return 0
    if len(items) == 1 and items[0][0] == ():
        return items[0][1]
    return Poly(items)


def sym(name: str) -> Poly:
    return Poly(((((name, 1),), 1),))


def _terms(a: Dim | Fraction) -> dict[Monomial, Coeff]:
    if isinstance(a, Poly):
        return dict(a.terms)
    return {(): a} if a != 0 else {}


def add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    t = _terms(a)
    for m, c in _terms(b).items():
        t[m] = t.get(m, 0) + c
    return _as_dim(make(t))


def neg(a: Dim) -> Dim:
    if isinstance(a, int):
        return -a
    return _as_dim(make({m: -c for m, c in a.terms}))


def sub(a: Dim, b: Dim) -> Dim:
    return add(a, neg(b))


def _mono_mul(x: Monomial, y: Monomial) -> Monomial:
    powers = dict(x)
    for s, p in y:
        powers[s] = powers.get(s, 0) + p
    return tuple(sorted(powers.items()))


def mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    t: dict[Monomial, Coeff] = {}
    for ma, ca in _terms(a).items():
        for mb, cb in _terms(b).items():
            m = _mono_mul(ma, mb)
            t[m] = t.get(m, 0) + ca * cb
    return _as_dim(make(t))


def _as_dim(x: Dim | Fraction) -> Dim:
    """A rational constant here is a bug in the caller: dims are integers."""
    if isinstance(x, Fraction):
        raise ValueError(f"non-integer dim {x}")
    return x


def _scaled(a: Dim, factor: Fraction) -> Dim | Fraction:
    return make({m: c * factor for m, c in _terms(a).items()})


def is_integer_valued(x: Dim | Fraction, env: DimEnv) -> bool:
    """Sufficient test that `x` is an integer for every admissible value of its symbols:
    each term's coefficient times the alignments of its symbols is an integer."""
    if not isinstance(x, Poly):
        return isinstance(x, int) or x.denominator == 1
    for mono, c in x.terms:
        scale: Coeff = c
        for s, p in mono:
            scale *= env.align(s) ** p
        if isinstance(scale, Fraction) and scale.denominator != 1:
            return False
    return True


def div_exact(a: Dim, b: Dim, env: DimEnv) -> Dim | None:
    """`a / b` when it is provably an integer for every admissible value, else None."""
    if isinstance(b, int):
        if b == 0:
            return None
        if isinstance(a, int):
            return a // b if a % b == 0 else None
        q = _scaled(a, Fraction(1, b))
        return q if is_integer_valued(q, env) and not isinstance(q, Fraction) else None
    if len(b.terms) != 1:
        quotient = _divide_polynomial(a, b)
        return quotient if quotient is not None and is_integer_valued(quotient, env) else None
    (mono_b, coeff_b), = b.terms
    out: dict[Monomial, Coeff] = {}
    powers_b = dict(mono_b)
    for mono, c in _terms(a).items():
        powers = dict(mono)
        for s, p in powers_b.items():
            if powers.get(s, 0) < p:
                return None
            powers[s] -= p
        out[tuple(sorted((s, p) for s, p in powers.items() if p))] = Fraction(c) / coeff_b
    q = make(out)
    return q if is_integer_valued(q, env) and not isinstance(q, Fraction) else None


def _order_key(mono: Monomial) -> tuple[int, Monomial]:
    return (sum(p for _, p in mono), mono)  # graded lexicographic


def _divide_polynomial(a: Dim, b: Poly) -> Dim | None:
    """`a / b` by multivariate long division when the remainder is zero, else None."""
    lead_mono, lead_coeff = max(b.terms, key=lambda t: _order_key(t[0]))
    rest = _terms(a)
    quotient: dict[Monomial, Coeff] = {}
    while rest:  # each step cancels the leading term of `rest`, so this ends
        mono, c = max(rest.items(), key=lambda t: _order_key(t[0]))
        powers = dict(mono)
        for s, p in lead_mono:
            if powers.get(s, 0) < p:
                return None  # the leading term does not divide: a remainder is left
            powers[s] -= p
        t_mono = tuple(sorted((s, p) for s, p in powers.items() if p))
        t_coeff = _norm(Fraction(c) / lead_coeff)
        quotient[t_mono] = quotient.get(t_mono, 0) + t_coeff
        for m, v in b.terms:
            key = _mono_mul(m, t_mono)
            rest[key] = rest.get(key, 0) - v * t_coeff
            if rest[key] == 0:
                del rest[key]
    q = make(quotient)
    return None if isinstance(q, Fraction) else q


def floordiv(a: Dim, c: int, env: DimEnv) -> Dim:
    """`floor(a / c)` for a positive int `c`, simplified where alignment makes it exact."""
    if isinstance(a, int):
        return a // c
    k = a.constant()
    rest = sub(a, k) if isinstance(k, int) else a
    q = _scaled(rest, Fraction(1, c))
    if isinstance(k, int) and not isinstance(q, Fraction) and is_integer_valued(q, env):
        return add(q, k // c)
    name = f"⌊({format_dim(a)}) / {c}⌋"
    env.floors[name] = (a, c)
    return sym(name)


def interval(x: Dim | Fraction, env: DimEnv) -> tuple[Fraction, Fraction]:
    """Bounds of `x` over the admissible values of its symbols (interval arithmetic)."""
    if not isinstance(x, Poly):
        return Fraction(x), Fraction(x)
    lo_sum, hi_sum = Fraction(0), Fraction(0)
    for mono, c in x.terms:
        lo, hi = Fraction(1), Fraction(1)
        for s, p in mono:
            slo, shi = env.bounds(s)
            cands = [slo**p, shi**p] + ([Fraction(0)] if p % 2 == 0 and slo < 0 < shi else [])
            lo_m, hi_m = min(cands), max(cands)
            prods = [lo * lo_m, lo * hi_m, hi * lo_m, hi * hi_m]
            lo, hi = min(prods), max(prods)
        a, b = c * lo, c * hi
        lo_sum += min(a, b)
        hi_sum += max(a, b)
    return lo_sum, hi_sum


def evaluate(x: Dim, values: dict[str, int], env: DimEnv | None = None) -> int:
    """`x` with every symbol replaced by its value (floor atoms evaluated through `env`)."""
    if isinstance(x, int):
        return x
    total: Fraction = Fraction(0)
    for mono, c in x.terms:
        term = Fraction(c)
        for s, p in mono:
            if s in values:
                v = values[s]
            elif env is not None and s in env.floors:
                inner, d = env.floors[s]
                v = evaluate(inner, values, env) // d
            else:
                raise KeyError(s)
            term *= v**p
        total += term
    if total.denominator != 1:
        raise ValueError(f"{format_dim(x)} is not an integer at {values}")
    return total.numerator


def compare(a: Dim, b: Dim, op: str, env: DimEnv) -> bool | None:
    """Decide `a op b` for every admissible value; None when it depends on the values."""
    diff = sub(a, b)
    if isinstance(diff, int):
        lo = hi = Fraction(diff)
    else:
        lo, hi = interval(diff, env)
    if op == "==":
        return True if (lo == hi == 0) else (False if lo > 0 or hi < 0 else None)
    if op == "!=":
        r = compare(a, b, "==", env)
        return None if r is None else not r
    tests = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0),
             ">": (lo > 0, hi <= 0), ">=": (lo >= 0, hi < 0)}
    yes, no = tests[op]
    return True if yes else (False if no else None)


# ---- printing, in source syntax --------------------------------------------------------------


def _format_mono(mono: Monomial) -> str:
    parts = []
    for s, p in mono:
        parts.extend([s] * p)
    return " * ".join(parts)


def _format_term(mono: Monomial, c: Coeff) -> str:
    """`c * mono` for c > 0: `3 * H`, `H / 2`, `3 * H / 2`."""
    num, den = (c.numerator, c.denominator) if isinstance(c, Fraction) else (c, 1)
    body = _format_mono(mono)
    if not body:
        return str(num) if den == 1 else f"{num} / {den}"
    text = body if num == 1 else f"{num} * {body}"
    return text if den == 1 else f"{text} / {den}"


def format_dim(x: Dim | Fraction) -> str:
    if not isinstance(x, Poly):
        return str(x)
    # Highest degree first, constant last: `H / 2 - 1`, `N * 49`.
    ordered = sorted(x.terms, key=lambda t: (-sum(p for _, p in t[0]), t[0]))
    out = ""
    for mono, c in ordered:
        text = _format_term(mono, -c if c < 0 else c)
        if not out:
            out = text if c > 0 else f"-{text}"
        else:
            out += f" + {text}" if c > 0 else f" - {text}"
    return out


def bucket_key(dims: Mapping[str, int]) -> str:
    """The name of a bucket, the key of its plans in the bundle: `N=32` or `N=1,T=128` (dims
    sorted), `static` for a model without dynamic dims."""
    return ",".join(f"{k}={v}" for k, v in sorted(dims.items())) or "static"
