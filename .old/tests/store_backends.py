"""The store backends, opened fresh for a test: the contract tests run against each."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import pytest

from governor.store import DAY, MemoryStore, RollingWindow, SQLiteStore, Store, WriteBehindStore
from tests.redis_server import redis_url  # noqa: F401  (a fixture the `store` fixture uses)

BACKENDS = ("memory", "sqlite", "writebehind", "redis")

# short, so the flusher runs (and races the operations) during the contract tests
FLUSH_INTERVAL = 0.005


def open_backend(kind: str, directory: Path, request: pytest.FixtureRequest, window: RollingWindow = DAY) -> Store:
    """A new, empty store of `kind`; Redis ones get their own key prefix on the shared server."""
    if kind == "memory":
        return MemoryStore(window=window)
    if kind == "sqlite":
        return SQLiteStore(directory / f"store-{uuid.uuid4().hex[:8]}.db", window=window)
    if kind == "writebehind":
        return WriteBehindStore(directory / f"store-{uuid.uuid4().hex[:8]}.db", window=window,
                                flush_interval=FLUSH_INTERVAL)
    from governor.store.redis import RedisStore

    return RedisStore(request.getfixturevalue("redis_url"), window=window, prefix=f"test-{uuid.uuid4().hex}:")


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_backend(request.param, tmp_path, request)
    yield s
    s.close()
