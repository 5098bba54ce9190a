"""Sessions shared by governor replicas on one Redis (docs/reference/shared-sessions.md).

With a store that shares sessions (`store.shared_sessions()`: Redis), any replica serves any
session. What a step needs is in the store, not in one process:
  * the journal is one hash chain in the store (`governor.evidence.shared_journal`), so
    the events of every replica are in one order and one record;
  * each decision round takes the session's round in the store (a lease, `RedisSessions.lock`),
    reads the session's state as the last round left it (any replica's), decides, journals,
    and saves the state and the session's last activity before it lets the round go: two
    replicas never decide on the same state;
  * a session idle past the idle timeout on every replica (its shared last activity) is
    ended by whichever replica's sweeper finds it first; one whose replica died is found the
    same way (`abandoned`), and ends at most once (the end line is a compare-and-append).
Embedded stores (memory, SQLite) share nothing: `SharedSteps` is not made for them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from governor.policy import Decision, SessionState, Step, Tick
from governor.runtime.refusals import unrecorded_failure
from governor.runtime.session import LiveSession, Ticket
from governor.store import StoreError

if TYPE_CHECKING:
    from governor.runtime.metrics import Metrics

log = logging.getLogger("governor.runtime")

Round = Callable[[LiveSession, Step, "Ticket | None"], Awaitable["tuple[Decision, Ticket | None]"]]


class SharedSteps:
    """Decision rounds on sessions shared through the store (see the module docstring)."""

    def __init__(self, *, sessions: Any, store: Any, metrics: Metrics, clock: Callable[[], float]) -> None:
        self.sessions = sessions  # governor.store.redis_sessions.RedisSessions
        self.store = store
        self.metrics = metrics
        self.clock = clock

    async def apply(self, live: LiveSession, step: Step, ticket: Ticket | None,
                    round_here: Round) -> tuple[Decision, Ticket | None]:
        """`round_here` (the runtime's decision round) on the session's shared state, as the
        one round in progress on it across replicas; the state saved before the round ends."""
        try:
            owner = await asyncio.to_thread(self.sessions.lock, live.id)
        except StoreError as exc:  # the store is down or another replica's round hangs: retryable
            self.metrics.store_error()
            return unrecorded_failure(step, exc), None
        try:
            try:
                await asyncio.to_thread(self._load, live)
            except Exception as exc:  # StoreError, or a state another writer made unreadable
                self.metrics.store_error()
                log.warning("session %s: its shared state could not be read: %s", live.id, exc)
                return unrecorded_failure(step, exc), None
            result = await round_here(live, step, ticket)
            await asyncio.to_thread(self._save, live, type(step) is not Tick)
            return result
        finally:
            try:
                await asyncio.to_thread(self.sessions.unlock, live.id, owner)
            except StoreError:  # its lease runs out by itself
                log.warning("session %s: could not end its round in the store (the lease expires)", live.id)

    def _load(self, live: LiveSession) -> None:
        saved = self.store.load_session(live.id)
        if saved is None:
            return
        state = SessionState.from_dict(saved)
        live.state = state
        if state.ended and not live.ended:  # another replica ended it: its chain holds the end
            live.journal.refresh()
            live.ended = True

    def _save(self, live: LiveSession, activity: bool) -> None:
        try:
            self.store.save_session(live.id, live.saved_state())
            live.unsaved = False
            if activity and not live.ended:
                self.sessions.touch(live.id, self.clock())
        except StoreError:  # the next round reads what the store holds; this one's events are chained
            self.metrics.store_error()
            log.exception("session %s: could not save its shared state", live.id)

    def mark_ended(self, live: LiveSession) -> None:
        """The session ended here: every replica reads it as ended from now on. Blocking."""
        live.state = live.state.evolve(ended=True)
        self.store.save_session(live.id, live.saved_state())
        self.sessions.forget_activity(live.id)

    async def still_active(self, live: LiveSession, now: float, idle_sec: float) -> bool:
        """Whether another replica served the session within `idle_sec` (then it is not idle)."""
        try:
            at = await asyncio.to_thread(self.sessions.last_activity, live.id)
        except StoreError:
            return True  # not known: not ended for idleness on a guess
        if at is not None and now - at < idle_sec:
            live.last_activity = max(live.last_activity, at)
            return True
        return False

    async def abandoned(self, now: float, idle_sec: float, kept_here: Callable[[str], bool]) -> list[str]:
        """Sessions no replica served within `idle_sec` (but those `kept_here`): a replica that
        died (or stopped) left them; any replica ends them."""
        try:
            activity = await asyncio.to_thread(self.sessions.activity)
        except StoreError:
            return []
        return [session for session, at in activity.items() if now - at >= idle_sec and not kept_here(session)]


__all__ = ["SharedSteps"]
