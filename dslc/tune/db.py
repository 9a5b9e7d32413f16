"""The tuning database: measured plans by group and environment, in one JSON file shared by every
build on the machine (default: the user cache folder; `--tuning-db PATH`).

Writes are read-modify-write under a file lock (`PATH.lock`) and atomic (`fsutil`), so
concurrent compiles sharing the file keep every entry, and a writer killed mid-write leaves the
previous file. Reads take no lock (a reader sees the old file or the new one, never a mix), so a
read-only shared database is readable. A file that cannot be read as a database of this version
(damaged, another version, the wrong shape) is never overwritten: the first reader or writer
that can write the folder keeps it aside as `PATH.unreadable-<time>` (or `PATH.v<N>-<time>`),
says so once with both paths, and a new file starts. A database that cannot be written costs
reuse, not the build: a warning, once. An entry that does not hold a valid plan record reads as
a miss.

Key: the group's concrete cuDNN form without names (so the same block in two models, or two
builds, is one entry) under the environment (device, compute capability, SM count, cuDNN).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from filelock import FileLock

from dslc import fsutil
from dslc.backend.spec import GroupSpec
from dslc.runtime.records import BundleError, Environment, PlanRecord

VERSION = 1
LOCK_TIMEOUT_S = 120.0
MAX_BYTES = 256 << 20  # a larger file is not a tuning database this code wrote
LOG = logging.getLogger("dslc.tune")
Entries = dict[str, dict[str, dict[str, Any]]]


def default_path() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("dslc")) / "tuning.json"


def spec_key(spec: GroupSpec) -> str:
    data = spec.data()
    data.pop("signature", None)
    for t in data["tensors"]:
        t.pop("name", None)
    for op in data["ops"]:
        op.pop("node", None)
        op["inputs"] = [len(op["inputs"])]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:24]


def env_key(env: Environment) -> str:
    return "|".join(str(getattr(env, k)) for k in ("device_name", "compute_capability",
                                                    "sm_count", "cudnn_backend", "cudnn_frontend"))


class Unreadable(Exception):
    """The file exists but is no database of this version; `tag` names the kept-aside copy."""

    def __init__(self, reason: str, tag: str = "unreadable") -> None:
        super().__init__(reason)
        self.tag = tag


def parse(text: str) -> Entries:
    """The entries of a database file's text (Unreadable if it is not one of this version)."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise Unreadable(f"not JSON: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise Unreadable("not a tuning database (no map of entries)")
    version = data.get("version")
    if version != VERSION:
        tag = f"v{version}" if isinstance(version, int) and not isinstance(version, bool) \
            else "unreadable"
        raise Unreadable(f"database version {version!r}, this dslc uses {VERSION}", tag)
    entries = data["entries"]
    for env, by_key in entries.items():
        if not isinstance(by_key, dict) or not all(isinstance(r, dict) for r in by_key.values()):
            raise Unreadable(f"the entries of environment {env[:60]!r} are not a map of records")
    return entries


class TuningDB:
    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        # A writer waits for another at most this long, then skips its entry (and says so).
        self.lock = FileLock(str(self.path) + ".lock", timeout=LOCK_TIMEOUT_S)
        self.hits = 0
        self.stores = 0
        self._warned: set[str] = set()  # what was said already (once each)

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            LOG.warning("%s", message)

    def _load(self) -> Entries:
        """The entries on disk: {} when there is no file; Unreadable, OSError otherwise."""
        try:
            data = fsutil.read_limited(self.path, MAX_BYTES)
        except FileNotFoundError:
            return {}
        except fsutil.UnreadableFile as err:
            if not self.path.is_file():
                raise  # a folder, a pipe, a device: nothing to keep aside, nothing to write
            raise Unreadable(str(err.strerror)) from err
        try:
            return parse(data.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise Unreadable("not UTF-8 text") from err

    def _entries(self) -> Entries:
        """For reading: no lock. A file that cannot be read is kept aside now if the folder is
        writable (under the lock), and reads as empty; either way it is said once."""
        try:
            return self._load()
        except Unreadable as err:
            reason = str(err)
        except OSError as err:
            self._warn("read", f"cannot read tuning database `{self.path}` "
                       f"({err.strerror or err}); tuning without it")
            return {}
        try:
            self._require_writable()
            with self.lock:
                return self._load_or_set_aside()
        except OSError as err:
            self._warn("read", f"tuning database `{self.path}` is unreadable ({reason}) and "
                       f"cannot be kept aside ({err.strerror or err}); tuning without it")
            return {}

    def _require_writable(self) -> None:
        if not os.access(self.path.parent, os.W_OK):
            raise PermissionError(13, "the folder is read-only")

    def _load_or_set_aside(self) -> Entries:
        """Under the lock: the entries, or {} once an unreadable file is kept aside."""
        try:
            return self._load()
        except Unreadable as err:
            aside = self._keep_aside(err.tag)
            self._warn("aside", f"tuning database `{self.path}` was unreadable ({err}); kept it "
                       f"as `{aside}` and started a new one")
            return {}

    def get(self, env: str, key: str) -> PlanRecord | None:
        """The measured plan under (environment, group), if a valid one is there."""
        found = self._entries().get(env, {}).get(key)
        if found is None:
            return None
        try:
            record = PlanRecord.from_data(found, f"entries.{key}", tuning=True)
        except BundleError as err:
            self._warn(f"entry {key}", f"tuning database `{self.path}`: ignoring a damaged "
                       f"entry ({err})")
            return None
        self.hits += 1
        return record

    def put(self, env: str, key: str, plan: PlanRecord) -> None:
        """What was measured of `plan` (not its serialized bytes, which belong to the bundle),
        read-modify-write under the lock: entries others added meanwhile are kept, and a file
        that cannot be read is kept aside, never overwritten."""
        record = {k: v for k, v in plan.to_data().items() if k not in ("serialized", "workspace")}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._require_writable()
            with self.lock:
                entries = self._load_or_set_aside()
                entries.setdefault(env, {})[key] = record
                text = json.dumps({"version": VERSION, "entries": entries}, indent=1,
                                  sort_keys=True)
                fsutil.write_text(self.path, text)
        except OSError as err:
            self._warn("write", f"cannot write tuning database `{self.path}` "
                       f"({err.strerror or err}); results stay in the bundle only")
            return
        self.stores += 1

    def _keep_aside(self, tag: str) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            aside = self.path.with_name(f"{self.path.name}.{tag}-{stamp}" + (f"-{n}" if n else ""))
            if not aside.exists():
                os.rename(self.path, aside)
                return aside
        raise OSError(f"no free name beside `{self.path}` to keep it aside")

    def size(self) -> int:
        return sum(len(v) for v in self._entries().values())
