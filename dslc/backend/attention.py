"""Attention of a few queries against a long key sequence (a decoder's step against its key/value
cache) as one CUDA kernel: split over the keys, as flash-decoding does. cuDNN's flash engines
tile the queries (64 or 128 a block), so one query a head fills 32 blocks at batch 1 (of the
H200's 132 multiprocessors), each reading its head's whole cache alone: 17 to 29 us a layer for
2 MB (a 1,024-token bf16 cache of 8 KV heads of 64 dims), which this kernel reads in 7.8 (a
block's time is its chain of memory latencies, not bandwidth: see the kernel's comments). The
tuner measures it against the cuDNN graph (`tune.fusion.kernel_steps`) and keeps the faster.

A block takes one query row of one KV head with its G query heads (GQA: the keys and values
are read once for all of them) over one span of the valid keys (the spans split the keys
evenly, computed on the GPU from `kv_len`, so a short cache wastes no block), in passes of CHUNK
keys: each thread scores one key against the G queries (queries in shared memory, pre-scaled by
scale * log2(e)), each warp keeps the running max and sum of its heads' scores (online softmax),
and the values are summed by threads that each own 8 dims of a row, reduced across rows by warp
shuffles and across warps in shared memory. The partial results (unnormalised sums, max, sum)
go to a scratch buffer; the last block of a query row to finish (an atomic count, reset by it)
combines them and stores the outputs, so a step is one launch.

Masks as `ops.attention._masked`: keys from `kv_len[b]` on, and with `causal` those after the
query's diagonal (top-left, or bottom-right: aligned to the valid keys), and with `window`
those `window` or more before it. Keys a block skips are never read. A query left no key gives
NaN, as the reference does. Probabilities stay f32 (cuDNN rounds them to the input dtype before
the values' product: within the dtype's tolerance of each other).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from dslc.backend import launch
from dslc.backend.cuda import LOAD_STORE, ceil_div, multiprocessors
from dslc.ops.attention import named_operands

THREADS = 128
CHUNK = 128  # keys a pass scores: one a thread
KEYS_AT_LEAST = CHUNK  # a block's keys: one pass (fewer: the combining costs more than it saves)
MAX_SPLITS = 64  # blocks a query row's keys split over, at most
MAX_GROUP = 8  # query heads a KV head serves (registers: 8 dims of each a thread)
HEAD_DIMS = (16, 32, 64, 128, 256)  # 8 dims a thread, a power of two threads a row (shuffles)
OPERANDS = ("q", "k", "v", "kv_len", "q_len")  # no bias, no fp8 descales
MOST_ROWS = 65535  # query rows of KV heads (B * Hk * Sq): a block row each, CUDA's grid limit

_SOURCE = r"""
typedef {storage} S;
#define INFINITY __int_as_float(0x7f800000)
#define G {group}
#define D {head_dim}
#define VEC {vec}
#define THREADS {threads}
#define CHUNK {chunk}
#define WARPS (THREADS / 32)
#define SLOTS (D / 8)
#define ROWS (THREADS / SLOTS)
__device__ __forceinline__ float load(S v) {{ {load} }}
__device__ __forceinline__ S store(float f) {{ {store} }}
struct __align__(16) Pack {{ S v[8]; }};

// packs of a key row and value rows a thread loads at once, as registers allow (powers of two:
// they divide a row's packs and a pass's rows)
#define GPOW ((G <= 4 ? 8 : 4) / (VEC == 8 ? 1 : 2))  // scalar loads: a register an element
#define KPRE (D / 8 < GPOW ? D / 8 : GPOW)
#define VPRE (CHUNK / ROWS < GPOW ? CHUNK / ROWS : GPOW)

// 8 elements from p on: one 16-byte load where the row is contiguous and aligned. Raw (four
// registers), converted where used: loads issued together need their registers at once.
__device__ __forceinline__ Pack load8(const S* p, long long stride) {{
#if VEC == 8
  return *reinterpret_cast<const Pack*>(p);
#else
  Pack pk;
#pragma unroll
  for (int e = 0; e < 8; ++e) pk.v[e] = p[e * stride];
  return pk;
#endif
}}

extern "C" __global__ void __launch_bounds__(THREADS) dslc_attend(
    const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v, S* __restrict__ o,
    const int* __restrict__ kv_len, float* __restrict__ part, unsigned int* __restrict__ done,
    const int KVH, const int SQ, const int SKV,
    const long long q0, const long long q1, const long long q2, const long long q3,
    const long long k0, const long long k1, const long long k2, const long long k3,
    const long long v0, const long long v1, const long long v2, const long long v3,
    const long long o0, const long long o1, const long long o2, const long long o3,
    const long long len_stride, const float scale, const int causal, const int bottom_right,
    const int window) {{
  // launched early (backend.launch): the launch overlaps the kernel before, whose results
  // (the queries, the cache rows just written) are read only once it has finished
  let_next_start();
  wait_for_previous();
  __shared__ __align__(16) float qs[G][D];
  __shared__ float ps[G][CHUNK];
  __shared__ float red[WARPS][G][D];
  __shared__ float run_max[G], run_sum[G], factor[G];
  __shared__ bool last;
  const int row = blockIdx.y;  // (b * KVH + kh) * SQ + i
  const int i = row % SQ, kh = (row / SQ) % KVH, b = row / (SQ * KVH);
  const int valid = kv_len ? kv_len[b * len_stride] : SKV;
  const int at = i + (bottom_right ? valid - SQ : 0);  // the query's diagonal
  int hi = valid < SKV ? valid : SKV;
  if (causal && at + 1 < hi) hi = at + 1;
  int lo = window > 0 && at - window + 1 > 0 ? at - window + 1 : 0;
  if (hi < lo) hi = lo;
  const int span = (hi - lo + gridDim.x - 1) / gridDim.x;
  const int begin = lo + blockIdx.x * span;
  const int end = begin + span < hi ? begin + span : hi;
  const int slot = threadIdx.x % SLOTS, r0 = threadIdx.x / SLOTS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const S* kb = k + b * k0 + kh * k1;
  const S* vb = v + b * v0 + kh * v1;

  // A block's time is its chain of memory latencies (about 0.8 us each on the H200): a pass's
  // key row and first value rows are loaded at once, before the queries are, and a row past
  // the pass's keys reads the first key's instead (its weight is 0).
  Pack kx[KPRE], vx[VPRE];
#define ISSUE(base_, n_) \
  _Pragma("unroll") for (int u = 0; u < KPRE; ++u) \
    kx[u] = load8(kb + ((int)threadIdx.x < (n_) ? (base_) + (int)threadIdx.x : begin) * k2 \
                  + 8 * u * k3, k3); \
  _Pragma("unroll") for (int u = 0; u < VPRE; ++u) \
    vx[u] = load8(vb + (r0 + u * ROWS < (n_) ? (base_) + r0 + u * ROWS : begin) * v2 \
                  + slot * 8 * v3, v3);
  if (begin < end) {{ ISSUE(begin, end - begin < CHUNK ? end - begin : CHUNK) }}
  for (int t = threadIdx.x; t < G * D; t += THREADS) {{
    const int g = t / D, d = t % D;
    qs[g][d] = load(q[b * q0 + (kh * G + g) * q1 + i * q2 + d * q3]) * scale * 1.4426950408889634f;
  }}
  if (threadIdx.x < G) {{ run_max[threadIdx.x] = -INFINITY; run_sum[threadIdx.x] = 0.0f; }}
  float acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  __syncthreads();

  for (int base = begin; base < end; base += CHUNK) {{
    const int n = end - base < CHUNK ? end - base : CHUNK;
    // scores: one key a thread (CHUNK == THREADS) against the G queries
    {{
      float s[G];
#pragma unroll
      for (int g = 0; g < G; ++g) s[g] = 0.0f;
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += 8 * KPRE) {{
        if (d0 > 0) {{
#pragma unroll
          for (int u = 0; u < KPRE; ++u)
            kx[u] = load8(kb + ((int)threadIdx.x < n ? base + (int)threadIdx.x : begin) * k2
                          + (d0 + 8 * u) * k3, k3);
        }}
#pragma unroll
        for (int u = 0; u < KPRE; ++u)
#pragma unroll
          for (int e = 0; e < 8; e += 4) {{
            const float a0 = load(kx[u].v[e]), a1 = load(kx[u].v[e + 1]);
            const float a2 = load(kx[u].v[e + 2]), a3 = load(kx[u].v[e + 3]);
#pragma unroll
            for (int g = 0; g < G; ++g) {{
              const float4 w = *reinterpret_cast<const float4*>(&qs[g][d0 + 8 * u + e]);
              s[g] += w.x * a0 + w.y * a1 + w.z * a2 + w.w * a3;
            }}
          }}
      }}
#pragma unroll
      for (int g = 0; g < G; ++g) ps[g][threadIdx.x] = (int)threadIdx.x < n ? s[g] : -INFINITY;
    }}
    __syncthreads();
    // the running max and sum of each head's scores, a warp a head
    for (int g = warp; g < G; g += WARPS) {{
      float m = -INFINITY;
      for (int t = lane; t < CHUNK; t += 32) m = fmaxf(m, ps[g][t]);
      for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      const float top = fmaxf(run_max[g], m);
      float sum = 0.0f;
      for (int t = lane; t < CHUNK; t += 32) {{
        const float p = top == -INFINITY ? 0.0f : exp2f(ps[g][t] - top);
        ps[g][t] = p;
        sum += p;
      }}
      for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      __syncwarp();
      if (lane == 0) {{
        const float f = top == -INFINITY ? 1.0f : exp2f(run_max[g] - top);
        factor[g] = f;
        run_sum[g] = run_sum[g] * f + sum;
        run_max[g] = top;
      }}
    }}
    __syncthreads();
    // the values' sum: 8 dims a thread, ROWS keys at once; the first VPRE rows loaded already
#pragma unroll
    for (int g = 0; g < G; ++g) {{
      const float f = factor[g];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= f;
    }}
#pragma unroll 1
    for (int t0 = r0; t0 < n; t0 += VPRE * ROWS) {{
      if (t0 > r0) {{
#pragma unroll
        for (int u = 0; u < VPRE; ++u) {{
          const int t = t0 + u * ROWS;
          vx[u] = load8(vb + (t < n ? base + t : begin) * v2 + slot * 8 * v3, v3);
        }}
      }}
#pragma unroll
      for (int u = 0; u < VPRE; ++u) {{
        const int t = t0 + u * ROWS;
        if (t < n) {{
#pragma unroll
          for (int g = 0; g < G; ++g) {{
            const float p = ps[g][t];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] += p * load(vx[u].v[e]);
          }}
        }}
      }}
    }}
    __syncthreads();  // before the next pass writes ps
    if (base + CHUNK < end) {{
      const int next = end - base - CHUNK < CHUNK ? end - base - CHUNK : CHUNK;
      ISSUE(base + CHUNK, next)
    }}
  }}

  // reduce over the rows: within a warp by shuffles, across warps in shared memory
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) {{
      float a = acc[g][e];
      for (int off = SLOTS; off < 32; off <<= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
      if (lane < SLOTS) red[warp][g][slot * 8 + e] = a;
    }}
  __syncthreads();
  const int splits = gridDim.x;
  for (int t = threadIdx.x; t < G * D; t += THREADS) {{
    const int g = t / D, d = t % D;
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) a += red[w][g][d];
    float* p = part + ((long long)(row * G + g) * splits + blockIdx.x) * (D + 2);
    p[d] = a;
    if (d == 0) {{ p[D] = run_max[g]; p[D + 1] = run_sum[g]; }}
  }}
  // the last block of this query row to finish combines the splits
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done + row, 1u) == (unsigned int)(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // online over the splits, 8 splits' loads at once (one latency, not three a split)
  for (int t = threadIdx.x; t < G * D; t += THREADS) {{
    const int g = t / D, d = t % D;
    const float* p = part + (long long)(row * G + g) * splits * (D + 2);
    float top = -INFINITY, sum = 0.0f, a = 0.0f;
    for (int s0 = 0; s0 < splits; s0 += 8) {{
      float m[8], l[8], x[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {{
        const bool in = s0 + u < splits;
        const float* ps_ = p + (in ? s0 + u : 0) * (D + 2);
        m[u] = in ? __ldcg(ps_ + D) : -INFINITY;
        l[u] = __ldcg(ps_ + D + 1);
        x[u] = __ldcg(ps_ + d);
      }}
#pragma unroll
      for (int u = 0; u < 8; ++u) {{
        const float top2 = fmaxf(top, m[u]);
        if (top2 == -INFINITY) continue;
        const float f_old = exp2f(top - top2), f = exp2f(m[u] - top2);
        sum = sum * f_old + l[u] * f;
        a = a * f_old + x[u] * f;
        top = top2;
      }}
    }}
    o[b * o0 + (kh * G + g) * o1 + i * o2 + d * o3] = store(a / sum);
  }}
  if (threadIdx.x == 0) done[row] = 0u;
}}
"""


def takes(shapes: Mapping[str, Sequence[int]], dtype: str) -> bool:
    """Whether the kernel computes an sdpa of these operands (by name: `q`, `k`, `v`, maybe
    `kv_len` and `q_len`; their shapes) and dtype: f16 or bf16, one head dim for keys and
    values of HEAD_DIMS, at most MAX_GROUP query heads a KV head (`fits`), at most MOST_ROWS
    query rows of KV heads."""
    if dtype not in ("f16", "bf16") or not {"q", "k", "v"} <= set(shapes) <= set(OPERANDS):
        return False
    q, k, v = shapes["q"], shapes["k"], shapes["v"]
    return (len(q) == 4 and q[3] == k[3] == v[3] and k[2] == v[2] and k[1] > 0
            and q[1] % k[1] == 0 and fits(q[1] // k[1], q[3])
            and 0 < q[0] * k[1] * q[2] <= MOST_ROWS)


def fits(group: int, head_dim: int) -> bool:
    """Whether a variant of the kernel serves `group` query heads a KV head at this head dim
    with its registers: at 32 dims, 6 or more spill (ptxas; tests/test_attention_kernel.py)."""
    return head_dim in HEAD_DIMS and 1 <= group <= (5 if head_dim == 32 else MAX_GROUP)


def splits(rows: int, keys: int) -> int:
    """Blocks a query row's keys split over: enough for four blocks a multiprocessor, each
    taking KEYS_AT_LEAST keys or more (a block's time is a few memory latencies in a row,
    whatever its keys: on the H200 blocks of 125 keys, reading the values a row at a time,
    took 13 us a decoder layer)."""
    return max(1, min(ceil_div(4 * multiprocessors(), rows), ceil_div(keys, KEYS_AT_LEAST),
                      MAX_SPLITS))


def attend(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """y = sdpa of xs (named by `a["operands"]`, default q, k, v) where `takes` holds: f16 as
    itself, bf16 as its uint16 bits, any strides."""
    import cupy
    import numpy as np

    named = named_operands(a, xs)
    q, k, v = named["q"], named["k"], named["v"]
    storage = "float16" if q.dtype == cupy.float16 else "bfloat16"
    q, k, v, o = (t.view(cupy.uint16) for t in (q, k, v, y))
    b, h, sq, d = q.shape
    kvh, skv = k.shape[1], k.shape[2]
    strides = [[s // 2 for s in t.strides] for t in (q, k, v, o)]
    vec = 8 if all(s[3] == 1 and all(x % 8 == 0 for x in s[:3]) and t.data.ptr % 16 == 0
                   for s, t in ((strides[1], k), (strides[2], v))) else 1
    rows = b * kvh * sq
    n = splits(rows, skv)
    part, done = _scratch(rows * (h // kvh) * n * (d + 2), rows)
    lengths = named.get("kv_len")
    length_ptr, length_stride = (np.uint64(0), 0) if lengths is None else (lengths, lengths.strides[0] // 4)
    scale = a["scale"] if a.get("scale") is not None else 1.0 / float(np.sqrt(d))
    window = a.get("window") or 0
    kernel = _kernel(storage, h // kvh, d, vec)
    launch.early(kernel, (n, rows), (THREADS,),
                 (q, k, v, o, length_ptr, part, done, np.int32(kvh), np.int32(sq),
                  np.int32(skv), *(np.int64(s) for t in strides for s in t),
                  np.int64(length_stride), np.float32(scale), np.int32(bool(a.get("causal"))),
                  np.int32(a.get("align") == "bottom_right"), np.int32(window)))


_SCRATCH: dict[tuple[int, int], tuple[Any, Any]] = {}


def _scratch(floats: int, rows: int) -> tuple[Any, Any]:
    """The partial results' buffer and the query rows' counters (zero between launches: the
    last block of a row resets its own), one pair a device and stream, grown as needed and never
    freed (a captured CUDA graph keeps their addresses)."""
    import cupy

    key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr)
    have = _SCRATCH.get(key)
    if have is None or have[0].size < floats or have[1].size < rows:
        grown = (cupy.empty(max(floats, 0 if have is None else have[0].size), cupy.float32),
                 cupy.zeros(max(rows, 0 if have is None else have[1].size), cupy.uint32))
        if have is not None:
            _RETIRED.append(have)
        _SCRATCH[key] = have = grown
    return have


_RETIRED: list[tuple[Any, Any]] = []  # replaced scratch a captured graph may still name


@cache
def _kernel(storage: str, group: int, head_dim: int, vec: int) -> Any:
    import cupy

    return cupy.RawKernel(source(storage, group, head_dim, vec), "dslc_attend")


def source(storage: str, group: int, head_dim: int, vec: int) -> str:
    """The kernel's CUDA source for a CuPy storage name, `group` query heads a KV head, a head
    dimension and the loads' width (8: 16-byte loads; 1: one element at a time)."""
    kind, load, store = LOAD_STORE[storage]
    return launch.DEVICE + _SOURCE.format(storage=kind, group=group, head_dim=head_dim, vec=vec,
                                          threads=THREADS, chunk=CHUNK, load=load, store=store)
