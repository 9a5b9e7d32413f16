"""The GPU side of the runtime: CuPy and cuDNN loaded on demand, device buffers, and arrays from
other frameworks taken without copies (DLPack, the CUDA array interface, torch tensors).

Importing this module needs no GPU; `require()` fails with one sentence (R0801) when there is none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dslc.core.errors import RunnerError
from dslc.core.types import FP8
from dslc.ir.storage import span as storage_span
from dslc.ops import fp8

TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i8": "int8",
                "u8": "uint8", "i32": "int32", "i64": "int64", "bool": "bool",
                "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}
CUPY_DTYPES = {"f32": "float32", "f16": "float16", "i8": "int8", "u8": "uint8",
               "i32": "int32", "i64": "int64", "bool": "bool"}
# What the fallback kernels are given: CuPy has no bf16, so a bf16 tensor is its uint16 bits.
KERNEL_DTYPES = {**CUPY_DTYPES, "bf16": "uint16"}
# ... and fp8 as its bytes, which only the pointwise kernels take (`backend.fused`: they are
# told each tensor's dtype, so these bytes are never taken for u8 integers).
STORED_AS = {**KERNEL_DTYPES, "f8e4m3": "uint8", "f8e5m2": "uint8"}


def require() -> tuple[Any, Any]:
    """(cupy, cudnn), or R0801 with the reason."""
    try:
        import cupy
    except Exception as err:
        raise RunnerError("R0801", f"running a compiled model needs a CUDA GPU and CuPy "
                          f"(`pip install cupy-cuda13x`); CuPy could not be imported: {err}") from err
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as err:
        raise RunnerError("R0801", f"running a compiled model needs a CUDA GPU, and none is "
                          f"usable here ({err})") from err
    try:
        import cudnn
    except Exception as err:
        raise RunnerError("R0801", "running a compiled model needs the cuDNN frontend "
                          f"(`pip install nvidia-cudnn-frontend`): {err}") from err
    return cupy, cudnn


def device_count() -> int:
    """How many CUDA GPUs this machine has (0 without CuPy or a driver)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


@dataclass
class ArrayRef:
    """A device array as the runtime sees it: pointer, shape, strides in elements, dtype."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    kind: str  # torch | cupy
    obj: Any


def _dtype_name(table: dict[str, str], dtype: Any) -> str | None:
    text = str(dtype).replace("torch.", "")
    for name, value in table.items():
        if value == text:
            return name
    return None


def as_array(obj: Any, name: str, span: dict[str, Any] | None) -> ArrayRef:
    """A tensor given to the model, without copying it."""
    module = type(obj).__module__
    if module.startswith("torch"):
        if not getattr(obj, "is_cuda", False):
            raise RunnerError("R0501", f"input `{name}` is a CPU tensor; move it to the GPU "
                              "(`.cuda()`)", span)
        dtype = _dtype_name(TORCH_DTYPES, obj.dtype)
        if dtype is None:
            raise RunnerError("R0401", f"input `{name}` has dtype {obj.dtype}, which dslc models "
                              "do not take", span)
        return ArrayRef(int(obj.data_ptr()), tuple(obj.shape), tuple(obj.stride()), dtype,
                        "torch", obj)
    cupy, _ = require()
    if not isinstance(obj, cupy.ndarray):
        try:
            if hasattr(obj, "__cuda_array_interface__"):
                obj = cupy.asarray(obj)
            elif hasattr(obj, "__dlpack__"):
                obj = cupy.from_dlpack(obj)
            else:
                raise TypeError(type(obj).__name__)
        except Exception as err:
            raise RunnerError("R0501", f"input `{name}` is not a GPU array (give a torch tensor, a "
                              f"CuPy array, or any DLPack / CUDA-array-interface object): {err}",
                              span) from err
    dtype = _dtype_name(CUPY_DTYPES, obj.dtype)
    if dtype is None:
        raise RunnerError("R0401", f"input `{name}` has dtype {obj.dtype}", span)
    item = obj.dtype.itemsize
    return ArrayRef(int(obj.data.ptr), tuple(obj.shape), tuple(s // item for s in obj.strides),
                    dtype, "cupy", obj)


def empty(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str, kind: str) -> ArrayRef:
    """A new device array of that layout, in the caller's framework."""
    span = storage_span(shape, strides)
    if kind == "torch" or dtype not in CUPY_DTYPES:
        import torch

        t = torch.empty_strided(shape, strides, dtype=getattr(torch, TORCH_DTYPES[dtype]),
                                device="cuda")
        return ArrayRef(int(t.data_ptr()), shape, strides, dtype, "torch", t)
    cupy, _ = require()
    dt = cupy.dtype(CUPY_DTYPES[dtype])
    base = cupy.empty(max(span, 1), dtype=dt)
    arr = cupy.ndarray(shape, dt, memptr=base.data, strides=tuple(s * dt.itemsize for s in strides))
    return ArrayRef(int(arr.data.ptr), shape, strides, dtype, "cupy", arr)


def view(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str,
         table: Mapping[str, str] = CUPY_DTYPES) -> Any:
    """A CuPy array over memory the runtime owns elsewhere (`table`: KERNEL_DTYPES for the
    fallback kernels, which take bf16 as bits)."""
    cupy, _ = require()
    if dtype not in table:
        raise RunnerError("R0801", f"the fallback kernels do not take {dtype} tensors")
    dt = cupy.dtype(table[dtype])
    span = storage_span(shape, strides) * dt.itemsize
    mem = cupy.cuda.UnownedMemory(ptr, max(span, 1), None)
    return cupy.ndarray(shape, dt, memptr=cupy.cuda.MemoryPointer(mem, 0),
                        strides=tuple(s * dt.itemsize for s in strides))


# -- floating-point storage on the device: CuPy has no bf16, so bf16 lives as uint16 bits --------
def round_to(cupy: Any, x: Any, dtype: str) -> Any:
    """An f32 array rounded to the values `dtype` holds (round to nearest even; fp8 saturating
    as `ops.fp8` does), still f32. Integers and masks as they are."""
    if dtype == "f16":
        return x.astype(cupy.float16).astype(cupy.float32)
    if dtype == "bf16":
        u = x.astype(cupy.float32).view(cupy.uint32)
        u = (u + cupy.uint32(0x7FFF) + ((u >> cupy.uint32(16)) & cupy.uint32(1))) \
            & cupy.uint32(0xFFFF0000)
        return u.view(cupy.float32)
    if dtype in FP8:  # the tuner compares a quantising cast's output with this
        return fp8.round_fp8(cupy, x, dtype)
    return x


def encode(cupy: Any, x: Any, dtype: str) -> Any:
    """A logical array as `dtype` stores it (bf16 as its uint16 bits)."""
    if dtype == "bf16":
        bits = round_to(cupy, x, "bf16").view(cupy.uint32) >> cupy.uint32(16)
        return bits.astype(cupy.uint16)
    return x.astype(CUPY_DTYPES[dtype])


def run_reference(cupy: Any, op: str, xs: list[Any], attrs: Mapping[str, Any], dtype: str) -> Any:
    """An op's reference on CuPy operands (floats as f32), its result rounded to the values
    `dtype` holds: f32 for floats, as it is for integers (the tuner's and the weights' oracle)."""
    from dslc.ops import OPS

    reference = OPS[op].reference
    assert reference is not None, op
    out = round_to(cupy, cupy.asarray(reference(xs, attrs)), dtype)
    return out.astype(cupy.float32) if out.dtype.kind == "f" else out


def decode(cupy: Any, stored: Any, dtype: str) -> Any:
    """A stored array back as f32 (floats; bf16 given as its uint16 bits) or as it is."""
    if dtype == "bf16":
        return (stored.view(cupy.uint16).astype(cupy.uint32) << cupy.uint32(16)).view(cupy.float32)
    return stored.astype(cupy.float32) if dtype in ("f16", "f32") else stored
