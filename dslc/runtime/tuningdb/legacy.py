"""The tuning database before SQLite: one JSON file (`{"version": 1, "entries": {env: {key:
record}}}`), in the user cache folder as `tuning.json` or wherever `--tuning-db` named. Its
entries are imported into the SQLite store once (`SQLiteStore` decides when); the file itself is
never removed, so nothing measured is lost."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any

from dslc import fsutil
from dslc.runtime.records import BundleError, PlanRecord
from dslc.runtime.tuningdb.store import Entry

JSON_VERSION = 1
MAX_BYTES = 256 << 20  # a larger file is not a tuning database dslc wrote


class NotLegacy(Exception):
    """Not a JSON tuning database of version 1 (`tag` names what it is, for a kept-aside name)."""

    def __init__(self, reason: str, tag: str = "unreadable") -> None:
        super().__init__(reason)
        self.tag = tag


def read(path: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """The entries of a JSON database (raw, per environment and key) and the digest of its bytes;
    NotLegacy if the file is none, OSError if it cannot be read."""
    data = fsutil.read_limited(path, MAX_BYTES)
    digest = hashlib.sha256(data).hexdigest()
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise NotLegacy(f"not JSON: {err}") from err
    if not isinstance(parsed, dict) or not isinstance(parsed.get("entries"), dict):
        raise NotLegacy("not a tuning database (no map of entries)")
    version = parsed.get("version")
    if version != JSON_VERSION:
        tag = (f"v{version}" if isinstance(version, int) and not isinstance(version, bool)
               else "unreadable")
        raise NotLegacy(f"JSON database version {version!r}", tag)
    entries = parsed["entries"]
    for env, by_key in entries.items():
        if not isinstance(by_key, dict):
            raise NotLegacy(f"the entries of environment {env[:60]!r} are not a map of records")
    return entries, digest


def entries(raw: dict[str, dict[str, Any]], path: Path,
            ) -> tuple[list[tuple[str, str, Entry]], list[str]]:
    """The JSON records as entries, with provenance from what is known (this host, the file's
    time, `source` naming the file); and one sentence per record that is no valid plan (those
    stay in the JSON file, which is kept)."""
    try:
        stamp = datetime.datetime.fromtimestamp(os.stat(path).st_mtime, datetime.UTC)
        at = stamp.isoformat(timespec="seconds")
    except OSError:
        at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    out, skipped = [], []
    for env, by_key in raw.items():
        for key, record in by_key.items():
            try:
                plan = PlanRecord.from_data(record, f"entries.{key[:40]}", tuning=True)
            except BundleError as err:
                skipped.append(str(err))
                continue
            out.append((env, key, Entry(plan, socket.gethostname(), at, "unknown",
                                        f"imported from {path}")))
    return out, skipped
