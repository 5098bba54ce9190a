"""State stores: budget counters with atomic multi-counter reservations, session state, nonces.

`open_store(location)` picks the implementation:
  memory:                          MemoryStore (nothing survives the process)
  sqlite:///abs/path.db            WriteBehindStore, the embedded default (also a plain path): one
                                   governor process owns the file; counters live in memory and reach
                                   the file in batches, `flush` seconds apart (?flush=0.25 by default)
  sqlite:///abs/path.db?shared=true
                                   SQLiteStore: several processes share the file, every step is a
                                   transaction (slower)
                                   Both SQLite stores take ?synchronous=NORMAL (default) or FULL
                                   (fsync every commit).
  redis://host:port/db             RedisStore, for replicas sharing budgets (also rediss://)
  redis+sentinel://h:p[,h:p]/SERVICE[/DB]
                                   RedisStore on the primary Sentinel names, through failovers
  redis+cluster://h:p[,h:p]        RedisStore on Redis Cluster (one hash slot per store prefix)
                                   Redis options (timeout, retry_after, wait, ...):
                                   governor.store.redis_client
"""

from __future__ import annotations

import math
import os
from urllib.parse import parse_qs

from governor.store.base import (
    DAY,
    CounterDamaged,
    Reservation,
    RollingWindow,
    Store,
    StoreError,
    StoreIntegrityError,
    StoreUnavailable,
    UnknownReservation,
)
from governor.store.memory import MemoryStore
from governor.store.sqlite import SQLiteStore
from governor.store.writebehind import FLUSH_INTERVAL, WriteBehindStore

__all__ = [
    "CounterDamaged",
    "DAY",
    "MemoryStore",
    "Reservation",
    "RollingWindow",
    "SQLiteStore",
    "Store",
    "StoreError",
    "StoreIntegrityError",
    "StoreUnavailable",
    "UnknownReservation",
    "WriteBehindStore",
    "open_store",
    "redacted",
]


def open_store(location: str | os.PathLike[str], *, window: RollingWindow = DAY) -> Store:
    """Open the store named by a URL or a path (see the module docstring)."""
    location = os.fspath(location)
    if location == "memory:":
        return MemoryStore(window=window)
    if location.startswith(("redis://", "rediss://", "redis+", "rediss+")):
        try:
            from governor.store.redis import RedisStore
        except ModuleNotFoundError as exc:  # the client is an optional dependency
            raise StoreError(f"{location}: the Redis store needs the 'redis' package ({exc})") from exc
        return RedisStore(location, window=window)
    if location.startswith("sqlite://"):
        path, _, query = location.removeprefix("sqlite://").partition("?")
        options = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        unknown = set(options) - {"synchronous", "shared", "flush"}
        if unknown:
            raise ValueError(f"{location}: unknown option(s) {', '.join(sorted(unknown))}")
        if not path:
            raise ValueError(f"{location}: no database path")
        synchronous = options.get("synchronous", "NORMAL")
        if _shared(location, options.get("shared", "false")):
            if "flush" in options:
                raise ValueError(f"{location}: flush= applies to the write-behind store, not to shared=true")
            return SQLiteStore(path, window=window, synchronous=synchronous)
        flush = _seconds(location, options["flush"]) if "flush" in options else FLUSH_INTERVAL
        return WriteBehindStore(path, window=window, synchronous=synchronous, flush_interval=flush)
    if "://" in location:
        raise ValueError(f"{location}: unknown store scheme (expected memory:, sqlite://, redis://, redis+sentinel://, redis+cluster:// or a path)")
    return WriteBehindStore(location, window=window)


def redacted(location: str | os.PathLike[str]) -> str:
    """The store's location for a message: a URL's userinfo (its password) replaced by ***."""
    location = os.fspath(location)
    scheme, sep, rest = location.partition("://")
    netloc, slash, path = rest.partition("/")
    if not sep or "@" not in netloc:
        return location
    return f"{scheme}{sep}***@{netloc.rpartition('@')[2]}{slash}{path}"


def _shared(location: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ValueError(f"{location}: shared must be true or false, got {value!r}")
    return value.lower() == "true"


def _seconds(location: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{location}: flush must be a positive number of seconds, got {value!r}")
    return seconds
