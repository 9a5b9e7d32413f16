"""The on-disk plan cache for sizes between buckets: one file per (graph, environment), atomic
writes, and a damaged or unwritable cache costs speed, never correctness."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest

from dslc.backend.spec import GroupSpec, OpSpec, TensorSpec
from dslc.runtime import plancache
from dslc.runtime.records import Environment, PlanRecord

X = TensorSpec("x", 1, (24, 8), (8, 1), "f16", "input")
Y = TensorSpec("y", 2, (24, 8), (8, 1), "f16", "output")
SPEC = GroupSpec("abc", (X, Y), (OpSpec("y", "relu", ("x",), {}, "f32"),), "f16", "f32", "f32")
ENV_FIELDS = {"device_name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132,
              "cudnn_backend": 91900, "cudnn_frontend": "1.32.0", "driver": 13000}
ENV = Environment(**ENV_FIELDS)


def env(**changes: object) -> Environment:
    return replace(ENV, **changes)


def plan(**fields: object) -> PlanRecord:
    return PlanRecord(**{"engine_id": 3, "knobs": {}, "workspace": 0, "serialized": b"\x01",
                         **fields})


def test_a_plan_round_trips_through_the_cache(tmp_path: Path) -> None:
    path = plancache.path_for(tmp_path, SPEC, ENV)
    assert plancache.load(path) is None
    stored = plan(knobs={"KERNEL_CFG": 7}, workspace=1024)
    plancache.store(path, stored)
    assert plancache.load(path) == stored


def test_the_key_follows_the_graph_and_the_environment(tmp_path: Path) -> None:
    base = plancache.path_for(tmp_path, SPEC, ENV)
    assert plancache.path_for(tmp_path, GroupSpec.from_data(SPEC.data()), env()) == base
    assert plancache.path_for(tmp_path, replace(SPEC, signature="abd"), ENV) != base
    assert plancache.path_for(tmp_path, SPEC, env(memory_bytes=1)) == base  # not a key


# What a serialized plan depends on, so each must be in the key: a plan made on another GPU
# (name, compute capability, SM count), with another cuDNN (backend, frontend) or driver must not
# be restored. Written here from that reasoning, not read from the module.
KEY_FIELDS = {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": "10.0",
              "sm_count": 114, "cudnn_backend": 92000, "cudnn_frontend": "1.33.0",
              "driver": 13010}


@pytest.mark.parametrize("field", sorted(KEY_FIELDS))
def test_each_environment_field_of_the_key_changes_the_file(tmp_path: Path, field: str) -> None:
    assert ENV_FIELDS[field] != KEY_FIELDS[field]
    base = plancache.path_for(tmp_path, SPEC, ENV)
    other = plancache.path_for(tmp_path, SPEC, env(**{field: KEY_FIELDS[field]}))
    assert other != base and other.parent == base.parent


def test_a_plan_stored_on_one_gpu_is_not_found_on_another(tmp_path: Path) -> None:
    plancache.store(plancache.path_for(tmp_path, SPEC, ENV), plan())
    for field, value in KEY_FIELDS.items():
        assert plancache.load(plancache.path_for(tmp_path, SPEC, env(**{field: value}))) is None, \
            field
    found = plancache.load(plancache.path_for(tmp_path, SPEC, env()))
    assert found is not None and (found.engine_id, found.serialized) == (3, b"\x01")


@pytest.mark.parametrize("change", [
    {"tensors": (replace(X, dims=(32, 8)), replace(Y, dims=(32, 8)))},   # another size
    {"tensors": (replace(X, name="z"), Y)},                               # another tensor name
    {"ops": (OpSpec("y", "tanh", ("x",), {}, "f32"),)},                   # another graph
])
def test_each_part_of_the_graph_changes_the_file(tmp_path: Path, change: dict[str, object]) -> None:
    assert plancache.path_for(tmp_path, replace(SPEC, **change), ENV) != \
        plancache.path_for(tmp_path, SPEC, ENV)


def test_a_damaged_file_reads_as_a_miss(tmp_path: Path) -> None:
    path = plancache.path_for(tmp_path, SPEC, ENV)
    path.write_bytes(b"\xc1 not msgpack")
    assert plancache.load(path) is None


def test_an_unwritable_cache_is_not_an_error(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("the cache folder cannot be made under a file")
    plancache.store(plancache.path_for(blocked, SPEC, ENV), plan())
    assert blocked.read_text().startswith("the cache")


def test_a_file_is_named_by_32_hex_digits_of_the_keys_sha256(tmp_path: Path) -> None:
    # Written out from the documented key: the graph's data and the six environment fields in
    # their order, as sorted-key JSON; files of earlier runs are found only under the same name.
    text = json.dumps([SPEC.data(), [ENV_FIELDS[k] for k in
                                     ("device_name", "compute_capability", "sm_count",
                                      "cudnn_backend", "cudnn_frontend", "driver")]],
                      sort_keys=True)
    path = plancache.path_for(tmp_path, SPEC, ENV)
    assert path == tmp_path / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.plan"


def test_an_attribute_json_cannot_write_still_makes_a_key(tmp_path: Path) -> None:
    odd = replace(SPEC, ops=(OpSpec("y", "relu", ("x",), {"blob": b"\x00\x01"}, "f32"),))
    assert plancache.path_for(tmp_path, odd, ENV) == plancache.path_for(tmp_path, odd, ENV)
    assert plancache.path_for(tmp_path, odd, ENV) != plancache.path_for(tmp_path, SPEC, ENV)


def test_a_plan_without_serialized_bytes_is_a_miss(tmp_path: Path) -> None:
    path = plancache.path_for(tmp_path, SPEC, ENV)
    plancache.store(path, plan(serialized=b""))
    assert path.exists() and plancache.load(path) is None


def test_why_a_file_is_not_used_is_logged_naming_the_field(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture,
                                                           ) -> None:
    path = plancache.path_for(tmp_path, SPEC, ENV)
    path.write_bytes(msgpack.packb({"engine_id": 3, 5: 0}))  # a key that is no string
    with caplog.at_level(logging.DEBUG, logger="dslc.runtime"):
        assert plancache.load(path) is None
    assert caplog.messages == [f"plan cache {path} unreadable (plan: a key 5 is not a string)"]


def test_why_a_plan_is_not_stored_is_logged(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    path = plancache.path_for(blocked, SPEC, ENV)
    with caplog.at_level(logging.DEBUG, logger="dslc.runtime"):
        plancache.store(path, plan())
    [message] = caplog.messages
    assert message.startswith(f"plan cache {path} not written ([Errno 20] Not a directory")


def test_the_cache_lives_under_the_users_cache_folder(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The user cache folder is $XDG_CACHE_HOME where it is set (the XDG base directory spec,
    # which platformdirs follows on Linux, where dslc runs).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert plancache.default_dir() == tmp_path / "dslc" / "plans"
