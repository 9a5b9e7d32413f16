"""The tuning database against what goes wrong on shared machines: a damaged file or one of
another version is kept aside (never overwritten: 50 entries stay 50), said once with both
paths; a wrong shape or a damaged entry is a miss, not a crash; a writer killed with SIGKILL
mid-write leaves a readable database; a read-only database is readable; and the atomic writes
underneath flush to disk and clean up what killed writers left."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from dslc import fsutil
from dslc.runtime.records import PlanRecord
from dslc.tune.db import VERSION, TuningDB


def record(i: int) -> PlanRecord:
    """A record as the tuner writes it (`TuneResult.record`)."""
    return PlanRecord.from_data(
        {"engine_id": i % 7, "knobs": {"KERNEL_CFG": i}, "ms": 0.5 + i, "error": 1e-3,
         "heuristic": {"engine_id": 0, "knobs": {}, "ms": 1.0 + i},
         "top": [{"engine_id": i % 7, "knobs": {"KERNEL_CFG": i}, "ms": 0.5 + i,
                  "error": 1e-3}], "candidates": 4, "tuned": True, "tune_s": 0.2},
        "record", tuning=True)


def fifty(path: Path) -> TuningDB:
    db = TuningDB(path)
    for i in range(50):
        db.put("env", f"k{i}", record(i))
    return db


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("damage, tag", [
    (lambda text: text[: len(text) // 2], "unreadable"),  # a torn file
    (lambda text: "\x00" + text, "unreadable"),
    (lambda text: json.dumps({**json.loads(text), "version": VERSION + 1}), f"v{VERSION + 1}"),
    (lambda text: json.dumps({"version": VERSION, "entries": []}), "unreadable"),
    (lambda text: json.dumps({"version": VERSION, "entries": {"env": [1]}}), "unreadable"),
])
def test_a_file_it_cannot_read_is_kept_aside_and_never_overwritten(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Any, tag: str) -> None:
    path = tmp_path / "tuning.json"
    fifty(path)
    original = damage(path.read_text())
    path.write_text(original)
    db = TuningDB(path)
    assert db.get("env", "k1") is None and db.size() == 0  # read as empty, not a crash
    db.put("env", "new", record(99))
    db.put("env", "newer", record(98))
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(f"tuning.json.{tag}-")]
    assert len(kept) == 1 and kept[0].read_text() == original  # nothing lost
    assert TuningDB(path).size() == 2 and db.get("env", "new") == record(99)
    said = warnings_of(caplog)  # once, naming both paths
    assert len(said) == 1 and str(path) in said[0] and f"kept it as `{kept[0]}`" in said[0]


def test_a_damaged_entry_is_a_miss_and_the_others_stay(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tuning.json"
    fifty(path)
    data = json.loads(path.read_text())
    data["entries"]["env"]["k3"]["engine_id"] = "x"  # would reach cuDNN as an engine id
    data["entries"]["env"]["k4"]["knobs"] = {"KERNEL_CFG": 2**40}
    path.write_text(json.dumps(data))
    db = TuningDB(path)
    assert db.get("env", "k3") is None and db.get("env", "k4") is None
    assert db.get("env", "k5") == record(5) and db.hits == 1
    db.put("env", "k50", record(50))
    assert TuningDB(path).size() == 51  # the damaged entries are kept, not dropped
    assert any("entries.k3.engine_id" in w for w in warnings_of(caplog))


def _writer(path: str, worker: int) -> None:
    db = TuningDB(Path(path))
    for i in range(20):
        db.put(f"env{worker % 2}", f"w{worker}-{i}", record(i))


def test_concurrent_writers_over_a_damaged_file_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tuning.json"
    path.write_text("{ torn")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert TuningDB(path).size() == 80
    kept = [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    assert len(kept) == 1 and kept[0].read_text() == "{ torn"  # set aside once, not per writer


def _killed_mid_write(path: str, flag: str) -> None:
    """A writer as `TuningDB.put` is one (the lock, then an atomic write), stopped halfway
    through its bytes: it tells the test, which kills it there."""
    db = TuningDB(Path(path))

    def half_then_wait(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write('{"version": 1, "entries": {"env": {"half')
            f.flush()
            Path(flag).touch()
            time.sleep(600)

    with db.lock:
        fsutil.atomic_write(Path(path), half_then_wait)


def test_a_writer_killed_mid_write_leaves_a_readable_database(tmp_path: Path) -> None:
    path = tmp_path / "tuning.json"
    fifty(path)
    flag = tmp_path / "halfway"
    p = multiprocessing.get_context("spawn").Process(target=_killed_mid_write,
                                                     args=(str(path), str(flag)))
    p.start()
    deadline = time.time() + 120
    while not flag.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert flag.exists() and p.pid is not None
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert TuningDB(path).size() == 50  # the file as it was
    leftovers = list(tmp_path.glob(".tuning.json.*.tmp"))
    assert len(leftovers) == 1  # the half-written file, beside it
    os.utime(leftovers[0], (time.time() - 2 * fsutil.STALE_TMP_S,) * 2)  # an hour later
    db = TuningDB(path)
    db.put("env", "after", record(1))  # the lock died with its holder: no wait
    assert db.stores == 1 and TuningDB(path).size() == 51
    assert not list(tmp_path.glob(".tuning.json.*.tmp"))  # and the leftover is gone


def _read_only_child(folder: str, queue: Any) -> None:
    if os.geteuid() == 0:  # root reads and writes through any mode bits: be somebody else
        os.setgid(65534)
        os.setuid(65534)
    logging.basicConfig(level=logging.WARNING)
    db = TuningDB(Path(folder) / "tuning.json")
    got = db.get("env", "k7")
    db.put("env", "new", record(1))  # cannot: a warning, not an error
    queue.put((got, db.size(), db.stores))


@pytest.mark.parametrize("damaged", [False, True])
def test_a_read_only_database_is_readable(damaged: bool) -> None:
    """Readable without the lock; a damaged one reads as empty (it cannot be kept aside)."""
    folder = Path(tempfile.mkdtemp(prefix="dslc-ro-"))  # not under pytest's private folder
    try:
        path = folder / "tuning.json"
        fifty(path)
        (folder / "tuning.json.lock").unlink(missing_ok=True)  # readers must not need it
        if damaged:
            path.write_text(path.read_text()[:-10])
        before = path.read_bytes()
        path.chmod(0o444)
        folder.chmod(0o555)
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        p = ctx.Process(target=_read_only_child, args=(str(folder), queue))
        p.start()
        got, size, stores = queue.get(timeout=60)
        p.join(30)
        assert p.exitcode == 0
        assert (got, size) == ((None, 0) if damaged else (record(7), 50)) and stores == 0
        assert path.read_bytes() == before and sorted(os.listdir(folder)) == ["tuning.json"]
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
