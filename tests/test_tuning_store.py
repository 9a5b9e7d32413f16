"""The tuning database's contract, held by both stores alike (each test runs on SQLite and on a
real Redis server): entries round-trip with their provenance; the merge rule keeps the fastest
validated record and says when a put lost; a damaged entry is a miss and stays; leases are held
by one holder at a time, given back only by it and expire by themselves; 8 writer processes of
200 puts each lose nothing; concurrent puts of one key keep the fastest of all; a writer killed
with SIGKILL 50 times leaves a readable store holding exactly what it committed."""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import signal
import sqlite3
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from dslc import __version__ as VERSION
from dslc.runtime.records import PlanRecord
from dslc.runtime.tuningdb import Entry, TuningStore, better, measured
from dslc.runtime.tuningdb.redisdb import RedisStore
from dslc.runtime.tuningdb.sqlite import SQLiteStore

ENV = "NVIDIA H200|9.0|132|91900|1.32.0"
FORK = multiprocessing.get_context("fork")  # children start at once: nothing to import again


def record(i: int, ms: float | None = None, error: float | None = 1e-3) -> PlanRecord:
    """A validated record as the tuner makes it (`TuneResult.record`)."""
    ms = 0.5 + i if ms is None else ms
    return PlanRecord.from_data(
        {"engine_id": i % 7, "knobs": {"KERNEL_CFG": i}, "ms": ms, "error": error,
         "heuristic": {"engine_id": 0, "knobs": {}, "ms": ms * 2},
         "top": [{"engine_id": i % 7, "knobs": {"KERNEL_CFG": i}, "ms": ms, "error": error}],
         "candidates": 4, "tuned": True, "tune_s": 0.2}, "record", tuning=True)


def entry(i: int, ms: float | None = None, host: str = "host-a", **kw: float | None) -> Entry:
    return measured(record(i, ms, **kw), host=host, at="2026-11-01T10:00:00+00:00")


@dataclass
class Backend:
    """One store kind at one place: `open` makes a new handle (what another process does)."""

    kind: str
    where: str

    def open(self) -> TuningStore:
        return SQLiteStore(Path(self.where)) if self.kind == "sqlite" else RedisStore(self.where)

    def corrupt(self, env: str, key: str, text: str) -> None:
        """Overwrite one entry's stored text behind the store's back."""
        if self.kind == "sqlite":
            with sqlite3.connect(self.where) as conn:
                conn.execute("UPDATE plans SET entry = ? WHERE env = ? AND key = ?",
                             (text, env, key))
            return
        store = RedisStore(self.where)
        store.client.set(store._name("tuning", env, key), text)
        store.close()


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "tuning.db"))
    return Backend("redis", request.getfixturevalue("redis_url"))


def test_an_entry_round_trips_with_its_provenance(backend: Backend) -> None:
    db = backend.open()
    assert db.get(ENV, "k") is None and db.size() == 0
    plan = replace(record(3), serialized=b"\x00\x01\xff", workspace=4096)
    kept = db.put(ENV, "k", measured(plan, host="gpu-07", driver=550540))
    got = backend.open().get(ENV, "k")
    assert got == kept and got is not None
    assert got.plan == plan and got.driver == 550540  # the bytes, with the driver that made them
    assert (got.host, got.dslc_version, got.plan.error) == ("gpu-07", VERSION, 1e-3)
    assert got.at.endswith("+00:00") and db.stores == 1
    assert backend.open().get("another environment", "k") is None


def test_the_fastest_validated_record_is_kept(backend: Backend,
                                              caplog: pytest.LogCaptureFixture) -> None:
    db = backend.open()
    slow, fast = entry(1, ms=2.0, host="slow"), entry(2, ms=1.0, host="fast")
    assert db.put(ENV, "k", slow) == slow
    assert db.put(ENV, "k", fast) == fast  # faster: replaces
    with caplog.at_level(logging.INFO, logger="dslc.tuningdb"):
        assert db.put(ENV, "k", slow) == fast  # slower: loses, and says so
    assert "kept the record of fast (1.0 ms)" in caplog.text and "one from slow" in caplog.text
    unchecked = entry(3, ms=0.1, host="unchecked", error=None)  # never checked: cannot win
    assert not unchecked.validated and db.put(ENV, "k", unchecked) == fast
    assert backend.open().get(ENV, "k") == fast and db.size() == 1


def test_the_merge_rule() -> None:
    fast, slow = entry(1, ms=1.0), entry(2, ms=2.0)
    unchecked = entry(3, ms=0.1, error=None)
    assert better(fast, None) and better(unchecked, None)
    assert better(fast, slow) and not better(slow, fast)
    assert not better(entry(4, ms=1.0), fast)  # a tie keeps the one there
    assert better(slow, unchecked) and not better(unchecked, slow)
    assert not better(entry(5, ms=0.05, error=None), unchecked)
    infinite = measured(replace(record(6), ms=float("inf")))
    assert not infinite.validated and not better(infinite, slow)


def test_a_damaged_entry_is_a_miss_and_stays(backend: Backend,
                                             caplog: pytest.LogCaptureFixture) -> None:
    db = backend.open()
    for i in range(5):
        db.put(ENV, f"k{i}", entry(i))
    backend.corrupt(ENV, "k1", "{ torn")
    # an engine id that would reach cuDNN as a string
    backend.corrupt(ENV, "k2", entry(2).encode().replace('"engine_id": 2', '"engine_id": "x"'))
    db = backend.open()
    assert db.get(ENV, "k1") is None and db.get(ENV, "k2") is None
    assert db.get(ENV, "k3") == entry(3) and db.hits == 1
    assert db.size() == 5  # kept, not dropped
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("entries.k2.plan.engine_id" in w for w in said)
    assert any("entries.k1: not JSON" in w for w in said)
    assert db.put(ENV, "k1", entry(1)) == entry(1)  # a valid record replaces a damaged one


def test_leases_are_held_by_one_holder_at_a_time(backend: Backend) -> None:
    a, b = backend.open(), backend.open()
    assert a.lease(ENV, "k", "replica-a", 30.0)
    assert not b.lease(ENV, "k", "replica-b", 30.0)
    assert a.lease(ENV, "k", "replica-a", 30.0)  # its holder holds it still
    assert b.lease(ENV, "other key", "replica-b", 30.0)  # per key
    b.release(ENV, "k", "replica-b")  # not its lease: nothing happens
    assert not b.lease(ENV, "k", "replica-b", 30.0)
    a.release(ENV, "k", "replica-a")
    assert b.lease(ENV, "k", "replica-b", 30.0)


def test_a_lease_expires_by_itself(backend: Backend) -> None:
    a, b = backend.open(), backend.open()
    assert a.lease(ENV, "k", "replica-a", 0.3)  # then the holder dies without giving it back
    assert not b.lease(ENV, "k", "replica-b", 30.0)
    time.sleep(0.5)
    assert b.lease(ENV, "k", "replica-b", 30.0)


def _writer(backend: Backend, worker: int) -> None:
    db = backend.open()
    for i in range(200):
        db.put(ENV if worker % 2 else "env 2", f"w{worker}-{i}", entry(i, host=f"w{worker}"))
    db.close()


def _join_all(procs: list[multiprocessing.process.BaseProcess], timeout: float) -> None:
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_eight_writers_of_200_puts_lose_nothing(backend: Backend) -> None:
    # No store yet: the writers race to make it too.
    _join_all([FORK.Process(target=_writer, args=(backend, w)) for w in range(8)], 60)
    db = backend.open()
    assert db.size() == 1600
    for w in range(8):
        for i in (0, 99, 199):
            assert db.get(ENV if w % 2 else "env 2", f"w{w}-{i}") == entry(i, host=f"w{w}")


def _racer(backend: Backend, worker: int) -> None:
    db = backend.open()
    rng = random.Random(worker)
    for _ in range(25):
        k = rng.randrange(5)
        db.put(ENV, f"k{k}", entry(k, ms=1.0 + worker + k / 10, host=f"w{worker}"))
    db.close()


def test_concurrent_puts_of_one_key_keep_the_fastest_of_all(backend: Backend) -> None:
    backend.open().size()
    _join_all([FORK.Process(target=_racer, args=(backend, w)) for w in range(8)], 60)
    db = backend.open()
    for k in range(5):  # the fastest that any writer put of this key
        wrote = [w for w in range(8) if k in _keys_of(w)]
        assert wrote, "every key is written by some writer"
        got = db.get(ENV, f"k{k}")
        best = min(wrote)
        assert got is not None and got.host == f"w{best}" and got.plan.ms == 1.0 + best + k / 10


def _keys_of(worker: int) -> set[int]:
    rng = random.Random(worker)
    return {rng.randrange(5) for _ in range(25)}


def _endless_writer(backend: Backend) -> None:
    db = backend.open()
    n = db.size()  # go on where the last one was killed
    while True:
        db.put(ENV, f"k{n}", entry(n))
        n += 1


def test_a_writer_killed_50_times_leaves_a_readable_store(backend: Backend) -> None:
    rng = random.Random(5)
    for _ in range(50):
        p = FORK.Process(target=_endless_writer, args=(backend,))
        p.start()
        time.sleep(rng.uniform(0.0, 0.06))  # anywhere: opening, mid-transaction, committing
        assert p.pid is not None
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        assert p.exitcode == -signal.SIGKILL
    db = backend.open()
    n = db.size()
    assert n > 50  # the writers got on, and each entry committed is whole
    assert all(db.get(ENV, f"k{i}") == entry(i) for i in range(n))
    assert db.get(ENV, f"k{n}") is None
    if backend.kind == "sqlite":
        with sqlite3.connect(backend.where) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_an_infinitely_slow_heuristic_choice_round_trips(backend: Backend) -> None:
    """The heuristics' choice that computed wrongly is timed as infinite (`TuneResult.record`)."""
    heuristic = record(1).heuristic
    assert heuristic is not None
    plan = replace(record(1), heuristic=replace(heuristic, ms=float("inf")))
    db = backend.open()
    db.put(ENV, "k", measured(plan))
    got = backend.open().get(ENV, "k")
    assert got is not None and got.plan.heuristic is not None
    assert got.plan.heuristic.ms == float("inf") and got.validated


# Redis alone: what a server says that SQLite never does.

def test_a_server_that_refuses_is_unavailable(redis_url: str) -> None:
    from dslc.runtime.tuningdb import Unavailable

    no_such_db = redis_url.rsplit("/", 1)[0] + "/99"  # the server has 16
    with pytest.raises(Unavailable, match="cannot be reached"):
        RedisStore(no_such_db).get(ENV, "k")


def test_a_read_only_replica_costs_the_writes_not_the_reads(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    from tests.redis_server import free_port

    writer = RedisStore(redis_url)
    writer.put(ENV, "k", entry(1))
    writer.client.replicaof("127.0.0.1", free_port())  # a replica (of nobody): read-only
    try:
        replica = RedisStore(redis_url)
        assert replica.get(ENV, "k") == entry(1)
        assert replica.put(ENV, "new", entry(2)) == entry(2) and replica.stores == 0
        assert replica.lease(ENV, "k", "me", 30.0)  # nobody to share the work with through it
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(said) == 1 and said[0].startswith(f"cannot write tuning database `{redis_url}` (")
        assert said[0].endswith("You can't write against a read only replica.); results stay local")
    finally:
        writer.client.replicaof("NO", "ONE")
    assert writer.get(ENV, "new") is None


# The fleet's database over this machine's (`tiered.Tiered`), with a fleet store that can be
# taken down at will and a clock the test moves.

class Fleet(TuningStore):
    """A fleet's store as `Tiered` sees one: a SQLite file behind it, and `down` makes every
    call raise `Unavailable`, as a server out of reach does; `calls` counts the calls."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.inner = SQLiteStore(path)
        self.name = "redis://fleet:6379/0"
        self.down = False
        self.calls = 0
        self.closed = False

    def _reach(self) -> SQLiteStore:
        from dslc.runtime.tuningdb import Unavailable

        self.calls += 1
        if self.down:
            raise Unavailable("tuning database `redis://fleet:6379/0` cannot be reached (down)")
        return self.inner

    def get(self, env: str, key: str) -> Entry | None:
        return self._reach().get(env, key)

    def put(self, env: str, key: str, entry: Entry) -> Entry:
        return self._reach().put(env, key, entry)

    def lease(self, env: str, key: str, holder: str, ttl_s: float) -> bool:
        return self._reach().lease(env, key, holder, ttl_s)

    def release(self, env: str, key: str, holder: str) -> None:
        self._reach().release(env, key, holder)

    def size(self) -> int:
        return self._reach().size()

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The clock `Tiered` reads (seconds; the test moves it)."""
    from types import SimpleNamespace

    from dslc.runtime.tuningdb import tiered

    now = [1000.0]
    monkeypatch.setattr(tiered, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def _tiered(tmp_path: Path) -> tuple[TuningStore, Fleet, SQLiteStore]:
    from dslc.runtime.tuningdb.tiered import Tiered

    fleet, local = Fleet(tmp_path / "fleet.db"), SQLiteStore(tmp_path / "local.db")
    return Tiered(fleet, local), fleet, local


def test_tiered_reads_the_fleet_first_and_keeps_what_it_read_here(
        tmp_path: Path, clock: list[float], caplog: pytest.LogCaptureFixture) -> None:
    db, fleet, local = _tiered(tmp_path)
    assert db.name == "redis://fleet:6379/0"
    fast, slow = entry(1, ms=1.0, host="fleet"), entry(2, ms=2.0, host="here")
    fleet.inner.put(ENV, "k", fast)
    assert db.get(ENV, "k") == fast and db.hits == 1
    assert local.get(ENV, "k") == fast  # kept here, for when the fleet is down
    fleet.inner.put(ENV, "k2", fast)
    local.put(ENV, "k2", slow)  # here an older, slower one: the fleet's replaces it
    assert db.get(ENV, "k2") == fast and local.get(ENV, "k2") == fast and db.hits == 2
    assert db.get(ENV, "none") is None and db.hits == 2
    stored = local.stores
    with caplog.at_level(logging.INFO, logger="dslc.tuningdb"):
        assert db.get(ENV, "k") == fast and local.stores == stored  # the same: not put again
    assert "kept the record" not in caplog.text


def test_tiered_publishes_what_was_measured_while_the_fleet_was_down(tmp_path: Path,
                                                                     clock: list[float]) -> None:
    db, fleet, local = _tiered(tmp_path)
    mine = entry(3, host="here")
    local.put(ENV, "k", mine)
    assert db.get(ENV, "k") == mine and db.hits == 1
    assert fleet.inner.get(ENV, "k") == mine


def test_tiered_puts_go_to_both_and_the_fleets_merge_decides(tmp_path: Path,
                                                             clock: list[float]) -> None:
    db, fleet, local = _tiered(tmp_path)
    fast, slow = entry(1, ms=1.0, host="fleet"), entry(2, ms=2.0, host="here")
    fleet.inner.put(ENV, "k", fast)
    assert db.put(ENV, "k", slow) == fast and db.stores == 0  # lost to the fleet's
    assert local.get(ENV, "k") == slow  # this machine had none: it keeps its own
    faster = entry(3, ms=0.5, host="here")
    assert db.put(ENV, "k", faster) == faster and db.stores == 1
    assert fleet.inner.get(ENV, "k") == faster and local.get(ENV, "k") == faster
    assert db.put(ENV, "k2", slow) == slow and db.stores == 2
    assert db.size() == 2 and fleet.calls > 0


def test_a_fleet_that_is_down_costs_reuse_never_a_start(
        tmp_path: Path, clock: list[float], caplog: pytest.LogCaptureFixture) -> None:
    """Reads, writes, leases and the size go to this machine's database alone, said once; the
    fleet is not tried again until 30 s later."""
    db, fleet, local = _tiered(tmp_path)
    mine = entry(1, host="here")
    local.put(ENV, "k", mine)
    fleet.inner.put(ENV, "a", entry(2))
    fleet.inner.put(ENV, "b", entry(3))
    fleet.inner.put(ENV, "c", entry(5))
    fleet.down = True
    with caplog.at_level(logging.WARNING, logger="dslc.tuningdb"):
        assert db.get(ENV, "k") == mine and db.hits == 1
        assert db.get(ENV, "a") is None and db.hits == 1
        assert db.get(ENV, "k") == mine and db.hits == 2
        assert fleet.calls == 1  # tried once; not again while it is down
        new = entry(4, host="here")
        assert db.put(ENV, "new", new) == new and db.stores == 1
        assert local.get(ENV, "new") == new
        assert db.lease(ENV, "k", "me", 30.0)
        assert not local.lease(ENV, "k", "another", 30.0)  # taken on this machine's database
        db.release(ENV, "k", "me")
        assert local.lease(ENV, "k", "another", 30.0)  # and given back there
        assert not db.lease(ENV, "k", "me", 30.0)  # another process of this host holds it
        db.release(ENV, "never leased", "me")  # nothing to give back: nothing happens
        assert db.size() == 2  # this machine's two
        assert fleet.calls == 1
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == ["tuning database `redis://fleet:6379/0` cannot be reached (down); using "
                    f"this machine's tuning database `{local.name}` and the heuristics' plans "
                    "meanwhile"]
    fleet.down = False
    clock[0] += 29.5
    assert db.size() == 2 and fleet.calls == 1  # not yet
    clock[0] += 0.5
    assert db.size() == 3 and fleet.calls == 2  # 30 s later: the fleet's three
    assert fleet.inner.get(ENV, "k") is None  # published when next read, not before
    assert db.get(ENV, "k") == mine and fleet.inner.get(ENV, "k") == mine


def test_tiered_leases_are_the_fleets_while_it_is_up(tmp_path: Path, clock: list[float]) -> None:
    db, fleet, local = _tiered(tmp_path)
    assert db.lease(ENV, "k", "me", 30.0)
    assert not fleet.inner.lease(ENV, "k", "another host", 30.0)  # one host measures a key
    assert local.lease(ENV, "k", "another process", 30.0)  # not taken here
    local.release(ENV, "k", "another process")
    db.release(ENV, "k", "me")
    assert fleet.inner.lease(ENV, "k", "another host", 30.0)  # given back on the fleet
    assert not db.lease(ENV, "k", "me", 30.0)  # another host holds it
    assert local.lease(ENV, "k", "another process", 30.0)  # and this machine's is not taken
    fleet.inner.release(ENV, "k", "another host")
    assert db.lease(ENV, "k2", "me", 30.0)
    fleet.down = True
    db.release(ENV, "k2", "me")  # the fleet went down meanwhile: its lease expires by itself
    assert db.size() == 0 and fleet.calls == 5  # down since the release: not tried for size
    db.close()
    assert fleet.closed and local._conn is None


# What each store says and counts, to the letter.

def test_what_a_put_that_lost_says(backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    db = backend.open()
    key = "0123456789abcdef0123456789abcdef"  # said by its first 24 characters
    fast, slow = entry(1, ms=1.0, host="fast"), entry(2, ms=2.0, host="slow")
    db.put(ENV, key, fast)
    with caplog.at_level(logging.INFO, logger="dslc.tuningdb"):
        assert db.put(ENV, key, slow) == fast
    assert [r.getMessage() for r in caplog.records] == [
        f"tuning database {db.name}: kept the record of fast (1.0 ms) for "
        "0123456789abcdef01234567 over the one from slow (2.0 ms)"]


def test_each_hit_and_each_store_is_counted(backend: Backend) -> None:
    db = backend.open()
    db.put(ENV, "a", entry(1))
    db.put(ENV, "b", entry(2))
    db.put(ENV, "b", entry(3, ms=9.0))  # lost: not a store
    assert db.get(ENV, "a") == entry(1) and db.get(ENV, "b") == entry(2)
    assert db.get(ENV, "c") is None
    assert (db.hits, db.stores) == (2, 2)


def test_a_damaged_entry_is_named_by_the_first_40_characters_of_its_key(
        backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    key = "k" * 40 + "-the rest of a long key"
    db = backend.open()
    db.put(ENV, key, entry(1))
    backend.corrupt(ENV, key, "{ torn")
    assert backend.open().get(ENV, key) is None
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and f"(entries.{'k' * 40}: not JSON " in said[0]


def test_a_record_is_validated_only_with_an_engine_a_positive_time_and_an_error() -> None:
    from dslc.runtime.tuningdb import validated

    plan = record(1)
    assert validated(plan) and validated(replace(plan, ms=1e-9))
    for wrong in ({"ms": 0.0}, {"ms": -1.0}, {"ms": float("nan")}, {"ms": None},
                  {"error": None}, {"error": float("inf")}, {"engine_id": None}):
        assert not validated(replace(plan, **wrong)), wrong


def test_an_entry_is_stored_with_its_keys_in_order_at_every_level() -> None:
    """The stored text is canonical: equal entries are equal bytes in any store."""
    import json

    orders: list[list[str]] = []

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        orders.append([k for k, _ in items])
        return dict(items)

    text = measured(replace(record(3), serialized=b"\x01"), host="h", at="t", source="s",
                    driver=5).encode()
    json.loads(text, object_pairs_hook=pairs)
    assert len(orders) > 3 and all(keys == sorted(keys) for keys in orders)


def test_a_redis_entry_is_one_key_named_by_schema_environment_and_group(redis_url: str) -> None:
    """`dslc:tuning:<schema>:<first 16 hex digits of the environment's SHA-256>:<group key>`
    (and `dslc:lease:...` for its lease); the size counts only the entries of this schema."""
    import hashlib

    from dslc.runtime.tuningdb.store import SCHEMA

    db = RedisStore(redis_url)
    db.put(ENV, "k", entry(1))
    db.lease(ENV, "k", "me", 30.0)
    digest = hashlib.sha256(ENV.encode()).hexdigest()[:16]
    client = db.client
    assert sorted(client.keys("*")) == [f"dslc:lease:{SCHEMA}:{digest}:k".encode(),
                                        f"dslc:tuning:{SCHEMA}:{digest}:k".encode()]
    client.set(f"dslc:tuning:{SCHEMA - 1}:{digest}:k", "an older dslc's")
    client.set("another:application", "x")
    for i in range(3):
        db.lease(ENV, f"lease{i}", "me", 30.0)
    assert db.size() == 1


def test_a_redis_store_is_used_again_after_close_and_handed_on_without_its_connection(
        redis_url: str) -> None:
    import pickle

    db = RedisStore(redis_url)
    db.put(ENV, "k", entry(1))
    copy = pickle.loads(pickle.dumps(db))
    assert copy._client is None and copy.url == redis_url and copy.get(ENV, "k") == entry(1)
    db.close()
    assert db.get(ENV, "k") == entry(1)  # connects again


def test_a_host_without_the_redis_client_reads_the_fleet_as_down(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from dslc.runtime.tuningdb import Unavailable

    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` raises ImportError
    with pytest.raises(Unavailable) as err:
        RedisStore("redis://db:6379/0").get(ENV, "k")
    assert str(err.value) == "the fleet's tuning database needs the Redis client, which is not " \
                             "installed here (`pip install 'dslc[fleet]'`)"


def test_a_redis_lease_lasts_its_time_in_milliseconds_and_at_least_one() -> None:
    asked: list[int] = []

    class Client:
        def set(self, name: str, holder: str, px: int, nx: bool) -> bool:
            asked.append(px)
            return True

    db = RedisStore("redis://db:6379/0")
    db._client = Client()
    for ttl_s in (30.0, 0.0025, 0.0001):
        assert db.lease(ENV, "k", "me", ttl_s)
    assert asked == [30000, 2, 1]


def test_an_entry_read_back_holds_each_field_within_its_bounds() -> None:
    """host up to 256 characters, `at` and the dslc version up to 64, a driver in 0..2**62,
    `source` optional, the serialized bytes base64; past a bound the entry is damaged, named
    by its field."""
    import base64
    import json

    from dslc.runtime.records import BundleError

    good = measured(replace(record(1), serialized=b"\x00\xff"), host="h", at="t", driver=7)
    data = good.to_data()
    assert Entry.from_data(data, "e") == good
    assert Entry.decode(json.dumps(data), "e") == good
    assert Entry.decode(json.dumps(data).encode(), "e") == good  # bytes, as Redis gives them
    for name, at_bound, past in (("host", "h" * 256, "h" * 257), ("at", "t" * 64, "t" * 65),
                                 ("dslc_version", "v" * 64, "v" * 65),
                                 ("driver", 2**62, 2**62 + 1), ("driver", 0, -1),
                                 ("source", "from a file", 7)):
        kept = Entry.from_data({**data, name: at_bound}, "e")
        assert getattr(kept, name) == at_bound
        with pytest.raises(BundleError, match=rf"^e\.{name}: "):
            Entry.from_data({**data, name: past}, "e")
    without = {k: v for k, v in data.items() if k not in ("serialized", "driver")}
    bare = Entry.from_data(without, "e")
    assert bare.plan.serialized is None and bare.driver is None and bare.source is None
    from dslc.runtime.fields import MAX_TEXT

    big = b"x" * (MAX_TEXT * 3 // 4 + 3)  # its base64 is longer than any other text field's bound
    assert Entry.from_data({**data, "serialized": base64.b64encode(big).decode()},
                           "e").plan.serialized == big
    with pytest.raises(BundleError, match=r"^e\.serialized: not base64"):
        Entry.from_data({**data, "serialized": "AAEC!"}, "e")  # "AAEC" alone would decode
    for missing in ("plan", "host", "at", "dslc_version"):
        with pytest.raises(BundleError, match=r"^e"):
            Entry.from_data({k: v for k, v in data.items() if k != missing}, "e")
    with pytest.raises(BundleError, match=r"^e: "):
        Entry.from_data({**data, "extra": 1}, "e")
    with pytest.raises(BundleError, match=r"^e: not JSON \("):
        Entry.decode(b"\xff\xfe", "e")


def test_an_entry_measured_here_says_where_when_and_by_which_dslc() -> None:
    import datetime
    import socket

    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    e = measured(record(1))
    after = datetime.datetime.now(datetime.UTC)
    assert e.host == socket.gethostname() and e.dslc_version == VERSION and e.source is None
    at = datetime.datetime.fromisoformat(e.at)
    assert e.at.endswith("+00:00") and before <= at <= after and at.microsecond == 0
    given = measured(record(1), host="gpu-1", at="2026-11-01T10:00:00+00:00", source="bundle")
    assert (given.host, given.at, given.source) == ("gpu-1", "2026-11-01T10:00:00+00:00",
                                                    "bundle")
    with_bytes = replace(record(1), serialized=b"\x01")
    assert measured(with_bytes, driver=5).driver == 5
    assert measured(with_bytes, driver=5).plan.serialized == b"\x01"
    assert measured(with_bytes).plan.serialized is None and measured(with_bytes).driver is None
    assert measured(record(1), driver=5).driver is None  # no bytes: no driver to keep
    fresh = SQLiteStore(Path("unused.db"))
    assert (fresh.hits, fresh.stores) == (0, 0)
