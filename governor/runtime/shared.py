"""Sessions shared by governor replicas on one Redis (docs/reference/shared-sessions.md).

With a store that shares sessions (`store.shared_sessions()`: Redis), any replica serves any
session. What a step needs is in the store, not in one process:
  * the journal is one hash chain in the store (`governor.evidence.shared_journal`), so
    the events of every replica are in one order and one record;
  * each decision round takes the session's round in the store (a lease, `RedisSessions.begin_round`),
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

import orjson

from governor.policy import ON_SESSION_INTEGRITY, Action, Decision, SessionState, Step, Tick, UsageReport, store_unreachable
from governor.policy.digests import STEP_KINDS
from governor.runtime.refusals import transient, unrecorded_failure
from governor.runtime.session import PIN_KEY, LiveSession, Ticket
from governor.runtime.shared_fast import version
from governor.store import StoreError
from governor.store.base import encode_state

if TYPE_CHECKING:
    from governor.runtime.metrics import Metrics

log = logging.getLogger("governor.runtime")

Round = Callable[[LiveSession, Step, "Ticket | None"], Awaitable["tuple[Decision, Ticket | None]"]]


class DamagedState(ValueError):
    """A session's shared state that is no state this governor saved (edited in the store)."""


class SharedSteps:
    """Decision rounds on sessions shared through the store (see the module docstring)."""

    def __init__(self, *, sessions: Any, store: Any, metrics: Metrics, clock: Callable[[], float],
                 record_audit: Callable[[str, str, float, dict[str, Any]], None]) -> None:
        self.sessions = sessions  # governor.store.redis_sessions.RedisSessions
        self.record_audit = record_audit  # the audit journal (blocking): a damaged chain is recorded there
        self.damage_recorded: set[str] = set()  # sessions whose damaged chain this process recorded
        self.store = store
        self.metrics = metrics
        self.clock = clock

    async def apply(self, live: LiveSession, step: Step, ticket: Ticket | None,
                    round_here: Round) -> tuple[Decision, Ticket | None]:
        """`round_here` (the runtime's decision round) on the session's shared state, as the
        one round in progress on it across replicas; the state saved as the round ends. Two
        store round trips besides the round's own: one takes the round and reads the state,
        one saves the state and the activity and lets the round go."""
        try:
            owner = await asyncio.to_thread(self._begin, live)
        except StoreError as exc:  # the store is down or another replica's round hangs: retryable
            return self.unreachable(live, step, ticket, exc), None
        except Exception as exc:  # a state another writer made unreadable, a damaged chain: the round was let go
            log.warning("session %s: its shared state could not be read: %s", live.id, exc)
            if isinstance(exc, DamagedState):
                await asyncio.to_thread(self.damaged, live.id, str(exc), "shared_state_damaged")
            return unrecorded_failure(step, exc), None
        self.metrics.shared_round(STEP_KINDS.get(type(step), "other"))
        saved: bytes | None = None
        saved_state: SessionState | None = None
        activity: float | None = None
        try:
            if live.journal.deferred:  # refusals met while the store was unreachable: chained first
                try:
                    await asyncio.to_thread(live.journal.flush)
                except StoreError as exc:
                    return self.unreachable(live, step, ticket, exc), None
            result = await round_here(live, step, ticket)
            saved_state = live.state
            saved = encode_state(live.saved_state_of(saved_state))
            activity = self.clock() if type(step) is not Tick and not live.ended else None
            return result
        finally:
            try:
                await asyncio.to_thread(self.sessions.end_round, live.id, owner, saved, activity)
                if saved is not None and saved_state is not None:
                    live.unsaved = False
                    live.shared_head = (version(saved), saved_state)
            except StoreError:  # the next round reads what the store holds; this one's events are chained
                live.shared_head = None
                self.metrics.store_error()
                log.warning("session %s: could not save its shared state and end its round (its lease expires)",
                            live.id)

    def _begin(self, live: LiveSession) -> str:
        """Take the session's round and adopt its shared state. Blocking."""
        owner, saved = self.sessions.begin_round(live.id)
        try:
            if saved is not None:
                self._adopt_saved(live, saved)
            else:
                live.shared_head = None
        except BaseException:
            self.sessions.end_round(live.id, owner, None, None)
            raise
        return owner

    def _adopt_saved(self, live: LiveSession, saved: bytes, head_only: bool = False) -> None:
        """Adopt a state as another writer saved it, with its version (`head_only`: as the
        version the next one-round-trip step decides on, leaving the live state to the round
        of this replica on the session); DamagedState when it is no session state (edited in
        the store)."""
        try:
            data = orjson.loads(saved)
            state = SessionState.from_dict(data)
            pin = data.get(PIN_KEY)
        except Exception as exc:
            live.shared_head = None
            raise DamagedState(f"the session's shared state is unreadable: {type(exc).__name__}: {exc}") from None
        if live.journal.record is not None and pin != live.pin():
            live.shared_head = None
            raise DamagedState("the session's shared state names another pin than its chain's header")
        if not head_only:
            self._adopt(live, data, state)
        live.shared_head = (version(saved), state)

    def adopt_saved(self, live: LiveSession, saved: bytes, head_only: bool = False) -> None:
        """`_adopt_saved` for the one-round-trip path (runtime/shared_fast.py): a damaged state
        is recorded (this governor's audit journal) before it is raised. Blocking on damage."""
        try:
            self._adopt_saved(live, saved, head_only)
        except DamagedState as exc:
            self.damaged(live.id, str(exc), "shared_state_damaged")
            raise

    def damaged(self, session: str, what: str, reason: str = "shared_chain_damaged") -> None:
        """A session's chain in the store was found damaged (edited, forged, cut): its steps fail
        closed; recorded in this governor's audit journal (once per session and process: every
        later step meets it again), since the chain itself cannot take it. Blocking."""
        log.error("session %s: its chain in the store is damaged, every step fails closed: %s", session, what)
        if session in self.damage_recorded:
            return
        self.damage_recorded.add(session)
        self.record_audit(ON_SESSION_INTEGRITY, "halt", self.clock(),
                          {"session": session, "reason": reason, "error": what[:500]})

    def unreachable(self, live: LiveSession, step: Step, ticket: Ticket | None, exc: StoreError) -> Decision:
        """The step refused because the store did not answer: retryable when it is only
        unreachable, its event kept to be chained once the store answers (the chain is in the
        store); a loss fails closed (runtime/refusals.py)."""
        self.metrics.store_error()
        if not transient(exc):
            return unrecorded_failure(step, exc)
        log.log(logging.DEBUG if type(step) is Tick else logging.WARNING,
                "session %s: %s refused, the store is unreachable: %s", live.id, type(step).__name__, exc)
        decision = store_unreachable(live.limits, live.state, step, str(exc), exc.retry_after)  # type: ignore[attr-defined]
        if type(step) is UsageReport and ticket is not None:
            ticket.reservation = None  # not settled: what it reserved keeps counting, never released as unused
        now = self.clock()
        for event in decision.events:
            live.journal.defer(event["cause"], event["action"], now, event.get("detail"))
        return decision

    def defer_refusal(self, live: LiveSession, decision: Decision, events: Any, exc: Exception, now: float) -> bool:
        """A refusal (deny: nothing goes ahead, nothing halts) whose events could not be chained
        because the store stopped answering mid-round: kept to be chained first once it answers.
        False for anything else (the caller fails closed, unrecorded)."""
        if not (transient(exc) and decision.action is Action.DENY):
            return False
        for event in events:
            live.journal.defer(event["cause"], event["action"], now, event.get("detail"))
        return True

    def load_state(self, live: LiveSession) -> None:
        """The session's state as the last round on any replica saved it (an end another replica
        made: its chain read again). Blocking."""
        saved = self.store.load_session(live.id)
        if saved is not None:
            self._adopt(live, saved)
            live.shared_head = None  # its version not known: the next step's reply brings it

    def _adopt(self, live: LiveSession, saved: dict[str, Any], state: SessionState | None = None) -> None:
        state = SessionState.from_dict(saved) if state is None else state
        live.state = state
        if state.ended and not live.ended:  # another replica ended it: its chain holds the end
            live.journal.refresh()
            live.ended = True

    async def refresh(self, session: str, live_sessions: dict[str, LiveSession],
                      open_session: Callable[[str], Awaitable[LiveSession]]) -> None:
        """For a view: the session opened here when another replica started it, and its state
        read again (not while a round of this replica is on it: that round saves it)."""
        try:
            live = live_sessions.get(session)
            if live is None:
                if not await asyncio.to_thread(self.sessions.has_chain, session):
                    return
                live = await open_session(session)
            if not live.lock.locked():
                await asyncio.to_thread(self.load_state, live)
        except Exception as exc:  # StoreError, a damaged chain: the view shows what this replica knows
            log.warning("session %s: its shared state could not be read for a view: %s", session, exc)

    def final_record(self, session: str, nonce: str | None) -> dict[str, Any] | None:
        """The final record another replica wrote for `session` (not bound to a nonce); None when
        there is none (or a nonce is asked for). Blocking."""
        if nonce is not None:
            return None
        try:
            return self.sessions.get_record(session)
        except StoreError:
            return None

    def mark_ended(self, live: LiveSession) -> None:
        """The session ended here: every replica reads it as ended from now on. Blocking."""
        live.state = live.state.evolve(ended=True)
        live.shared_head = None
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
