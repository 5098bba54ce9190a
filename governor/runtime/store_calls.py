"""How the runtime and its collaborators (views, the sweeper, rate limits) call the store from
the event loop: inline when it is local (it answers in microseconds: no thread hop on the
per-request path), from a worker thread when it crosses the network (Redis's blocking client).
And the two calls whose failure is counted and logged but refuses nothing: a session's state
saved (the next step's snapshot fails closed if the store stays down) and a reservation
released (it keeps counting until it expires: the store errs on counting)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from governor.store import Store, StoreError

log = logging.getLogger("governor.runtime")


class StoreCalls:
    def __init__(self, store: Store, metrics: Any) -> None:
        self.store = store
        self.metrics = metrics
        self.in_thread = bool(getattr(store, "remote", False))

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call the store: inline when local, from a worker thread when it crosses the network."""
        if self.in_thread:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    def save(self, live: Any) -> None:
        """Persist a session's state (blocking)."""
        try:
            self.store.save_session(live.id, live.saved_state())
            live.unsaved = False
        except StoreError:  # the next step's snapshot will fail closed if the store stays down
            self.metrics.store_error()
            log.exception("session %s: could not save session state", live.id)

    def release_quietly(self, reservation: str) -> None:
        """Release a reservation nobody will settle (blocking)."""
        try:
            self.store.release(reservation)
        except StoreError:
            self.metrics.store_error()
            log.exception("could not release reservation %s", reservation)


__all__ = ["StoreCalls"]
