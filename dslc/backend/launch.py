"""Kernels launched early: programmatic dependent launch (sm_90 and newer). A kernel launched so
may start while the one before it in the stream still runs; it reads nothing that kernel writes,
and writes nothing, until its `griddepcontrol.wait` (`wait_for_previous` in `DEVICE` below),
which returns once the kernels before it have finished and their writes are visible. What it
does before the wait is free: the few-row matmul kernel asks the L2 for its weight rows there
(a prefetch is safe whoever writes them), so a decoder's projections start reading their
weights while the step before them ends, and the launch's own latency is hidden too. A kernel
lets its dependents launch early with `griddepcontrol.launch_dependents` (`let_next_start`);
where it does not, they start once it has finished, as a plain launch would.

Only kernels that wait before they read what others write are launched so (`backend.gemv`,
`backend.attention`, the cache write and the strided pointwise kernel of `backend.fused`);
the launch goes through the driver's `cuLaunchKernelEx` (ctypes, the
layouts of cuda.h's `CUlaunchConfig` and `CUlaunchAttribute`), and CUDA graphs captured from
the stream keep the dependency as a programmatic edge. `DSLC_EARLY_LAUNCH=0` launches them as
CuPy does (an A/B of what early launches are worth)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from functools import cache
from typing import Any

# CUDA C: the kernel's side. Without a programmatic dependency both instructions do nothing.
DEVICE = r"""
__device__ __forceinline__ void let_next_start() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
"""

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class Attribute(ctypes.Structure):
    """cuda.h's CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union (here the
    first int: programmaticStreamSerializationAllowed)."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class Config(ctypes.Structure):
    """cuda.h's CUlaunchConfig."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(Attribute)), ("count", ctypes.c_uint)]


def early(kernel: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any]) -> None:
    """`kernel(grid, block, args)` (a CuPy RawKernel whose source waits before it reads what
    other kernels write) launched early on the current stream, where the device and driver allow
    it; else as CuPy launches it."""
    launch = _launcher()
    if launch is None:
        kernel(tuple(grid), tuple(block), tuple(args))
        return
    import cupy

    values = [_value(a) for a in args]
    pointers = (ctypes.c_void_p * len(values))(
        *(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values))
    attribute = Attribute(PROGRAMMATIC_STREAM_SERIALIZATION)
    attribute.value[0] = 1
    config = Config((ctypes.c_uint * 3)(*_three(grid)), (ctypes.c_uint * 3)(*_three(block)), 0,
                    cupy.cuda.get_current_stream().ptr, ctypes.pointer(attribute), 1)
    status = launch(ctypes.byref(config), kernel.kernel.ptr, pointers, None)
    if status != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed (CUresult {status})")


def _three(dims: Sequence[int]) -> list[int]:
    return [*dims, *([1] * (3 - len(dims)))]


def _value(a: Any) -> Any:
    """A kernel argument as the C value its parameter takes: an array as its device pointer, a
    NumPy scalar as its own type."""
    import numpy as np

    if hasattr(a, "data") and hasattr(a.data, "ptr"):
        return ctypes.c_void_p(a.data.ptr)
    kinds = {np.int32: ctypes.c_int32, np.int64: ctypes.c_int64, np.uint64: ctypes.c_uint64,
             np.float32: ctypes.c_float, np.uint32: ctypes.c_uint32}
    return kinds[type(a)](a.item())


@cache
def _launcher() -> Any | None:
    """The driver's cuLaunchKernelEx, where early launches are on and the GPU has them."""
    if os.environ.get("DSLC_EARLY_LAUNCH", "1") == "0":
        return None
    import cupy

    if int(cupy.cuda.Device().compute_capability) < 90:
        return None
    try:
        function = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.POINTER(Config), ctypes.c_void_p,
                         ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function
