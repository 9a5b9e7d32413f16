"""Fallback kernels (CuPy) for the ops cuDNN's graph API cannot run from Python: pooling and
upsampling (cuDNN's resample node is not exposed by the Python frontend, and its JSON route is
rejected: see docs/DESIGN.md), and concatenation (copies into one buffer). Any other op cuDNN
rejects on the target (some reductions, genstats, pointwise ops on gapped strides) runs its
numpy reference on CuPy arrays (NumPy dispatches to CuPy): slower, always correct.

Each kernel reads and writes strided tensors in place (any layout: NCHW, NHWC, views), on the
current CUDA stream, so it can be captured into a CUDA graph with the cuDNN graphs around it.
CuPy has no bf16: a bf16 tensor reaches a kernel as its uint16 bits (`device.KERNEL_DTYPES`;
dslc has no 16-bit integer dtype, so uint16 always means bf16), and the kernels convert through
`to_f` / `from_f` (round to nearest even, as cuDNN stores bf16).
`KERNELS` is importable without a GPU; CuPy is imported when a kernel first runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

from dslc.backend import attention, depthwise, fused, merge, rows
from dslc.backend.cuda import (
    PREAMBLE,
    elementwise,
    flat,
    grid_blocks,
    needs_int64,
    vector_width,
)
from dslc.backend.device import KERNEL_DTYPES
from dslc.backend.groupnorm import groupnorm
from dslc.ops.attention import named_operands
from dslc.ops.conv import depthwise_taps

KernelFn = Callable[[list[Any], Any, Mapping[str, Any]], None]


# Thread i -> output element (n, c, ho, wo), in the output's memory order (see `_c_inner`).
_INDEX = r"""
I idx = (I)i, n, c, ho, wo;
if (c_inner) {  // channels last: neighbouring threads take neighbouring channels (coalesced)
  c = idx % C; idx /= C; wo = idx % Wo; idx /= Wo; ho = idx % Ho; n = idx / Ho;
} else {
  wo = idx % Wo; idx /= Wo; ho = idx % Ho; idx /= Ho; c = idx % C; n = idx / C;
}
"""

# The pooling window of output pixel (ho, wo): the body that follows sees input row h, column w.
_WINDOW = r"""I count = 0;
for (I a = 0; a < kh; ++a) {
  const I h = ho * sh - ph + a;
  if (h < 0 || h >= H) continue;
  for (I b = 0; b < kw; ++b) {
    const I w = wo * sw - pw + b;
    if (w < 0 || w >= W) continue;
"""

_POOL = _INDEX + r"""float acc = is_max ? -3.402823466e38f : 0.0f;
""" + _WINDOW + r"""    const float v = to_f(x[n * xn + c * xc + h * xh + w * xw]);
    acc = is_max ? (v > acc ? v : acc) : acc + v;
    ++count;
  }
}
if (!is_max) acc = acc / (float)(count_pad ? kh * kw : (count > 0 ? count : 1));
y[n * yn + c * yc + ho * yh + wo * yw] = from_f<T>(acc);
"""

_UPSAMPLE = _INDEX + r"""const I base = n * xn + c * xc;
float v;
if (bilinear) {
  float sy = ((float)ho + 0.5f) / (float)fh - 0.5f; if (sy < 0.0f) sy = 0.0f;
  float sx = ((float)wo + 0.5f) / (float)fw - 0.5f; if (sx < 0.0f) sx = 0.0f;
  I y0 = (I)sy; if (y0 > H - 1) y0 = H - 1;
  I x0 = (I)sx; if (x0 > W - 1) x0 = W - 1;
  const I y1 = y0 + 1 < H ? y0 + 1 : H - 1;
  const I x1 = x0 + 1 < W ? x0 + 1 : W - 1;
  const float ly = sy - (float)y0, lx = sx - (float)x0;
  const float a = to_f(x[base + y0 * xh + x0 * xw]), b = to_f(x[base + y0 * xh + x1 * xw]);
  const float c0 = to_f(x[base + y1 * xh + x0 * xw]), d = to_f(x[base + y1 * xh + x1 * xw]);
  v = (a * (1.0f - lx) + b * lx) * (1.0f - ly) + (c0 * (1.0f - lx) + d * lx) * ly;
} else {
  v = to_f(x[base + (ho / fh) * xh + (wo / fw) * xw]);
}
y[n * yn + c * yc + ho * yh + wo * yw] = from_f<T>(v);
"""

# NHWC with channels contiguous and 16-byte aligned rows: thread i -> VEC consecutive channels of
# output pixel (n, ho, wo), read and written as 16-byte vectors (`_vector_width` checks when).
# Scalar 2-byte loads left the batch-256 ResNet stem pool at a third of the bandwidth.
_POOL_VEC = r"""constexpr int VEC = 16 / sizeof(T);
I idx = (I)i;
const I c = (idx % (C / VEC)) * VEC; idx /= C / VEC;
const I wo = idx % Wo; idx /= Wo;
const I ho = idx % Ho; const I n = idx / Ho;
float acc[VEC];
#pragma unroll
for (int k = 0; k < VEC; ++k) acc[k] = is_max ? -3.402823466e38f : 0.0f;
""" + _WINDOW + r"""    const uint4 raw = *reinterpret_cast<const uint4*>(&x[n * xn + c + h * xh + w * xw]);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float v = to_f(e[k]);
      acc[k] = is_max ? (v > acc[k] ? v : acc[k]) : acc[k] + v;
    }
    ++count;
  }
}
const float div = is_max ? 1.0f : (float)(count_pad ? kh * kw : (count > 0 ? count : 1));
uint4 packed;
T* o = reinterpret_cast<T*>(&packed);
#pragma unroll
for (int k = 0; k < VEC; ++k) o[k] = from_f<T>(is_max ? acc[k] : acc[k] / div);
*reinterpret_cast<uint4*>(&y[n * yn + c + ho * yh + wo * yw]) = packed;
"""

# `I`, the index type, is int32 where every offset fits (64-bit division costs a loop of
# instructions per thread), else int64 (see `_elementwise`).
_POOL_PARAMS = ("raw T x, I C, I H, I W, I Ho, I Wo, I xn, I xc, I xh, I xw, I yn, I yc, I yh, "
                "I yw, I kh, I kw, I sh, I sw, I ph, I pw, int32 is_max, int32 count_pad, "
                "int32 c_inner")
_POOL_VEC_PARAMS = ("raw T x, I C, I H, I W, I Ho, I Wo, I xn, I xh, I xw, I yn, I yh, I yw, I kh, "
                    "I kw, I sh, I sw, I ph, I pw, int32 is_max, int32 count_pad")
_UPSAMPLE_PARAMS = ("raw T x, I C, I H, I W, I Ho, I Wo, I xn, I xc, I xh, I xw, I yn, I yc, "
                    "I yh, I yw, I fh, I fw, int32 bilinear, int32 c_inner")


def _spatial_2d(op: str, x: Any) -> None:
    if x.ndim != 4:
        raise NotImplementedError(f"the fallback `{op}` kernel takes 2-D images (rank 4)")


def _c_inner(strides: list[int]) -> int:
    """1 when channels are innermost in memory (NHWC): threads then walk channels first, so a
    warp reads and writes contiguous bytes (walking W first strides by C: measured 30x slower)."""
    return int(strides[1] <= min(strides[2], strides[3]))


def maxpool(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    _pool(xs[0], y, a, is_max=True)


def avgpool(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    _pool(xs[0], y, a, is_max=False)


def _pool(x: Any, y: Any, a: Mapping[str, Any], is_max: bool) -> None:
    _spatial_2d("pool", x)
    xf, xs = flat(x)
    yf, ys = flat(y)
    _n, c, h, w = x.shape
    window = (a["window"][0], a["window"][1], a["stride"][0], a["stride"][1], a["pad"][0],
              a["pad"][1])
    wide = needs_int64(xf.size, yf.size, y.size)
    flags = (int(is_max), int(bool(a.get("count_pad"))))
    vec = vector_width(x, y, xs, ys)
    if vec > 1:
        kernel = elementwise("pool_vec", _POOL_VEC_PARAMS, _POOL_VEC, wide)
        kernel(xf, c, h, w, y.shape[2], y.shape[3], xs[0], xs[2], xs[3], ys[0], ys[2], ys[3],
               *window, *flags, yf, size=y.size // vec)
        return
    kernel = elementwise("pool", _POOL_PARAMS, _POOL, wide)
    kernel(xf, c, h, w, y.shape[2], y.shape[3], *xs, *ys, *window, *flags, _c_inner(ys), yf,
           size=y.size)


def upsample(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    x = xs[0]
    _spatial_2d("upsample", x)
    xf, xst = flat(x)
    yf, yst = flat(y)
    _n, c, h, w = x.shape
    kernel = elementwise("upsample", _UPSAMPLE_PARAMS, _UPSAMPLE,
                         needs_int64(xf.size, yf.size, y.size))
    sizes = (c, h, w, y.shape[2], y.shape[3], *xst, *yst,
                  a["factor"][0], a["factor"][1])
    kernel(xf, *sizes, int(a["mode"] == "bilinear"), _c_inner(yst), yf, size=y.size)


def concat(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """Each operand copied into its slice of y, but one its producer wrote there in place
    (`dslc.ir.placement`): that one already is the slice."""
    axis = int(a["axis"])
    at = 0
    copies = []
    for x in xs:
        index = tuple(slice(at, at + x.shape[axis]) if i == axis else slice(None)
                      for i in range(y.ndim))
        part = y[index]
        if (part.data.ptr, part.strides, part.shape) != (x.data.ptr, x.strides, x.shape) and \
                x.size:
            copies.append((x, part))
        at += x.shape[axis]
    if rows.copy_parts(copies):  # all rows at a pitch: one launch moving vectors
        return
    for x, part in copies:
        if not rows.copy(x, part):
            part[...] = x  # a strided copy kernel


def _reduction(op: str) -> KernelFn:
    """Sum, mean, max and min with CuPy's reduction, reading the input in its own dtype and
    strides (the generic route copies it to f32 first) and accumulating in f32."""

    def kernel(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
        import cupy

        x, axes = _math(cupy, xs[0]), tuple(int(i) for i in a["axes"])
        if op in ("reduce_sum", "reduce_mean"):
            r = cupy.sum(x, axis=axes, dtype=cupy.float32, keepdims=True)
            if op == "reduce_mean":
                r *= 1.0 / max(1, x.size // max(1, r.size))
        else:
            r = (cupy.max if op == "reduce_max" else cupy.min)(x, axis=axes, keepdims=True)
        _store(cupy, y, r.reshape(y.shape))

    return kernel


def _math(cupy: Any, x: Any) -> Any:
    """A kernel operand as the math reads it: bf16 bits as f32 (one kernel), anything else as
    it is."""
    if x.dtype != cupy.uint16:
        return x
    return _conversion("uint16 b", "float32 f", "f = to_f(b)", "bf16_to_f32")(x)


def _store(cupy: Any, y: Any, value: Any) -> None:
    """`value` rounded into `y` in one kernel (bf16 bits: rounded to nearest even), whatever
    `y`'s strides."""
    if y.dtype == cupy.uint16:
        _conversion("float32 f", "uint16 b", "b = from_f<unsigned short>(f)", "f32_to_bf16")(
            value.astype(cupy.float32, copy=False), y)
    else:
        y[...] = value


@cache
def _conversion(inputs: str, output: str, body: str, name: str) -> Any:
    import cupy

    return cupy.ElementwiseKernel(inputs, output, body, f"dslc_{name}", preamble=PREAMBLE)


def arange(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """0, 1, ..., n - 1 made on the device (the generic route would copy numpy's, which a CUDA
    graph cannot capture)."""
    import cupy

    y[...] = cupy.arange(y.shape[0], dtype=y.dtype)


# Thread i -> element (b, h, s, d) of `new`, stored at row at[0] + s of the cache `y`: the
# offset is read on the device, so a CUDA graph of the step serves every position. Rows outside
# the cache are not written (the reference drops them too). Elements move as their bytes (T: an
# unsigned type of their size). Launched early, alone or merged with other small steps' kernels
# (`backend.merge`): between a decoder's projections and its attention it costs no launch gap.
_CACHE_WRITE_PARAMS = (
    "const T* __restrict__ x", "const int* __restrict__ at", "T* __restrict__ y",
    "const long long n", "const long long H", "const long long S", "const long long D",
    "const long long MAX", "const long long xb", "const long long xh", "const long long xs",
    "const long long xd", "const long long yb", "const long long yh", "const long long ys",
    "const long long yd")
_CACHE_WRITE = r"""
  const long long first = at[0];
  for (long long i = BLOCK * blockDim.x + threadIdx.x; i < n; i += BLOCKS * blockDim.x) {
    long long idx = i;
    const long long d = idx % D; idx /= D;
    const long long s = idx % S; idx /= S;
    const long long h = idx % H, b = idx / H;
    const long long row = first + s;
    if (row >= 0 && row < MAX)
      y[b * yb + h * yh + row * ys + d * yd] = x[b * xb + h * xh + s * xs + d * xd];
  }
"""
_BYTES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


def cache_write(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """`new` written into rows [at, at + S) of the cache in place: `y` is the cache's memory (the
    memory plan gives the result the input's storage), so nothing else is copied. Where it is
    not (a schedule laid out otherwise), the cache is copied into `y` first."""
    if not _in_place(xs[0], y):
        y[...] = xs[0]
    part = _cache_write_part(xs, y)
    if part is not None:
        merge.run([part])


def cache_write_part(xs: Sequence[Any], y: Any) -> merge.Part | None:
    """The cache write's kernel as a part of a merged launch, or None: where `y` is not the
    cache's own memory (the cache is copied first: `cache_write` runs it alone) or it writes
    nothing."""
    return _cache_write_part(xs, y) if _in_place(xs[0], y) else None


def _in_place(cache: Any, y: Any) -> bool:
    return bool((y.data.ptr, y.strides) == (cache.data.ptr, cache.strides))


def _cache_write_part(xs: Sequence[Any], y: Any) -> merge.Part | None:
    import numpy as np

    _cache, new, at = xs
    if new.size == 0:
        return None
    _b, h, s, d = new.shape
    item = new.dtype.itemsize
    strides = [st // item for st in (*new.strides, *y.strides)]
    return merge.Part(cache_write_kernel(item), (new, at, y, *(np.int64(v) for v in (
        new.size, h, s, d, y.shape[2], *strides))), grid_blocks(new.size))


@cache
def cache_write_kernel(item: int) -> merge.Kernel:
    """The cache write's kernel for elements of `item` bytes."""
    t = _BYTES[item]
    return merge.Kernel(("cache_write", item),
                        tuple(p.replace("T*", f"{t}*") for p in _CACHE_WRITE_PARAMS),
                        _CACHE_WRITE)


def expand(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """x broadcast into y as it is stored: one copy (the reference's `broadcast_to(...).copy()`
    on CuPy wrote the full-size tensor twice: BERT's attention mask, 12.6 us of its 122)."""
    y[...] = xs[0]


def full(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """One integer everywhere, filled on the device (capturable: no copy from the host)."""
    y.fill(int(a["value"]))


def reference_kernel(op: str, xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """The op's numpy reference, run on CuPy arrays: operands in f32, result rounded into y.
    An op that only moves values (a copy, an expand, a layout op) runs on them as they are
    stored, bf16 bits included: converting a table or an image to f32 and back cost more than
    the op. A pointwise op of `POINTWISE` is one kernel (`pointwise`)."""
    import cupy

    from dslc.ops import OPS

    reference = OPS[op].reference
    assert reference is not None, op
    if _moves_values(op, xs, y):
        y[...] = reference(xs, a)
        return
    if pointwise(op, xs, y, a):
        return
    math = [_math(cupy, x) for x in xs]
    math = [x.astype(cupy.float32) if x.dtype.kind == "f" else x for x in math]
    _store(cupy, y, cupy.asarray(reference(math, a)))


_DSLC = {"float32": "f32", "float16": "f16", "uint16": "bf16", "bool": "bool"}  # uint16: bf16 bits


def pointwise(op: str, xs: list[Any], y: Any, a: Mapping[str, Any]) -> bool:
    """`op` into y as one kernel (`backend.fused`), if it has an expression there and its
    operands and result are floats or booleans (integers keep the generic route: exact, not
    through f32); whether it ran."""
    ydtype = _DSLC.get(y.dtype.name)
    expr = None if ydtype is None else fused.expression(op, ydtype, a)
    dtypes = [_DSLC.get(x.dtype.name) if hasattr(x, "dtype") else None for x in xs]
    if expr is None or ydtype is None or None in dtypes:
        return False
    along = (int(a["axis"]), y.ndim) if op in fused.ALONG_AXIS else None
    operands = tuple(fused.Operand(f"x{i}", str(d), along if i == 1 else None)
                     for i, d in enumerate(dtypes))
    member = fused.Member(expr, tuple(o.name for o in operands), ydtype)
    fused.run(fused.Plan(operands, (member,), (0,), (ydtype,)), xs, [y])
    return True


MOVES = ("contiguous", "expand", "reshape", "transpose", "slice")


def _moves_values(op: str, xs: list[Any], y: Any) -> bool:
    """Whether `op` makes each value of its result a copy of one of its operand's, stored alike
    (the same dtype, so bf16 bits are copied as they are)."""
    return op in MOVES and all(x.dtype == y.dtype for x in xs)


# NaN where an index is outside the table, as each float dtype stores it (bf16: its bits).
_NAN_BITS = {"float16": 0x7E00, "uint16": 0x7FC0}


def gather(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """Rows of the table picked in its stored dtype (an embedding table converted to f32 at
    every call cost 0.13 ms of BERT's 0.33 on the H200), NaN for an index outside it: one
    kernel (`gather_part`) where the arrays are packed, else CuPy's take and where (six)."""
    part = gather_part(xs, y, a)
    if part is not None:
        merge.run([part])
        return
    import cupy

    x, idx = xs
    axis, n = int(a["axis"]), x.shape[int(a["axis"])]
    rows = cupy.take(x, cupy.clip(idx, 0, n - 1), axis=axis)
    outside = ((idx < 0) | (idx >= n)).reshape((1,) * axis + idx.shape
                                               + (1,) * (x.ndim - axis - 1))
    bits = _NAN_BITS.get(x.dtype.name)
    nan = cupy.asarray(cupy.nan, x.dtype) if bits is None else \
        cupy.asarray(bits, cupy.uint16).view(x.dtype)
    y[...] = cupy.where(outside, nan, rows)


# The NaN each stored dtype's kernel writes, as bits (bf16 travels as uint16).
_NAN_WORD = {"float32": 0x7FC00000, "float16": 0x7E00, "uint16": 0x7FC0}
_INDEX_TYPES = {"int32": "int", "int64": "long long"}
_WORDS = {**_BYTES, 16: "uint4"}  # what a thread moves: 16 bytes where rows and pointers allow
# y[o, j, w] = x[o, idx[j], w] over packed arrays, counted in words of the row (w < inner); an
# index outside [0, rows) gives a row of NaN (`nan`'s bits in each element).
_GATHER_PARAMS = ("const W* __restrict__ x", "const I* __restrict__ idx", "W* __restrict__ y",
                  "const long long n", "const long long m", "const long long rows",
                  "const long long inner", "const long long nan")
_GATHER = r"""
  for (long long i = BLOCK * blockDim.x + threadIdx.x; i < n; i += BLOCKS * blockDim.x) {
    const long long w = i % inner, r = i / inner;
    const long long j = r % m, o = r / m;
    const long long row = (long long)idx[j];
    if (row >= 0 && row < rows) {
      y[i] = x[(o * rows + row) * inner + w];
    } else {
      E* e = (E*)(y + i);
      for (int k = 0; k < (int)(sizeof(W) / sizeof(E)); ++k) e[k] = (E)nan;
    }
  }
"""


def gather_part(xs: Sequence[Any], y: Any, a: Mapping[str, Any]) -> merge.Part | None:
    """The gather as one kernel over packed (C-order) table, indices and result, or None (a
    strided view, a dtype without a NaN here): a thread moves 16 bytes where a row and both
    pointers allow, else fewer (the largest word that divides them)."""
    import numpy as np

    x, idx = xs
    nan = _NAN_WORD.get(x.dtype.name)
    if nan is None or idx.dtype.name not in _INDEX_TYPES or y.size == 0 or \
            not all(t.flags.c_contiguous for t in (x, idx, y)):
        return None
    axis = int(a["axis"])
    rows = x.shape[axis]
    item = x.dtype.itemsize
    row_bytes = int(np.prod(x.shape[axis + 1:], dtype=np.int64)) * item
    word = next(w for w in (16, 8, 4, 2, 1) if w >= item and row_bytes % w == 0
                and x.data.ptr % w == 0 and y.data.ptr % w == 0)
    n = y.nbytes // word
    return merge.Part(gather_kernel(word, item, idx.dtype.name),
                      (x, idx, y, *(np.int64(v) for v in (n, idx.size, rows, row_bytes // word,
                                                          nan))), grid_blocks(n))


@cache
def gather_kernel(word: int, item: int, index: str) -> merge.Kernel:
    """The gather's kernel moving words of `word` bytes of elements of `item` bytes, indices
    of the numpy dtype `index`."""
    params = tuple(p.replace("W*", f"{_WORDS[word]}*").replace("I*", f"{_INDEX_TYPES[index]}*")
                   for p in _GATHER_PARAMS)
    return merge.Kernel(("gather", word, item, index), params,
                        _GATHER.replace("sizeof(W)", f"sizeof({_WORDS[word]})")
                        .replace("E*", f"{_BYTES[item]}*").replace("(E)", f"({_BYTES[item]})"))


def conv(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """A depthwise conv as one kernel (`backend.depthwise`); any other conv the reference runs
    (a conv reaches a kernel only where cuDNN has no engine for it)."""
    x, w = xs
    if on_the_reference("conv", [x.shape, w.shape], _STORED_AS[x.dtype.name], a) or \
            y.dtype != x.dtype:  # the depthwise kernel stores in its input's dtype
        reference_kernel("conv", xs, y, a)
    else:
        depthwise.conv(xs, y, a)


_STORED_AS = {cupy_name: dtype for dtype, cupy_name in KERNEL_DTYPES.items()}  # uint16: bf16


def on_the_reference(op: str, shapes: list[tuple[Any, ...]], dtype: str,
                     a: Mapping[str, Any]) -> bool:
    """Whether the kernel of `op` over operands of these shapes and this dslc dtype runs the
    op's numpy reference on CuPy (which may use cuBLAS, refused while a CUDA graph is captured)
    rather than a kernel of its own."""
    if op == "conv":
        taps = depthwise_taps(shapes[0], shapes[1], int(a["groups"]))
        return taps is None or not depthwise.takes(taps, dtype)
    return op not in KERNELS and op not in fused.POINTWISE  # a pointwise op: one kernel


def sdpa(xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    """Attention of few queries over many keys as one kernel (`backend.attention`) where it
    takes the operands, else the reference on CuPy."""
    shapes = {n: tuple(x.shape) for n, x in named_operands(a, xs).items()}
    if attention.takes(shapes, _DSLC.get(xs[0].dtype.name, "")):
        attention.attend(xs, y, a)
    else:
        reference_kernel("sdpa", xs, y, a)


KERNELS: dict[str, KernelFn] = {"conv": conv, "maxpool": maxpool, "avgpool": avgpool, "upsample": upsample,
                                "concat": concat, "arange": arange, "full": full, "expand": expand,
                                "cache_write": cache_write, "gather": gather,
                                "groupnorm": groupnorm, "sdpa": sdpa,
                                **{op: _reduction(op) for op in ("reduce_sum", "reduce_mean",
                                                                 "reduce_max", "reduce_min")}}
DTYPES = ("f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool")  # bf16 as its uint16 bits


def run_kernel(op: str, xs: list[Any], y: Any, a: Mapping[str, Any]) -> None:
    kernel = KERNELS.get(op)
    if kernel is not None:
        kernel(xs, y, a)
    else:
        reference_kernel(op, xs, y, a)
