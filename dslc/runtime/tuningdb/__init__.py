"""The tuning database: measured plans by environment and group graph, shared by every build and
runner that can reach it. One interface (`store.TuningStore`), two stores: SQLite on this
machine (the default, `tuning.db` in the user cache folder) and Redis for a fleet, read through
this machine's SQLite (`tiered.Tiered`) so a server that is down costs reuse, never a start.

Where it is: `--tuning-db` on the command line, `tuning_db=` in a runner's options, else the
environment variable `DSLC_TUNING_DB`, else the default file; each takes the same string: a
path (SQLite), `redis://HOST:PORT/DB` (or `rediss://` for TLS), or `none`.

It sits on the runtime's floor because start-up reads and writes it too (a replica looks for
plans measured in its environment before it re-tunes); `dslc.tune` uses it from above.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

from dslc.runtime.tuningdb.redisdb import RedisStore
from dslc.runtime.tuningdb.sqlite import SQLiteStore
from dslc.runtime.tuningdb.store import (
    Entry,
    TuningStore,
    Unavailable,
    better,
    env_key,
    measured,
    spec_key,
    validated,
)
from dslc.runtime.tuningdb.tiered import Tiered

__all__ = ["ENV_VAR", "Entry", "SpecError", "TuningStore", "Unavailable", "better",
           "default_path", "env_key", "measured", "open_store", "spec_key", "validated"]

ENV_VAR = "DSLC_TUNING_DB"


class SpecError(ValueError):
    """A `--tuning-db` value (or `DSLC_TUNING_DB`) that names no database: one sentence."""


def default_path() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("dslc")) / "tuning.db"


def redis_url(text: str, origin: str) -> str:
    """`text` if it is a usable `redis://HOST:PORT/DB` address; SpecError naming `origin`."""
    parts = urllib.parse.urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        raise SpecError(f"{origin} `{text}`: the port must be a number in 1..65535") from None
    if not parts.hostname:
        raise SpecError(f"{origin} `{text}`: no host; write redis://HOST:PORT/DB")
    if port == 0:
        raise SpecError(f"{origin} `{text}`: the port must be a number in 1..65535")
    db = parts.path.strip("/")
    if db and not (db.isdigit() and int(db) < 2**31):
        raise SpecError(f"{origin} `{text}`: the database must be a number, as in "
                        "redis://HOST:PORT/0")
    if parts.fragment or parts.query:
        raise SpecError(f"{origin} `{text}`: write redis://HOST:PORT/DB, without options")
    return text


def open_store(spec: str | Path | None = None, origin: str = "--tuning-db") -> TuningStore | None:
    """The database `spec` names (None: `DSLC_TUNING_DB`, else the default file); None for
    `none`. Opening connects to nothing yet: the first read does."""
    if spec is None:
        spec = os.environ.get(ENV_VAR) or None
        origin = ENV_VAR if spec is not None else origin
    if spec is None:
        return open_local()
    text = str(spec)
    if text == "none":
        return None
    scheme = urllib.parse.urlsplit(text).scheme
    if scheme in ("redis", "rediss"):
        return Tiered(RedisStore(redis_url(text, origin)), open_local())
    if "://" in text:
        raise SpecError(f"{origin} `{text}`: not a database dslc knows; name a file (SQLite), "
                        "redis://HOST:PORT/DB or `none`")
    if not text:
        raise SpecError(f"{origin} is empty; name a file (SQLite), redis://HOST:PORT/DB or `none`")
    return SQLiteStore(Path(text))


def open_local() -> SQLiteStore:
    """This machine's database (the default file), under a fleet's."""
    path = default_path()
    return SQLiteStore(path, beside=path.with_name("tuning.json"))


def is_file(spec: str | Path | None) -> Path | None:
    """The file a `--tuning-db` value names, if it names one (not a server, not `none`)."""
    if spec is None or str(spec) == "none" or "://" in str(spec):
        return None
    return Path(spec)
