"""Check the tensors given to a model against its manifest and read off the dynamic dims
(R0201 missing or unexpected input, R0301 shape, R0401 dtype, R0601 range, R0602 alignment)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from dslc.core.dims import Dim, Poly
from dslc.core.errors import RunnerError
from dslc.runtime.manifest import Declared, Manifest


def evaluate(d: Dim, dims: Mapping[str, int]) -> int | None:
    """A declared size at the given dim values; None if a symbol is not known yet."""
    if isinstance(d, int):
        return d
    total = Fraction(0)
    for mono, coeff in d.terms:
        term = Fraction(coeff)
        for sym, power in mono:
            if sym not in dims:
                return None
            term *= dims[sym] ** power
        total += term
    return int(total)


def _solve(d: Poly, got: int, dims: dict[str, int]) -> bool:
    """Bind the one unknown symbol of a linear dim `c * S + k` to make it equal `got`."""
    unknown = {s for mono, _ in d.terms for s, _ in mono if s not in dims}
    if len(unknown) != 1:
        return False
    (sym,) = unknown
    k = Fraction(0)  # the terms of dims already known (`P + T` with T known: k = T)
    c = None
    for mono, coeff in d.terms:
        if mono == ((sym, 1),):
            c = Fraction(coeff)
        elif any(s == sym for s, _ in mono):
            return False  # S squared, or times another dim: not solved here
        else:
            k += Fraction(coeff) * math.prod(Fraction(dims[s]) ** p for s, p in mono)
    if c is None:
        return False
    value = (got - k) / c
    if value.denominator != 1:
        return False
    dims[sym] = int(value)
    return True


def _show(d: Poly) -> str:
    """A symbolic manifest dim as the source spells it (an int size is checked on its own)."""
    parts = []
    for mono, c in d.terms:
        num, den = Fraction(c).numerator, Fraction(c).denominator
        body = " * ".join(s for s, p in mono for _ in range(p))
        coeff = f"{num}" if den == 1 else f"{num}/{den}"
        parts.append(body if (num, den) == (1, 1) and body else f"{coeff} * {body}" if body
                     else coeff)
    return " + ".join(parts)


def bind_inputs(manifest: Manifest, given: Mapping[str, tuple[tuple[int, ...], str]],
                ) -> dict[str, int]:
    """`given`: input name -> (shape, dtype name). Returns the values of the dynamic dims."""
    inputs = {i.name: i for i in manifest.inputs}
    for name in given:
        if name not in inputs:
            raise RunnerError("R0201", f"`{manifest.model}` has no input `{name}`; its inputs "
                              f"are {', '.join(inputs)}")
    dims: dict[str, int] = {}
    pending: list[tuple[Declared, int, Poly, int]] = []
    for name, spec in inputs.items():
        span = spec.span.to_data()
        if name not in given:
            raise RunnerError("R0201", f"input `{name}` is missing", span)
        shape, dtype = given[name]
        if dtype != spec.dtype:
            raise RunnerError("R0401", f"input `{name}` is {dtype}, expected {spec.dtype}", span)
        if len(shape) != len(spec.shape):
            raise RunnerError("R0301", f"input `{name}` has rank {len(shape)}, expected "
                              f"{len(spec.shape)}", span)
        for axis, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
            if isinstance(want, int):
                if want != got:
                    raise RunnerError("R0301", f"input `{name}` has size {got} on axis {axis}, "
                                      f"expected {want}", span)
            elif not _solve(want, got, dims):
                pending.append((spec, axis, want, got))
    # A size that names a dim a later input binds (`b: [P + T]` before `a: [T]`): solved again
    # once that dim is known.
    while any(_solve(want, got, dims) for _, _, want, got in pending if evaluate(want, dims) is None):
        pass
    _check_ranges(manifest, dims)
    for spec, axis, want, got in pending:
        value = evaluate(want, dims)
        if value != got:  # value None: no integer value of its symbol gives `got`
            expected = _show(want) if value is None else f"{_show(want)} = {value}"
            raise RunnerError("R0301", f"input `{spec.name}` has size {got} on axis {axis}, "
                              f"expected {expected}", spec.span.to_data())
    return dims


def _check_ranges(manifest: Manifest, dims: Mapping[str, int]) -> None:
    for d in manifest.dims:
        value = dims.get(d.name)
        if value is None:
            continue
        if not d.lo <= value <= d.hi:
            raise RunnerError("R0601", f"dim `{d.name}` is {value}, outside {d.lo}..{d.hi}",
                              d.span.to_data())
        if value % d.align:
            raise RunnerError("R0602", f"dim `{d.name}` is {value}, not a multiple of "
                              f"{d.align}", d.span.to_data())
