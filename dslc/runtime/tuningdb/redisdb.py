"""The fleet's tuning database: a Redis server (`redis://HOST:PORT/DB`) shared by every host and
replica. An entry is one string key (`dslc:tuning:<schema>:<environment digest>:<group key>`)
holding the entry's JSON; a put merges under `WATCH` (an optimistic transaction: a concurrent
put of the same key makes it retry, so the merge rule sees every writer's record); a lease is
`SET NX PX` and is given back only by its holder (a compare-and-delete script), and expires on
its own if the holder dies. A server that cannot be reached, or refuses (no such database, a
password wanted), raises `Unavailable` (after at most `CONNECT_S` + `IO_S` seconds), which
`tiered.Tiered` turns into the local database; a read-only replica costs the writes (said
once). Needs the `redis` client (`pip install 'dslc[fleet]'`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

from dslc.runtime.records import BundleError
from dslc.runtime.tuningdb.store import SCHEMA, Entry, TuningStore, Unavailable, better, say_kept

T = TypeVar("T")
CONNECT_S = 1.0  # a replica's start-up waits at most this long for a server that is down
IO_S = 2.0
RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class ReadOnly(Exception):
    """The server is a read-only replica: the write is skipped (said once)."""


def redis_module() -> Any:
    """The `redis` client package (optional: only a fleet's database needs it); a host without
    it reads the fleet's database as down."""
    try:
        import redis
    except ImportError as err:
        raise Unavailable("the fleet's tuning database needs the Redis client, which is not "
                          "installed here (`pip install 'dslc[fleet]'`)") from err
    return redis


class RedisStore(TuningStore):
    def __init__(self, url: str, prefix: str = "dslc") -> None:
        super().__init__()
        self.url = url
        self.name = url
        self.prefix = prefix
        self._client: Any = None

    def __getstate__(self) -> dict[str, object]:
        """What another process gets (a tuning worker): the address, never the connection."""
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = redis_module().Redis.from_url(
                self.url, socket_connect_timeout=CONNECT_S, socket_timeout=IO_S,
                retry_on_timeout=False)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None

    def _name(self, kind: str, env: str, key: str) -> str:
        digest = hashlib.sha256(env.encode()).hexdigest()[:16]
        return f"{self.prefix}:{kind}:{SCHEMA}:{digest}:{key}"

    def _call(self, op: Callable[[Any], T]) -> T:
        """`op(client)`; a server out of reach or refusing is `Unavailable`, a read-only
        replica's refusal `ReadOnly` (the caller skips the write)."""
        redis = redis_module()
        try:
            return op(self.client)
        except redis.exceptions.ReadOnlyError as err:
            raise ReadOnly(str(err)) from err
        except (redis.exceptions.RedisError, OSError) as err:  # down, refused, no such DB...
            raise Unavailable(f"tuning database `{self.url}` cannot be reached ({err})") from err

    def _read_only(self, err: Exception) -> None:
        self.say_once("write", f"cannot write tuning database `{self.url}` ({err}); results stay "
                      "local")

    def _decode(self, raw: bytes | None, key: str) -> Entry | None:
        if raw is None:
            return None
        try:
            return Entry.decode(raw, f"entries.{key[:40]}")
        except BundleError as err:
            self.damaged_entry(key, err)
            return None

    def get(self, env: str, key: str) -> Entry | None:
        name = self._name("tuning", env, key)
        found = self._decode(self._call(lambda c: c.get(name)), key)
        if found is not None:
            self.hits += 1
        return found

    def put(self, env: str, key: str, entry: Entry) -> Entry:
        name = self._name("tuning", env, key)
        try:
            kept, stored = self._call(lambda c: self._merge(c, name, key, entry))
        except ReadOnly as err:
            self._read_only(err)
            return entry
        if stored:
            self.stores += 1
        elif kept is not entry:
            say_kept(self.name, key, entry, kept)
        return kept

    def _merge(self, client: Any, name: str, key: str, entry: Entry) -> tuple[Entry, bool]:
        watch_error = redis_module().exceptions.WatchError
        with client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(name)
                    old = self._decode(pipe.get(name), key)
                    if not better(entry, old):
                        pipe.unwatch()
                        assert old is not None
                        return old, False
                    pipe.multi()
                    pipe.set(name, entry.encode())
                    pipe.execute()
                    return entry, True
                except watch_error:
                    continue  # another put of this key came first: merge with what it left

    def lease(self, env: str, key: str, holder: str, ttl_s: float) -> bool:
        name = self._name("lease", env, key)
        ms = max(1, int(ttl_s * 1000))
        try:
            if self._call(lambda c: c.set(name, holder, px=ms, nx=True)):
                return True
        except ReadOnly as err:  # nobody to share the work with through it
            self._read_only(err)
            return True
        current = self._call(lambda c: c.get(name))
        return current is not None and current.decode() == holder

    def release(self, env: str, key: str, holder: str) -> None:
        name = self._name("lease", env, key)
        try:
            self._call(lambda c: c.eval(RELEASE, 1, name, holder))
        except ReadOnly as err:
            self._read_only(err)

    def size(self) -> int:
        pattern = f"{self.prefix}:tuning:{SCHEMA}:*"
        return self._call(lambda c: sum(1 for _ in c.scan_iter(pattern, count=1000)))
