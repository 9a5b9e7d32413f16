"""The SQLite tuning database against what goes wrong on shared machines: a file that is no
database of this schema (torn, damaged, another version, another shape, JSON of another
version) is kept aside, never written over (50 entries stay 50), said once with both paths; a
damaged entry is a miss, not a crash; a writer killed inside its transaction costs nobody a wait
and leaves the store as it was; concurrent writers over a damaged file keep it aside once; a
read-only database is readable; and the atomic writes of the other artifacts flush to disk and
clean up what killed writers left."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dslc import fsutil
from dslc.runtime.tuningdb import Entry, measured
from dslc.runtime.tuningdb.sqlite import SQLiteStore
from dslc.runtime.tuningdb.store import SCHEMA
from tests.test_tuning_store import record

FORK = multiprocessing.get_context("fork")


def entry(i: int) -> Entry:
    return measured(record(i), host="host-a", at="2026-11-01T10:00:00+00:00")


def fifty(path: Path) -> None:
    db = SQLiteStore(path)
    for i in range(50):
        db.put("env", f"k{i}", entry(i))
    db.close()  # the last connection: the log is folded into the file, which stands alone


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _sql(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in statements:
        conn.execute(statement)
    conn.close()


def _torn(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _prefixed(path: Path) -> None:
    path.write_bytes(b"\x00" + path.read_bytes())


def _newer(path: Path) -> None:
    _sql(path, f"UPDATE meta SET value = '{SCHEMA + 1}' WHERE name = 'schema'")


def _another_database(path: Path) -> None:
    path.unlink()
    _sql(path, "CREATE TABLE users (name TEXT)", "INSERT INTO users VALUES ('x')")


def _another_shape(path: Path) -> None:
    _sql(path, "DROP TABLE plans", "CREATE TABLE plans (env TEXT, key TEXT, data BLOB)")


def _json_of_another_version(path: Path) -> None:
    path.write_text(json.dumps({"version": 7, "entries": {}}))


def _torn_json(path: Path) -> None:
    path.write_text('{"version": 1, "entries": {"env": {"k0": {"engine')


@pytest.mark.parametrize("damage, tag", [
    (_torn, "unreadable"), (_prefixed, "unreadable"), (_newer, f"v{SCHEMA + 1}"),
    (_another_database, "unreadable"), (_another_shape, "unreadable"),
    (_json_of_another_version, "v7"), (_torn_json, "unreadable"),
], ids=["torn", "prefixed", "newer schema", "another database", "another shape",
        "json v7", "torn json"])
def test_a_file_it_cannot_read_is_kept_aside_and_never_overwritten(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None],
        tag: str) -> None:
    path = tmp_path / "tuning.db"
    fifty(path)
    damage(path)
    original = path.read_bytes()
    db = SQLiteStore(path)
    assert db.get("env", "k1") is None and db.size() == 0  # read as empty, not a crash
    db.put("env", "new", entry(99))
    db.put("env", "newer", entry(98))
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(f"tuning.db.{tag}-")]
    assert len(kept) == 1 and kept[0].read_bytes() == original  # nothing lost
    assert SQLiteStore(path).size() == 2 and db.get("env", "new") == entry(99)
    said = warnings_of(caplog)  # once, naming both paths
    assert len(said) == 1 and str(path) in said[0] and f"kept it as `{kept[0]}`" in said[0]


def test_a_damaged_entry_is_a_miss_and_the_others_stay(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tuning.db"
    fifty(path)
    bad = entry(3).to_data()
    bad["plan"]["engine_id"] = "x"  # would reach cuDNN as an engine id
    worse = entry(4).to_data()
    worse["plan"]["knobs"] = {"KERNEL_CFG": 2**40}
    _sql(path, f"UPDATE plans SET entry = '{json.dumps(bad)}' WHERE key = 'k3'",
         f"UPDATE plans SET entry = '{json.dumps(worse)}' WHERE key = 'k4'")
    db = SQLiteStore(path)
    assert db.get("env", "k3") is None and db.get("env", "k4") is None
    assert db.get("env", "k5") == entry(5) and db.hits == 1
    db.put("env", "k50", entry(50))
    assert SQLiteStore(path).size() == 51  # the damaged entries are kept, not dropped
    assert any("entries.k3.plan.engine_id" in w for w in warnings_of(caplog))


def _writer(path: str, worker: int) -> None:
    db = SQLiteStore(Path(path))
    for i in range(20):
        db.put(f"env{worker % 2}", f"w{worker}-{i}", entry(i))
    db.close()


def test_concurrent_writers_over_a_damaged_file_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tuning.db"
    path.write_text("{ torn")
    procs = [FORK.Process(target=_writer, args=(str(path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert SQLiteStore(path).size() == 80
    kept = [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    assert len(kept) == 1 and kept[0].read_text() == "{ torn"  # set aside once, not per writer


def _killed_mid_transaction(path: str, flag: str) -> None:
    """A writer as `SQLiteStore.put` is one, stopped inside its transaction (the write lock
    held, a row written, no commit): it tells the test, which kills it there."""
    db = SQLiteStore(Path(path))
    conn = db._connection()
    assert conn is not None
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO plans VALUES ('env', 'half', '{\"plan\": ')")
    Path(flag).touch()
    time.sleep(600)


def test_a_writer_killed_mid_write_leaves_a_readable_database(tmp_path: Path) -> None:
    path = tmp_path / "tuning.db"
    fifty(path)
    flag = tmp_path / "halfway"
    p = FORK.Process(target=_killed_mid_transaction, args=(str(path), str(flag)))
    p.start()
    deadline = time.time() + 60
    while not flag.exists() and time.time() < deadline:
        time.sleep(0.02)
    assert flag.exists() and p.pid is not None
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert SQLiteStore(path).size() == 50  # the database as it was
    db = SQLiteStore(path, timeout_s=5.0)
    started = time.monotonic()
    db.put("env", "after", entry(1))  # the lock died with its holder: no wait
    assert time.monotonic() - started < 2.0
    assert db.stores == 1 and SQLiteStore(path).size() == 51 and db.get("env", "half") is None


def _read_only_child(folder: str, queue: Any) -> None:
    if os.geteuid() == 0:  # root reads and writes through any mode bits: be somebody else
        os.setgid(65534)
        os.setuid(65534)
    logging.basicConfig(level=logging.WARNING)
    db = SQLiteStore(Path(folder) / "tuning.db")
    got = db.get("env", "k7")
    db.put("env", "new", entry(1))  # cannot: a warning, not an error
    queue.put((got, db.size(), db.stores))


@pytest.mark.parametrize("damaged", [False, True])
def test_a_read_only_database_is_readable(damaged: bool) -> None:
    """Readable without writing anything beside it; a damaged one reads as empty (it cannot be
    kept aside)."""
    folder = Path(tempfile.mkdtemp(prefix="dslc-ro-"))  # not under pytest's private folder
    try:
        path = folder / "tuning.db"
        fifty(path)
        if damaged:
            _prefixed(path)
        before = path.read_bytes()
        path.chmod(0o444)
        folder.chmod(0o555)
        queue = FORK.Queue()
        p = FORK.Process(target=_read_only_child, args=(str(folder), queue))
        p.start()
        got, size, stores = queue.get(timeout=60)
        p.join(30)
        assert p.exitcode == 0
        assert (got, size) == ((None, 0) if damaged else (entry(7), 50)) and stores == 0
        assert path.read_bytes() == before and sorted(os.listdir(folder)) == ["tuning.db"]
    finally:
        folder.chmod(0o755)
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


def test_atomic_writes_flush_the_file_and_its_folder(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "out.bin"
    fsutil.write_bytes(target, b"abc")
    assert target.read_bytes() == b"abc"
    assert len(synced) == 2 and synced[0].startswith(str(tmp_path / ".out.bin."))
    assert synced[1] == str(tmp_path)  # the rename itself


def test_only_stale_temporary_files_of_the_same_target_are_removed(tmp_path: Path) -> None:
    old = time.time() - 2 * fsutil.STALE_TMP_S
    stale = tmp_path / ".out.bin.dead1.tmp"
    live = tmp_path / ".out.bin.live2.tmp"  # a writer at work right now
    other = tmp_path / ".other.bin.dead3.tmp"
    folder = tmp_path / ".out.bin.dir.tmp"
    for p in (stale, live, other):
        p.write_bytes(b"x")
    folder.mkdir()
    for p in (stale, other, folder):
        os.utime(p, (old, old))
    fsutil.write_bytes(tmp_path / "out.bin", b"new")
    assert not stale.exists() and live.exists() and other.exists() and folder.is_dir()


def test_threads_sharing_one_store_lose_nothing(tmp_path: Path) -> None:
    """A service building models from several threads shares one store (one connection)."""
    import threading

    db = SQLiteStore(tmp_path / "tuning.db")
    failures: list[BaseException] = []

    def put(worker: int) -> None:
        try:
            for i in range(50):
                db.put("env", f"t{worker}-{i}", entry(i))
                assert db.get("env", f"t{worker}-{i}") == entry(i)
        except BaseException as err:
            failures.append(err)

    threads = [threading.Thread(target=put, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures and db.size() == 200


# In this process (what the forked tests above check from outside, seen here step by step).

def _page_damaged(path: Path) -> None:
    """The last page (entries) overwritten: the header and the schema read fine, the entries
    do not."""
    data = bytearray(path.read_bytes())
    data[-4096 + 8:-100] = b"\x55" * (4096 - 108)
    path.write_bytes(bytes(data))


@pytest.fixture
def stamp(monkeypatch: pytest.MonkeyPatch) -> str:
    """The time a file is kept aside at, fixed: 2026-11-01 10:00:00."""
    from types import SimpleNamespace

    from dslc.runtime.tuningdb import sqlite as module

    fixed = time.struct_time((2026, 11, 1, 10, 0, 0, 6, 305, 0))
    monkeypatch.setattr(module, "time", SimpleNamespace(
        strftime=lambda fmt: time.strftime(fmt, fixed), time=time.time))
    return "20261101-100000"


def test_a_file_found_damaged_only_when_its_entries_are_read_is_kept_aside(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, stamp: str) -> None:
    """The schema reads fine, the entries' page does not: SQLite's quick check confirms it (its
    report named), the file is kept aside with the time, and the read is tried on a new one."""
    path = tmp_path / "tuning.db"
    fifty(path)
    _page_damaged(path)
    original = path.read_bytes()
    db = SQLiteStore(path)
    assert db.get("env", "k49") is None and db.size() == 0
    aside = tmp_path / f"tuning.db.unreadable-{stamp}"
    assert aside.read_bytes() == original
    [said] = warnings_of(caplog)
    assert said.startswith(f"tuning database `{path}` was unreadable (damaged (*** in database "
                           "main ***\n")
    assert said.endswith(f"); kept it as `{aside}` and started a new one")


def test_a_file_kept_aside_in_the_same_second_as_another_gets_the_next_number(
        tmp_path: Path, stamp: str) -> None:
    path = tmp_path / "tuning.db"
    path.write_text("{ torn")
    (tmp_path / f"tuning.db.unreadable-{stamp}").write_text("an earlier one")
    SQLiteStore(path).size()
    assert (tmp_path / f"tuning.db.unreadable-{stamp}").read_text() == "an earlier one"
    assert (tmp_path / f"tuning.db.unreadable-{stamp}-1").read_text() == "{ torn"


def test_with_no_free_name_to_keep_a_file_aside_it_is_left_and_said(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, stamp: str) -> None:
    """1000 names are tried (the time, then -1 .. -999); all taken, the file stays as it is."""
    path = tmp_path / "tuning.db"
    path.write_text("{ torn")
    for n in range(1000):
        (tmp_path / (f"tuning.db.unreadable-{stamp}" + (f"-{n}" if n else ""))).touch()
    db = SQLiteStore(path)
    assert db.get("env", "k") is None
    assert path.read_text() == "{ torn"
    assert warnings_of(caplog) == [f"cannot read tuning database `{path}` (no free name beside "
                                   f"`{path}` to keep it aside); tuning without it"]


def test_a_file_another_process_keeps_aside_meanwhile_is_not_kept_aside_twice(
        tmp_path: Path) -> None:
    """A store that finds the file damaged waits for the lock of the one keeping it aside, then
    finds the new database good (checked through) and uses it."""
    import threading

    from filelock import FileLock

    path = tmp_path / "tuning.db"
    path.write_text("{ torn")
    lock = FileLock(str(path) + ".lock")
    lock.acquire()
    got: list[Entry | None] = []
    reader = threading.Thread(target=lambda: got.append(SQLiteStore(path).get("env", "k")))
    reader.start()
    time.sleep(1.0)  # the reader is waiting for the lock now
    os.rename(path, tmp_path / "kept by the other")  # what the other process does
    other = SQLiteStore(path)
    other.put("env", "k", entry(1))
    other.close()
    lock.release()
    reader.join(30)
    assert got == [entry(1)]
    assert sorted(p.name for p in tmp_path.iterdir() if "tuning.db." in p.name) == \
        ["tuning.db.lock"]  # nothing else kept aside


def test_a_file_whose_keep_aside_lock_is_held_too_long_costs_the_read_and_the_write(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from filelock import FileLock

    path = tmp_path / "tuning.db"
    path.write_text("{ torn")
    lock = FileLock(str(path) + ".lock")
    lock.acquire()
    try:
        db = SQLiteStore(path, timeout_s=0.2)
        started = time.monotonic()
        assert db.get("env", "k") is None
        assert db.put("env", "k", entry(1)) == entry(1) and db.stores == 0
        assert db.lease("env", "k", "me", 30.0)  # nobody to share the work with through it
        db.release("env", "k", "me")
        assert db.size() == 0
        assert time.monotonic() - started < 10.0
    finally:
        lock.release()
    assert path.read_text() == "{ torn"
    held = f"The file lock '{path}.lock' could not be acquired."
    assert warnings_of(caplog) == [
        f"cannot read tuning database `{path}` ({held}); tuning without it",
        f"cannot write tuning database `{path}` ({held}); results stay in the bundle only"]


def test_an_error_that_is_no_damage_costs_the_operation_not_the_file(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tuning.db"
    fifty(path)
    db = SQLiteStore(path)
    conn = db._connection()
    assert conn is not None
    conn.close()  # closed under the store
    assert db.get("env", "k1") is None
    assert warnings_of(caplog) == [f"cannot read tuning database `{path}` (Cannot operate on a "
                                   "closed database.); tuning without it"]
    assert db.get("env", "k1") == entry(1)  # opened again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuning.db", "tuning.db-shm",
                                                          "tuning.db-wal"]


@pytest.mark.parametrize("read_only", ["the folder", "the file"])
def test_a_database_this_process_cannot_write_is_read_and_never_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        read_only: str) -> None:
    """What a user who may not write the folder or the file sees (here the access check says
    so; the forked test above is such a user)."""
    from types import SimpleNamespace

    from dslc.runtime.tuningdb import sqlite as module

    path = tmp_path / "tuning.db"
    fifty(path)
    before = path.read_bytes()
    writable = (lambda p: False) if read_only == "the folder" else (lambda p: Path(p) != path)
    monkeypatch.setattr(module, "os", SimpleNamespace(
        **{k: getattr(os, k) for k in ("path", "getpid", "rename", "W_OK")},
        access=lambda p, mode: writable(p)))
    db = SQLiteStore(path)
    assert db.get("env", "k7") == entry(7) and db.size() == 50 and not db.writable
    assert db.put("env", "new", entry(1)) == entry(1) and db.stores == 0
    assert db.lease("env", "k7", "me", 30.0) and db.lease("env", "k7", "another", 30.0)
    db.release("env", "k7", "me")
    db.close()
    assert path.read_bytes() == before
    assert warnings_of(caplog) == [f"cannot write tuning database `{path}` (the folder or the "
                                   "file is read-only); results stay in the bundle only"]
    if read_only == "the folder":
        assert SQLiteStore(tmp_path / "absent.db").size() == 0  # nothing to read, nothing made
        assert not (tmp_path / "absent.db").exists()


def test_a_damaged_database_this_process_cannot_write_reads_as_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from dslc.runtime.tuningdb import sqlite as module

    def _emptied(path: Path) -> None:
        path.write_bytes(b"")

    cases = (("prefixed.db", _prefixed, "file is not a database"),
             ("other.db", _another_database, "not a tuning database (no schema recorded)"),
             ("empty.db", _emptied, "not a tuning database (no schema recorded)"))
    for name, damage, _ in cases:
        fifty(tmp_path / name)
        damage(tmp_path / name)
    monkeypatch.setattr(module, "os", SimpleNamespace(
        **{k: getattr(os, k) for k in ("path", "getpid", "rename", "W_OK")},
        access=lambda p, mode: False))
    for name, _, problem in cases:
        path = tmp_path / name
        before = path.read_bytes()
        assert SQLiteStore(path).size() == 0
        assert path.read_bytes() == before
        assert warnings_of(caplog)[-1] == f"tuning database `{path}` is unreadable ({problem}) " \
                                          "and cannot be kept aside (read-only); tuning without it"


def test_a_store_handed_to_another_process_takes_its_place_not_its_connection(
        tmp_path: Path) -> None:
    import pickle

    path = tmp_path / "tuning.db"
    fifty(path)
    db = SQLiteStore(path, timeout_s=7.0)
    assert db.get("env", "k1") == entry(1)
    copy = pickle.loads(pickle.dumps(db))
    assert (copy.path, copy.timeout_s, copy._conn) == (path, 7.0, None)
    assert copy.get("env", "k2") == entry(2) and db.get("env", "k3") == entry(3)


def test_a_lease_is_free_again_at_the_very_second_it_expires(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from dslc.runtime.tuningdb import sqlite as module

    now = [100.0]
    monkeypatch.setattr(module, "time", SimpleNamespace(time=lambda: now[0],
                                                        strftime=time.strftime))
    db = SQLiteStore(tmp_path / "tuning.db")
    assert db.lease("env", "k", "a", 10.0)
    now[0] = 109.5
    assert not db.lease("env", "k", "b", 10.0)
    now[0] = 110.0
    assert db.lease("env", "k", "b", 10.0)


@pytest.mark.parametrize("statements, reason, tag", [
    (["DELETE FROM meta"], f"database schema None, this dslc uses {SCHEMA}", "unreadable"),
    (["UPDATE meta SET value = 'abc'"], f"database schema 'abc', this dslc uses {SCHEMA}",
     "unreadable"),
    (["UPDATE meta SET value = '7'"], f"database schema '7', this dslc uses {SCHEMA}", "v7"),
    (["DROP TABLE meta"], "not a tuning database (no schema recorded)", "unreadable"),
    (["DROP TABLE leases", "CREATE TABLE leases (env TEXT, key TEXT)"],
     "not a tuning database (table leases holds ['env', 'key'])", "unreadable"),
], ids=["no schema row", "a schema that is no number", "schema 7", "no meta", "other leases"])
def test_what_a_database_of_another_schema_is_kept_aside_as(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, stamp: str, statements: list[str],
        reason: str, tag: str) -> None:
    path = tmp_path / "tuning.db"
    fifty(path)
    _sql(path, *statements)
    assert SQLiteStore(path).size() == 0
    aside = tmp_path / f"tuning.db.{tag}-{stamp}"
    assert aside.is_file()
    assert warnings_of(caplog) == [f"tuning database `{path}` was unreadable ({reason}); kept it "
                                   f"as `{aside}` and started a new one"]


def test_a_file_that_is_no_database_is_said_in_sqlites_words(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, stamp: str) -> None:
    path = tmp_path / "tuning.db"
    fifty(path)
    _prefixed(path)
    old = tmp_path / "tuning.json"  # and the JSON database beside comes into the new one
    old.write_text(json.dumps({"version": 1, "entries": {"env": {"k0": entry(0).plan.to_data()}}}))
    db = SQLiteStore(path, beside=old)
    assert db.size() == 1
    aside = tmp_path / f"tuning.db.unreadable-{stamp}"
    assert warnings_of(caplog) == [f"tuning database `{path}` was unreadable (file is not a "
                                   f"database); kept it as `{aside}` and started a new one"]


def test_each_file_kept_aside_in_a_stores_life_is_said_with_its_name(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, stamp: str) -> None:
    """Twice damaged, twice kept aside under two names: both said, not only the first."""
    path = tmp_path / "tuning.db"
    fifty(path)
    _prefixed(path)
    db = SQLiteStore(path)
    assert db.size() == 0
    db.close()
    _prefixed(path)
    assert db.size() == 0
    kept = [tmp_path / f"tuning.db.unreadable-{stamp}", tmp_path / f"tuning.db.unreadable-{stamp}-1"]
    assert all(p.is_file() for p in kept)
    assert warnings_of(caplog) == [f"tuning database `{path}` was unreadable (file is not a "
                                   f"database); kept it as `{p}` and started a new one"
                                   for p in kept]


def test_a_database_in_folders_not_made_yet_is_made_with_them(tmp_path: Path) -> None:
    db = SQLiteStore(tmp_path / "a" / "b" / "tuning.db")
    db.put("env", "k", entry(1))
    assert db.stores == 1 and SQLiteStore(tmp_path / "a" / "b" / "tuning.db").size() == 1


def test_a_path_that_is_no_regular_file_is_said_once_whatever_else_cannot_be_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from filelock import FileLock

    path = tmp_path / "tuning.db"
    path.mkdir()
    db = SQLiteStore(path, timeout_s=0.2)
    assert db.get("env", "k") is None and db.size() == 0
    assert warnings_of(caplog) == [f"tuning database `{path}` is not a regular file; tuning "
                                   "without it"]
    path.rmdir()
    path.write_text("{ torn")
    with FileLock(str(path) + ".lock"):
        assert db.get("env", "k") is None  # another reason it cannot be read: not said again
    assert len(warnings_of(caplog)) == 1


def test_a_database_another_writer_holds_costs_the_read_after_the_timeout(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tuning.db"
    fifty(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        db = SQLiteStore(path, timeout_s=0.2)
        started = time.monotonic()
        assert db.get("env", "k1") is None
        assert time.monotonic() - started < 3.0  # its own timeout, not SQLite's 5 s
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert warnings_of(caplog) == [f"cannot read tuning database `{path}` (database is locked); "
                                   "tuning without it"]
    assert db.get("env", "k1") == entry(1)
    assert not [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]


def test_a_file_kept_aside_takes_its_log_and_index_with_it(tmp_path: Path, stamp: str) -> None:
    """Another process still has the damaged file open: its `-wal` and `-shm` go with it."""
    path = tmp_path / "tuning.db"
    fifty(path)
    _page_damaged(path)
    other = sqlite3.connect(path)
    try:
        other.execute("SELECT COUNT(*) FROM meta").fetchone()  # makes the log and its index
        assert SQLiteStore(path).get("env", "k49") is None
    finally:
        other.close()
    aside = f"tuning.db.unreadable-{stamp}"
    assert {aside, f"{aside}-wal", f"{aside}-shm"} <= {p.name for p in tmp_path.iterdir()}


def test_what_importing_the_json_database_beside_says(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    path, beside = tmp_path / "tuning.db", tmp_path / "tuning.json"
    beside.write_text("{ torn")
    db = SQLiteStore(path, beside=beside)
    assert db.size() == 0 and db.timeout_s == 120.0 and db.name == str(path)
    [said] = warnings_of(caplog)
    assert said.startswith(f"tuning database `{beside}` not imported (not JSON: ")
    db.close()
    caplog.clear()
    bad = {**entry(1).plan.to_data(), "engine_id": "x"}
    beside.write_text(json.dumps({"version": 1, "entries": {"env": {
        "k0": entry(0).plan.to_data(), "k1": bad}}}))
    with caplog.at_level(logging.INFO, logger="dslc.tuningdb"):
        assert SQLiteStore(path, beside=beside).size() == 1
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == f"tuning database {path}: imported 1 of 1 entries of {beside} (the " \
                          "file stays)"
    assert messages[1].startswith(f"tuning database `{beside}`: not imported, no valid plan "
                                  "(entries.k1.engine_id: ")
    assert len(messages) == 2


def test_a_write_that_finds_the_file_damaged_is_made_in_the_new_database(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tuning.db"
    fifty(path)
    _page_damaged(path)
    db = SQLiteStore(path)
    assert db.put("env", "k49", entry(99)) == entry(99) and db.stores == 1
    assert SQLiteStore(path).get("env", "k49") == entry(99)
    assert len(warnings_of(caplog)) == 1  # the file kept aside, said; the write made


def test_a_file_found_damaged_that_this_process_cannot_write_costs_the_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from dslc.runtime.tuningdb import sqlite as module

    path = tmp_path / "tuning.db"
    fifty(path)
    _page_damaged(path)
    before = path.read_bytes()
    monkeypatch.setattr(module, "os", SimpleNamespace(
        **{k: getattr(os, k) for k in ("path", "getpid", "rename", "W_OK")},
        access=lambda p, mode: False))
    db = SQLiteStore(path)
    assert db.get("env", "k49") is None
    assert path.read_bytes() == before
    assert warnings_of(caplog) == [f"cannot read tuning database `{path}` (database disk image "
                                   "is malformed); tuning without it"]


def _read_only_here(monkeypatch: pytest.MonkeyPatch, refuse: Callable[[str], bool]) -> None:
    """This process may write nothing, and SQLite opens no URI that `refuse` names (as where the
    WAL index of a database cannot be made beside it, mode=ro alone fails)."""
    from types import SimpleNamespace
    from urllib.parse import parse_qs, urlsplit

    from dslc.runtime.tuningdb import sqlite as module

    real = sqlite3.connect

    def connect(database: str, **kw: Any) -> sqlite3.Connection:
        if refuse(str(parse_qs(urlsplit(database).query))):
            raise sqlite3.OperationalError("unable to open database file")
        return real(database, **kw)

    monkeypatch.setattr(module, "os", SimpleNamespace(
        **{k: getattr(os, k) for k in ("path", "getpid", "rename", "W_OK")},
        access=lambda p, mode: False))
    monkeypatch.setattr(module, "sqlite3", SimpleNamespace(
        **{k: getattr(sqlite3, k) for k in ("Error", "DatabaseError", "Connection")},
        connect=connect))


def test_a_read_only_database_whose_index_cannot_be_made_is_read_as_it_stands(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import threading

    path = tmp_path / "tuning.db"
    fifty(path)
    _read_only_here(monkeypatch, lambda query: query != "{'mode': ['ro'], 'immutable': ['1']}")
    db = SQLiteStore(path)
    assert db.get("env", "k7") == entry(7) and db.size() == 50
    got: list[Entry | None] = []
    reader = threading.Thread(target=lambda: got.append(db.get("env", "k8")))  # one store,
    reader.start()  # read from another thread too
    reader.join(30)
    assert got == [entry(8)] and not warnings_of(caplog)


@pytest.mark.parametrize("writable", [True, False])
def test_the_stores_timeout_is_its_connections_busy_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writable: bool) -> None:
    """A reader waits for a writer as long as the store was told, read-only or not (SQLite's
    own default is 5 s)."""
    path = tmp_path / "tuning.db"
    fifty(path)
    if not writable:
        _read_only_here(monkeypatch, lambda query: False)
    db = SQLiteStore(path, timeout_s=0.25)
    conn = db._connection()
    assert conn is not None and db.writable == writable
    assert conn.execute("PRAGMA busy_timeout").fetchone() == (250,)
    db.close()


def test_a_read_only_database_that_cannot_be_opened_at_all_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tuning.db"
    fifty(path)
    _read_only_here(monkeypatch, lambda query: True)
    assert SQLiteStore(path).get("env", "k7") is None
    assert warnings_of(caplog) == [f"tuning database `{path}` is unreadable (unable to open "
                                   "database file) and cannot be kept aside (read-only); tuning "
                                   "without it"]


def test_a_read_only_path_that_is_no_regular_file_then_no_database_is_said_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tuning.db"
    path.mkdir()
    _read_only_here(monkeypatch, lambda query: False)
    db = SQLiteStore(path)
    assert db.get("env", "k") is None
    path.rmdir()
    path.write_text("{ torn")
    assert db.get("env", "k") is None  # unreadable for another reason now: not said again
    assert warnings_of(caplog) == [f"tuning database `{path}` is not a regular file; tuning "
                                   "without it"]
