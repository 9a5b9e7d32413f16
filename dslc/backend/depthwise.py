"""A depthwise 2-d convolution (`groups` = input channels = output channels, one filter per
channel) as one CUDA kernel: the fallback kernel for a depthwise conv cuDNN has no engine for
(the generic route ran the numpy reference on CuPy, several kernels and an f32 copy of the
image). The compiler gives depthwise convs to cuDNN (compile/stage.py): on the H200 its engines
run them in 0.4x to 0.6x of this kernel's time (`scripts/probe_gpu.py`, part depthwise).

Each block row copies the filters of its channels to shared memory once (f32, tap-major, so
neighbouring channels sit together), then each thread computes VEC neighbouring channels of one
output pixel, reading the image in 16-byte vectors where it is channels-last, contiguous and
aligned (scalar loads otherwise, any strides). Accumulates in f32 and rounds once, as cuDNN
computes a f16 or bf16 conv. f16 and bf16 reach the kernel as their 16-bit patterns
(`uint16`), converted by the PTX `cvt` instruction or by shifts: no CUDA header is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from dslc.backend.cuda import LOAD_STORE, ceil_div, flat, multiprocessors, needs_int64, vector_width

CHUNK_BYTES = 16 * 1024  # f32 filters per block row: a third of the default shared memory
THREADS = 256


_SOURCE = r"""
typedef {index} I;
typedef {storage} S;
#define VEC {vec}
__device__ __forceinline__ float load(S v) {{ {load} }}
__device__ __forceinline__ S store(float f) {{ {store} }}
struct __align__(VEC * sizeof(S)) Pack {{ S v[VEC]; }};

extern "C" __global__ void dslc_depthwise(
    const S* __restrict__ x, const S* __restrict__ w, S* __restrict__ y,
    const I N, const I C, const I H, const I W, const I Ho, const I Wo,
    const I xn, const I xc, const I xh, const I xw, const I yn, const I yc, const I yh, const I yw,
    const I wc, const I wa, const I wb, const int kh, const int kw, const int sh, const int sw,
    const int ph, const int pw, const int dh, const int dw, const I chunk, const int c_inner) {{
  // block row blockIdx.y takes channels [c0, c0 + cb): their filters in shared memory
  extern __shared__ float taps[];  // [kh * kw][cb]
  const I c0 = (I)blockIdx.y * chunk;
  const I cb = C - c0 < chunk ? C - c0 : chunk;
  for (I j = threadIdx.x; j < (I)(kh * kw) * cb; j += blockDim.x) {{
    const I c = j % cb;
    const int t = (int)(j / cb);
    taps[j] = load(w[(c0 + c) * wc + (t / kw) * wa + (t % kw) * wb]);
  }}
  __syncthreads();
  const I groups = cb / VEC;
  const I items = N * Ho * Wo * groups;
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += (I)gridDim.x * blockDim.x) {{
    I idx = i, n, cl, ho, wo;
    if (c_inner) {{  // neighbouring threads take neighbouring channels: coalesced
      cl = (idx % groups) * VEC; idx /= groups; wo = idx % Wo; idx /= Wo; ho = idx % Ho; n = idx / Ho;
    }} else {{
      wo = idx % Wo; idx /= Wo; ho = idx % Ho; idx /= Ho; cl = idx % cb; n = idx / cb;
    }}
    const I c = c0 + cl;
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
    for (int a = 0; a < kh; ++a) {{
      const I h = ho * sh - ph + a * dh;
      if (h < 0 || h >= H) continue;
      for (int b = 0; b < kw; ++b) {{
        const I col = wo * sw - pw + b * dw;
        if (col < 0 || col >= W) continue;
        const float* t = taps + (a * kw + b) * cb + cl;
        const I at = n * xn + c * xc + h * xh + col * xw;
#if VEC == 1
        acc[0] += load(x[at]) * t[0];
#else
        // filters read as float4: lane i's VEC floats sit VEC words after lane i - 1's, which
        // word by word is a VEC-way bank conflict
        const Pack p = *reinterpret_cast<const Pack*>(x + at);
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q) {{
          const float4 f = reinterpret_cast<const float4*>(t)[q];
          acc[4 * q] += load(p.v[4 * q]) * f.x;
          acc[4 * q + 1] += load(p.v[4 * q + 1]) * f.y;
          acc[4 * q + 2] += load(p.v[4 * q + 2]) * f.z;
          acc[4 * q + 3] += load(p.v[4 * q + 3]) * f.w;
        }}
#endif
      }}
    }}
    const I out = n * yn + c * yc + ho * yh + wo * yw;
#if VEC == 1
    y[out] = store(acc[0]);
#else
    Pack p;
#pragma unroll
    for (int k = 0; k < VEC; ++k) p.v[k] = store(acc[k]);
    *reinterpret_cast<Pack*>(y + out) = p;
#endif
  }}
}}
"""


def takes(taps: int, dtype: str) -> bool:
    """Whether the kernel computes a depthwise conv (`ops.conv.depthwise_taps`) of this many
    filter taps: a float dtype (dslc's name), and filters small enough that 16 channels' fit a
    block's shared memory."""
    return dtype in ("f32", "f16", "bf16") and taps * 16 * 4 <= CHUNK_BYTES


def chunk(channels: int, taps: int, vec: int) -> int:
    """Channels per block row: as many as CHUNK_BYTES of f32 filters hold, in whole vectors,
    spread evenly over the rows (96 channels of 7x7 filters: two rows of 48)."""
    most = max(vec, (CHUNK_BYTES // (4 * taps)) // vec * vec)
    return ceil_div(ceil_div(channels, ceil_div(channels, most)), vec) * vec


def conv(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """y = the depthwise conv of xs[0] by xs[1] (`a`: stride, pre_pad, dilation), any strides
    (f32, f16, or bf16 as its uint16 bits)."""
    import cupy
    import numpy as np

    x, w = xs
    storage = {"float32": "float32", "float16": "float16", "uint16": "bfloat16"}[x.dtype.name]
    half = x.dtype == cupy.float16
    xf, xst = flat(x.view(cupy.uint16) if half else x)
    wf, wst = flat(w.view(cupy.uint16) if half else w)
    yf, yst = flat(y.view(cupy.uint16) if half else y)
    n, c, h, wd = x.shape
    ho, wo = y.shape[2], y.shape[3]
    kh, kw = w.shape[2], w.shape[3]
    vec = vector_width(x, y, xst, yst)
    c_inner = int(vec > 1 or yst[1] <= min(yst[2], yst[3]))
    wide = needs_int64(xf.size, yf.size, y.size)
    index = np.int64 if wide else np.int32
    cb = chunk(c, kh * kw, vec)
    rows = ceil_div(c, cb)
    blocks = max(1, min(ceil_div(n * ho * wo * cb // vec, THREADS),
                        ceil_div(8 * multiprocessors(), rows)))
    sizes = [index(v) for v in (n, c, h, wd, ho, wo, *xst, *yst, wst[0], wst[2], wst[3])]
    window = [np.int32(v) for v in (kh, kw, *a["stride"], *a["pre_pad"], *a["dilation"])]
    _kernel(storage, vec, wide)((blocks, rows), (THREADS,),
                                (xf, wf, yf, *sizes, *window, index(cb), np.int32(c_inner)),
                                shared_mem=kh * kw * cb * 4)



@cache
def _kernel(storage: str, vec: int, wide: bool) -> Any:
    import cupy

    return cupy.RawKernel(source(storage, vec, wide), "dslc_depthwise")


def source(storage: str, vec: int, wide: bool) -> str:
    """The kernel's CUDA source for a CuPy storage name, channels a thread (`cuda.vector_width`)
    and 64-bit indices (`wide`)."""
    kind, load, store = LOAD_STORE[storage]
    return _SOURCE.format(index="long long" if wide else "int", storage=kind, vec=vec,
                          load=load, store=store)

