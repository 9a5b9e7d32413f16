"""The tuning database's one interface, whichever store holds it (SQLite on this machine, Redis
for a fleet): entries keyed by environment (`env_key`) and group graph (`spec_key`), each a
measured plan with where, when and by which dslc it was measured.

The merge rule, the same for every store: a put keeps the fastest validated record (measured and
checked against the reference); a record that loses is not dropped silently: `put` returns the
entry kept and says which was faster. Leases let one process measure a key while others wait.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import json
import logging
import math
import socket
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any

from dslc import __version__ as VERSION
from dslc.backend.spec import GroupSpec
from dslc.runtime import fields as f
from dslc.runtime.records import BundleError, Environment, PlanRecord

SCHEMA = 2  # 1 was the JSON file (`dslc.runtime.tuningdb.legacy` imports it)
LOG = logging.getLogger("dslc.tuningdb")
ENTRY_FIELDS = ("plan", "host", "at", "dslc_version", "source", "serialized", "driver")


def spec_key(spec: GroupSpec) -> str:
    """The group's concrete cuDNN form without names: the same block in two models, or two
    builds, is one key."""
    data = spec.data()
    data.pop("signature", None)
    for t in data["tensors"]:
        t.pop("name", None)
    for op in data["ops"]:
        op.pop("node", None)
        op["inputs"] = [len(op["inputs"])]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:24]


def env_key(env: Environment) -> str:
    """What a measured time depends on: the GPU and the cuDNN that ran it."""
    return "|".join(str(getattr(env, k)) for k in ("device_name", "compute_capability",
                                                    "sm_count", "cudnn_backend", "cudnn_frontend"))


def validated(plan: PlanRecord) -> bool:
    """Measured and checked against the reference: an engine, a finite time, an error."""
    return (plan.engine_id is not None and plan.ms is not None and math.isfinite(plan.ms)
            and plan.ms > 0 and plan.error is not None and math.isfinite(plan.error))


@dataclass(frozen=True)
class Entry:
    """A measured plan and its provenance; the error against the reference is the plan's
    `error`. The plan keeps its serialized bytes and workspace only with the `driver` that
    serialized them: a serialized plan restores only under the same cuDNN (the key's
    environment) and driver, and elsewhere its engine and knobs are replayed (`plan_for`)."""

    plan: PlanRecord
    host: str
    at: str  # ISO 8601, UTC
    dslc_version: str
    source: str | None = None  # where it came from, if not measured into this store
    driver: int | None = None  # of the host that serialized `plan.serialized`

    @property
    def validated(self) -> bool:
        return validated(self.plan)

    def plan_for(self, driver: int | None) -> PlanRecord:
        """The plan as a host with this driver can use it: with its bytes only where the driver
        that serialized them is the same (both known)."""
        if self.plan.serialized is not None and driver is not None and driver == self.driver:
            return self.plan
        return replace(self.plan, serialized=None)

    def to_data(self) -> dict[str, Any]:
        plan = {k: v for k, v in self.plan.to_data().items() if k != "serialized"}
        out: dict[str, Any] = {"plan": plan, "host": self.host, "at": self.at,
                               "dslc_version": self.dslc_version}
        if self.source is not None:
            out["source"] = self.source
        if self.plan.serialized is not None:  # JSON has no bytes
            out["serialized"] = base64.b64encode(self.plan.serialized).decode("ascii")
            out["driver"] = self.driver
        return out

    @staticmethod
    def from_data(d: Any, path: str) -> Entry:
        d = f.mapping(d, path, ENTRY_FIELDS[:4], ENTRY_FIELDS)
        plan = PlanRecord.from_data(d["plan"], f"{path}.plan", tuning=True)
        blob, driver = d.get("serialized"), d.get("driver")
        if blob is not None:
            text = f.text(blob, f"{path}.serialized", hi=f.MAX_BLOB)
            try:
                plan = replace(plan, serialized=base64.b64decode(text, validate=True))
            except binascii.Error as err:
                f.wrong(f"{path}.serialized", f"not base64 ({err})")
        return Entry(plan, f.text(d["host"], f"{path}.host", hi=256),
                     f.text(d["at"], f"{path}.at", hi=64),
                     f.text(d["dslc_version"], f"{path}.dslc_version", hi=64),
                     f.opt_text(d.get("source"), f"{path}.source"),
                     f.opt_integer(driver, f"{path}.driver", 0, 2**62))

    def encode(self) -> str:
        # Infinity stays (a heuristics' choice that computed wrongly is timed as infinite).
        return json.dumps(self.to_data(), sort_keys=True)

    @staticmethod
    def decode(text: str | bytes, path: str) -> Entry:
        """An entry from its stored text; BundleError naming the field if it is none."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as err:
            raise BundleError(f"{path}: not JSON ({err})") from err
        return Entry.from_data(data, path)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def measured(plan: PlanRecord, host: str | None = None, at: str | None = None,
             source: str | None = None, driver: int | None = None) -> Entry:
    """The entry of a plan measured here and now; its serialized bytes are kept with the
    `driver` that made them, and left out where it is not known."""
    kept = plan if driver is not None else replace(plan, serialized=None)
    return Entry(kept, host or socket.gethostname(), at or now(), VERSION, source,
                 driver if kept.serialized is not None else None)


def better(new: Entry, old: Entry | None) -> bool:
    """The merge rule: does `new` replace `old`? A validated record beats one that is not; of two
    validated, the faster wins (a tie keeps the one there); of two unvalidated, the one there
    stays."""
    if old is None:
        return True
    if new.validated != old.validated:
        return new.validated
    if not new.validated:
        return False
    assert new.plan.ms is not None and old.plan.ms is not None
    return new.plan.ms < old.plan.ms


def say_kept(name: str, key: str, new: Entry, kept: Entry) -> None:
    """A put that lost to the entry there: said, never silent."""
    LOG.info("tuning database %s: kept the record of %s (%s ms) for %s over the one from %s "
             "(%s ms)", name, kept.host, kept.plan.ms, key[:24], new.host, new.plan.ms)


class Unavailable(Exception):
    """The store cannot be reached now (a Redis server down): callers go on without it."""


class TuningStore(ABC):
    """One tuning database. Reads never fail the caller: a store that cannot be read reads as
    empty (said once); writes that cannot be made are said once and skipped. `Unavailable` is
    raised only by stores behind a network, for `tiered.Tiered` to fall back."""

    name: str  # the path or address, for messages

    def __init__(self) -> None:
        self.hits = 0
        self.stores = 0
        self._said: set[str] = set()

    def say_once(self, what: str, message: str) -> None:
        if what not in self._said:
            self._said.add(what)
            LOG.warning("%s", message)

    def damaged_entry(self, key: str, err: BundleError) -> None:
        self.say_once(f"entry {key}", f"tuning database `{self.name}`: ignoring a damaged entry "
                      f"({err})")

    @abstractmethod
    def get(self, env: str, key: str) -> Entry | None:
        """The entry under (environment, group), if a valid one is there."""

    @abstractmethod
    def put(self, env: str, key: str, entry: Entry) -> Entry:
        """Merge `entry` in (`better`); returns the entry the store keeps."""

    @abstractmethod
    def lease(self, env: str, key: str, holder: str, ttl_s: float) -> bool:
        """Take the lease on (environment, group) for `ttl_s` seconds unless another holder has
        one that has not expired; True if `holder` holds it now."""

    @abstractmethod
    def release(self, env: str, key: str, holder: str) -> None:
        """Give the lease back if `holder` still holds it."""

    @abstractmethod
    def size(self) -> int:
        """How many entries (valid or not) the store holds."""

    @abstractmethod
    def close(self) -> None:
        """Let go of connections (a store may be used again after)."""
