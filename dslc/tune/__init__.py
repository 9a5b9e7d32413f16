"""Tune: for each distinct group graph and bucket of a bundle, measure the plans on this GPU and
keep the fastest that is correct; results go to the bundle and to the tuning database, which
later builds (of this model or any other with the same groups) reuse.

`tune` is what `dslc tune BUNDLE` and `dslc compile` on a GPU run: it returns plan records,
and `tuned_bundle` puts them into the bundle's records (nothing is edited in place).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dslc.backend import environment, gemv
from dslc.backend.device import require
from dslc.backend.kernels import run_kernel
from dslc.backend.measure import Bench, time_kernel, time_launch, tolerance, tune_spec
from dslc.backend.spec import GroupSpec
from dslc.runtime.records import Bundle, Environment, PlanRecord, StepRecord
from dslc.runtime.schedule import Schedule
from dslc.runtime.tuningdb import TuningStore, env_key, measured, spec_key

LOG = logging.getLogger("dslc.tune")

# CUDA errors after which the process's context is lost: every later call fails the same way.
# Tuning stops at the first and says so once (on the H200 an fp8 read past its buffer failed
# every graph after it, one warning each, 2026-12-03).
CONTEXT_LOST = ("illegal memory access", "ILLEGAL_ADDRESS", "IllegalAddress",
                "misaligned address", "illegal instruction", "unspecified launch failure")


class ContextLost(RuntimeError):
    """The GPU's context was lost while tuning a graph (`CONTEXT_LOST`)."""


@dataclass
class Row:
    bucket: str
    signature: str
    group: str
    heuristic_ms: float | None
    tuned_ms: float | None
    error: float | None
    source: str  # tuned | database | untimed (over budget) | untimed (GPU context lost) | failed
    candidates: int = 0
    gpu: int | None = None  # which GPU measured it, when tuning across several (`gpus`)


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0

    def geomean_speedup(self) -> float:
        ratios = [r.heuristic_ms / r.tuned_ms for r in self.rows if r.heuristic_ms and r.tuned_ms
                  and math.isfinite(r.heuristic_ms) and math.isfinite(r.tuned_ms)]
        return math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else 1.0


@dataclass(frozen=True)
class Tuned:
    """What tuning chose: a plan record per (bucket key, group signature) it measured or found in
    the database, and the environment it measured in."""

    plans: Mapping[tuple[str, str], PlanRecord]
    environment: Environment
    report: Report


def tune(bundle: Bundle, db: TuningStore | None = None, budget_s: float = 20.0,
         model_budget_s: float = 600.0, search: str = "heuristics",
         progress: Callable[[str], None] | None = None,
         only: Collection[tuple[str, str]] | None = None) -> Tuned:
    """Measure every (bucket, graph) of a bundle on this GPU (or those of `only`, by bucket key
    and signature: one GPU's share, `dslc.tune.gpus`); the bundle is not changed (`tuned_bundle`
    makes the tuned one)."""
    handle, live, program = _on_this_gpu(bundle)
    env = env_key(live)
    names = {s.signature: s.name for s in program.steps}
    report = Report()
    plans: dict[tuple[str, str], PlanRecord] = {}
    started = time.perf_counter()
    chosen = {(b.key, sig) for b in bundle.buckets for sig in b.graphs
              if only is None or (b.key, sig) in only}
    total = len(chosen)
    done = 0
    lost: str | None = None  # where the context was lost: the rest keep their saved plans
    for bucket in bundle.buckets:
        if not any(key == bucket.key for key, _ in chosen):
            continue
        storage = program.memory_plan(dict(bucket.dims)).storage
        for signature, entry in bucket.graphs.items():
            if (bucket.key, signature) not in chosen:
                continue
            done += 1
            group = names.get(signature, signature)
            if progress:
                progress(f"[{done}/{total}] {bucket.key} {group}")
            spec = GroupSpec.from_data(entry.spec.to_data())
            if lost is not None:
                row, plan = (None, None, None, "untimed (GPU context lost)"), None
            else:
                try:
                    row, plan = _tune_one(spec, program, storage, handle, db,
                                          (env, live.driver),
                                          time.perf_counter() - started > model_budget_s,
                                          (budget_s, search, f"{group} at {bucket.key}"))
                except ContextLost as err:
                    lost = str(err)
                    LOG.error("tuning stopped: the GPU's context was lost at %s; every graph "
                              "not tuned yet keeps its saved plan (a defect of dslc or cuDNN: "
                              "please report it with the bundle)", lost)
                    row, plan = (None, None, None, "failed"), None
            report.rows.append(Row(bucket.key, signature, group, *row))
            if plan is not None:
                plans[(bucket.key, signature)] = entry.plan.updated(  # measured: it ran here
                    {**plan.to_data(), "built_on_device": True},
                    f"buckets.{bucket.key}.graphs.{signature}.plan")
    report.seconds = time.perf_counter() - started
    return Tuned(plans, live, report)


def _tune_one(spec: GroupSpec, program: Schedule, storage: dict[str, Any],
              handle: Any, db: TuningStore | None, where_run: tuple[str, int | None],
              over_budget: bool,
              how: tuple[float, str, str]) -> tuple[tuple[Any, ...], PlanRecord | None]:
    """One graph at one size: its report row (after bucket, signature and group) and its new
    plan (None: the saved plan stays)."""
    from dslc.backend.graphs import build  # imports cudnn: only where tuning runs

    env, driver = where_run  # the database's environment key, this host's driver
    key = spec_key(spec)
    entry = db.get(env, key) if db is not None else None
    found = entry.plan_for(driver) if entry is not None else None
    if found is not None and found.engine_id is not None:
        if found.serialized is None:  # serialized under another driver: build it here
            built = build(spec, handle, engine=(found.engine_id, dict(found.knobs)))
            found = (replace(found, serialized=built.serialized, workspace=built.workspace)
                     if built.has_plan else None)
        if found is not None:
            return (found.heuristic.ms if found.heuristic else None, found.ms, found.error,
                    "database", found.candidates or 0), replace(found, reused=True)
    if over_budget:
        return (None, None, None, "untimed (over budget)"), None
    budget_s, search, where = how
    try:
        result = tune_spec(spec, program.nodes, storage, handle, budget_s, search)
    except Exception as err:
        if any(s in str(err) for s in CONTEXT_LOST):
            raise ContextLost(f"{where} ({err})") from err
        LOG.warning("%s: tuning failed (%s); the saved plan stays", where, err)
        return (None, None, None, "failed"), None
    if result.chosen is None:
        return (None, None, None, "failed", len(result.candidates)), None
    record = PlanRecord.from_data(result.record(), "tuned plan", tuning=True)
    plan = replace(record, serialized=result.serialized, workspace=result.workspace,
                   reused=False)
    if db is not None:
        db.put(env, key, measured(replace(plan, reused=None), driver=driver))
    heur = result.heuristic.ms if result.heuristic else None
    return (heur, result.chosen.ms, result.chosen.error, "tuned", len(result.candidates)), plan


def _on_this_gpu(bundle: Bundle) -> tuple[Any, Environment, Schedule]:
    """What measuring a bundle here needs: a cuDNN handle, this machine's environment (with
    the device's properties, as a tuned bundle records it), the bundle's schedule."""
    _, cudnn = require()
    live = Environment.from_data(environment.live(properties=True), "live environment")
    return cudnn.create_handle(), live, Schedule(bundle)


def group_measurer(bundle: Bundle, db: TuningStore | None, budget_s: float = 20.0,
                   search: str = "heuristics") -> Callable[[GroupSpec, Mapping[str, Any], str],
                                                           PlanRecord | None]:
    """A function measuring one group graph on this GPU as `tune` measures each of a bundle's
    (the database first): its tuned plan with its time, or None (`dslc.tune.fusion`)."""
    handle, live, program = _on_this_gpu(bundle)

    def measure(spec: GroupSpec, storage: Mapping[str, Any], where: str) -> PlanRecord | None:
        _, plan = _tune_one(spec, program, dict(storage), handle, db, (env_key(live), live.driver),
                            False, (budget_s, search, where))
        return plan

    return measure


def kernel_measurer(bundle: Bundle) -> Callable[[StepRecord, GroupSpec, Mapping[str, Any], str],
                                                float | None]:
    """A function measuring the one kernel of a graph step on this GPU (a pointwise group's,
    or an op's own: `tune.fusion.kernel_steps`), in the buffers its graph is measured in and
    checked against the reference as a plan is: milliseconds, or None where it failed the
    check (`dslc.tune.fusion`)."""
    cupy, _ = require()
    program = Schedule(bundle)

    def measure(step: StepRecord, spec: GroupSpec, storage: Mapping[str, Any],
                where: str) -> float | None:
        bench = Bench(spec, program.nodes, storage, cupy)
        p = program.pointwise_kernel(step)
        g = program.matmul_kernel(step)
        if p is not None:
            ms, _ = time_kernel(p, bench, step.outputs, tolerance(spec))
        elif g is not None:
            ms, _ = time_launch(lambda xs, ys: gemv.run(g, xs, ys), g.operands, bench,
                                step.outputs, tolerance(spec))
        else:
            [op] = spec.ops
            ms, _ = time_launch(lambda xs, ys: run_kernel(op.op, xs, ys[0], op.attrs),
                                op.inputs, bench, step.outputs, tolerance(spec))
        return ms if math.isfinite(ms) else None

    return measure


def tuned_bundle(bundle: Bundle, tuned: Tuned) -> Bundle:
    """The bundle with the plans tuning chose and the environment it measured in."""
    return bundle.with_plans(tuned.plans, tuned.environment)


def format_report(report: Report) -> str:
    lines = [f"{'bucket':<16} {'group':<28} {'heuristic ms':>12} {'tuned ms':>9} {'speedup':>8} "
             f"{'rel err':>8}  source"]
    for r in report.rows:
        h = f"{r.heuristic_ms:.4f}" if r.heuristic_ms and math.isfinite(r.heuristic_ms) else "-"
        t = f"{r.tuned_ms:.4f}" if r.tuned_ms else "-"
        s = (f"{r.heuristic_ms / r.tuned_ms:.2f}" if r.heuristic_ms and r.tuned_ms
             and math.isfinite(r.heuristic_ms) else "-")
        e = f"{r.error:.1e}" if r.error is not None else "-"
        on = f" (GPU {r.gpu})" if r.gpu is not None else ""
        lines.append(f"{r.bucket:<16} {r.group[:28]:<28} {h:>12} {t:>9} {s:>8} {e:>8}  "
                     f"{r.source}{on}")
    lines.append(f"geomean speedup over the heuristics' choice: {report.geomean_speedup():.3f}; "
                 f"{report.seconds:.1f} s")
    return "\n".join(lines)
