"""The fleet's database over this machine's: what a host reads and writes when `--tuning-db` (or
`DSLC_TUNING_DB`) names a Redis server.

Every entry read from the fleet or measured here is also kept in the local SQLite database, so a
host whose server goes down still has what it saw. While the server is out of reach (said once),
reads, writes and leases go to the local database alone, and the server is tried again after
`RETRY_S`; an entry the local database has and the fleet's lacks is published when it is next
read (what was measured during an outage reaches the fleet later: eventually consistent).
"""

from __future__ import annotations

import time

from dslc.runtime.tuningdb.store import Entry, TuningStore, Unavailable

RETRY_S = 30.0


class Tiered(TuningStore):
    def __init__(self, shared: TuningStore, local: TuningStore) -> None:
        super().__init__()
        self.shared = shared
        self.local = local
        self.name = shared.name
        self._down_until = 0.0
        self._leased: dict[tuple[str, str], TuningStore] = {}

    def _up(self) -> bool:
        return time.monotonic() >= self._down_until

    def _went_down(self, err: Unavailable) -> None:
        self._down_until = time.monotonic() + RETRY_S
        self.say_once("down", f"{err}; using this machine's tuning database `{self.local.name}` "
                      "and the heuristics' plans meanwhile")

    def get(self, env: str, key: str) -> Entry | None:
        here = self.local.get(env, key)
        if self._up():
            try:
                found = self.shared.get(env, key)
                if found is None and here is not None:
                    found = self.shared.put(env, key, here)  # measured while it was down
                if found is not None:
                    self.hits += 1
                    if here is None or here != found:
                        self.local.put(env, key, found)
                return found
            except Unavailable as err:
                self._went_down(err)
        if here is not None:
            self.hits += 1
        return here

    def put(self, env: str, key: str, entry: Entry) -> Entry:
        kept = self.local.put(env, key, entry)
        if self._up():
            try:
                kept = self.shared.put(env, key, entry)
            except Unavailable as err:
                self._went_down(err)
        if kept is entry:
            self.stores += 1
        return kept

    def lease(self, env: str, key: str, holder: str, ttl_s: float) -> bool:
        """On the fleet's server while it is up (one host measures a key), else on this
        machine's database (one process of this host does)."""
        if self._up():
            try:
                if not self.shared.lease(env, key, holder, ttl_s):
                    return False
                self._leased[(env, key)] = self.shared
                return True
            except Unavailable as err:
                self._went_down(err)
        if not self.local.lease(env, key, holder, ttl_s):
            return False
        self._leased[(env, key)] = self.local
        return True

    def release(self, env: str, key: str, holder: str) -> None:
        store = self._leased.pop((env, key), self.local)
        try:
            store.release(env, key, holder)
        except Unavailable as err:  # the lease expires by itself
            self._went_down(err)

    def size(self) -> int:
        if self._up():
            try:
                return self.shared.size()
            except Unavailable as err:
                self._went_down(err)
        return self.local.size()

    def close(self) -> None:
        self.shared.close()
        self.local.close()
