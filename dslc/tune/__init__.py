"""Tune: for each distinct group graph and bucket of a bundle, measure the plans on this GPU and
keep the fastest that is correct; results go to the bundle and to the tuning database, which
later builds (of this model or any other with the same groups) reuse.

`tune_payload` is what `dslc tune BUNDLE` and `dslc compile` on a GPU run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dslc.backend import environment
from dslc.backend.device import require
from dslc.backend.measure import tune_spec
from dslc.backend.spec import GroupSpec
from dslc.runtime.schedule import Program
from dslc.tune.db import TuningDB, env_key, spec_key

LOG = logging.getLogger("dslc.tune")


@dataclass
class Row:
    bucket: str
    signature: str
    group: str
    heuristic_ms: float | None
    tuned_ms: float | None
    error: float | None
    source: str  # tuned | database | untimed (over budget) | failed
    candidates: int = 0


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0

    def geomean_speedup(self) -> float:
        ratios = [r.heuristic_ms / r.tuned_ms for r in self.rows if r.heuristic_ms and r.tuned_ms
                  and math.isfinite(r.heuristic_ms) and math.isfinite(r.tuned_ms)]
        return math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else 1.0


def tune_payload(payload: dict[str, Any], db: TuningDB | None = None, budget_s: float = 20.0,
                 model_budget_s: float = 600.0, search: str = "heuristics",
                 progress: Callable[[str], None] | None = None) -> Report:
    """Tune every (bucket, graph) of a bundle in place; returns the per-graph report."""
    from dslc.backend.graphs import build

    _, cudnn = require()
    handle = cudnn.create_handle()
    live = environment.live(properties=True)
    env = env_key(live)
    program = Program(payload)
    names = {s.signature: s.name for s in program.steps}
    report = Report()
    started = time.perf_counter()
    total = sum(len(b["graphs"]) for b in payload["buckets"])
    done = 0
    for bucket in payload["buckets"]:
        storage = program.layout(bucket["dims"]).storage
        for signature, entry in bucket["graphs"].items():
            done += 1
            spec = GroupSpec.from_data(entry["spec"])
            key = spec_key(spec)
            group = names.get(signature, signature)
            if progress:
                progress(f"[{done}/{total}] {bucket['key']} {group}")
            plan = entry["plan"]
            record = db.get(env, key) if db is not None else None
            if record is not None and record.get("engine_id") is not None:
                built = build(spec, handle, engine=(record["engine_id"], record["knobs"]))
                if built.has_plan:
                    plan.update(record)
                    plan.update(serialized=built.serialized, workspace=built.workspace,
                                reused=True)
                    report.rows.append(Row(bucket["key"], signature, group,
                                           (record.get("heuristic") or {}).get("ms"),
                                           record.get("ms"), record.get("error"), "database",
                                           record.get("candidates", 0)))
                    continue
            if time.perf_counter() - started > model_budget_s:
                report.rows.append(Row(bucket["key"], signature, group, None, None, None,
                                       "untimed (over budget)"))
                continue
            try:
                result = tune_spec(spec, program.nodes, storage, handle, budget_s, search)
            except Exception as err:
                LOG.warning("%s at %s: tuning failed (%s); the saved plan stays", group,
                            bucket["key"], err)
                report.rows.append(Row(bucket["key"], signature, group, None, None, None, "failed"))
                continue
            if result.chosen is None:
                report.rows.append(Row(bucket["key"], signature, group, None, None, None, "failed",
                                       len(result.candidates)))
                continue
            record = result.record()
            plan.update(record)
            plan.update(serialized=result.serialized, workspace=result.workspace, reused=False)
            if db is not None:
                db.put(env, key, record)
            heur = result.heuristic.ms if result.heuristic else None
            report.rows.append(Row(bucket["key"], signature, group, heur, result.chosen.ms,
                                   result.chosen.error, "tuned", len(result.candidates)))
    payload["environment"] = live
    report.seconds = time.perf_counter() - started
    return report


def format_report(report: Report) -> str:
    lines = [f"{'bucket':<16} {'group':<28} {'heuristic ms':>12} {'tuned ms':>9} {'speedup':>8} "
             f"{'rel err':>8}  source"]
    for r in report.rows:
        h = f"{r.heuristic_ms:.4f}" if r.heuristic_ms and math.isfinite(r.heuristic_ms) else "-"
        t = f"{r.tuned_ms:.4f}" if r.tuned_ms else "-"
        s = (f"{r.heuristic_ms / r.tuned_ms:.2f}" if r.heuristic_ms and r.tuned_ms
             and math.isfinite(r.heuristic_ms) else "-")
        e = f"{r.error:.1e}" if r.error is not None else "-"
        lines.append(f"{r.bucket:<16} {r.group[:28]:<28} {h:>12} {t:>9} {s:>8} {e:>8}  {r.source}")
    lines.append(f"geomean speedup over the heuristics' choice: {report.geomean_speedup():.3f}; "
                 f"{report.seconds:.1f} s")
    return "\n".join(lines)
