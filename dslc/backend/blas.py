"""A matrix product of many rows on cuBLASLt, with the additions and activation its epilogue
takes: y = act(x @ w (+ c) (+ a bias along y's columns)), act a ReLU or the tanh form of GELU,
summed in f32 and rounded once to y's dtype (f16 or bf16).

cuDNN's matmul engines ran a transformer's projections 1.3-1.6x slower than cuBLAS's kernels on
an H100 (the 12-layer encoder at B=8, S=576: docs/benchmarks.md, session 33), so a matmul step
may run here instead (`backend.gemv.run` past its few rows); the tuner measures it against the
step's cuDNN graph and keeps the faster (`tune.fusion.kernel_steps`).

cuBLASLt is column-major: a row-major [M, N] array of row pitch ld is its N x M matrix of leading
dimension ld, so y = x @ w is computed as y^T = w^T x^T, w^T being w's memory read as stored
(a PyTorch linear's weight [N, K], K contiguous, seen as [K, N]: transposed) or transposed. The
library is reached through ctypes (the layouts of cublasLt.h's enums and its heuristic result);
descriptors and the chosen algorithm are kept per shape, strides, dtypes and alignment, the
workspace per device and stream (a captured CUDA graph names its address)."""

from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from typing import Any

COMPUTE_32F = 68  # cublasComputeType_t
DATA_TYPES = {"f32": 0, "f16": 2, "bf16": 14}  # cudaDataType_t
OP_N, OP_T = 0, 1  # cublasOperation_t
# cublasLtMatmulDescAttributes_t
TRANSA, TRANSB, EPILOGUE, BIAS_POINTER, BIAS_DATA_TYPE = 3, 4, 7, 8, 26
EPILOGUE_DEFAULT, EPILOGUE_BIAS = 1, 4  # cublasLtEpilogue_t
# The activations cuBLASLt applies after the sum, without and with the bias. Its GELU is the tanh
# approximation (PyTorch computes `gelu(x, "tanh")` where it cannot use that epilogue), so it
# serves the `gelu_tanh` op, not `gelu`.
ACTIVATIONS = {"": (EPILOGUE_DEFAULT, EPILOGUE_BIAS), "relu": (2, 6), "gelu_tanh": (32, 36)}
# cublasLtMatmulPreferenceAttributes_t: the workspace, then A, B, C and D's alignment in bytes
MAX_WORKSPACE_BYTES, MIN_ALIGNMENT = 1, (5, 6, 7, 8)
WORKSPACE = 32 << 20  # bytes: what cuBLAS asks for on Hopper
ALGOS = 1  # the heuristic's first algorithm, as PyTorch takes it
BIAS_ALIGNMENT = 16  # bytes: the alignment preferences name A to D, not the bias
# A product's descriptor is shared by every call of its shapes, and a call sets its bias there:
# two host threads must not interleave that and the call.
LOCK = threading.Lock()


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t: the algorithm (opaque, 8 words), its workspace, status,
    waves and reserved words."""

    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t),
                ("state", ctypes.c_int), ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


@dataclass(frozen=True)
class Matrix:
    """A row-major 2-d array as cuBLASLt reads it: rows, columns, the row pitch in elements
    (columns contiguous), or with `transposed` the column pitch (rows contiguous)."""

    rows: int
    cols: int
    pitch: int
    transposed: bool = False

    def column_major(self) -> tuple[int, int, int]:
        """(rows, cols, ld) of the same memory read column-major: the transpose of a row-major
        array, or the array itself where its rows are contiguous."""
        return (self.rows, self.cols, self.pitch) if self.transposed else \
            (self.cols, self.rows, self.pitch)


def matrix(a: Any) -> Matrix | None:
    """A 2-d array (CuPy or NumPy) as a Matrix, or None where it is empty, neither axis is
    contiguous, a pitch is short of its row, or a stride is no whole number of elements."""
    if a.ndim != 2 or a.size == 0 or any(s % a.itemsize for s in a.strides):
        return None
    (r, c), (sr, sc) = a.shape, (s // a.itemsize for s in a.strides)
    if sc == 1 and (r == 1 or sr >= c):
        return Matrix(r, c, max(sr, c))
    if sr == 1 and (c == 1 or sc >= r):
        return Matrix(r, c, max(sc, r), transposed=True)
    return None


def rows_of(a: Any) -> Any | None:
    """`a` ([..., N]) as one 2-d view of its rows, [prod(...), N], where its leading axes merge
    into one (each a whole number of the next's rows), else None. CuPy or NumPy."""
    if a.ndim < 2:
        return a[None, :] if a.ndim == 1 else None
    if a.ndim == 2:
        return a
    lead = [(a.shape[i], a.strides[i]) for i in range(a.ndim - 1) if a.shape[i] != 1]
    if any(s0 != d1 * s1 for (_, s0), (d1, s1) in pairwise(lead)):
        return None
    rows = math.prod(d for d, _ in lead)
    stride = lead[-1][1] if lead else 0  # one row: its pitch is never read
    return _module(a).lib.stride_tricks.as_strided(a, (rows, a.shape[-1]),
                                                    (stride, a.strides[-1]))


def _address(a: Any) -> int:
    """An array's first byte (CuPy's device pointer, or NumPy's: the CPU tests ask)."""
    return int(a.data.ptr) if hasattr(a.data, "ptr") else int(a.ctypes.data)


def _module(a: Any) -> Any:
    import numpy as np

    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


@dataclass(frozen=True)
class Problem:
    """What a product's descriptors and algorithm depend on: y = x @ w (+ c) (+ bias)."""

    dtype: str
    x: Matrix
    w: Matrix
    y: Matrix
    c: Matrix | None
    bias: bool
    activation: str  # "" or a key of ACTIVATIONS, applied after the sum
    alignment: tuple[int, int, int, int]  # bytes each of A (w), B (x), C and D is aligned to

    def valid(self) -> bool:
        return (self.dtype in DATA_TYPES and self.dtype != "f32" and not self.x.transposed
                and self.activation in ACTIVATIONS
                and not self.y.transposed and (self.c is None or not self.c.transposed)
                and self.x.cols == self.w.rows and (self.x.rows, self.w.cols) == (self.y.rows,
                                                                                self.y.cols)
                and (self.c is None or (self.c.rows, self.c.cols) == (self.y.rows, self.y.cols)))

    def layouts(self) -> tuple[tuple[int, int, int, int], ...]:
        """(type, rows, cols, ld) of A = w^T, B = x^T, C and D = y^T, column-major; A read
        transposed where w's columns are contiguous (its memory is then w^T's transpose)."""
        t = DATA_TYPES[self.dtype]
        a = self.w.column_major()
        c = self.c or self.y
        return ((t, *a), (t, *self.x.column_major()), (t, *c.column_major()),
                (t, *self.y.column_major()))

    def trans_a(self) -> int:
        """How A is read to be w^T: as it lies where w's rows are contiguous (w's memory read
        column-major is w^T), transposed where its columns are (that memory is w itself)."""
        return OP_T if self.w.transposed else OP_N


def alignment(*ptrs: int) -> tuple[int, ...]:
    """The largest power of two up to 256 bytes each address is a multiple of."""
    return tuple(next(b for b in (256, 128, 64, 32, 16, 8, 4, 2, 1) if p % b == 0) for p in ptrs)


def problem(dtype: str, x: Any, w: Any, y: Any, c: Any | None = None, bias: Any | None = None,
            activation: str = "") -> Problem | None:
    """The product of these arrays, or None where cuBLASLt cannot take them as they lie:
    x [..., K] and y [..., N] whose rows merge into one axis, w [K, N] with one contiguous axis,
    c like y, bias [N] contiguous and on 16 bytes (a kernel the heuristic picks may load it so:
    the alignment preferences cover the matrices only); all of `dtype`, f16 or bf16 (bf16 as
    its uint16 bits)."""
    xs, ys = rows_of(x), rows_of(y)
    cs = None if c is None else rows_of(c)
    if xs is None or ys is None or (c is not None and cs is None):
        return None
    if any(a.dtype != y.dtype for a in (x, w, *(t for t in (c, bias) if t is not None))):
        return None
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != y.shape[-1]
                             or bias.strides[0] != bias.itemsize
                             or _address(bias) % BIAS_ALIGNMENT):
        return None
    mx, mw, my = matrix(xs), matrix(w), matrix(ys)
    mc = None if cs is None else matrix(cs)
    if mx is None or mw is None or my is None or (cs is not None and mc is None):
        return None
    a, b, cc, d = alignment(*(_address(t) for t in (w, x, c if c is not None else y, y)))
    p = Problem(dtype, mx, mw, my, mc, bias is not None, activation, (a, b, cc, d))
    return p if p.valid() else None


def matmul(dtype: str, x: Any, w: Any, y: Any, c: Any | None = None, bias: Any | None = None,
           activation: str = "") -> bool:
    """y = activation(x @ w (+ c) (+ bias)) on the current stream (bf16 arrays as their uint16
    bits), or False where cuBLASLt is not here, cannot take the arrays (`problem`), proposes nothing or
    refuses the call: the caller then computes the product another way."""
    import cupy

    p = problem(dtype, x, w, y, c, bias, activation)
    lib = _library()
    if p is None or lib is None:
        return False
    device = cupy.cuda.Device().id
    plan = _plan(p, device)
    if plan is None:
        return False
    xs, ys = rows_of(x), rows_of(y)
    cs = ys if c is None else rows_of(c)
    assert xs is not None and ys is not None and cs is not None  # as `problem` found them
    desc, layouts, algo = plan
    space = _workspace(device, cupy.cuda.get_current_stream().ptr)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    with LOCK:
        if bias is not None:
            pointer = ctypes.c_void_p(bias.data.ptr)
            _check(lib.cublasLtMatmulDescSetAttribute(desc, BIAS_POINTER, ctypes.byref(pointer),
                                                      ctypes.sizeof(pointer)), "bias")
        status = lib.cublasLtMatmul(
            _handle(device), desc, ctypes.byref(one), ctypes.c_void_p(w.data.ptr), layouts[0],
            ctypes.c_void_p(xs.data.ptr), layouts[1], ctypes.byref(one if c is not None else zero),
            ctypes.c_void_p(cs.data.ptr), layouts[2], ctypes.c_void_p(ys.data.ptr), layouts[3],
            ctypes.byref(algo), ctypes.c_void_p(space.data.ptr), ctypes.c_size_t(WORKSPACE),
            ctypes.c_void_p(cupy.cuda.get_current_stream().ptr))
    if status != 0:  # refused at the call (nothing launched): not asked again
        _PLANS[(p, device)] = None
        return False
    return True


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt: {what} failed (cublasStatus_t {status})")


@cache
def _library() -> Any | None:
    """libcublasLt through ctypes (the NVIDIA wheel's or the system's), or None."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        lib = ctypes.CDLL(load_nvidia_dynamic_lib("cublasLt").abs_path)
    except Exception:
        try:
            lib = ctypes.CDLL("libcublasLt.so.13")
        except OSError:
            return None
    p = ctypes.c_void_p
    signatures: dict[str, list[Any]] = {
        "cublasLtCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulDescCreate": [ctypes.POINTER(p), ctypes.c_int, ctypes.c_int],
        "cublasLtMatmulDescSetAttribute": [p, ctypes.c_int, p, ctypes.c_size_t],
        "cublasLtMatmulDescGetAttribute": [p, ctypes.c_int, p, ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.c_size_t)],
        "cublasLtMatrixLayoutCreate": [ctypes.POINTER(p), ctypes.c_int, ctypes.c_uint64,
                                       ctypes.c_uint64, ctypes.c_int64],
        "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulPreferenceSetAttribute": [p, ctypes.c_int, p, ctypes.c_size_t],
        "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, ctypes.c_int,
                                           ctypes.POINTER(HeuristicResult),
                                           ctypes.POINTER(ctypes.c_int)],
        "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, p, p, ctypes.c_size_t, p],
    }
    for name, args in signatures.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, ctypes.c_int
    return lib


def _loaded() -> Any:
    lib = _library()
    assert lib is not None, "cuBLASLt is not here (`_library`)"
    return lib


def descriptor(p: Problem) -> tuple[Any, list[Any]]:
    """The matmul descriptor (f32 compute and scale, w's transpose, the bias epilogue) and the
    four layouts (A, B, C, D) of a product: host objects, no GPU needed."""
    lib = _loaded()
    desc = ctypes.c_void_p()
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, DATA_TYPES["f32"]),
           "descriptor")
    settings = [(TRANSA, ctypes.c_int32(p.trans_a())), (TRANSB, ctypes.c_int32(OP_N)),
                (EPILOGUE, ctypes.c_uint32(ACTIVATIONS[p.activation][p.bias]))]
    if p.bias:
        settings.append((BIAS_DATA_TYPE, ctypes.c_int32(DATA_TYPES[p.dtype])))
    for attr, value in settings:
        _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value),
                                                  ctypes.sizeof(value)), f"attribute {attr}")
    layouts = []
    for t, rows, cols, ld in p.layouts():
        layout = ctypes.c_void_p()
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), t, rows, cols, ld), "layout")
        layouts.append(layout)
    return desc, layouts


_PLANS: dict[tuple[Problem, int], Any] = {}
_SPACE: dict[tuple[int, int], Any] = {}


def _workspace(device: int, stream: int) -> Any:
    """cuBLASLt's workspace, one a device and stream (products on two streams at once must not
    share one), made once and never freed (a captured CUDA graph names its address)."""
    import cupy

    key = (device, stream)
    if key not in _SPACE:
        _SPACE[key] = cupy.empty(WORKSPACE, cupy.uint8)
    return _SPACE[key]


def _plan(p: Problem, device: int) -> tuple[Any, list[Any], Any] | None:
    """The descriptors and the heuristic's algorithm of a product (made once), or None where
    cuBLASLt proposes no algorithm."""
    key = (p, device)
    if key not in _PLANS:
        lib = _loaded()
        desc, layouts = descriptor(p)
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        size = ctypes.c_uint64(WORKSPACE)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, MAX_WORKSPACE_BYTES,
                                                        ctypes.byref(size), 8), "workspace")
        for attr, bytes_ in zip(MIN_ALIGNMENT, p.alignment, strict=True):
            value = ctypes.c_uint32(bytes_)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(value), 4),
                   "alignment")
        found = (HeuristicResult * ALGOS)()
        count = ctypes.c_int(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(_handle(device), desc, *layouts, pref,
                                                    ALGOS, found, ctypes.byref(count))
        _PLANS[key] = (desc, layouts, found[0]) if status == 0 and count.value > 0 else None
    return _PLANS[key]


_HANDLES: dict[int, Any] = {}


def _handle(device: int) -> Any:
    if device not in _HANDLES:
        lib = _loaded()
        handle = ctypes.c_void_p()
        _check(lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
        _HANDLES[device] = handle
    return _HANDLES[device]
