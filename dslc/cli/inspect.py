"""`dslc inspect BUNDLE [--env]`: what a bundle holds (its steps, where each runs, the plans of
each bucket), or what start-up would do with it on this machine. One report, printed as text or
as one JSON document (`--format json`) whose keys are those of `bundle_report` and `env_report`."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from dslc.backend import environment, gemv
from dslc.backend.target import live_device_available
from dslc.cli import paths
from dslc.cli.front import EXIT_OK, command
from dslc.core.errors import RunnerError
from dslc.core.types import FP8
from dslc.ir.placement import placed_in, why_copied
from dslc.runtime import batches, startup
from dslc.runtime.bundle import load
from dslc.runtime.records import Bundle, Environment, PlanRecord, StepRecord
from dslc.runtime.schedule import Schedule

NO_GPU = "this machine has no GPU: start-up would stop with R0801"


def cmd_inspect(args: argparse.Namespace) -> int:
    bundle = load(paths.bundle_file(args.bundle))  # validated records
    if args.env:
        report = env_report(bundle.environment, args.on_mismatch)
        print(json.dumps(report, indent=2) if args.format == "json" else _env_text(report))
    else:
        report = bundle_report(bundle)
        print(json.dumps(report, indent=2) if args.format == "json" else _bundle_text(report))
    return EXIT_OK


def _environment(env: Environment) -> dict[str, Any]:
    """An environment's fields, less the device-properties blob (kilobytes of JSON text)."""
    return {k: v for k, v in env.to_data().items() if k != "device_properties"}


def _plan(plan: PlanRecord) -> dict[str, Any]:
    data = {k: v for k, v in plan.to_data().items() if k != "serialized"}
    return {**data, "saved": plan.serialized is not None}


def _launches(program: Schedule) -> dict[str, dict[str, str]]:
    """Per step, per bucket where the runtime runs it otherwise than alone (`runtime.batches`):
    in one launch with other small steps, or, a cache write, as its value's writers; and where
    a matmul kernel step runs (`backend.gemv.backend_of`)."""
    out: dict[str, dict[str, str]] = {}
    for bucket in program.bundle.buckets:
        slots, again = batches.plan(program, program.memory_plan(dict(bucket.dims)),
                                    bucket.key)
        for slot in slots:
            for step in slot:
                said = []
                g = program.matmul_kernel(step) if step.kind == "kernel" else None
                if g is not None and not program.runs_graph(step, bucket.key):
                    rows = math.prod(program.storage(g.x, dict(bucket.dims)).shape[:-1])
                    said.append(f"on {gemv.backend_of(g, rows)}")
                if step.name in again:
                    writers = ", ".join(w.name for w in again[step.name].writers)
                    said.append(f"runs as its value's writers ({writers}) into the cache")
                if len(slot) > 1:
                    said.append(f"one launch with {len(slot) - 1} other step"
                                + ("" if len(slot) == 2 else "s"))
                if said:
                    out.setdefault(step.name, {})[bucket.key] = "; ".join(said)
    return out


def bundle_report(bundle: Bundle) -> dict[str, Any]:
    program = Schedule(bundle)
    nodes = program.nodes
    launches = _launches(program)
    reasons = why_copied(program.graph, program.load_time)  # the whole graph's, once
    steps = []
    for i, step in enumerate(program.steps, start=1):
        plans = {b.key: _plan(b.graphs[step.signature].plan) for b in bundle.buckets
                 if program.runs_graph(step, b.key) and step.signature in b.graphs}
        runs_on = "cuDNN" if step.kind == "graph" else \
            "fallback kernel, cuDNN at " + ", ".join(plans) if plans else "fallback kernel"
        steps.append({"index": i, "name": step.name, "kind": step.kind, "runs_on": runs_on,
                      "pattern": step.pattern, "ops": [nodes[n].op for n in step.nodes],
                      "nodes": list(step.nodes), "signature": step.signature,
                      "reason": step.reason, "plans": plans,
                      "in_place": _in_place(program, step, reasons),
                      "launch": launches.get(step.name, {})})
    return {
        "model": bundle.model, "source": bundle.source, "dslc_version": bundle.dslc_version,
        "created": bundle.created, "target": bundle.target,
        "environment": _environment(bundle.environment),
        "buckets": [{"key": b.key, "arena_bytes": b.arena_bytes, "graphs": len(b.graphs),
                     "saved_plans": sum(1 for g in b.graphs.values() if g.plan.serialized)}
                    for b in bundle.buckets],
        "steps": steps,
        "fp8": _fp8(program),
    }


def _fp8(program: Schedule) -> dict[str, Any]:
    """The ops that compute in fp8 (by node, with the fp8 dtype and how weights are scaled),
    and the calibration that gives their activations' scales (None: not calibrated yet)."""
    ops = [{"node": n.name, "op": n.op, "dtype": n.attrs["precision"],
            "weight_scales": n.attrs.get("weight_scales")}
           for n in program.graph.nodes if n.attrs.get("precision") in FP8]
    c = program.bundle.calibration
    return {"ops": ops, "calibration": None if c is None else c.to_data()}


def _in_place(program: Schedule, step: StepRecord, reasons: dict[str, str]) -> dict[str, Any]:
    """Concatenation in place (`dslc.ir.placement`): which of the step's values it writes
    straight into a concat's slice, and, for a concat, which operands it still copies."""
    copies, why = {}, {}
    for name in step.nodes:
        node = program.nodes[name]
        if node.op == "concat":
            placed = placed_in(program.placement, name)
            copies[name] = [i for i in node.inputs if i not in placed]
            why.update({i: reasons[i] for i in copies[name] if i in reasons})
    return {"writes": {v: program.placement[v][0] for v in step.outputs
                       if v in program.placement}, "concat_copies": copies, "why_copied": why}


def _in_place_text(s: dict[str, Any]) -> list[str]:
    lines = [f"writes %{v} in place into its slice of %{c} (no copy)"
             for v, c in s["in_place"]["writes"].items()]
    why = s["in_place"]["why_copied"]
    for copied in s["in_place"]["concat_copies"].values():
        lines.append("copies nothing: every operand was written in place" if not copied else
                     f"copies {', '.join('%' + c for c in copied)}; any other operand was "
                     "written in place")
        lines += [f"  %{c}: {why[c]}" for c in dict.fromkeys(copied) if c in why]
    return lines


def _launch_text(launch: dict[str, str]) -> list[str]:
    """One line for every bucket alike, else a line a bucket."""
    if len(set(launch.values())) == 1:
        keys = list(launch)
        return [f"{', '.join(keys)}: {launch[keys[0]]}"]
    return [f"{key}: {text}" for key, text in launch.items()]


def _bundle_text(r: dict[str, Any]) -> str:
    env = r["environment"]
    lines = [f"model {r['model']}  (from {r['source']}, dslc {r['dslc_version']}, {r['created']})",
             f"compiled for {r['target']}: {env['device_name']} (sm {env['compute_capability']}), "
             f"cuDNN {env['cudnn_backend']}, frontend {env['cudnn_frontend']}"]
    lines += [f"bucket {b['key']}: arena {b['arena_bytes'] / 2**20:.1f} MiB, {b['graphs']} graphs, "
              f"{b['saved_plans']} with a saved plan" for b in r["buckets"]]
    lines.append(f"\n{len(r['steps'])} steps:")
    for s in r["steps"]:
        where = "cuDNN" if s["kind"] == "graph" else "OUTSIDE cuDNN (fallback kernel)" + (
            f"; cuDNN at {', '.join(s['plans'])}" if s["plans"] else "")
        lines.append(f"{s['index']:4d}. {s['name']}  [{' -> '.join(s['ops'])}]  {where}")
        for key, plan in s["plans"].items():
            state = (f"engine {plan['engine_id']} knobs {plan['knobs']}, workspace "
                     f"{plan['workspace']} B" if plan["engine_id"] is not None
                     else f"no plan yet: {plan.get('note') or 'none recorded'}")
            lines.append(f"        {key}: {state}")
        if s["reason"]:
            lines.append(f"        why: {s['reason']}")
        lines += [f"        {line}" for line in _in_place_text(s)]
        lines += [f"        {line}" for line in _launch_text(s["launch"])]
    return "\n".join(lines + _fp8_text(r["fp8"]))


def _fp8_text(r: dict[str, Any]) -> list[str]:
    if not r["ops"]:
        return []
    lines = [f"\n{len(r['ops'])} ops compute in fp8:"]
    lines += [f"  %{o['node']}  {o['op']} in {o['dtype']}"
              + (f", weights scaled {o['weight_scales'].replace('_', ' ')}"
                 if o["weight_scales"] else "") for o in r["ops"]]
    c = r["calibration"]
    if c is None:
        lines.append("not calibrated: the runner stops with R0203 (`dslc calibrate`)")
    else:
        lines.append(f"calibrated on {c['samples']} runs (samples {c['data'][:12]}, weights "
                     f"{c['weights'][:12]}):")
        lines += [f"  amax {amax:<12.6g} %{name}" for name, amax in c["amax"].items()]
    return lines


def env_report(recorded: Environment, policy: str) -> dict[str, Any]:
    """The bundle's environment against this machine's, field by field, and start-up's
    decision (`startup`: its action and why, or the error it would stop with)."""
    out: dict[str, Any] = {"recorded": _environment(recorded), "this_machine": None,
                           "fields": [], "policy": policy, "startup": None, "error": NO_GPU}
    if not live_device_available():
        return out
    live = Environment.from_data(environment.live(), "live environment")
    out["this_machine"] = _environment(live)
    for name, action in startup.FIELD_ACTION.items():
        was, now = getattr(recorded, name), getattr(live, name)
        out["fields"].append({"name": name, "recorded": was, "this_machine": now,
                              "same": str(was) == str(now), "action": action})
    try:
        decision = startup.decide(recorded, live, policy)
    except RunnerError as err:
        out["error"] = str(err)
        return out
    out["startup"] = {"action": decision.action, "explain": decision.explain()}
    out["error"] = None
    return out


def _env_text(r: dict[str, Any]) -> str:
    rec = r["recorded"]
    if rec["live"]:
        lines = [f"bundle tuned on: {rec['device_name']}, cuDNN {rec['cudnn_backend']} (frontend "
                 f"{rec['cudnn_frontend']}), CUDA {rec['cuda_runtime']}, driver "
                 f"{rec['driver_release'] or rec['driver']}"]
    else:
        lines = [f"bundle compiled deviceless (untuned) for {rec['device_name']} (sm "
                 f"{rec['compute_capability']}), cuDNN {rec['cudnn_backend']} (frontend "
                 f"{rec['cudnn_frontend']})"]
    live = r["this_machine"]
    if live is None:
        return "\n".join([*lines, r["error"]])
    lines.append(f"this machine:    {live['device_name']}, cuDNN {live['cudnn_backend']} "
                 f"(frontend {live['cudnn_frontend']}), CUDA {live['cuda_runtime']}, driver "
                 f"{live['driver']}")
    for f in r["fields"]:
        mark = "same" if f["same"] else f"changed -> {f['action']}"
        lines.append(f"  {f['name']:<20} {f['recorded']!s:<24} {f['this_machine']!s:<24} {mark}")
    if r["startup"] is None:
        lines.append(f"start-up: {r['error']}")
    else:
        lines.append(f"start-up (on_mismatch={r['policy']!r}): {r['startup']['explain']}")
    return "\n".join(lines)


def add_commands(sub: Any) -> None:
    p = command(sub, "inspect", "what a bundle holds: steps, plans, where each runs")
    p.add_argument("bundle", type=Path, metavar="BUNDLE", help="a bundle made by `dslc compile`")
    p.add_argument("--env", action="store_true",
                   help="compare the bundle's environment with this machine's: what start-up does")
    p.add_argument("--on-mismatch", choices=("retune", "heuristic", "error"), default="retune",
                   help="the runner's policy when the environment differs (default retune)")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text for people (default), or one JSON document")
    p.set_defaults(run=cmd_inspect)
