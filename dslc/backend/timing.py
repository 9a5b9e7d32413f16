"""Benchmark timing on the GPU: medians of CUDA-event timings, and inputs put on the device in
their declared memory layout (`dslc bench`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dslc.backend.device import CUPY_DTYPES, TORCH_DTYPES, require


def median_ms(fn: Callable[[], Any], repeats: int, warmup: int = 5) -> float:
    """Median milliseconds of `fn()` over `repeats` calls after `warmup` calls, each timed by
    two CUDA events on the current stream (the legacy default stream, which is also torch's
    unless a caller chose another), so launches queued by Python count, as a caller sees them."""
    cupy, _ = require()
    for _ in range(warmup):
        fn()
    stream = cupy.cuda.get_current_stream()
    stream.synchronize()
    samples = []
    for _ in range(max(repeats, 1)):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        samples.append(float(cupy.cuda.get_elapsed_time(start, end)))
    return statistics.median(samples)


def synchronize() -> None:
    cupy, _ = require()
    cupy.cuda.Device().synchronize()


def upload(host: np.ndarray, dtype: str, order: tuple[int, ...] | None, kind: str) -> Any:
    """`host` (logical axis order) on the GPU as `dtype`, its memory in `order` (outermost axis
    first; None: row-major): a torch tensor (`kind` "torch", which has bf16) or a CuPy array."""
    order = order if order is not None else tuple(range(host.ndim))
    inverse = [order.index(i) for i in range(host.ndim)]
    physical = np.ascontiguousarray(host.transpose(order))
    if kind == "torch":
        import torch

        source = physical if physical.dtype.kind in "biu" else physical.astype(np.float32)
        t = torch.from_numpy(source).to(device="cuda", dtype=getattr(torch, TORCH_DTYPES[dtype]))
        return t.permute(inverse)
    cupy, _ = require()
    return cupy.asarray(physical.astype(CUPY_DTYPES[dtype])).transpose(inverse)


def upload_inputs(arrays: Mapping[str, np.ndarray], program: Any) -> dict[str, Any]:
    """A schedule's inputs (`program`: a `runtime.schedule.Schedule`) as torch CUDA tensors,
    each in its declared dtype and memory order (torch: it has bf16; integers as they are:
    through f32 an id above 2**24 would change)."""
    out = {}
    for name, a in arrays.items():
        node = program.nodes[program.inputs[name]]
        order = node.type.layout.order if node.type.layout is not None else None
        out[name] = upload(a, node.type.dtype, order, "torch")
    return out


def to_host(value: Any) -> np.ndarray:
    """A device output (torch or CuPy) on the host, floats as float64."""
    if hasattr(value, "detach"):
        t = value.detach()
        t = t.double() if t.is_floating_point() else t
        return np.asarray(t.cpu().numpy())
    array = np.asarray(value.get())
    return array.astype(np.float64) if array.dtype.kind == "f" else array


def allocated_bytes() -> int:
    """Bytes CuPy's memory pool holds now (the runtime's arenas, workspaces, weights)."""
    cupy, _ = require()
    return int(cupy.get_default_memory_pool().used_bytes())
