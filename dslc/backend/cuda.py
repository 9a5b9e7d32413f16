"""What every fallback kernel shares: the CUDA preamble of loads and stores through f32 (bf16
as its uint16 bits, converted by hand), elementwise kernels over an index type sized to the
tensors, and strided arrays as flat views with element strides. CuPy is imported when a
kernel is first made."""

from __future__ import annotations

from functools import cache
from typing import Any

from dslc.ir.storage import span as storage_span

# Loads and stores through f32: bf16 (uint16 bits) converted by hand, every other type by a cast.
PREAMBLE = r"""
__device__ __forceinline__ float to_f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
template <typename T> __device__ __forceinline__ float to_f(T v) { return (float)v; }
template <typename T> __device__ __forceinline__ T from_f(float v) { return (T)v; }
template <> __device__ __forceinline__ unsigned short from_f<unsigned short>(float v) {
  unsigned int u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
// NaN passes through as numpy's maximum, minimum and clip pass it (fmaxf would drop it).
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ float nan_min(float a, float b) { return (a != a || a < b) ? a : b; }
__device__ __forceinline__ float clip(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }
"""

# Loads and stores through f32 for a RawKernel, per CuPy storage name: (the C type, the body of
# `float load(S v)`, the body of `S store(float f)`). f16 travels as its uint16 bits, converted
# by the PTX `cvt` instruction, bf16 by shifts (round to nearest even): no CUDA header is needed.
LOAD_STORE = {
    "float32": ("float", "return v;", "return f;"),
    "float16": ("unsigned short",
                "float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(v)); return f;",
                "unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); "
                "return h;"),
    "bfloat16": ("unsigned short", "return __uint_as_float(((unsigned int)v) << 16);",
                 "unsigned int u = __float_as_uint(f);"
                 " if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);"
                 " u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16);"),
}


@cache
def elementwise(name: str, params: str, body: str, wide: bool = False) -> Any:
    """The kernel, with `I` (sizes, strides, indices) as int64 if `wide`, else int32."""
    import cupy

    index, ctype = ("int64", "long long") if wide else ("int32", "int")
    params = ", ".join(f"{index} {p[2:]}" if p.startswith("I ") else p
                       for p in params.split(", "))
    return cupy.ElementwiseKernel(params, "raw T y", f"typedef {ctype} I;\n{body}",
                                  f"dslc_{name}_{index}", preamble=PREAMBLE)


def needs_int64(*spans: int) -> bool:
    """Whether some offset of the tensors needs 64 bits."""
    return max(spans) >= 2**31 - 1


def flat(a: Any) -> tuple[Any, list[int]]:
    """A 1-D view from the array's first element, and its strides in elements."""
    import cupy

    item = a.dtype.itemsize
    strides = [s // item for s in a.strides]
    span = storage_span(a.shape, strides)
    return cupy.ndarray((span,), a.dtype, memptr=a.data), strides


def vector_width(x: Any, y: Any, xs: list[int], ys: list[int]) -> int:
    """Channels per thread for a kernel over images (pooling, depthwise conv): 16 bytes' worth
    when both tensors are NHWC with contiguous channels, a channel count that splits into
    vectors, and every pixel 16-byte aligned; else 1 (the scalar kernel)."""
    vec = 16 // x.dtype.itemsize
    aligned = all(s % vec == 0 for s in (*xs[0:1], *xs[2:], *ys[0:1], *ys[2:]))
    if (xs[1] == 1 and ys[1] == 1 and x.shape[1] % vec == 0 and aligned
            and x.data.ptr % 16 == 0 and y.data.ptr % 16 == 0):
        return vec
    return 1


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def grid_blocks(items: int, threads: int = 256) -> int:
    """Blocks of `threads` for a grid-stride loop over `items`: one an item a thread, at most
    16 a multiprocessor (more only queue)."""
    return max(1, min(ceil_div(items, threads), 16 * multiprocessors()))


@cache
def multiprocessors() -> int:
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])
