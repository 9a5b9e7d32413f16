"""The tuning database: entries keyed by the group's concrete form and the environment, reused
across builds; concurrent writers sharing one file keep every entry."""

from __future__ import annotations

import multiprocessing
from dataclasses import replace
from pathlib import Path

from dslc.backend.spec import group_spec
from dslc.runtime.records import Environment, PlanRecord
from dslc.tune.db import TuningDB, env_key, spec_key
from tests.test_compile_deviceless import compiled


def test_identical_groups_share_a_key_across_models() -> None:
    keys = {}
    for name in ("resnet18", "resnet50"):
        c = compiled(name)
        for step in c.steps:
            if step.kind == "graph":
                spec = group_spec(c.graph, step.group, {"N": 32}, c.model.env)
                keys.setdefault(name, set()).add(spec_key(spec))
    shared = keys["resnet18"] & keys["resnet50"]
    assert shared  # the stem conv, at least, is the same graph in both
    # one key per distinct cuDNN graph: as many as fusion's signatures tell apart
    graphs = {s.group.signature for s in compiled("resnet50").steps if s.kind == "graph"}
    assert len(keys["resnet50"]) == len(graphs) > 1


def test_keys_differ_by_size_and_environment() -> None:
    c = compiled("resnet18")
    step = next(s for s in c.steps if s.kind == "graph")
    a = spec_key(group_spec(c.graph, step.group, {"N": 1}, c.model.env))
    b = spec_key(group_spec(c.graph, step.group, {"N": 32}, c.model.env))
    assert a != b
    env = Environment(device_name="NVIDIA H200", compute_capability="9.0", sm_count=132,
                      cudnn_backend=91900, cudnn_frontend="1.32.0")
    assert env_key(env) != env_key(replace(env, cudnn_backend=92000))


def measured(i: int) -> PlanRecord:
    return PlanRecord(engine_id=i, knobs={}, workspace=0, serialized=None, ms=1.0)


def _writer(path: str, worker: int) -> None:
    db = TuningDB(Path(path))
    for i in range(25):
        db.put("env", f"w{worker}-{i}", measured(i))


def test_concurrent_writers_keep_every_entry(tmp_path: Path) -> None:
    path = tmp_path / "tuning.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    db = TuningDB(path)
    assert db.size() == 100
    assert db.get("env", "w3-24") == measured(24)


def test_an_entry_keeps_what_was_measured_not_the_plan_bytes(tmp_path: Path) -> None:
    import json

    db = TuningDB(tmp_path / "tuning.json")
    plan = replace(measured(3), serialized=b"\x00\x01", workspace=4096, reused=False)
    db.put("env", "k", plan)
    [entry] = json.loads((tmp_path / "tuning.json").read_text())["entries"]["env"].values()
    assert "serialized" not in entry and "workspace" not in entry and entry["ms"] == 1.0
    assert db.get("env", "k") == replace(plan, serialized=None, workspace=0)
