"""The on-disk plan cache for sizes between buckets: one file per (graph, environment), atomic
writes, and a damaged or unwritable cache costs speed, never correctness."""

from __future__ import annotations

from pathlib import Path

from dslc.runtime import plancache

SPEC = {"signature": "abc", "tensors": [{"name": "x", "dims": [24, 8]}], "ops": []}
ENV = {"device_name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132,
       "cudnn_backend": 91900, "cudnn_frontend": "1.32.0", "driver": 13000}


def test_a_plan_round_trips_through_the_cache(tmp_path: Path) -> None:
    path = plancache.path_for(tmp_path, SPEC, ENV)
    assert plancache.load(path) is None
    plan = {"engine_id": 3, "knobs": {"KERNEL_CFG": 7}, "workspace": 1024, "serialized": b"\x01"}
    plancache.store(path, plan)
    loaded = plancache.load(path)
    assert loaded is not None and loaded.to_data() == plan


def test_the_key_follows_the_graph_and_the_environment(tmp_path: Path) -> None:
    base = plancache.path_for(tmp_path, SPEC, ENV)
    assert plancache.path_for(tmp_path, dict(SPEC), dict(ENV)) == base
    assert plancache.path_for(tmp_path, {**SPEC, "signature": "abd"}, ENV) != base
    assert plancache.path_for(tmp_path, SPEC, {**ENV, "cudnn_backend": 92000}) != base
    assert plancache.path_for(tmp_path, SPEC, {**ENV, "memory_bytes": 1}) == base  # not a key


def test_a_damaged_file_reads_as_a_miss(tmp_path: Path) -> None:
    path = plancache.path_for(tmp_path, SPEC, ENV)
    path.write_bytes(b"\xc1 not msgpack")
    assert plancache.load(path) is None


def test_an_unwritable_cache_is_not_an_error(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("the cache folder cannot be made under a file")
    plancache.store(plancache.path_for(blocked, SPEC, ENV), {"serialized": b"x"})
    assert blocked.read_text().startswith("the cache")
