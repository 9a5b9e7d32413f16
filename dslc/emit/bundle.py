"""Compiled model -> bundle payload (schema in `dslc.runtime.bundle`), written atomically, alone
or together with the files that go with it (its runner, its weights)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dslc import fsutil
from dslc.compile.stage import Compiled, bucket_key
from dslc.emit.manifest import build_manifest
from dslc.ir.serial import graph_data
from dslc.runtime import bundle, environment
from dslc.runtime.schedule import Program, StepInfo

VERSION = "0.1.0"


def _plan_data(compiled: Compiled, key: tuple[str, str]) -> dict[str, Any]:
    b = compiled.builds[key]
    return {"engine_id": b.engine_id, "knobs": dict(b.knobs), "workspace": b.workspace,
            "serialized": b.serialized, "candidates": b.candidates, "note": b.note,
            "built_on_device": compiled.target.live and b.has_plan, "tuned": False,
            "build_s": round(b.build_s, 4)}


def payload(compiled: Compiled) -> dict[str, Any]:
    model = compiled.model
    steps = [StepInfo(s.kind, s.group.name, s.group.pattern, s.group.nodes, s.group.inputs,
                      s.group.outputs, s.group.signature, s.reason).data()
             for s in compiled.steps]
    out: dict[str, Any] = {
        "model": model.name,
        "source": model.file,
        "dslc_version": VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "manifest": build_manifest(model),
        "graph": graph_data(compiled.graph, model.env),
        "load_time": list(compiled.plan.load_time),
        "steps": steps,
        "target": compiled.target.name,
        "environment": (environment.live(properties=True) if compiled.target.live
                        else environment.from_profile(compiled.target.properties_json)),
    }
    program = Program(out)
    buckets = []
    for b in compiled.buckets:
        key = bucket_key(b)
        graphs = {sig: {"spec": compiled.specs[(k, sig)].data(), "plan": _plan_data(compiled, (k, sig))}
                  for (k, sig) in compiled.specs if k == key}
        layout = program.layout(b)
        buckets.append({"key": key, "dims": dict(b), "graphs": graphs,
                        "memory": {"offsets": layout.offsets, "arena_bytes": layout.arena}})
    out["buckets"] = buckets
    return out


def write(path: Path, data: dict[str, Any]) -> None:
    fsutil.write_bytes(path, bundle.pack(data))


def write_with(path: Path, data: dict[str, Any],
               beside: list[tuple[Path, Callable[[str], object]]]) -> None:
    """The bundle and the files made with it, replaced together (`fsutil.replace_together`): a
    failed write leaves the previous set, and the bundle is replaced last."""
    packed = bundle.pack(data)
    fsutil.replace_together([(path, lambda tmp: Path(tmp).write_bytes(packed)), *beside])
