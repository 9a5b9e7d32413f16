"""Benchmark timing on the GPU: medians of CUDA-event timings, and inputs put on the device in
their declared memory layout (`dslc bench`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from functools import cache
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


HOLD = r"""
extern "C" __global__ void dslc_hold(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) { }
}
"""


@cache
def _hold_kernel(cupy: Any) -> tuple[Any, int]:
    """A one-thread kernel that keeps the GPU busy for a number of clock cycles, and the GPU's
    clock in kHz (cycles per millisecond)."""
    return (cupy.RawKernel(HOLD, "dslc_hold"),
            int(cupy.cuda.Device().attributes["ClockRate"]))


def gpu_ms(cupy: Any, once: Callable[[], object], before: Callable[[], object],
           runs: int, warmup: int = 3) -> list[float]:
    """Milliseconds the GPU spends in each of `runs` calls of `once()` (`before()` queued ahead
    of each, untimed: an L2 flush), all queued behind a kernel that holds the GPU for longer than
    Python takes to queue them: the events then time the GPU's work alone. Timed one by one, as
    Python launches them, a small kernel's time was mostly the host's (a CuPy kernel's launch:
    tens of microseconds), which a CUDA graph's replay does not pay: the one generated kernel of
    a quantising cast timed 0.078 ms against cuDNN's graph at 0.030 ms (H200, 2026-12-03)."""
    stream = cupy.cuda.get_current_stream()
    before()
    once()  # the first call may build what the others reuse
    stream.synchronize()
    started = time.perf_counter()
    for _ in range(max(warmup - 1, 1)):
        before()
        once()
    host_ms = (time.perf_counter() - started) * 1e3 / max(warmup - 1, 1)  # queueing them
    stream.synchronize()
    kernel, khz = _hold_kernel(cupy)
    hold_ms = min(2.0 * host_ms * runs + 0.5, 2000.0)
    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(runs)]
    kernel((1,), (1,), (np.int64(hold_ms * khz),))
    for start, end in events:
        before()
        start.record(stream)
        once()
        end.record(stream)
    stream.synchronize()
    return [float(cupy.cuda.get_elapsed_time(start, end)) for start, end in events]


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
