"""What the runtime holds of one live session, and what an admitted step holds.

`LiveSession` is a row of the runtime's live-session table (`SessionTable.live`, which the
runtime's collaborators, approvals, records, views, the sweeper and the audit trail, are
handed in their constructors); `Ticket` is what `admit` gives the proxy to hand back to
`usage` and `finish`; `HeldStep` is a paused step waiting for its review.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from governor.evidence import Journal
from governor.policy import SessionState, Step
from governor.sessions.index import SessionIndex

if TYPE_CHECKING:
    from governor.runtime.metrics import Metrics

PIN_KEY = "pin"  # the member of a saved session state that names what it was admitted with


@dataclass(slots=True)
class Ticket:
    """What an admitted step holds until `finish`: its reservation and in-flight slot."""

    kind: str  # "model" | "tool" | "other"
    persona: str | None
    charges: tuple = ()
    reservation: str | None = None
    in_flight: bool = False
    done: bool = False
    rates: Any = None  # what it drew on the rate limits' windows (governor.runtime.rates.RateHold)


@dataclass(slots=True)
class HeldStep:
    """A paused step waiting for its review, and the future its request waits on."""

    step: Step
    expires_at: float
    answer: asyncio.Future  # resolves to (approved: bool, admission for a rejection or None)
    reason: str
    trigger: str
    held_at: float = 0.0  # when the step was paused (the approval wait histogram)
    edited: bool = False  # plan editing: `step` is the reviewer's edited step (governor.runtime.edit)


@dataclass(slots=True)
class LiveSession:
    """One session the runtime governs (or knows as ended), with its journal open."""

    id: str
    state: SessionState
    journal: Journal
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: dict[str, HeldStep] = field(default_factory=dict)
    last_activity: float = 0.0
    ended: bool = False
    final_record: dict[str, Any] | None = None
    unsaved: bool = False  # state changed since it was last persisted
    metric_state: str | None = None  # its state as counted in governor_sessions
    # the limits this session is governed by: the runtime's, or, for a session resumed
    # under another pin, its original ones (governor.runtime.resume)
    limits: Any = None
    swept_at: float = 0.0  # when the sweeper last charged its wall-clock
    recorded: tuple[int, ...] = ()  # the seqs of the events its last decision round journaled
    # a shared session (runtime/shared.py): its state as last seen in the store, with that
    # state's version (the SHA-1 of its saved bytes); None: not known (runtime/shared_fast.py)
    shared_head: tuple[str, SessionState] | None = None
    # the saved bytes a version conflict's reply last brought, as adopted: the replies of the
    # other scripts of the same batch bring them again (runtime/shared_fast.py)
    shared_seen: bytes | None = None
    # settlements queued without awaiting that the store then failed (runtime/remote_steps.py):
    # runtime/late_settlement.py's Unsettled (either session mode), counting until settled again
    unsettled: list[Any] = field(default_factory=list)

    def restate(self, metrics: Metrics) -> None:
        """Keep governor_sessions current on every transition (no walk over sessions per scrape)."""
        state = "ended" if self.ended else "halted" if self.state.halted else "paused" if self.pending else "active"
        if state != self.metric_state:
            metrics.session_moved(self.metric_state, state)
            self.metric_state = state

    def saved_state(self) -> dict[str, Any]:
        """What the store keeps of a session: its state and the pin it was admitted with."""
        return self.saved_state_of(self.state)

    def saved_state_of(self, state: SessionState) -> dict[str, Any]:
        """What the store keeps of this session in `state`."""
        return {**state.to_dict(), PIN_KEY: self.pin()}

    def pin(self) -> dict[str, Any]:
        """The pin the session was admitted with, as its saved state names it."""
        header = self.journal.record.header
        return {"digest": header.passport_digest, "tier": header.tier, "subject": header.subject_id}


class SessionTable:
    """The live sessions by id (and their ids sorted, for the control plane's pages), each
    opened on first use by `opener` (blocking: new, or resumed from the store and its
    journal after a restart)."""

    def __init__(self, *, opener: Callable[[str], LiveSession], metrics: Metrics) -> None:
        self.live: dict[str, LiveSession] = {}
        self.index = SessionIndex()
        self.opener = opener
        self.metrics = metrics
        self._opening: dict[str, asyncio.Lock] = {}  # sessions being opened (their first request)

    async def open(self, session_id: str) -> LiveSession:
        """The live session, opened on first use. Opening reads the store and creates the
        journal with an fsync: done in a worker thread, once, whatever the number of
        concurrent first requests."""
        live = self.live.get(session_id)
        if live is not None:
            return live
        opening = self._opening.setdefault(session_id, asyncio.Lock())
        async with opening:
            live = self.live.get(session_id)
            if live is None:
                live = await asyncio.to_thread(self.opener, session_id)
                self.live[session_id] = live
                self.index.add(session_id)
                live.restate(self.metrics)
        self._opening.pop(session_id, None)
        return live

    def adopt(self, live: LiveSession) -> None:
        """A session known without being opened (finalized at start-up), unless one is live."""
        if live.id not in self.live:
            self.live[live.id] = live
            self.index.add(live.id)


__all__ = ["HeldStep", "LiveSession", "PIN_KEY", "SessionTable", "Ticket"]
