"""`bench`: a loaded model timed at each chosen size (plain calls, CUDA-graph replay, per-step
profile with its roofline), and optionally the same model in PyTorch in this process (eager,
CUDA graph, `torch.compile`) with its outputs compared. Returns plain data (the JSON report).

Everything is timed by `dslc.backend.timing.median_ms` on the same stream; per-step times come
from `Model.profile` (CUDA events around each step of plain calls), so their sum is above the
replay's total by the launch gaps between steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dslc.backend import environment, target, timing, torch_side
from dslc.bench.inputs import random_inputs, rel_error, tolerance
from dslc.bench.roofline import Peaks, by_time_lost, step_line, totals
from dslc.core.dims import DimEnv, bucket_key
from dslc.core.errors import RunnerError
from dslc.ir.cost import Sizes, step_cost
from dslc.ir.graph import Graph, Node
from dslc.runtime import Model
from dslc.runtime.schedule import Schedule

Progress = Callable[[str], None]


@dataclass
class BenchOptions:
    sizes: list[dict[str, int]]
    repeats: int = 30  # timed calls per median
    warmup: int = 5
    profile_repeats: int = 10  # runs of the per-step profile
    torch_compile: str | None = "default"  # with a reference: torch.compile's mode, or None
    seed: int = 0  # of the random inputs
    kernels: bool = False  # also the GPU kernels of a replay, each side's (`torch_side.kernels`)


@dataclass
class Reference:
    """The checked model, for the PyTorch translation, and the weights both sides load."""

    graph: Graph
    env: DimEnv
    weights: Mapping[str, np.ndarray] = field(default_factory=dict)


def bench(model: Model, options: BenchOptions, reference: Reference | None = None,
          progress: Progress | None = None) -> dict[str, Any]:
    say: Progress = progress or _silent
    live = environment.live()
    known = target.peaks(str(live["device_name"]))
    peaks = Peaks.from_data(str(live["device_name"]), known) if known is not None else None
    rows = []
    for i, dims in enumerate(options.sizes):
        where = f"[{i + 1}/{len(options.sizes)}] {bucket_key(dims)}"
        rows.append(_bench_size(model, dims, options, reference, peaks, _prefixed(say, where)))
    versions = {"cudnn_backend": live.get("cudnn_backend"),
                "cudnn_frontend": live.get("cudnn_frontend"), "driver": live.get("driver"),
                "cuda_runtime": live.get("cuda_runtime"),
                "torch": torch_side.version() if reference is not None else None}
    return {"model": model.bundle.model, "bundle": str(model.path), "device": live["device_name"],
            "versions": versions, "repeats": options.repeats,
            "peaks": None if peaks is None else {"tensor_tflops": dict(peaks.tensor_tflops),
                                                 "vector_tflops": peaks.vector_tflops,
                                                 "memory_gbps": peaks.memory_gbps},
            "torch_compile": options.torch_compile if reference is not None else None,
            "sizes": rows}


def _silent(text: str) -> None:
    pass


def _prefixed(say: Progress, where: str) -> Progress:
    return lambda text: say(f"{where}: {text}")


def _bench_size(model: Model, dims: dict[str, int], options: BenchOptions,
                reference: Reference | None, peaks: Peaks | None,
                say: Progress) -> dict[str, Any]:
    program = model.program
    host = random_inputs(program, dims, options.seed)
    declared = {name: program.nodes[node] for name, node in program.inputs.items()}
    kind = "torch" if reference is not None or any(
        n.type.dtype == "bf16" for n in declared.values()) else "cupy"
    inputs = {name: timing.upload(a, declared[name].type.dtype, _order(declared[name]), kind)
              for name, a in host.items()}
    say("first call (plans restored or built)")
    start = time.perf_counter()
    ours = model.run(inputs)
    timing.synchronize()
    first_s = time.perf_counter() - start
    ours_host = {k: timing.to_host(v) for k, v in ours.items()}
    say("dslc plain calls (a CUDA graph replayed from the second call on)")
    dslc: dict[str, Any] = {"plain_ms": timing.median_ms(lambda: model.run(inputs),
                                                         options.repeats, options.warmup),
                            "first_call_s": first_s, "graph_ms": None, "graph_call_ms": None,
                            "graph_error": None}
    say("dslc plain calls step by step (cuda_graphs=False)")
    graphs, model.cuda_graphs = model.cuda_graphs, False
    try:
        dslc["steps_ms"] = timing.median_ms(lambda: model.run(inputs), options.repeats,
                                            options.warmup)
    finally:
        model.cuda_graphs = graphs
    say("dslc CUDA-graph replay")
    try:
        captured = model.capture(inputs)
        # As PyTorch's graph is timed: a replay over inputs already in place. A call with
        # new inputs also copies them in (`graph_call_ms`).
        dslc["graph_ms"] = timing.median_ms(captured.replay, options.repeats, options.warmup)
        dslc["graph_call_ms"] = timing.median_ms(lambda: captured(inputs), options.repeats,
                                                 options.warmup)
        if options.kernels:
            say("dslc's kernels (CUPTI)")
            dslc["kernels"], dslc["kernels_error"] = _kernels(captured.replay)
    except RunnerError as err:  # R0803: fallback kernels CuPy will not capture
        dslc["graph_error"] = str(err)
    dslc["activation_bytes"] = _activation_bytes(model, dims)
    say("per-step profile")
    profile = model.profile(inputs, repeats=options.profile_repeats)
    row: dict[str, Any] = {"dims": dict(dims), "dslc": dslc,
                           "roofline": _roofline(program, dims, profile, peaks),
                           "torch": None, "outputs": None}
    if reference is not None:
        row["torch"], theirs = _torch(reference, dims, inputs, options, say)
        row["outputs"] = _compare(program, ours_host, theirs)
    return row


def _order(node: Node) -> tuple[int, ...] | None:
    layout = node.type.layout
    return layout.order if layout is not None else None


def _activation_bytes(model: Model, dims: dict[str, int]) -> int:
    """The arena, the workspace and the outputs at these dims (weights excluded)."""
    exe = model.executable(dims)
    outputs = {exe.storage(v).base for v in model.program.outputs.values()}
    return int(exe.memory.arena + exe.workspace.nbytes +
               sum(exe.storage(v).nbytes for v in outputs if v not in model.program.load_time))


def _roofline(program: Schedule, dims: dict[str, int], profile: list[dict[str, Any]],
              peaks: Peaks | None) -> dict[str, Any] | None:
    sizes = Sizes(program.nodes, dims, program.env)
    costs = [step_cost(sizes, s.nodes, s.inputs, s.outputs) for s in program.steps]
    if peaks is None:
        return {"steps": None, "totals": None, "flops": sum(c.flops for c in costs),
                "bytes": sum(c.bytes for c in costs)}
    # A step CuPy would not record in a CUDA graph was timed as a launch (its Python counted).
    lines = [step_line(r["step"], r["kind"] if r.get("timed", "graph") == "graph"
                       else f"{r['kind']} (launch)", r["ms"], c, peaks)
             for r, c in zip(profile, costs, strict=True)]
    return {"steps": [x.to_data() for x in by_time_lost(lines)],
            "totals": totals(lines).to_data()}


def _torch(reference: Reference, dims: dict[str, int], inputs: Mapping[str, Any],
           options: BenchOptions, say: Progress) -> tuple[dict[str, Any], dict[str, Any]]:
    """PyTorch's times and its outputs (eager, and compiled where it ran) on the host."""
    say("PyTorch eager")
    program = torch_side.program_on_gpu(reference.graph, dims, reference.env, reference.weights)
    call = torch_side.eager(program, inputs)
    outputs = {"eager": {k: timing.to_host(v) for k, v in call().items()}}
    out: dict[str, Any] = {"eager_ms": timing.median_ms(call, options.repeats, options.warmup),
                           "peak_bytes": torch_side.peak_bytes(call), "graph_ms": None,
                           "graph_error": None, "compile_mode": options.torch_compile,
                           "compile_ms": None, "compile_s": None, "compile_error": None}
    say("PyTorch CUDA graph")
    try:
        replay = torch_side.cuda_graph(call)
        out["graph_ms"] = timing.median_ms(replay, options.repeats, options.warmup)
        if options.kernels:
            say("PyTorch CUDA graph's kernels (CUPTI)")
            out["graph_kernels"], out["graph_kernels_error"] = _kernels(replay)
    except RuntimeError as err:  # an op that cannot be captured
        out["graph_error"] = str(err).splitlines()[0] if str(err) else type(err).__name__
    if options.torch_compile is not None:
        say(f"torch.compile ({options.torch_compile}), compiling")
        try:
            fn, out["compile_s"], last = torch_side.compiled(program, inputs,
                                                             options.torch_compile)
            outputs["compile"] = {k: timing.to_host(v) for k, v in last.items()}
            say(f"torch.compile ({options.torch_compile}), timing")
            out["compile_ms"] = timing.median_ms(fn, options.repeats, options.warmup)
            if options.kernels:
                say(f"torch.compile ({options.torch_compile})'s kernels (CUPTI)")
                out["compile_kernels"], out["compile_kernels_error"] = _kernels(fn)
        except Exception as err:  # inductor's failures are many; the rest of the run stands
            out["compile_error"] = _failure(err)
    return out, outputs


def _kernels(fn: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    """`torch_side.kernels` of `fn`, or why the profiler gave none: a side's times stand
    whatever the listing does."""
    try:
        return torch_side.kernels(fn), None
    except Exception as err:  # the profiler's failures are many (CUPTI busy, no CUDA build)
        return None, _failure(err)


def _failure(err: Exception) -> str:
    """One line of a failure another library raised: its type and its message's first line."""
    first = str(err).splitlines()[0][:200] if str(err) else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _compare(program: Schedule, ours: Mapping[str, np.ndarray],
             theirs: Mapping[str, Mapping[str, np.ndarray]]) -> list[dict[str, Any]]:
    """Each output of dslc against PyTorch eager (and compiled), at its dtype's tolerance."""
    rows = []
    for name in program.outputs:
        dtype = program.nodes[program.outputs[name]].type.dtype
        eager = rel_error(ours[name], theirs["eager"][name])
        compiled = (rel_error(ours[name], theirs["compile"][name])
                    if "compile" in theirs else None)
        tol = tolerance(dtype)
        rows.append({"name": name, "dtype": dtype, "rel_error_eager": eager,
                     "rel_error_compile": compiled, "tolerance": tol,
                     "within": bool(eager <= tol and (compiled is None or compiled <= tol))})
    return rows
