"""Plans at start-up, most to least direct: restore the serialized plan (milliseconds); if that
fails, rebuild the graph and replay the recorded (engine_id, knobs); if that fails, take the
heuristics' choice. Each fallback is logged with its reason and recorded in `startup`."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dslc.backend.spec import GroupSpec
from dslc.core.errors import RunnerError
from dslc.runtime.fields import MAX_BYTES
from dslc.runtime.records import PlanRecord


@dataclass
class Ready:
    """An executable cuDNN graph for one group signature at one size."""

    graph: Any
    spec: GroupSpec
    workspace: int
    how: str  # restored | replayed | heuristics
    seconds: float
    engine_id: int | None = None
    knobs: dict[str, int] | None = None
    kernel_cache: bool = False  # built with dynamic shapes and cuDNN's kernel cache


def plan_record(ready: Ready) -> PlanRecord:
    """What a bundle or the plan cache keeps of a ready graph; `serialized` is None when the
    plan does not serialize (start-up then replays its (engine_id, knobs))."""
    try:
        blob: bytes | None = bytes(ready.graph.serialize(as_bytes=True))
    except Exception:
        blob = None
    return PlanRecord(ready.engine_id, dict(ready.knobs or {}), ready.workspace, blob,
                      built_on_device=True)  # a Ready is a plan on this machine's GPU


def prepare(spec: GroupSpec, plan: PlanRecord | None, handle: Any, where: str,
            log: logging.Logger, kernel_cache: Any = None) -> Ready:
    """The graph for `spec`: from its recorded plan if there is one (serialized, else its
    engine and knobs at this very size), else built from the heuristics' choice (with cuDNN's
    `kernel_cache`, shared by the sizes of one group graph, when given)."""
    from dslc.backend import graphs as cbuild

    start = time.perf_counter()
    reasons = []
    if plan is not None and plan.serialized:
        try:
            g = cbuild.restore(plan.serialized, handle)
            workspace = _workspace(g, plan.workspace)
            failed = None if plan.built_on_device else _unproven(g, spec, handle, workspace)
            if failed is None:
                return Ready(g, spec, workspace, "restored",
                             time.perf_counter() - start, plan.engine_id, dict(plan.knobs))
            reasons.append(f"the serialized plan failed its first run ({failed})")
            plan = None  # its engine is the one that failed: the heuristics' next candidate
        except Exception as err:
            reasons.append(f"the serialized plan did not load ({_short(err)})")
    engine = None
    if plan is not None and plan.engine_id is not None:
        engine = (plan.engine_id, dict(plan.knobs))
    if engine is not None:
        try:
            built = cbuild.build(spec, handle, engine=engine, kernel_cache=kernel_cache)
            if built.has_plan:
                if reasons:
                    log.info("%s: %s; replayed engine %s", where, reasons[-1], engine[0])
                return Ready(built.graph, spec, built.workspace, "replayed",
                             time.perf_counter() - start, built.engine_id, built.knobs)
            reasons.append(f"engine {engine[0]} did not build ({built.note})")
        except Exception as err:
            reasons.append(f"engine {engine[0]} did not build ({_short(err)})")
    try:
        built = cbuild.build(spec, handle, kernel_cache=kernel_cache)
    except Exception as err:
        raise RunnerError("R0802", f"{where}: cuDNN rejects this graph here ({_short(err)})") from err
    if not built.has_plan:
        raise RunnerError("R0802", f"{where}: no cuDNN plan builds here ({built.note}); compile "
                          "the model on this GPU (`dslc compile --target device`), which splits "
                          "a fused group that has no plan that runs")
    why = "; ".join(reasons) if reasons else "no plan was recorded for it"
    log.info("%s: %s; took the heuristics' choice (engine %s)", where, why, built.engine_id)
    return Ready(built.graph, spec, built.workspace, "heuristics", time.perf_counter() - start,
                 built.engine_id, built.knobs)


def _unproven(graph: Any, spec: GroupSpec, handle: Any, workspace: int) -> str | None:
    """A restored plan that no device has run (a deviceless compile's): where it adds a
    residual to a conv, run it once (`graphs.fails_to_run`); engines that fail so on one GPU
    build on another and on the profile, and failed in `execute` mid-model (session 29)."""
    from dslc.backend import graphs as cbuild

    if not cbuild.adds_a_residual_to_a_conv(spec):
        return None
    return cbuild.fails_to_run(graph, spec, handle, workspace)


def _workspace(graph: Any, recorded: int) -> int:
    """The workspace a restored plan needs: what cuDNN says it needs (a recorded size may be
    smaller than the plan writes), never less than recorded, and never past `MAX_BYTES`."""
    try:
        needed = int(graph.get_workspace_size())
    except Exception:  # a frontend that does not say for a deserialized graph
        needed = recorded
    if not 0 <= needed <= MAX_BYTES:
        raise RunnerError("R0802", f"a restored plan asks for a workspace of {needed:,} bytes")
    return max(needed, recorded)


def retime(spec: GroupSpec, plan: PlanRecord, handle: Any, storage: Mapping[str, Any],
           nodes: Mapping[str, Any], where: str, log: logging.Logger) -> Ready:
    """The driver changed: rebuild the saved top candidates, check each against the reference,
    time them here, keep the fastest."""
    from dslc.backend import graphs as cbuild
    from dslc.backend.device import require
    from dslc.backend.measure import Bench, check_and_time, tolerance

    cupy, _ = require()
    start = time.perf_counter()
    bench = Bench(spec, nodes, storage, cupy)
    want = bench.reference()
    tops = [(c.engine_id, dict(c.knobs)) for c in plan.top or ()]
    if not tops and plan.engine_id is not None:
        tops = [(plan.engine_id, dict(plan.knobs))]
    best: tuple[float, Any] | None = None
    workspace = cupy.empty(256, dtype=cupy.uint8)
    for top in tops:
        try:
            built = cbuild.build(spec, handle, engine=top)
            if not built.has_plan:
                continue
            ms, _, workspace = check_and_time(built.graph, bench, want, handle,
                                              tolerance(spec), workspace)
        except Exception:
            continue
        if ms < (best[0] if best else math.inf):
            best = (ms, built)
    if best is None:
        log.info("%s: no saved candidate builds and checks out here; heuristics", where)
        return prepare(spec, None, handle, where, log)
    built = best[1]
    log.info("%s: re-timed %d saved candidates; engine %s", where, len(tops), built.engine_id)
    return Ready(built.graph, spec, built.workspace, "retimed", time.perf_counter() - start,
                 built.engine_id, built.knobs)


def measure_here(spec: GroupSpec, nodes: Mapping[str, Any], storage: Mapping[str, Any],
                 handle: Any, budget_s: float = 20.0) -> PlanRecord | None:
    """Measure the candidates of a graph here, as the tuner does (each checked against the
    reference): the fastest valid plan, with its serialized bytes and workspace, or None."""
    from dslc.backend.measure import tune_spec

    result = tune_spec(spec, nodes, storage, handle, budget_s)
    if result.chosen is None or result.serialized is None:
        return None
    return PlanRecord.from_data({**result.record(), "serialized": result.serialized,
                                 "workspace": result.workspace}, "measured plan", tuning=True)


def retune(spec: GroupSpec, nodes: Mapping[str, Any], storage: dict[str, Any], handle: Any,
           where: str, log: logging.Logger, budget_s: float = 20.0) -> Ready:
    """The GPU changed: measure the candidates here (checked against the reference)."""
    from dslc.backend import graphs as cbuild

    start = time.perf_counter()
    plan = measure_here(spec, nodes, storage, handle, budget_s)
    if plan is None or plan.serialized is None:
        log.info("%s: re-tuning found no valid plan; heuristics", where)
        return prepare(spec, None, handle, where, log)
    log.info("%s: re-tuned %s candidates; engine %s (%.3f ms)", where, plan.candidates,
             plan.engine_id, plan.ms)
    graph = cbuild.restore(plan.serialized, handle)
    return Ready(graph, spec, plan.workspace, "retuned", time.perf_counter() - start,
                 plan.engine_id, dict(plan.knobs))


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]
