"""The embedded tuning database: one SQLite file (WAL mode) shared by every build and runner on
the machine (default: `tuning.db` in the user cache folder).

SQLite gives what the JSON file got from a lock and atomic renames, per entry: a put is one
transaction (`BEGIN IMMEDIATE`, the merge rule, commit), so concurrent writers keep every
entry and a writer killed at any point leaves the store as it was before or after its put.
Readers take no lock (WAL), so readers never wait for a writer; a database in a folder or file
this process cannot write is opened read-only (and `immutable` where even the WAL index cannot
be made), so a read-only shared database is readable. A file that is no tuning database of this
schema (damaged, another version, another shape) is never written over: the first process that
can write the folder keeps it aside as `PATH.unreadable-<time>` (or `PATH.v<N>-<time>`), under a
lock file so only one does, says so once with both paths, and a new database starts. A JSON
tuning database (the store before this one) found at the path is kept aside the same way as
`PATH.v1-<time>` and its entries imported; one beside the default database (`tuning.json`) is
imported whenever its bytes are new to the store, and left where it is.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from filelock import FileLock

from dslc.runtime.records import BundleError
from dslc.runtime.tuningdb import legacy
from dslc.runtime.tuningdb.store import LOG, SCHEMA, Entry, TuningStore, better, say_kept

T = TypeVar("T")
TIMEOUT_S = 120.0  # a writer waits for another at most this long, then skips its entry
TABLES = {"meta": ["name", "value"], "plans": ["env", "key", "entry"],
          "leases": ["env", "key", "holder", "expires"]}
CREATE = ("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
          "CREATE TABLE plans (env TEXT NOT NULL, key TEXT NOT NULL, entry TEXT NOT NULL, "
          "PRIMARY KEY (env, key))",
          "CREATE TABLE leases (env TEXT NOT NULL, key TEXT NOT NULL, holder TEXT NOT NULL, "
          "expires REAL NOT NULL, PRIMARY KEY (env, key))")


class Damaged(Exception):
    """The file is no tuning database of this schema; `tag` names its kept-aside copy."""

    def __init__(self, reason: str, tag: str = "unreadable") -> None:
        super().__init__(reason)
        self.tag = tag


def is_damage(err: sqlite3.DatabaseError) -> bool:
    """SQLite's own word that the file is not a database or is corrupt (not a busy lock, not a
    full disk, not a read-only file)."""
    return getattr(err, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT")


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction, taken at its start so that two read-modify-writes never interleave."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def check_schema(conn: sqlite3.Connection, create: bool) -> None:
    """Damaged unless the file holds this schema's tables (made here when it holds none and
    `create`)."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables and create:
        for statement in CREATE:
            conn.execute(statement)
        conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
        return
    if "meta" not in tables:
        raise Damaged("not a tuning database (no schema recorded)")
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
    version = row[0] if row else None
    if version != str(SCHEMA):
        tag = f"v{version}" if isinstance(version, str) and version.isdigit() else "unreadable"
        raise Damaged(f"database schema {version!r}, this dslc uses {SCHEMA}", tag)
    for table, columns in TABLES.items():
        found = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        if found != columns:
            raise Damaged(f"not a tuning database (table {table} holds {found})")


class SQLiteStore(TuningStore):
    def __init__(self, path: Path, beside: Path | None = None, timeout_s: float = TIMEOUT_S,
                 ) -> None:
        """`beside`: an older JSON database to import whenever its bytes are new here."""
        super().__init__()
        self.path = Path(path)
        self.name = str(self.path)
        self.beside = beside
        self.timeout_s = timeout_s
        self.writable = False
        self._conn: sqlite3.Connection | None = None
        self._pid = 0  # a connection is never used across fork
        # One operation at a time on the connection: a model built from several threads would
        # otherwise interleave two transactions on it.
        self._busy = threading.RLock()

    def __getstate__(self) -> dict[str, object]:
        """What another process gets (a tuning worker): the place, never the connection."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_conn", "_pid", "_busy")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._conn, self._pid, self._busy = None, 0, threading.RLock()

    # -- connecting ------------------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection | None:
        if self._conn is None or self._pid != os.getpid():
            self._conn = self._open()
            self._pid = os.getpid()
        return self._conn

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    def _open(self) -> sqlite3.Connection | None:
        if os.path.lexists(self.path) and not self.path.is_file():
            self.say_once("read", f"tuning database `{self.path}` is not a regular file; "
                          "tuning without it")
            return None
        folder = self.path.parent
        with contextlib.suppress(OSError):  # then it cannot be written: read-only, below
            folder.mkdir(parents=True, exist_ok=True)
        self.writable = os.access(folder, os.W_OK) and (
            not self.path.exists() or os.access(self.path, os.W_OK))
        if not self.writable:
            return self._open_read_only()
        try:
            conn = self._open_rw()
        except Damaged as err:
            conn = self._recover(err)
        except sqlite3.DatabaseError as err:
            if not is_damage(err):
                raise
            conn = self._recover(Damaged(str(err)))
        self._import_beside(conn)
        return conn

    def _open_rw(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None,
                               check_same_thread=False)
        try:
            # The schema first: a file that is not ours is left as it is (switching it to WAL
            # would rewrite its header).
            with immediate(conn):
                check_schema(conn, create=True)
            # WAL with NORMAL sync: a commit survives any crash of the process (the log is
            # written before COMMIT returns); a power cut may lose the last commits, never the
            # file's consistency. FULL (an fsync per put) made 8 writers 10x slower, and an entry
            # lost costs a re-tune, not a wrong plan.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_read_only(self) -> sqlite3.Connection | None:
        if not self.path.exists():
            return None
        base = "file:" + urllib.parse.quote(str(self.path.resolve())) + "?mode=ro"
        problem = ""
        # A WAL database needs its index file; where it cannot be made here, read the file as
        # it stands (immutable): what writers checkpointed, which is all once they closed.
        for uri in (base, base + "&immutable=1"):
            try:
                conn = sqlite3.connect(uri, uri=True, timeout=self.timeout_s, isolation_level=None,
                                       check_same_thread=False)
            except sqlite3.Error as err:
                problem = str(err)
                continue
            try:
                check_schema(conn, create=False)
                return conn
            except Damaged as err:
                conn.close()
                problem = str(err)
                break
            except sqlite3.DatabaseError as err:
                conn.close()
                problem = str(err)
                if is_damage(err):
                    break
        self.say_once("read", f"tuning database `{self.path}` is unreadable ({problem}) and "
                      "cannot be kept aside (read-only); tuning without it")
        return None

    # -- what cannot be read is kept aside -------------------------------------------------
    def _recover(self, err: Damaged) -> sqlite3.Connection:
        """Under the lock file: look again (another process may have kept the file aside and
        started a new one), keep the file aside if it is still no database, start anew."""
        with FileLock(str(self.path) + ".lock", timeout=self.timeout_s):
            try:
                return self._open_checked()
            except Damaged as again:
                err = again
            except sqlite3.DatabaseError as again:
                if not is_damage(again):
                    raise
                err = Damaged(str(again))
            old: list[tuple[str, str, Entry]] = []
            try:
                raw, _ = legacy.read(self.path)
                old, skipped = legacy.entries(raw, self.path)
                err = Damaged("a JSON tuning database, the format before this one", "v1")
            except legacy.NotLegacy as why:
                skipped = []
                if why.tag != "unreadable":
                    err = Damaged(f"a JSON tuning database ({why})", why.tag)
            aside = self._keep_aside(err.tag)
            conn = self._open_rw()
            if old:
                self._merge_all(conn, old)
            # Each time: every file kept aside has its own name, which the user may want back.
            if err.tag == "v1":
                LOG.warning("%s", f"tuning database `{self.path}` was a JSON database, the "
                            f"format before this one: kept it as `{aside}`; imported its "
                            f"{len(old)} entries into a new one")
            else:
                LOG.warning("%s", f"tuning database `{self.path}` was unreadable ({err}); "
                            f"kept it as `{aside}` and started a new one")
            for problem in skipped:
                self.say_once(f"skip {problem}", f"tuning database `{aside}`: not imported, no "
                              f"valid plan ({problem})")
            return conn

    def _open_checked(self) -> sqlite3.Connection:
        """The database opened and read through (`quick_check`): a file torn in the middle
        passes the schema check and fails here."""
        conn = self._open_rw()
        try:
            result = conn.execute("PRAGMA quick_check").fetchone()
            if not result or result[0] != "ok":
                raise Damaged(f"damaged ({result[0] if result else 'no answer'})")
        except BaseException:
            conn.close()
            raise
        return conn

    def _keep_aside(self, tag: str) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            aside = self.path.with_name(f"{self.path.name}.{tag}-{stamp}" + (f"-{n}" if n else ""))
            if not os.path.lexists(aside):
                os.rename(self.path, aside)
                for suffix in ("-wal", "-shm"):  # the log of that file goes with it
                    if os.path.lexists(f"{self.path}{suffix}"):
                        os.rename(f"{self.path}{suffix}", f"{aside}{suffix}")
                return aside
        raise OSError(f"no free name beside `{self.path}` to keep it aside")

    def _import_beside(self, conn: sqlite3.Connection) -> None:
        """The older JSON database beside, imported when its bytes are new here (it stays)."""
        if self.beside is None or not self.beside.is_file():
            return
        try:
            raw, digest = legacy.read(self.beside)
        except (legacy.NotLegacy, OSError) as err:
            self.say_once("beside", f"tuning database `{self.beside}` not imported ({err})")
            return
        mark = f"imported {self.beside.resolve()}"
        with immediate(conn):
            row = conn.execute("SELECT value FROM meta WHERE name = ?", (mark,)).fetchone()
            if row is not None and row[0] == digest:
                return
            old, skipped = legacy.entries(raw, self.beside)
            kept = self._merge_rows(conn, old)
            conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (mark, digest))
        LOG.info("tuning database %s: imported %d of %d entries of %s (the file stays)",
                 self.path, kept, len(old), self.beside)
        for problem in skipped:
            self.say_once(f"skip {problem}", f"tuning database `{self.beside}`: not imported, "
                          f"no valid plan ({problem})")

    def _merge_all(self, conn: sqlite3.Connection, rows: list[tuple[str, str, Entry]]) -> None:
        with immediate(conn):
            self._merge_rows(conn, rows)

    def _merge_rows(self, conn: sqlite3.Connection, rows: list[tuple[str, str, Entry]]) -> int:
        """Inside a transaction: each entry merged by the rule; how many were kept."""
        kept = 0
        for env, key, entry in rows:
            if better(entry, self._read(conn, env, key)):
                conn.execute("INSERT OR REPLACE INTO plans VALUES (?, ?, ?)",
                             (env, key, entry.encode()))
                kept += 1
        return kept

    # -- operations ------------------------------------------------------------------------
    def _do(self, op: Callable[[sqlite3.Connection], T], default: T, what: str) -> T:
        """`op` on the connection; a file found damaged meanwhile is recovered and `op` tried
        again once; what still fails is said once and gives `default`."""
        with self._busy:
            return self._attempts(op, default, what)

    def _attempts(self, op: Callable[[sqlite3.Connection], T], default: T, what: str) -> T:
        for attempt in (0, 1):
            try:
                conn = self._connection()
                if conn is None:
                    return default
                return op(conn)
            except (sqlite3.DatabaseError, Damaged) as err:
                damage = isinstance(err, Damaged) or is_damage(err)
                self.close()
                if not (damage and attempt == 0 and self.writable):
                    self._failed(what, err)
                    return default
                try:  # found torn only now (the schema read fine): keep it aside, start anew
                    self._conn, self._pid = self._recover(Damaged(str(err))), os.getpid()
                except (sqlite3.Error, OSError) as again:
                    self._failed(what, again)
                    return default
            except OSError as err:
                self.close()
                self._failed(what, err)
                return default
        return default

    def _failed(self, what: str, err: Exception) -> None:
        reason = getattr(err, "strerror", None) or str(err)
        tail = ("results stay in the bundle only" if what == "write" else "tuning without it")
        self.say_once(what, f"cannot {what} tuning database `{self.path}` ({reason}); {tail}")

    def _read(self, conn: sqlite3.Connection, env: str, key: str) -> Entry | None:
        row = conn.execute("SELECT entry FROM plans WHERE env = ? AND key = ?",
                           (env, key)).fetchone()
        if row is None:
            return None
        try:
            return Entry.decode(row[0], f"entries.{key[:40]}")
        except BundleError as err:
            self.damaged_entry(key, err)
            return None

    def get(self, env: str, key: str) -> Entry | None:
        found = self._do(lambda conn: self._read(conn, env, key), None, "read")
        if found is not None:
            self.hits += 1
        return found

    def put(self, env: str, key: str, entry: Entry) -> Entry:
        def op(conn: sqlite3.Connection) -> tuple[Entry, bool]:
            if not self.writable:
                raise PermissionError(13, "the folder or the file is read-only")
            with immediate(conn):
                old = self._read(conn, env, key)
                if not better(entry, old):
                    assert old is not None
                    return old, False
                conn.execute("INSERT OR REPLACE INTO plans VALUES (?, ?, ?)",
                             (env, key, entry.encode()))
                return entry, True

        kept, stored = self._do(op, (entry, False), "write")
        if stored:
            self.stores += 1
        elif kept is not entry:
            say_kept(self.name, key, entry, kept)
        return kept

    def lease(self, env: str, key: str, holder: str, ttl_s: float) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            if not self.writable:  # nobody to share the work with through this file
                return True
            with immediate(conn):
                row = conn.execute("SELECT holder, expires FROM leases WHERE env = ? AND key = ?",
                                   (env, key)).fetchone()
                clock = time.time()
                if row is not None and row[0] != holder and row[1] > clock:
                    return False
                conn.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?)",
                             (env, key, holder, clock + ttl_s))
                return True

        return self._do(op, True, "write")

    def release(self, env: str, key: str, holder: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            if self.writable:
                with immediate(conn):
                    conn.execute("DELETE FROM leases WHERE env = ? AND key = ? AND holder = ?",
                                 (env, key, holder))

        self._do(op, None, "write")

    def size(self) -> int:
        return self._do(lambda conn: int(conn.execute("SELECT COUNT(*) FROM plans").fetchone()[0]),
                        0, "read")
