"""Measure the plans of one group graph on the GPU: every candidate built and timed with CUDA
events (warm-up, then the median of 15 runs queued behind a kernel that holds the GPU, so the
host's launch time does not count, with the L2 cache flushed before each run so it does not
flatter: `backend.timing.gpu_ms`), and its output checked against the
reference before it may win. A candidate that fails to build, run or match counts as infinitely
slow. The heuristics' choice is kept unless another plan beats it beyond noise.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dslc.backend.device import STORED_AS, decode, encode, require, run_reference
from dslc.backend.fused import Plan, run
from dslc.backend.spec import GroupSpec
from dslc.backend.timing import gpu_ms
from dslc.core.types import FP8
from dslc.ir.graph import Node
from dslc.ir.interp import ITEMSIZE
from dslc.ir.storage import Storage
from dslc.ops import fp8
from dslc.ops.attention import named_operands

NOISE = 0.03  # a plan must beat the heuristics' choice by more than this to replace it
# Candidates timed of the heuristics' list (past these, only until one is valid). Measured on
# the H200 at batch 32 with every candidate timed (`scripts/profile_tune.py`): the fastest of the
# first 6 was 0.08% (geomean; 1.6% at worst) slower than the fastest of all over ResNet-50's 25
# graphs, 1.66% (12.3%) over ResNet-18's 16, whose small graphs' fastest knobs of engine 41 came
# later (the first 16: 0.67%, 6.6%). ResNet-50 at three buckets tuned in 12.4 s with the first 6
# (1.042 over the heuristics' choice, as the full search's 1.043-1.050), and past 100 s with 16:
# some candidates (a runtime-compiled engine) build for a second each.
FIRST = 6
TOLERANCE = {"f32": 5e-3, "f16": 2e-2, "bf16": 4e-2}
L2_FLUSH_BYTES = 128 << 20  # twice the H200's 60 MB L2
# An fp8 output's: one unit in the last place at its largest value, relative to it (3 and 2
# mantissa bits: at most 2^-3 and 2^-2). Engines computing a GELU or a norm before the
# quantising cast differ by last bits in f32, and a value at a rounding boundary then lands one
# fp8 step apart: held to f16's 2e-2, the fp8 GPT blocks' fastest plans (their heuristics'
# choices) were refused and tuning kept one 4.6x slower (H200, 2026-12-03).
FP8_TOLERANCE = {"f8e4m3": 0.13, "f8e5m2": 0.26}


def tolerance(spec: GroupSpec) -> float:
    """How far a plan's outputs may be from the reference (relative to each output's largest
    value): the group's io dtype's, or an fp8 output's where it has one."""
    return max([TOLERANCE.get(spec.io, 2e-2), *(FP8_TOLERANCE[t.dtype] for t in spec.tensors
                                                 if t.role == "output" and t.dtype in FP8)])


@dataclass
class Candidate:
    index: int
    engine_id: int | None
    knobs: dict[str, int]
    ms: float = math.inf
    error: float | None = None  # relative error against the reference
    note: str = ""


@dataclass
class TuneResult:
    candidates: list[Candidate] = field(default_factory=list)
    chosen: Candidate | None = None
    heuristic: Candidate | None = None
    serialized: bytes | None = None
    workspace: int = 0
    seconds: float = 0.0

    @property
    def speedup(self) -> float:
        if self.chosen is None or self.heuristic is None or not math.isfinite(self.heuristic.ms):
            return 1.0
        return self.heuristic.ms / self.chosen.ms

    def record(self, top: int = 5) -> dict[str, Any]:
        """What the bundle and the tuning database keep."""
        ranked = sorted((c for c in self.candidates if math.isfinite(c.ms)), key=lambda c: c.ms)
        chosen, heur = self.chosen, self.heuristic
        return {
            "engine_id": chosen.engine_id if chosen else None,
            "knobs": dict(chosen.knobs) if chosen else {},
            "ms": chosen.ms if chosen else None,
            "error": chosen.error if chosen else None,
            "heuristic": ({"engine_id": heur.engine_id, "knobs": dict(heur.knobs), "ms": heur.ms}
                          if heur else None),
            "top": [{"engine_id": c.engine_id, "knobs": dict(c.knobs), "ms": c.ms,
                     "error": c.error} for c in ranked[:top]],
            "candidates": len(self.candidates),
            "tuned": True,
            "tune_s": round(self.seconds, 3),
        }


class Bench:
    """Device buffers for one group at one size: random inputs, outputs, the reference."""

    def __init__(self, spec: GroupSpec, nodes: Mapping[str, Node], storage: Mapping[str, Storage],
                 cupy: Any, seed: int = 0) -> None:
        self.cupy = cupy
        self.spec = spec
        self.nodes = nodes
        self.storage = storage
        rng = cupy.random.default_rng(seed)
        lengths = sequence_lengths(spec)
        self.buffers: dict[str, Any] = {}  # raw device memory by tensor name
        self.logical: dict[str, Any] = {}  # f32 logical views of the inputs (reference operands)
        for t in spec.tensors:
            if t.role not in ("input", "output"):
                continue
            s = storage[t.name]
            span = (1 + sum((d - 1) * st for d, st in zip(s.shape, s.strides, strict=True))
                    if all(s.shape) else 1)
            buf = cupy.zeros(span * ITEMSIZE[s.dtype], dtype=cupy.uint8)
            self.buffers[t.name] = buf
            if t.role == "input":
                values = rng.standard_normal(span, dtype=cupy.float32) * 0.5
                self._fill(buf, values, s.dtype)
                if t.name in lengths:
                    buf.view(cupy.int32)[...] = lengths[t.name]
                self.logical[t.name] = self._read(t.name)
        self.flush = cupy.empty(L2_FLUSH_BYTES, dtype=cupy.uint8)

    def _fill(self, buf: Any, values: Any, dtype: str) -> None:
        if dtype in ("bf16", "f16", "f32"):
            stored = encode(self.cupy, values, dtype)
            buf.view(stored.dtype)[...] = stored
        elif dtype in FP8:  # random fp8 values too, as their bytes
            buf[...] = fp8.to_bits(self.cupy, values, dtype)
        else:  # integers and masks: zeros (an index always in range)
            buf.view(self.cupy.uint8)[...] = 0

    def _read(self, name: str) -> Any:
        """A tensor in its logical shape: floats (fp8 too) as f32, integers as they are. Read
        through the dtype it is stored as: through f32, an fp8 tensor's bytes were read four
        to the element, past its buffer (an illegal memory access when tuning fp8 graphs)."""
        cupy = self.cupy
        s = self.storage[name]
        stored = self.buffers[name].view(cupy.dtype(STORED_AS[s.dtype]))
        flat = fp8.from_bits(cupy, stored, s.dtype) if s.dtype in FP8 else \
            decode(cupy, stored, s.dtype)
        item = flat.dtype.itemsize
        return cupy.lib.stride_tricks.as_strided(flat, s.shape,
                                                  tuple(st * item for st in s.strides)).copy()

    def reference(self) -> dict[str, Any]:
        """The group's outputs from the ops' references run on CuPy, rounded as stored."""
        cupy = self.cupy
        values = dict(self.logical)
        for t in self.spec.tensors:
            if t.role == "scalar":
                values[t.name] = cupy.asarray(t.value, dtype=cupy.float32)
        for op in self.spec.ops:
            values[op.node] = run_reference(cupy, op.op, [values[i] for i in op.inputs], op.attrs,
                                            self.spec.tensor(op.node).dtype)
        return {t.name: values[t.name] for t in self.spec.tensors if t.role == "output"}

    def pack(self) -> dict[int, int]:
        return {t.uid: int(self.buffers[t.name].data.ptr) for t in self.spec.tensors
                if t.role in ("input", "output")}

    def outputs(self) -> dict[str, Any]:
        return {t.name: self._read(t.name) for t in self.spec.tensors if t.role == "output"}


def sequence_lengths(spec: GroupSpec) -> dict[str, int]:
    """The sequence lengths an sdpa of the group reads (`kv_len`, `q_len`), each at its full
    extent: the keys' or queries' length. (Zeros, as other integers are filled, left every
    query no key: the attention was timed doing nothing, and checked on NaN.)"""
    out = {}
    for op in spec.ops:
        if op.op == "sdpa":
            named = named_operands(op.attrs, op.inputs)
            for length, of in (("kv_len", "k"), ("q_len", "q")):
                if length in named:
                    out[named[length]] = int(spec.tensor(named[of]).dims[2])
    return out


def relative_error(cupy: Any, got: Mapping[str, Any], want: Mapping[str, Any]) -> float:
    """The largest difference of each output from the reference, relative to the reference's
    largest magnitude, worst over the outputs. NaN and infinities must fall where the
    reference's do (a NaN compares false: a plan writing NaN was once counted exact), and are
    then left out of both."""
    worst = 0.0
    for name, w in want.items():
        if not w.size:
            continue
        g, w = got[name].astype(cupy.float32), w.astype(cupy.float32)
        same = g == w  # equal infinities too
        if bool(((cupy.isnan(g) != cupy.isnan(w)) | (cupy.isinf(w) & ~same)).any()):
            return math.inf
        finite = cupy.isfinite(w)
        differ = finite & ~same
        scale = float(cupy.abs(cupy.where(finite, w, 0)).max())
        diff = float(cupy.abs(cupy.where(differ, g, 0) - cupy.where(differ, w, 0)).max())
        worst = max(worst, diff / max(scale, 1e-30))
    return worst


def time_plan(graph: Any, bench: Bench, workspace: Any, handle: Any, max_runs: int = 15) -> float:
    """Median milliseconds of `graph.execute` on the GPU, L2 flushed before each run."""
    pack = bench.pack()
    ws = int(workspace.data.ptr)
    return _median_ms(lambda: graph.execute(pack, ws, handle=handle), bench, max_runs)


def _median_ms(once: Callable[[], object], bench: Bench, max_runs: int = 15) -> float:
    """Median milliseconds the GPU spends in `once()` (`backend.timing.gpu_ms`: after 3
    warm-up runs, the L2 flushed before each, the host's launch time not counted)."""
    return statistics.median(gpu_ms(bench.cupy, once, lambda: bench.flush.fill(1), max_runs))


def check_and_time(graph: Any, bench: Bench, want: Mapping[str, Any], handle: Any,
                   tolerance: float, workspace: Any) -> tuple[float, float, Any]:
    """Run the graph's built plan once, compare its outputs with the reference, and time it if
    they match: (milliseconds, or infinity when wrong; relative error; the workspace, grown to
    the plan's size)."""
    cupy = bench.cupy
    size = int(graph.get_workspace_size())
    if size > workspace.nbytes:
        workspace = cupy.empty(size, dtype=cupy.uint8)
    graph.execute(bench.pack(), int(workspace.data.ptr), handle=handle)
    cupy.cuda.get_current_stream().synchronize()
    error = relative_error(cupy, bench.outputs(), want)
    if not error <= tolerance:
        return math.inf, error, workspace
    return time_plan(graph, bench, workspace, handle), error, workspace


def time_kernel(p: Plan, bench: Bench, outputs: Sequence[str],
                tolerance: float) -> tuple[float, float]:
    """One pointwise kernel (`backend.fused`) over the buffers the group's graph is measured
    in: its outputs checked against the reference as a plan's are, then timed as a plan is (L2
    flushed before each run, the median): (milliseconds, or infinity when wrong; relative
    error)."""
    return time_launch(lambda xs, ys: run(p, xs, ys), [o.name for o in p.operands], bench,
                       outputs, tolerance)


def time_launch(launch: Callable[[list[Any], list[Any]], None], operands: Sequence[str],
                bench: Bench, outputs: Sequence[str], tolerance: float) -> tuple[float, float]:
    """`launch(inputs, outputs)` (a fallback kernel: views of the named buffers) checked and
    timed as `time_kernel`'s kernel is."""
    cupy = bench.cupy

    def view(name: str) -> Any:
        s = bench.storage[name]
        dt = cupy.dtype(STORED_AS[s.dtype])
        return cupy.ndarray(s.shape, dt, memptr=bench.buffers[name].data,
                            strides=tuple(st * dt.itemsize for st in s.strides))

    xs = [view(name) for name in operands]  # a step's scalars are constants of the kernel
    ys = [view(n) for n in outputs]
    want = bench.reference()
    launch(xs, ys)
    cupy.cuda.get_current_stream().synchronize()
    error = relative_error(cupy, bench.outputs(), want)
    if not error <= tolerance:
        return math.inf, error
    return _median_ms(lambda: launch(xs, ys), bench), error


def tune_graph(make: Any, spec: GroupSpec, bench: Bench, handle: Any, budget_s: float,
               tolerance: float, extra: list[tuple[int, dict[str, int]]] | None = None,
               first: int | None = None) -> TuneResult:
    """Build every candidate of `make()` (the heuristics' list, plus `extra` (engine_id, knobs)
    pairs), or the `first` of them and then only until one is valid; check each against the
    reference, time the valid ones, pick the fastest."""
    from dslc.backend.graphs import HEURISTICS, _knobs_in, knobs_out

    cupy = bench.cupy
    started = time.perf_counter()
    out = TuneResult()
    graph = make()
    graph.create_execution_plans(HEURISTICS)
    def key(engine_id: Any, knobs: dict[Any, Any]) -> tuple[int, tuple[tuple[str, int], ...]]:
        return int(engine_id), tuple(sorted(knobs_out(knobs).items()))

    seen = {key(*graph.get_engine_and_knobs_at_index(i))
            for i in range(graph.get_execution_plan_count())}
    for engine_id, knobs in extra or []:
        if key(engine_id, knobs) in seen:
            continue
        seen.add(key(engine_id, knobs))
        try:
            graph.create_execution_plan(engine_id, _knobs_in(knobs))
        except Exception:
            continue
    count = graph.get_execution_plan_count()
    want = bench.reference()
    workspace = cupy.empty(256, dtype=cupy.uint8)
    for index in range(count):
        if time.perf_counter() - started > budget_s and out.heuristic is not None:
            break
        if first is not None and index >= first and any(math.isfinite(c.ms)
                                                         for c in out.candidates):
            break
        engine_id, knobs = graph.get_engine_and_knobs_at_index(index)
        cand = Candidate(index, int(engine_id), knobs_out(knobs))
        out.candidates.append(cand)
        try:
            graph.build_plan_at_index(index)
            ms, cand.error, workspace = check_and_time(graph, bench, want, handle, tolerance,
                                                       workspace)
        except Exception as err:
            cand.note = str(err).strip().splitlines()[0][:160] if str(err).strip() else "failed"
            continue
        if not math.isfinite(ms):
            cand.note = f"wrong result (relative error {cand.error:.2e})"
            if out.heuristic is None:
                out.heuristic = cand
            continue
        cand.ms = ms
        if out.heuristic is None:
            out.heuristic = cand
    valid = [c for c in out.candidates if math.isfinite(c.ms)]
    if valid:
        best = min(valid, key=lambda c: c.ms)
        heur = out.heuristic
        keep = heur is not None and math.isfinite(heur.ms) and best.ms >= heur.ms * (1 - NOISE)
        out.chosen = heur if keep else best
        assert out.chosen is not None
        graph.build_plan_at_index(out.chosen.index)
        out.workspace = int(graph.get_workspace_size())
        out.serialized = bytes(graph.serialize(as_bytes=True))
    out.seconds = time.perf_counter() - started
    return out



def tune_spec(spec: GroupSpec, nodes: Mapping[str, Node], storage: Mapping[str, Storage],
              handle: Any, budget_s: float, search: str = "heuristics") -> TuneResult:
    """Measure the candidates of one graph (`search="exhaustive"` adds the library's engine x
    knob space after the heuristics' list; the time budget bounds how much of it is tried)."""
    from dslc.backend.graphs import knob_space, make_graph

    cupy, _ = require()
    bench = Bench(spec, nodes, storage, cupy)
    exhaustive = search == "exhaustive"
    extra = knob_space(make_graph(spec, handle)) if exhaustive else []
    return tune_graph(lambda: make_graph(spec, handle), spec, bench, handle, budget_s,
                      tolerance(spec), extra, None if exhaustive else FIRST)
