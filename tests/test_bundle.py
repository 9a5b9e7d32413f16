"""The bundle: written, read back equal; a damaged or foreign file is refused in one sentence;
the memory plan shares bytes between values whose lifetimes do not overlap."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from dslc.emit import bundle as emit_bundle
from dslc.runtime import bundle
from dslc.runtime.memory import Buffer, plan_memory
from dslc.runtime.records import Bundle, BundleError, Environment
from dslc.runtime.schedule import Schedule
from tests.test_compile_deviceless import compiled


def test_bundle_round_trips(tmp_path: Path) -> None:
    c = compiled("resnet18")
    data = emit_bundle.payload(c)
    path = tmp_path / "m.bundle"
    emit_bundle.write(path, data)
    assert bundle.read(path) == data
    assert bundle.load(path) == Bundle.from_data(data)
    program = Schedule(bundle.load(path))
    assert [s.name for s in program.steps] == [s.group.name for s in c.steps]
    assert program.graph == c.graph  # the IR survives the trip, dims and all


def test_bundle_records_plans_environment_and_memory() -> None:
    data = emit_bundle.payload(compiled("resnet50"))
    assert data["environment"]["device_name"] == "NVIDIA H200"
    assert data["environment"]["cudnn_backend"] and data["environment"]["sm_count"] == 132
    assert [b["key"] for b in data["buckets"]] == ["N=1", "N=32", "N=256"]
    for b in data["buckets"]:
        assert b["memory"]["arena_bytes"] > 0
        plans = [g["plan"] for g in b["graphs"].values()]
        saved = [p for p in plans if p["serialized"]]
        assert saved and all(p["engine_id"] is not None and p["workspace"] >= 0 for p in saved)
    small, large = data["buckets"][0], data["buckets"][2]
    assert large["memory"]["arena_bytes"] > 100 * small["memory"]["arena_bytes"]


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:], "is corrupt (checksum mismatch)"),
    (lambda b: b"hello", "is not a dslc bundle"),
    (lambda b: msgpack.packb({"magic": "other"}), "is not a dslc bundle (no `dslc-bundle` magic)"),
    (lambda b: msgpack.packb({"magic": "dslc-bundle", "schema_version": 99}),
     "has bundle schema 99; this dslc reads schema 1"),
])
def test_damaged_bundle_is_refused_in_one_sentence(tmp_path: Path, damage, message) -> None:  # type: ignore[no-untyped-def]
    good = bundle.pack({"model": "m", "steps": list(range(100))})
    path = tmp_path / "x.bundle"
    path.write_bytes(damage(good))
    with pytest.raises(bundle.BundleError) as err:
        bundle.read(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_memory_plan_reuses_bytes_of_dead_values() -> None:
    offsets, peak = plan_memory([Buffer("a", 1000, 0, 1), Buffer("b", 1000, 1, 2),
                                 Buffer("c", 1000, 2, 3)])
    assert offsets["a"] == offsets["c"] != offsets["b"]  # a is dead when c is written
    assert peak == 2048


def test_memory_plan_never_overlaps_live_values() -> None:
    buffers = [Buffer(f"v{i}", 100 * (i % 7 + 1), i, i + i % 3) for i in range(40)]
    offsets, peak = plan_memory(buffers)
    for x in buffers:
        for y in buffers:
            if x.name < y.name and not (x.last < y.first or y.last < x.first):
                a, b = offsets[x.name], offsets[y.name]
                assert a + x.size <= b or b + y.size <= a, (x, y)
    assert peak >= max(b.size for b in buffers)


def test_source_date_epoch_fixes_the_build_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1700000000 s after 1970-01-01 is 2023-11-14 22:13:20 UTC (derived by hand from the epoch).
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    c = compiled("mlp")
    first = emit_bundle.records(c)
    assert first.created == "2023-11-14T22:13:20+00:00"
    assert all(e.plan.build_s is None for b in first.buckets for e in b.graphs.values())
    assert bundle.pack(first) == bundle.pack(emit_bundle.records(c))  # byte for byte


def test_with_plans_replaces_only_the_named_plans_and_validates_them() -> None:
    records = emit_bundle.records(compiled("mlp"))
    bucket = records.buckets[1]
    sig, entry = next(iter(bucket.graphs.items()))
    where = f"buckets.{bucket.key}.graphs.{sig}.plan"
    plan = entry.plan.updated({"engine_id": 7, "knobs": {"2": 1}, "ms": 0.25, "tuned": True}, where)
    env = Environment.from_data({**records.environment.to_data(), "device_name": "Another GPU"})
    out = records.with_plans({(bucket.key, sig): plan}, env)
    assert out.buckets[1].graphs[sig].plan == plan
    assert (plan.engine_id, dict(plan.knobs), plan.ms) == (7, {"2": 1}, 0.25)
    assert plan.workspace == entry.plan.workspace  # fields not named are kept
    assert out.environment.device_name == "Another GPU"
    others = [(b.key, s, g.plan) for b in out.buckets for s, g in b.graphs.items()
              if (b.key, s) != (bucket.key, sig)]
    assert others == [(b.key, s, g.plan) for b in records.buckets for s, g in b.graphs.items()
                      if (b.key, s) != (bucket.key, sig)]
    with pytest.raises(BundleError, match=f"{where}.workspace"):
        entry.plan.updated({"workspace": -1}, where)
