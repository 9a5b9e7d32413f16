"""fp8 values with plain array arithmetic, for numpy and CuPy alike (CuPy has no fp8 dtype):
rounding an f32 array to the values an fp8 dtype holds (to nearest, ties to even, as cuDNN's
conversions round), the byte each value is stored as, and the value of each byte.

e4m3 (`float8_e4m3fn`: 4 exponent bits, 3 mantissa bits, no infinity, largest 448) saturates:
what lies beyond 448 becomes 448, as cuDNN's conversions do. e5m2 (5 and 2 bits, largest 57344)
has infinities: what rounds beyond 57344 becomes infinite, as in IEEE arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from dslc.core.types import FP8_MAX


@dataclass(frozen=True)
class Format:
    mantissa: int  # bits
    bias: int  # of the exponent
    saturates: bool  # e4m3: no infinity

    @property
    def min_exponent(self) -> int:
        """The exponent of the smallest normal value (2^(1 - bias))."""
        return 1 - self.bias


FORMATS = {"f8e4m3": Format(3, 7, True), "f8e5m2": Format(2, 15, False)}


def round_fp8(xp: Any, x: Any, dtype: str) -> Any:
    """`x` (f32) rounded to the nearest value of `dtype`, still f32; NaN stays NaN."""
    fmt = FORMATS[dtype]
    x = xp.asarray(x, dtype=xp.float32)
    a = xp.abs(x)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and infinities (numpy's warnings)
        _, e = xp.frexp(a)  # a = m * 2^e with m in [0.5, 1): the leading bit is 2^(e - 1)
        exponent = xp.maximum(e.astype(xp.int32) - 1, fmt.min_exponent)  # subnormals: one
        ulp = xp.ldexp(xp.ones_like(a), exponent - fmt.mantissa)
        r = xp.rint(a / ulp) * ulp  # exact division by a power of two; rint: ties to even
    top = FP8_MAX[dtype]  # beyond it: 448 (e4m3 saturates) or infinity (e5m2)
    r = xp.where(r > top, xp.float32(top if fmt.saturates else np.inf), r)
    r = xp.where(xp.isnan(a), a, r)
    return xp.copysign(r, x).astype(xp.float32)


@cache
def values(dtype: str) -> np.ndarray:
    """The f32 value of each of the 256 bytes of `dtype` (NaN where the byte is a NaN)."""
    fmt = FORMATS[dtype]
    byte = np.arange(256)
    sign = np.where(byte & 0x80, -1.0, 1.0)
    exp = (byte >> fmt.mantissa) & ((1 << (7 - fmt.mantissa)) - 1)
    man = byte & ((1 << fmt.mantissa) - 1)
    normal = np.ldexp(1.0 + man / 2.0 ** fmt.mantissa, exp - fmt.bias)
    sub = np.ldexp(man / 2.0 ** fmt.mantissa, fmt.min_exponent)
    out = sign * np.where(exp == 0, sub, normal)
    top_exp = (1 << (7 - fmt.mantissa)) - 1
    if fmt.saturates:  # e4m3fn: only S.1111.111 is NaN
        out = np.where((exp == top_exp) & (man == (1 << fmt.mantissa) - 1), np.nan, out)
    else:  # e5m2: exponent all ones is infinity (mantissa 0) or NaN
        out = np.where(exp == top_exp, np.where(man == 0, sign * np.inf, np.nan), out)
    return out.astype(np.float32)


def to_bits(xp: Any, x: Any, dtype: str) -> Any:
    """The byte (uint8) each value of `x` (f32) is stored as in `dtype`, rounded first."""
    fmt = FORMATS[dtype]
    r = round_fp8(xp, x, dtype)
    a = xp.abs(r)
    finite = xp.isfinite(a)
    a = xp.where(finite, a, xp.float32(0))  # infinities and NaN get their bytes below
    _, e = xp.frexp(a)
    exponent = e.astype(xp.int32) - 1
    normal = (exponent >= fmt.min_exponent) & (a > 0)
    field = xp.where(normal, exponent + fmt.bias, 0)
    scaled = xp.where(normal, xp.ldexp(a, -exponent) - 1, xp.ldexp(a, -fmt.min_exponent))
    man = xp.rint(scaled * 2 ** fmt.mantissa).astype(xp.int32)
    bits = (field << fmt.mantissa) | man
    if not fmt.saturates:
        bits = xp.where(xp.isinf(r), 0x7C, bits)
    bits = xp.where(xp.isnan(r), 0x7F, bits)
    return (bits | xp.where(xp.signbit(r), 0x80, 0)).astype(xp.uint8)


def from_bits(xp: Any, bits: Any, dtype: str) -> Any:
    """The f32 values of fp8 bytes (uint8)."""
    table = xp.asarray(values(dtype))
    return table[xp.asarray(bits).astype(xp.int32)]
