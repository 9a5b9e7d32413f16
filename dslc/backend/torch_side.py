"""The PyTorch side of `dslc bench`: the checked model translated op by op to PyTorch
(`dslc.ir.to_torch`, independent of dslc's lowering and kernels), on the GPU with the same
weights, run eager, replayed as a CUDA graph, or under `torch.compile`. torch is imported here
only when these functions are called: it is an optional dependency."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dslc.core.dims import DimEnv
from dslc.ir.graph import Graph

Call = Callable[[], Any]
COMPILE_MODES = ("default", "max-autotune")


def program_on_gpu(graph: Graph, dims: Mapping[str, int], env: DimEnv | None,
                   weights: Mapping[str, np.ndarray]) -> Any:
    """The checked `graph` as a torch module at these dims, in its declared dtypes, on the GPU
    (cuDNN's autotuner on, as a tuned PyTorch deployment has it)."""
    import torch

    from dslc.ir.to_torch import to_torch

    torch.backends.cudnn.benchmark = True
    program = to_torch(graph, dims, "declared", env)
    program.load_weights(weights)
    return program.eval().cuda()


def eager(program: Any, inputs: Mapping[str, Any]) -> Call:
    import torch

    def call() -> Any:
        with torch.no_grad():
            return program(**inputs)

    return call


def cuda_graph(fn: Call) -> Call:
    """`fn` (reading fixed inputs) recorded as a CUDA graph after warm-up on a side stream, as
    PyTorch's documentation does it; the call replays it."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def compiled(program: Any, inputs: Mapping[str, Any], mode: str) -> tuple[Call, float, Any]:
    """`torch.compile(program, mode=mode)`, warmed up: the call, the seconds of compiling and
    warming up, and the outputs of the last warm-up call (cloned: later calls may reuse them);
    in the default mode replayed as a CUDA graph of ours; "max-autotune" captures its own
    graphs (each call marks a new step, so a replay may reuse the previous call's memory)."""
    import torch

    if mode not in COMPILE_MODES:
        raise ValueError(f"torch.compile mode must be one of {COMPILE_MODES}, not {mode!r}")
    fn = torch.compile(program, mode=None if mode == "default" else mode)

    def call() -> Any:
        with torch.no_grad():
            if mode != "default":
                torch.compiler.cudagraph_mark_step_begin()
            return fn(**inputs)

    start = time.perf_counter()
    for _ in range(3):
        last = call()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    last = {k: v.clone() for k, v in last.items()}
    return (cuda_graph(call) if mode == "default" else call), seconds, last


def peak_bytes(fn: Call) -> int:
    """Bytes torch allocated during one call beyond what it held before (activations)."""
    import torch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - base)


def version() -> str:
    import torch

    return str(torch.__version__)


def kernels(fn: Call, calls: int = 20) -> list[dict[str, Any]]:
    """Every GPU kernel (and copy) `fn()` runs, by name, from CUPTI through torch.profiler: its
    microseconds and launches per call, the longest first. It sees any library's kernels
    (cuDNN's, CuPy's and dslc's own as well as PyTorch's): where a model's time goes inside a
    replayed CUDA graph, which a per-step profile times only step by step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)
        if us > 0:
            rows.append({"name": e.key, "us": us / calls, "launches": e.count / calls})
    return sorted(rows, key=lambda r: -r["us"])
