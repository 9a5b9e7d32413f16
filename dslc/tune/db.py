"""The tuning database: measured plans by group and environment, in one JSON file shared by every
build on the machine (default: the user cache folder; `--tuning-db PATH`). Writes are atomic and
made under a file lock, so concurrent compiles sharing it stay consistent.

Key: the group's concrete cuDNN form without names (so the same block in two models, or two
builds, is one entry) under the environment (device, compute capability, SM count, cuDNN).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from filelock import FileLock

from dslc import fsutil
from dslc.compile.spec import GroupSpec

VERSION = 1


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


def env_key(env: dict[str, Any]) -> str:
    return "|".join(str(env.get(k)) for k in ("device_name", "compute_capability", "sm_count",
                                               "cudnn_backend", "cudnn_frontend"))


class TuningDB:
    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.lock = FileLock(str(self.path) + ".lock")
        self.hits = 0
        self.stores = 0

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {"version": VERSION, "entries": {}}
        if not isinstance(data, dict) or data.get("version") != VERSION:
            return {"version": VERSION, "entries": {}}
        return data

    def get(self, env: str, key: str) -> dict[str, Any] | None:
        with self.lock:
            found = self._read()["entries"].get(env, {}).get(key)
        if found is not None:
            self.hits += 1
        return found

    def put(self, env: str, key: str, record: dict[str, Any]) -> None:
        """Read-modify-write under the lock: entries others added meanwhile are kept."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            data = self._read()
            data["entries"].setdefault(env, {})[key] = record
            fsutil.write_text(self.path, json.dumps(data, indent=1, sort_keys=True))
        self.stores += 1

    def size(self) -> int:
        with self.lock:
            return sum(len(v) for v in self._read()["entries"].values())
