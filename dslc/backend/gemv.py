"""A matmul of a few rows (a decoder's projections at batch 1 to 8) with its pointwise epilogue
as one CUDA kernel. At one row a matmul reads its weight once and does two flops a weight: its
time is the weight's read. cuDNN's engines tile 16-64 rows, and on the H200 a decoder's
projections took about twice their weight-read time (docs/benchmarks.md, session 10). Here a
warp computes COLUMNS output columns for all rows: its lanes walk the weight's row of each
column (the weight stored [N, K], as a PyTorch linear's, so K is contiguous) in 16-byte loads,
UNROLL of them at once, multiply by the input rows (read through the cache: every warp reads
them) and sum by shuffles; then one lane an output element applies the epilogue, a
`fused.Plan` over the matmul's value and the step's other operands, and stores. The tuner
measures the kernel against the step's cuDNN graph (`tune.fusion.kernel_steps`) and keeps the
faster.

The matmul's value is held as the reference holds it inside the step (its intermediate dtype:
`ir.graph.stored_dtype`), and f32 accumulation as cuDNN's. Where `fits` refuses the arrays at
run time (strides the measured step did not have), the reference matmul on CuPy and the
epilogue's pointwise kernel compute the step instead: slower, the same values.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import numpy as np

from dslc.backend import fused
from dslc.backend.cuda import LOAD_STORE, PREAMBLE, ceil_div
from dslc.ir.graph import Node, stored_dtype

MOST_ROWS = 8
COLUMNS = 2  # output columns a warp
WARPS = 8  # a block
DTYPES = ("f16", "bf16")


@dataclass(frozen=True)
class Gemv:
    """A step's matmul (its input and weight, by name) and epilogue (over `anchor`, the
    matmul's value, and the step's other operands); `held` is the dtype the matmul's value is
    held in before the epilogue."""

    x: str
    w: str
    dtype: str
    held: str
    epilogue: fused.Plan
    anchor: int

    @property
    def operands(self) -> tuple[str, ...]:
        """The arrays `run` takes, in order: input, weight, the epilogue's other operands."""
        return (self.x, self.w, *(o.name for i, o in enumerate(self.epilogue.operands)
                                  if i != self.anchor))


def plan_of(nodes: Mapping[str, Node], members: Sequence[str], inputs: Sequence[str],
            outputs: Sequence[str]) -> Gemv | str:
    """The kernel of a step that is a 2-d weight's matmul and a pointwise epilogue over the
    matmul's shape, or why there is none."""
    first = nodes[members[0]]
    if first.op != "matmul":
        return "it is no matmul"
    x, w = (nodes[i] for i in first.inputs)
    if w.type.rank != 2 or x.type.dtype != w.type.dtype or x.type.dtype not in DTYPES:
        return "its matmul is no f16 or bf16 product with a 2-d weight"
    rest = [nodes[m] for m in members[1:]]
    if first.name in outputs and rest:
        return "it stores the matmul's value and the epilogue's"
    if any(nodes[o].type.shape != first.type.shape for o in outputs):
        return "its results are not of the matmul's shape"
    if not rest:
        epilogue = fused.Plan((fused.Operand(first.name, "f32"),),
                              (fused.Member("a", ("x0",), first.type.dtype),), (0,),
                              (first.type.dtype,))
    else:
        given = [first, *(nodes[i] for i in inputs)]  # the epilogue reads the ones it names
        p = fused.plan(rest, given, outputs, {n.name: n.attrs for n in rest})
        if isinstance(p, str):
            return p
        epilogue = p
    [anchor] = [i for i, o in enumerate(epilogue.operands) if o.name == first.name]
    operands = list(epilogue.operands)
    operands[anchor] = replace(operands[anchor], dtype="f32", along=None)
    return Gemv(x.name, w.name, x.type.dtype, stored_dtype(first, virtual=bool(rest)),
                replace(epilogue, operands=tuple(operands)), anchor)


def fits(x: Any, w: Any) -> bool:
    """Whether the kernel reads these arrays: an input of at most MOST_ROWS rows (one batch
    axis of more than one) whose K is contiguous, a weight [K, N] whose K is contiguous, each
    row starting on 16 bytes."""
    rows = [d for d in x.shape[:-1] if d != 1]
    k = x.shape[-1]
    item = x.dtype.itemsize
    return (math.prod(x.shape[:-1]) <= MOST_ROWS and len(rows) <= 1 and k % 8 == 0
            and x.strides[-1] == item and w.strides[0] == item and k == w.shape[0]
            and all(s % 16 == 0 for s in (*x.strides[:-1], w.strides[1]))
            and x.data.ptr % 16 == 0 and w.data.ptr % 16 == 0)


def run(g: Gemv, xs: Sequence[Any], ys: Sequence[Any]) -> None:
    """y = epilogue(x @ w, others) for the arrays of `g.operands` into the step's outputs."""
    import cupy

    x, w, *others = xs
    if not fits(x, w):
        _fallback(g, xs, ys)
        return
    out = ys[0].shape
    rows, n, k = math.prod(out[:-1]), out[-1], x.shape[-1]
    read = [o for i, o in enumerate(g.epilogue.operands) if i != g.anchor]
    arrays = [fused.operand_view(a, o) for a, o in zip(others, read, strict=True)]
    strides = [_row_column(cupy.broadcast_to(a, out)) for a in arrays]
    strides += [_row_column(y) for y in ys]
    x_row = _row_column(x)[0]  # elements
    blocks = ceil_div(n, WARPS * COLUMNS)
    bits = [a.view(cupy.uint16) if a.dtype == cupy.float16 else a for a in (x, w, *arrays, *ys)]
    kernel = _kernel(g, rows)
    kernel((blocks,), (32 * WARPS,),
           (*bits, np.int32(n), np.int32(k), np.int64(x_row),
            np.int64(w.strides[1] // w.dtype.itemsize),
            *(np.int64(s) for pair in strides for s in pair)))


def _row_column(a: Any) -> tuple[int, int]:
    """Element strides of a row and a column of `a` seen as [rows, N]: the row stride is its
    one batch axis of more than one element's (0 where there is none)."""
    item = a.dtype.itemsize
    batch = [s for d, s in zip(a.shape[:-1], a.strides[:-1], strict=True) if d != 1]
    return (batch[0] // item if batch else 0), a.strides[-1] // item


def _fallback(g: Gemv, xs: Sequence[Any], ys: Sequence[Any]) -> None:
    import cupy

    from dslc.backend.kernels import reference_kernel

    x, w, *others = xs
    value = cupy.empty(ys[0].shape, cupy.float32)
    reference_kernel("matmul", [x, w], value, {})
    operands = list(others)
    operands.insert(g.anchor, value)
    fused.run(g.epilogue, operands, ys)


_SOURCE = r"""
typedef unsigned short S;
#define M {rows}
#define COLUMNS {columns}
#define UNROLL {unroll}
struct __align__(16) Pack {{ S v[8]; }};
__device__ __forceinline__ float load(S v) {{ {load} }}

extern "C" __global__ void __launch_bounds__({threads}) dslc_gemv(
    const S* __restrict__ x, const S* __restrict__ w, {params}
    const int N, const int K, const long long xm, const long long wn, {strides}) {{
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * {warps} + warp) * COLUMNS;
  if (n0 >= N) return;
  float acc[M][COLUMNS];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < COLUMNS; ++c) acc[m][c] = 0.0f;
  // UNROLL chunks of 256 elements of K at once: each lane loads 16 bytes of each
  for (int k0 = lane * 8; k0 < K; k0 += 256 * UNROLL) {{
    Pack wv[UNROLL][COLUMNS], xv[UNROLL][M];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
      const int k = k0 + u * 256 < K ? k0 + u * 256 : k0;  // past K: reread, not summed
#pragma unroll
      for (int c = 0; c < COLUMNS; ++c)
        wv[u][c] = *reinterpret_cast<const Pack*>(w + (long long)(n0 + c < N ? n0 + c : n0) * wn + k);
#pragma unroll
      for (int m = 0; m < M; ++m) {{
        const uint4 t = __ldg(reinterpret_cast<const uint4*>(x + m * xm + k));
        xv[u][m] = *reinterpret_cast<const Pack*>(&t);
      }}
    }}
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
      if (k0 + u * 256 >= K) break;
#pragma unroll
      for (int e = 0; e < 8; ++e)
#pragma unroll
        for (int c = 0; c < COLUMNS; ++c) {{
          const float wf = load(wv[u][c].v[e]);
#pragma unroll
          for (int m = 0; m < M; ++m) acc[m][c] += load(xv[u][m].v[e]) * wf;
        }}
    }}
  }}
  float mine = 0.0f;  // lane m * COLUMNS + c keeps the sum of (m, c)
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < COLUMNS; ++c) {{
      float a = acc[m][c];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
      if (lane == m * COLUMNS + c) mine = a;
    }}
  const int m = lane / COLUMNS, n = n0 + lane % COLUMNS;
  if (lane >= M * COLUMNS || n >= N) return;
  const float x{anchor} = {held};
{loads}
{outs}
  {{
{body}
  }}
{stores}
}}
"""


@cache
def _kernel(g: Gemv, rows: int) -> Any:
    import cupy

    from dslc.backend.fused import _RAW_CTYPE, _RAW_LOAD, _RAW_STORE, _ROUND, CONVERSIONS

    p = g.epilogue
    others = [(i, o) for i, o in enumerate(p.operands) if i != g.anchor]
    params = "".join(f"const {_RAW_CTYPE[o.dtype]}* __restrict__ p{i}, " for i, o in others)
    params += "".join(f"{_RAW_CTYPE[d]}* __restrict__ q{j}, "
                      for j, d in enumerate(p.output_dtypes))
    strides = ", ".join([f"const long long s{i}m, const long long s{i}n" for i, _ in others] +
                        [f"const long long t{j}m, const long long t{j}n"
                         for j in range(len(p.output_dtypes))])
    loads = "\n".join(f"  const {_RAW_CTYPE[o.dtype]} x{i} = p{i}[m * s{i}m + n * s{i}n];"
                      for i, o in others)
    outs = "\n".join(f"  {_RAW_CTYPE[d]} y{j};" for j, d in enumerate(p.output_dtypes))
    stores = "\n".join(f"  q{j}[m * t{j}m + n * t{j}n] = y{j};"
                       for j in range(len(p.output_dtypes)))
    load = LOAD_STORE["bfloat16" if g.dtype == "bf16" else "float16"][1]
    unroll = 4 if rows <= 2 else 2 if rows <= 4 else 1
    source = _SOURCE.format(rows=rows, columns=COLUMNS, unroll=unroll, threads=32 * WARPS,
                            warps=WARPS, load=load, params=params, strides=strides,
                            anchor=g.anchor, held=_ROUND[g.held].format("mine"), loads=loads,
                            outs=outs, body=p._body(_RAW_LOAD, _RAW_STORE), stores=stores)
    name = f"dslc_gemv_{zlib.crc32(source.encode()):08x}"
    return cupy.RawKernel(PREAMBLE + CONVERSIONS + source.replace("dslc_gemv(", f"{name}(", 1),
                          name)
