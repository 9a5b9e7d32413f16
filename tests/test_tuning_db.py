"""The tuning database: entries keyed by the group's concrete form and the environment, reused
across builds; where it is (`--tuning-db`, a runner's `tuning_db`, `DSLC_TUNING_DB`) and what a
value that names none says; the JSON database of before is imported, never lost."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from dslc.backend.spec import GroupSpec, OpSpec, TensorSpec, group_spec
from dslc.runtime import tuningdb
from dslc.runtime.records import Environment, PlanRecord
from dslc.runtime.tuningdb import SpecError, env_key, measured, open_store, spec_key
from dslc.runtime.tuningdb.redisdb import RedisStore
from dslc.runtime.tuningdb.sqlite import SQLiteStore
from dslc.runtime.tuningdb.tiered import Tiered
from tests.helpers import run_cli
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


def record(i: int) -> dict[str, object]:
    """A record as the JSON database held it (`TuneResult.record`)."""
    return {"engine_id": i % 7, "knobs": {"KERNEL_CFG": i}, "ms": 0.5 + i, "error": 1e-3,
            "heuristic": {"engine_id": 0, "knobs": {}, "ms": 1.0 + i}, "top": [],
            "candidates": 4, "tuned": True, "tune_s": 0.2}


def json_database(path: Path, n: int, env: str = "env") -> None:
    path.write_text(json.dumps({"version": 1, "entries": {env: {f"k{i}": record(i)
                                                                for i in range(n)}}}))


def test_where_the_database_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tuningdb.ENV_VAR, raising=False)
    monkeypatch.setattr(tuningdb, "default_path", lambda: tmp_path / "cache" / "tuning.db")
    default = open_store(None)
    assert isinstance(default, SQLiteStore) and default.path == tmp_path / "cache" / "tuning.db"
    assert default.beside == tmp_path / "cache" / "tuning.json"  # the one before, imported
    named = open_store(str(tmp_path / "x.db"))
    assert isinstance(named, SQLiteStore) and named.path == tmp_path / "x.db"
    assert open_store("none") is None
    fleet = open_store("redis://db.internal:6380/2")
    assert isinstance(fleet, Tiered) and isinstance(fleet.shared, RedisStore)
    assert fleet.shared.url == "redis://db.internal:6380/2" and isinstance(fleet.local, SQLiteStore)
    assert fleet.local.path == tmp_path / "cache" / "tuning.db"  # this machine's, under it
    monkeypatch.setenv(tuningdb.ENV_VAR, "redis://10.0.0.5:6379/0")
    assert isinstance(open_store(None), Tiered)  # the variable, where no option is given
    assert isinstance(open_store(str(tmp_path / "x.db")), SQLiteStore)  # the option first


@pytest.mark.parametrize("spec, words", [
    ("redis://db:notaport/0", "the port must be a number"),
    ("redis://db:0/0", "the port must be a number"),
    ("redis://:6379/0", "no host"),
    ("redis://db:6379/zero", "the database must be a number"),
    ("redis://db:6379/0?timeout=3", "without options"),
    ("postgres://db/tuning", "not a database dslc knows"),
    ("", "is empty"),
])
def test_a_value_that_names_no_database_is_one_sentence(spec: str, words: str) -> None:
    with pytest.raises(SpecError, match=words) as err:
        open_store(spec)
    assert str(err.value).count(". ") == 0 and "--tuning-db" in str(err.value)


def test_a_bad_tuning_db_is_a_usage_error_before_any_work(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_cli("compile", "models/mlp.cgraph", "-o", str(tmp_path / "out"), "-q",
                  "--tuning-db", "redis://db:port/0")
    assert run.code == 2 and "the port must be a number" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()
    monkeypatch.setenv(tuningdb.ENV_VAR, "redis://:1/0")
    run = run_cli("compile", "models/mlp.cgraph", "-o", str(tmp_path / "out"), "-q")
    assert run.code == 2 and "DSLC_TUNING_DB `redis://:1/0`: no host" in run.stderr


def test_an_entry_keeps_the_plan_bytes_only_with_the_driver_that_made_them(
        tmp_path: Path) -> None:
    import base64
    import sqlite3

    db = SQLiteStore(tmp_path / "tuning.db")
    plan = replace(PlanRecord.from_data(record(3), "r", tuning=True), serialized=b"\x00\x01",
                   workspace=4096, reused=False)
    db.put("env", "with", measured(plan, driver=550540))
    db.put("env", "without", measured(plan))  # a driver not known: the bytes cannot be trusted
    db.close()
    with sqlite3.connect(tmp_path / "tuning.db") as conn:
        rows = dict(conn.execute("SELECT key, entry FROM plans").fetchall())
    stored = json.loads(rows["with"])
    assert base64.b64decode(stored["serialized"]) == b"\x00\x01" and stored["driver"] == 550540
    assert stored["plan"]["workspace"] == 4096 and stored["plan"]["ms"] == 3.5
    assert "serialized" not in json.loads(rows["without"])
    again = SQLiteStore(tmp_path / "tuning.db")
    got, bare = again.get("env", "with"), again.get("env", "without")
    assert got is not None and bare is not None
    assert got.plan == plan and got.plan_for(550540) == plan
    assert got.plan_for(560350) == got.plan_for(None) == replace(plan, serialized=None)
    assert bare.plan == replace(plan, serialized=None) and bare.driver is None


def test_an_entry_whose_bytes_are_not_base64_is_ignored_as_damaged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import sqlite3

    db = SQLiteStore(tmp_path / "tuning.db")
    db.put("env", "k", measured(PlanRecord.from_data(record(3), "r", tuning=True)))
    db.close()
    with sqlite3.connect(tmp_path / "tuning.db") as conn:
        [(text,)] = conn.execute("SELECT entry FROM plans").fetchall()
        data = {**json.loads(text), "serialized": "not base64!", "driver": 1}
        conn.execute("UPDATE plans SET entry = ?", (json.dumps(data),))
    with caplog.at_level(logging.WARNING, logger="dslc.tuningdb"):
        assert SQLiteStore(tmp_path / "tuning.db").get("env", "k") is None
    assert "entries.k.serialized: not base64" in caplog.text


def test_the_json_database_beside_is_imported_once_and_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = tmp_path / "tuning.json"
    json_database(old, 30)
    before = old.read_bytes()
    with caplog.at_level(logging.INFO, logger="dslc.tuningdb"):
        db = SQLiteStore(tmp_path / "tuning.db", beside=old)
        assert db.size() == 30
    got = db.get("env", "k7")
    assert got is not None and got.plan == PlanRecord.from_data(record(7), "r", tuning=True)
    assert got.source == f"imported from {old}" and got.dslc_version == "unknown"
    assert "imported 30 of 30 entries" in caplog.text
    assert old.read_bytes() == before  # never removed: an older dslc may still use it
    db.close()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dslc.tuningdb"):
        again = SQLiteStore(tmp_path / "tuning.db", beside=old)
        again.put("env", "new", measured(PlanRecord.from_data(record(40), "r", tuning=True)))
        assert again.size() == 31 and "imported" not in caplog.text  # once
    again.close()
    json_database(old, 35)  # an older dslc wrote to it since: the new entries come in
    assert SQLiteStore(tmp_path / "tuning.db", beside=old).size() == 36


def test_a_json_database_at_the_path_is_kept_aside_and_imported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "db.json"  # `--tuning-db db.json`, as before
    json_database(path, 12)
    before = path.read_bytes()
    db = SQLiteStore(path)
    assert db.size() == 12 and db.get("env", "k3") is not None
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("db.json.v1-")]
    assert aside.read_bytes() == before
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [f"tuning database `{path}` was a JSON database, the format before this one: "
                    f"kept it as `{aside}`; imported its 12 entries into a new one"]


def test_the_default_database_is_in_the_users_cache_folder(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # $XDG_CACHE_HOME where it is set (the XDG spec, which platformdirs follows on Linux).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(tuningdb.ENV_VAR, raising=False)
    assert tuningdb.default_path() == tmp_path / "dslc" / "tuning.db"
    for spec in (None, ""):  # nothing named, or the variable set empty: the default file
        if spec is not None:
            monkeypatch.setenv(tuningdb.ENV_VAR, spec)
        store = open_store(None)
        assert isinstance(store, SQLiteStore) and store.path == tmp_path / "dslc" / "tuning.db"
        assert store.beside == tmp_path / "dslc" / "tuning.json"
    monkeypatch.setenv(tuningdb.ENV_VAR, "none")
    assert open_store(None) is None
    assert isinstance(open_store(tmp_path / "x.db"), SQLiteStore)  # a Path as well as a string


@pytest.mark.parametrize("spec", ["redis://db:6379/0", "rediss://db:6380/15", "redis://db:6379",
                                  "redis://db/3", "redis://db:65535/2147483647"])
def test_a_redis_address_that_is_usable(spec: str) -> None:
    assert tuningdb.redis_url(spec, "--tuning-db") == spec
    store = open_store(spec)
    assert isinstance(store, Tiered) and isinstance(store.shared, RedisStore)
    assert store.shared.url == spec


@pytest.mark.parametrize("spec, sentence", [
    ("redis://db:65536/0", "the port must be a number in 1..65535"),
    ("redis://db:0/0", "the port must be a number in 1..65535"),
    ("redis://:6379/0", "no host; write redis://HOST:PORT/DB"),
    ("redis://db:6379/2147483648", "the database must be a number, as in redis://HOST:PORT/0"),
    ("redis://db:6379/-1", "the database must be a number, as in redis://HOST:PORT/0"),
    ("redis://db:6379/X", "the database must be a number, as in redis://HOST:PORT/0"),
    ("redis://db:6379/0#x", "write redis://HOST:PORT/DB, without options"),
    ("redis://db:6379/0?db=1", "write redis://HOST:PORT/DB, without options"),
])
def test_what_a_redis_address_that_is_not_usable_says(spec: str, sentence: str) -> None:
    with pytest.raises(SpecError) as err:
        tuningdb.redis_url(spec, "DSLC_TUNING_DB")
    assert str(err.value) == f"DSLC_TUNING_DB `{spec}`: {sentence}"


def test_what_a_value_that_names_no_database_says(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SpecError) as err:
        open_store("postgres://db/tuning")
    assert str(err.value) == "--tuning-db `postgres://db/tuning`: not a database dslc knows; " \
                             "name a file (SQLite), redis://HOST:PORT/DB or `none`"
    with pytest.raises(SpecError) as err:
        open_store("")
    assert str(err.value) == "--tuning-db is empty; name a file (SQLite), redis://HOST:PORT/DB " \
                             "or `none`"
    monkeypatch.setenv(tuningdb.ENV_VAR, "redis://db:x/0")  # the variable is named as the origin
    with pytest.raises(SpecError) as err:
        open_store(None)
    assert str(err.value) == "DSLC_TUNING_DB `redis://db:x/0`: the port must be a number in " \
                             "1..65535"


def test_which_values_name_a_file() -> None:
    assert tuningdb.is_file("runs/tuning.db") == Path("runs/tuning.db")
    assert tuningdb.is_file(Path("/x/t.db")) == Path("/x/t.db")
    for spec in (None, "none", "redis://db:6379/0", "postgres://db/t"):
        assert tuningdb.is_file(spec) is None


@pytest.mark.parametrize("data, reason, tag", [
    ({"version": 1}, "not a tuning database (no map of entries)", "unreadable"),
    ({"version": 1, "entries": []}, "not a tuning database (no map of entries)", "unreadable"),
    ([1, 2], "not a tuning database (no map of entries)", "unreadable"),
    ({"version": 2, "entries": {}}, "JSON database version 2", "v2"),
    ({"version": "1", "entries": {}}, "JSON database version '1'", "unreadable"),
    ({"version": False, "entries": {}}, "JSON database version False", "unreadable"),
    ({"version": 1, "entries": {"e" * 70: []}},
     f"the entries of environment {'e' * 60!r} are not a map of records", "unreadable"),
])
def test_what_a_json_file_that_is_no_tuning_database_is(tmp_path: Path, data: object,
                                                        reason: str, tag: str) -> None:
    from dslc.runtime.tuningdb import legacy

    path = tmp_path / "tuning.json"
    path.write_text(json.dumps(data))
    with pytest.raises(legacy.NotLegacy) as err:
        legacy.read(path)
    assert (str(err.value), err.value.tag) == (reason, tag)


def test_json_records_come_in_with_the_files_time_and_each_invalid_one_is_named(
        tmp_path: Path) -> None:
    import datetime
    import os
    import socket

    from dslc.runtime.tuningdb import legacy

    path = tmp_path / "tuning.json"
    long_key = "b" * 40 + "-more"
    raw = {"env": {long_key: {**record(1), "engine_id": "x"}, "k2": record(2),
                   "k3": {**record(3), "ms": "slow"}, "k4": record(4)}}
    path.write_text(json.dumps({"version": 1, "entries": raw}))
    written = datetime.datetime(2026, 11, 1, 10, 0, 0, tzinfo=datetime.UTC).timestamp()
    os.utime(path, (written, written))
    entries, skipped = legacy.entries(legacy.read(path)[0], path)
    assert [(env, key) for env, key, _ in entries] == [("env", "k2"), ("env", "k4")]
    for *_, e in entries:
        assert (e.host, e.at, e.dslc_version, e.source) == (
            socket.gethostname(), "2026-11-01T10:00:00+00:00", "unknown", f"imported from {path}")
    assert len(skipped) == 2
    assert skipped[0].startswith(f"entries.{'b' * 40}.engine_id: ")
    assert skipped[1].startswith("entries.k3.ms: ")


def test_json_records_of_a_file_gone_meanwhile_come_in_at_the_time_now(tmp_path: Path) -> None:
    import datetime

    from dslc.runtime.tuningdb import legacy

    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    [(_, _, e)], _ = legacy.entries({"env": {"k": record(1)}}, tmp_path / "gone.json")
    after = datetime.datetime.now(datetime.UTC)
    at = datetime.datetime.fromisoformat(e.at)
    assert e.at.endswith("+00:00") and before <= at <= after and at.microsecond == 0


def test_an_imported_json_record_does_not_replace_a_faster_entry(tmp_path: Path) -> None:
    db = SQLiteStore(tmp_path / "tuning.db")
    fast = measured(replace(PlanRecord.from_data(record(0), "r", tuning=True), ms=0.1))
    db.put("env", "k0", fast)
    db.close()
    json_database(tmp_path / "tuning.json", 2)  # k0 at 0.5 ms, k1
    again = SQLiteStore(tmp_path / "tuning.db", beside=tmp_path / "tuning.json")
    assert again.get("env", "k0") == fast and again.size() == 2


def _spec(names: tuple[str, str, str], signature: str, rows: int = 4,
          op: str = "relu") -> GroupSpec:
    x, y, node = names
    return GroupSpec(signature,
                     (TensorSpec(x, 1, (rows, 8), (8, 1), "f16", "input"),
                      TensorSpec(y, 2, (rows, 8), (8, 1), "f16", "output")),
                     (OpSpec(node, op, (x,), {"mode": op}, "f32"),), "f16", "f32", "f32")


def test_a_group_key_is_its_cuDNN_form_without_names() -> None:
    """Two groups that differ only in value names and signature share a key (24 hex digits);
    a size, an op or an operand count tells them apart."""
    a = _spec(("x", "h", "h"), "aaaa")
    b = _spec(("input.0", "layer1.out", "layer1.relu"), "bbbb")
    key = spec_key(a)
    assert key == spec_key(b) and len(key) == 24 and int(key, 16) >= 0
    assert a.data()["tensors"][0]["name"] == "x"  # the spec itself keeps its names
    assert spec_key(_spec(("x", "h", "h"), "aaaa", rows=2)) != key
    assert spec_key(_spec(("x", "h", "h"), "aaaa", op="tanh")) != key
    two = replace(a, ops=(replace(a.ops[0], inputs=("x", "x")),))
    assert spec_key(two) != key
    both = replace(a, ops=(replace(a.ops[0], attrs={"mode": "relu", "alpha": 0.5}),))
    reordered = replace(a, ops=(replace(a.ops[0], attrs={"alpha": 0.5, "mode": "relu"}),))
    assert spec_key(both) == spec_key(reordered) != key  # attrs in another order: one group


def test_an_environment_key_names_the_gpu_and_the_cudnn_that_ran_it() -> None:
    env = Environment(device_name="NVIDIA H200", compute_capability="9.0", sm_count=132,
                      cudnn_backend=91900, cudnn_frontend="1.32.0")
    assert env_key(env) == "NVIDIA H200|9.0|132|91900|1.32.0"
