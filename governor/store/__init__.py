"""State stores: budget counters with atomic multi-counter reservations, session state, nonces.

`open_store(location)` picks the implementation:
  memory:                    MemoryStore (nothing survives the process)
  sqlite:///abs/path.db      SQLiteStore (the embedded default); also a plain path.
                             ?synchronous=FULL fsyncs every commit
  redis://host:port/db       RedisStore, for replicas sharing budgets (also rediss://)
"""

from __future__ import annotations

import os
from urllib.parse import parse_qs

from governor.store.base import (
    DAY,
    Reservation,
    RollingWindow,
    Store,
    StoreError,
    StoreUnavailable,
    UnknownReservation,
)
from governor.store.memory import MemoryStore
from governor.store.sqlite import SQLiteStore

__all__ = [
    "DAY",
    "MemoryStore",
    "Reservation",
    "RollingWindow",
    "SQLiteStore",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "UnknownReservation",
    "open_store",
]


def open_store(location: str | os.PathLike[str], *, window: RollingWindow = DAY) -> Store:
    """Open the store named by a URL or a path (see the module docstring)."""
    location = os.fspath(location)
    if location == "memory:":
        return MemoryStore(window=window)
    if location.startswith(("redis://", "rediss://")):
        try:
            from governor.store.redis import RedisStore
        except ModuleNotFoundError as exc:  # the client is an optional dependency
            raise StoreError(f"{location}: the Redis store needs the 'redis' package ({exc})") from exc
        return RedisStore(location, window=window)
    if location.startswith("sqlite://"):
        path, _, query = location.removeprefix("sqlite://").partition("?")
        options = {k: v[-1] for k, v in parse_qs(query).items()}
        unknown = set(options) - {"synchronous"}
        if unknown:
            raise ValueError(f"{location}: unknown option(s) {', '.join(sorted(unknown))}")
        if not path:
            raise ValueError(f"{location}: no database path")
        return SQLiteStore(path, window=window, synchronous=options.get("synchronous", "NORMAL"))
    if "://" in location:
        raise ValueError(f"{location}: unknown store scheme (expected memory:, sqlite://, redis:// or a path)")
    return SQLiteStore(location, window=window)
