"""Start-up and the tuning database (`dslc.runtime.fleet`): a replica whose environment differs
from the bundle's takes plans measured in an equal environment, measures only what nobody has,
under the key's lease, publishes it, and waits for the keys another replica holds, up to a
bound, then takes the heuristics' plan; a database that is down costs reuse, never a start.

No GPU here, nor in CI: the measuring is a fake backend (a function that sleeps a little and
returns a valid plan, counting its calls), which stands in for `plans.measure_here` (cuDNN on
the GPU) in these tests only. Everything around it is real: the bundle (resnet18 compiled
deviceless), the start-up decision, the keys, the stores (SQLite, and a real Redis server), the
leases and the processes."""

from __future__ import annotations

import logging
import multiprocessing
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dslc.backend.target import load_target
from dslc.compile.stage import compile_model
from dslc.diag.diagnostic import Sink
from dslc.emit.bundle import records
from dslc.pipeline import Options, front_end, lower_and_fuse
from dslc.runtime import fleet, tuningdb
from dslc.runtime.fleet import FleetOptions, Outcome, Wanted, consult, plans_for
from dslc.runtime.records import Bundle, Environment, PlanRecord
from dslc.runtime.startup import decide
from dslc.runtime.tuningdb import TuningStore, env_key, measured, open_store, spec_key
from dslc.runtime.tuningdb.redisdb import RedisStore
from dslc.runtime.tuningdb.sqlite import SQLiteStore
from dslc.runtime.tuningdb.tiered import Tiered
from tests.conftest import ROOT
from tests.redis_server import RedisServer, free_port

FORK = multiprocessing.get_context("fork")
LOG = logging.getLogger("dslc.runtime")
FAST = FleetOptions(wait_s=30.0, poll_s=0.02, lease_s=60.0)


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    """resnet18 at one batch size, compiled deviceless for the H200 profile."""
    result = front_end(ROOT / "models" / "resnet18.cgraph", Options(), Sink())
    assert result.model is not None
    lowered, plan = lower_and_fuse(result.model)
    return records(compile_model(result.model, lowered, plan, load_target("h200"),
                                 buckets=[{"N": 32}]))


def tuned_elsewhere(bundle: Bundle) -> Environment:
    """The bundle as if measured on an H200 (what `dslc tune` records)."""
    return replace(bundle.environment, live=True)


def live_here(bundle: Bundle) -> Environment:
    """A replica on another GPU: start-up re-tunes."""
    return replace(bundle.environment, live=True, device_name="NVIDIA H100 80GB HBM3",
                   sm_count=132)


def wanted(bundle: Bundle) -> list[Wanted]:
    names = {s.signature: s.name for s in bundle.steps}
    return fleet.wanted_in(bundle.buckets[0], names)


def fake_plan(key: str) -> PlanRecord:
    """What a measurement on the GPU returns (a valid plan with its serialized bytes)."""
    return PlanRecord(engine_id=len(key) % 7, knobs={}, workspace=256,
                      serialized=b"plan " + key.encode(), ms=0.25, error=1e-3, tuned=True,
                      candidates=3)


class FakeBackend:
    """Stands in for the GPU's measuring: sleeps as a measurement would take time, counts."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds
        self.measured: list[str] = []

    def __call__(self, w: Wanted) -> PlanRecord | None:
        time.sleep(self.seconds)
        self.measured.append(spec_key(w.spec))
        return fake_plan(spec_key(w.spec))


def test_the_bundle_has_distinct_keys_to_share(bundle: Bundle) -> None:
    keys = {spec_key(w.spec) for w in wanted(bundle)}
    assert len(keys) == len(wanted(bundle)) >= 8
    assert decide(tuned_elsewhere(bundle), live_here(bundle)).action == "retune"


def test_a_plan_in_the_database_is_taken_not_measured(bundle: Bundle, tmp_path: Path) -> None:
    db = SQLiteStore(tmp_path / "tuning.db")
    env = env_key(live_here(bundle))
    ws = wanted(bundle)
    db.put(env, spec_key(ws[0].spec), measured(fake_plan("elsewhere"), host="gpu-02"))
    backend = FakeBackend(0.0)
    got = plans_for(db, env, ws, backend, LOG, FAST)
    # measured where the driver was not known: its engine and knobs, no bytes
    assert got[ws[0].signature] == Outcome("database", replace(fake_plan("elsewhere"),
                                                               serialized=None))
    assert sorted(backend.measured) == sorted(spec_key(w.spec) for w in ws[1:])
    assert all(got[w.signature].how == "tuned" for w in ws[1:])
    for w in ws[1:]:  # published, with where it was measured
        entry = db.get(env, spec_key(w.spec))
        assert entry is not None and entry.plan.ms == 0.25 and entry.host
    published = db.get(env, spec_key(ws[1].spec))
    assert published is not None and published.plan.serialized is None  # no driver, no bytes


def test_a_replica_of_the_same_driver_gets_the_serialized_plan_another_the_engine(
        bundle: Bundle, tmp_path: Path) -> None:
    """Bytes restore in milliseconds where the driver that made them runs; elsewhere the engine
    and knobs are replayed (a serialized plan is not promised to load under another driver)."""
    db = SQLiteStore(tmp_path / "tuning.db")
    env = env_key(live_here(bundle))
    ws = wanted(bundle)[:3]
    first = plans_for(db, env, ws, FakeBackend(0.0), LOG, FAST, driver=550540)
    assert all(o.how == "tuned" for o in first.values())
    same = plans_for(db, env, ws, FakeBackend(0.0), LOG, FAST, driver=550540)
    for w in ws:
        assert same[w.signature] == Outcome("database", fake_plan(spec_key(w.spec)))
    other = plans_for(db, env, ws, FakeBackend(0.0), LOG, FAST, driver=560350)
    unknown = plans_for(db, env, ws, FakeBackend(0.0), LOG, FAST)
    for got in (other, unknown):
        for w in ws:
            plan = got[w.signature].plan
            assert got[w.signature].how == "database" and plan is not None
            assert plan.serialized is None and plan.engine_id == fake_plan(spec_key(w.spec)).engine_id


def test_a_key_another_replica_holds_is_waited_for_then_heuristics(bundle: Bundle,
                                                                   tmp_path: Path) -> None:
    db = SQLiteStore(tmp_path / "tuning.db")
    env = env_key(live_here(bundle))
    ws = wanted(bundle)[:3]
    held = spec_key(ws[1].spec)
    assert db.lease(env, held, "another replica", 600.0)  # and it never publishes
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    backend = FakeBackend(0.0)
    got = plans_for(db, env, ws, backend, LOG, FleetOptions(wait_s=5.0, poll_s=1.0),
                    clock=lambda: now[0], sleep=sleep)
    assert got[ws[1].signature] == Outcome("heuristics", None) and 5.0 <= now[0] <= 6.0
    assert held not in backend.measured and len(backend.measured) == 2  # the others went on


def test_a_waiting_replica_takes_what_the_holder_publishes(bundle: Bundle, tmp_path: Path) -> None:
    db = SQLiteStore(tmp_path / "tuning.db")
    env = env_key(live_here(bundle))
    [w] = wanted(bundle)[:1]
    key = spec_key(w.spec)
    assert db.lease(env, key, "holder", 600.0)
    naps = []

    def sleep(s: float) -> None:  # while this replica waits, the holder finishes
        naps.append(s)
        db.put(env, key, measured(fake_plan("holder"), host="holder-host"))
        db.release(env, key, "holder")

    backend = FakeBackend(0.0)
    got = plans_for(db, env, [w], backend, LOG, FAST, sleep=sleep)
    assert got[w.signature].how == "database" and naps == [FAST.poll_s] and not backend.measured


def test_a_holder_that_finds_no_valid_plan_stops_the_waiting(bundle: Bundle,
                                                             tmp_path: Path) -> None:
    db = SQLiteStore(tmp_path / "tuning.db")
    env = env_key(live_here(bundle))
    [w] = wanted(bundle)[:1]
    got = plans_for(db, env, [w], lambda _: None, LOG, FAST)
    assert got[w.signature] == Outcome("heuristics", None)
    entry = db.get(env, spec_key(w.spec))
    assert entry is not None and not entry.validated  # said in the database ...
    backend = FakeBackend(0.0)
    again = plans_for(db, env, [w], backend, LOG, FleetOptions(wait_s=60.0),
                      sleep=lambda s: pytest.fail("waited"))
    assert again[w.signature].how == "heuristics" and not backend.measured  # ... so no wait


def test_a_measurement_that_fails_costs_the_plan_not_the_start(bundle: Bundle,
                                                              tmp_path: Path) -> None:
    db = SQLiteStore(tmp_path / "tuning.db")
    env = env_key(live_here(bundle))
    [w] = wanted(bundle)[:1]

    def broken(_: Wanted) -> PlanRecord:
        raise RuntimeError("CUDNN_STATUS_INTERNAL_ERROR")

    assert plans_for(db, env, [w], broken, LOG, FAST)[w.signature].how == "heuristics"
    assert db.lease(env, spec_key(w.spec), "next", 60.0)  # the lease was given back


def test_what_each_decision_asks_of_the_database(bundle: Bundle, tmp_path: Path) -> None:
    db = SQLiteStore(tmp_path / "tuning.db")
    ws = wanted(bundle)
    recorded, live = tuned_elsewhere(bundle), live_here(bundle)
    db.put(env_key(live), spec_key(ws[0].spec), measured(fake_plan("x")))
    db.put(env_key(live), spec_key(ws[1].spec), measured(replace(fake_plan("y"), error=None)))
    backend = FakeBackend(0.0)
    # cuDNN changed (replay), or the heuristic policy: look up only, measure nothing
    for d in (decide(recorded, replace(recorded, cudnn_backend=99999)),
              decide(recorded, live, "heuristic")):
        got = consult(db, live, d, ws, backend, LOG, FAST)
        assert set(got) == {ws[0].signature} and got[ws[0].signature].how == "database"
    assert consult(db, live, decide(recorded, recorded), ws, backend, LOG, FAST) == {}
    assert consult(db, live, decide(recorded, replace(recorded, driver=1)), ws, backend, LOG,
                   FAST) == {}  # re-time: the saved candidates, timed here
    assert consult(None, live, decide(recorded, live), ws, backend, LOG, FAST) == {}
    assert not backend.measured
    got = consult(db, live, decide(recorded, live), ws, backend, LOG, FAST)  # re-tune
    assert got[ws[1].signature].how == "heuristics"  # measured before: nothing was valid
    assert len(backend.measured) == len(ws) - 2


def _replica(url: str, cache: str, bundle: Bundle, go: Any, results: Any) -> None:
    tuningdb.default_path = lambda: Path(cache) / "tuning.db"  # this host's local database
    db = open_store(url)
    backend = FakeBackend()
    go.wait()  # all at once
    live = live_here(bundle)
    got = consult(db, live, decide(tuned_elsewhere(bundle), live), wanted(bundle), backend, LOG,
                  FAST)
    results.put((backend.measured, {sig: o.how for sig, o in got.items()}))


def _fleet(url: str, cache: Path, bundle: Bundle, replicas: int) -> list[tuple[list[str], dict]]:
    go = FORK.Event()
    results = FORK.Queue()
    procs = [FORK.Process(target=_replica, args=(url, str(cache), bundle, go, results))
             for _ in range(replicas)]
    for p in procs:
        p.start()
    go.set()
    out = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return out


def test_sixteen_replicas_starting_at_once_measure_each_key_once(
        bundle: Bundle, redis_url: str, tmp_path: Path) -> None:
    keys = sorted(spec_key(w.spec) for w in wanted(bundle))
    started = time.monotonic()
    out = _fleet(redis_url, tmp_path, bundle, 16)
    seconds = time.monotonic() - started
    measured_keys = sorted(k for m, _ in out for k in m)
    assert measured_keys == keys  # each key exactly once: one replica's work in all
    assert sum(1 for m, _ in out if m) > 1  # spread over the replicas
    for _, hows in out:  # every replica has a plan for every graph, none the heuristics'
        assert set(hows) == {w.signature for w in wanted(bundle)}
        assert set(hows.values()) <= {"database", "tuned"}
    env = env_key(live_here(bundle))
    fleet_db = RedisStore(redis_url)
    assert fleet_db.size() == len(keys)
    assert all(fleet_db.get(env, k) is not None for k in keys)
    print(f"16 replicas, {len(keys)} keys: {seconds:.2f} s")


def test_with_the_fleets_server_down_one_process_per_host_measures(bundle: Bundle,
                                                                  tmp_path: Path) -> None:
    """Nothing listens at the address: each replica goes on with this host's database, whose
    leases still share the work among the host's processes (what a replica says then: the
    next test)."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    keys = sorted(spec_key(w.spec) for w in wanted(bundle))
    out = _fleet(url, tmp_path, bundle, 4)
    assert sorted(k for m, _ in out for k in m) == keys
    assert all(set(hows.values()) <= {"database", "tuned"} for _, hows in out)
    assert SQLiteStore(tmp_path / "tuning.db").size() == len(keys)


def test_what_was_measured_while_the_server_was_down_reaches_it_later(
        redis_server: RedisServer, redis_url: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    local = SQLiteStore(tmp_path / "tuning.db")
    db = Tiered(RedisStore(redis_url), local)
    db.put("env", "before", measured(fake_plan("a")))
    redis_server.stop()  # the server goes down
    try:
        assert db.get("env", "before") is not None  # this host kept what it saw
        db.put("env", "during", measured(fake_plan("b")))  # measured meanwhile: local only
        assert db.lease("env", "k", "me", 60.0)  # leases: this host's
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(said) == 1 and "cannot be reached" in said[0] and str(local.path) in said[0]
    finally:
        redis_server.start(redis_server.port)
    later = Tiered(RedisStore(redis_url), SQLiteStore(tmp_path / "tuning.db"))
    assert later.get("env", "during") is not None  # published now
    assert RedisStore(redis_url).get("env", "during") == local.get("env", "during")


def test_a_store_alone_that_is_down_costs_the_plans_not_the_start(bundle: Bundle) -> None:
    db: TuningStore = RedisStore(f"redis://127.0.0.1:{free_port()}/0")
    ws = wanted(bundle)
    got = plans_for(db, env_key(live_here(bundle)), ws, FakeBackend(0.0), LOG, FAST)
    assert {o.how for o in got.values()} == {"heuristics"} and len(got) == len(ws)


def test_a_runner_takes_the_database_as_the_command_line_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dslc.runtime import Model
    from tests.helpers import run_cli

    assert run_cli("compile", "models/mlp.cgraph", "-o", str(tmp_path), "-q").code == 0
    path = tmp_path / "mnist_mlp.bundle"
    monkeypatch.delenv(tuningdb.ENV_VAR, raising=False)
    monkeypatch.setattr(tuningdb, "default_path", lambda: tmp_path / "cache" / "tuning.db")
    assert Model(path, tuning_db=None).tuning_db is None
    named = Model(path, tuning_db=str(tmp_path / "x.db")).tuning_db
    assert isinstance(named, SQLiteStore) and named.path == tmp_path / "x.db"
    default = Model(path).tuning_db
    assert isinstance(default, SQLiteStore) and default.path == tmp_path / "cache" / "tuning.db"
    monkeypatch.setenv(tuningdb.ENV_VAR, "redis://10.1.2.3:6379/1")
    fleet_db = Model(path).tuning_db
    assert isinstance(fleet_db, Tiered) and fleet_db.name == "redis://10.1.2.3:6379/1"
    with pytest.raises(ValueError, match=r"^tuning_db `redis://:1/0`: no host"):
        Model(path, tuning_db="redis://:1/0")
    with pytest.raises(ValueError, match="tuning_wait_s must be a number of seconds"):
        Model(path, tuning_wait_s=-1.0)


def test_a_host_without_the_redis_client_reads_the_fleet_as_down(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` fails, as where absent
    db = Tiered(RedisStore("redis://10.9.8.7:6379/0"), SQLiteStore(tmp_path / "tuning.db"))
    db.put("env", "k", measured(fake_plan("k")))
    assert db.get("env", "k") is not None and db.lease("env", "k2", "me", 60.0)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "pip install 'dslc[fleet]'" in said[0]
