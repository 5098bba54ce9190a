"""Where the statistical envelope (policy/envelope.py) is kept: an agent's state across
sessions and restarts. `open_envelope_book(store)` picks the book for the governor's store:

  memory            `EnvelopeBook` in memory (a memory store keeps nothing across restarts either)
  SQLite, write-behind  `EnvelopeBook` in the store's own file, table `envelope` (one row per
                    agent, read and written in one BEGIN IMMEDIATE transaction per feed, at most
                    once a second: processes sharing the file (?shared=true) merge atomically)
  Redis             `RedisEnvelopeBook` (redis_envelope.py): fleet-wide, folded by a Lua script

Each book does the window arithmetic of `policy.envelope.feed` atomically per agent and
returns the window a feed closed; the caller judges it (pure) and marks a deviation, the first
mark standing until `reset` (sticky).
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Protocol

import orjson

from governor.policy.envelope import ClosedWindow, EnvelopeConfig, EnvelopeState, feed, reset
from governor.store.base import StoreError


class Book(Protocol):
    def feed(self, agent: str, config: EnvelopeConfig, now: float, increments: Mapping[str, float],
             tools: Mapping[str, int]) -> tuple[EnvelopeState, ClosedWindow | None]: ...

    def mark(self, agent: str, deviation: Mapping[str, Any]) -> Mapping[str, Any]: ...

    def load(self, agent: str) -> EnvelopeState: ...

    def reset(self, agent: str) -> Mapping[str, Any] | None: ...

    def close(self) -> None: ...


class EnvelopeBook:
    """The envelope of each agent in this process, persisted to a SQLite file when given one."""

    def __init__(self, path: str | None = None) -> None:
        self._states: dict[str, EnvelopeState] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if path is not None:
            try:
                self._db = sqlite3.connect(path, timeout=5.0, check_same_thread=False, isolation_level=None)
                self._db.execute("PRAGMA synchronous=NORMAL")  # as the store's own connections
                self._db.execute("CREATE TABLE IF NOT EXISTS envelope (agent TEXT PRIMARY KEY, state TEXT NOT NULL)")
            except sqlite3.Error as exc:
                raise StoreError(f"the envelope table in {path} cannot be opened: {exc}") from exc

    def _state(self, agent: str) -> EnvelopeState:
        """The agent's state: from the file when there is one (another process sharing the
        file may have fed it: sqlite:///PATH?shared=true), else from memory."""
        if self._db is None:
            return self._states.get(agent) or EnvelopeState()
        try:
            # fetchall: a statement left unfinished would keep its read snapshot open
            rows = self._db.execute("SELECT state FROM envelope WHERE agent = ?", (agent,)).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"the envelope cannot be read: {exc}") from exc
        return EnvelopeState.from_json(orjson.loads(rows[0][0])) if rows else EnvelopeState()

    def _put(self, agent: str, state: EnvelopeState) -> None:
        if self._db is not None:
            try:
                self._db.execute("INSERT INTO envelope (agent, state) VALUES (?, ?) ON CONFLICT (agent) "
                                 "DO UPDATE SET state = excluded.state", (agent, orjson.dumps(state.to_json()).decode()))
            except sqlite3.Error as exc:
                raise StoreError(f"the envelope cannot be written: {exc}") from exc
        else:
            self._states[agent] = state

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One read-modify-write, atomic against other processes sharing the file (BEGIN IMMEDIATE)."""
        with self._lock:
            if self._db is None:
                yield
                return
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"the envelope cannot be updated: {exc}") from exc
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"the envelope cannot be written: {exc}") from exc

    def feed(self, agent: str, config: EnvelopeConfig, now: float, increments: Mapping[str, float],
             tools: Mapping[str, int]) -> tuple[EnvelopeState, ClosedWindow | None]:
        with self._transaction():
            state, closed = feed(config, self._state(agent), now, increments, tools)
            self._put(agent, state)
            return state, closed

    def mark(self, agent: str, deviation: Mapping[str, Any]) -> Mapping[str, Any]:
        with self._transaction():
            state = self._state(agent)
            if state.deviation is None:  # the first deviation stands until the principal resets it
                state = EnvelopeState(state.window, state.counts, state.tools, state.stats, state.tool_history,
                                      dict(deviation))
                self._put(agent, state)
            return state.deviation  # type: ignore[return-value]

    def load(self, agent: str) -> EnvelopeState:
        with self._lock:
            return self._state(agent)

    def reset(self, agent: str) -> Mapping[str, Any] | None:
        with self._transaction():
            state = self._state(agent)
            if state.deviation is not None:
                self._put(agent, reset(state))
            return state.deviation

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def open_envelope_book(store: Any) -> Book:
    """The envelope book for `store`: fleet-wide on Redis, in the store's file for SQLite."""
    if getattr(store, "remote", False) and hasattr(store, "client"):  # RedisStore
        from governor.store.redis_envelope import RedisEnvelopeBook  # redis is an optional dependency
        return RedisEnvelopeBook(store.client, store.prefix)
    return EnvelopeBook(getattr(store, "path", None))


__all__ = ["Book", "EnvelopeBook", "open_envelope_book"]
