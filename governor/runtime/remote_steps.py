"""The usual model call on a store across the network (Redis): admitted and settled with one
awaited round trip each on the event loop (the store's asyncio client: no thread per step),
and the session's lock never held across that wait.

Admission reserves what a quiet permit of the call would charge (`expected_charges`) and
reads the counters it is decided on in the same round trip (`reserve_within`); then, with
no await between deciding and advancing (under the session's lock only when a full round
holds it, so that round's state is not overwritten), the engine's own quiet decision is
taken on that snapshot. When it is not a quiet permit with exactly those charges (a cause
would fire, a warning is due, a concurrent step moved the session on), the reservation is
released and the caller's full round decides, records and reserves: a conflict re-decides.
A reservation the store refused (a cap) is the full round's to report.

Settlement commits a final report within its reservation (`quiet_settlement`) without
awaiting the store: the COMMIT is queued on the store's pipeline (governor.store.redis_pipeline,
FIFO on one connection, so the session's next admission, queued later, runs after it) and
the session's state moves on at once. The reservation and the in-flight slot are claimed
first, so a concurrent `finish` does not release or free them twice. A commit that then
fails (the store down, a fence) takes the route shared sessions take too
(governor.runtime.late_settlement): logged, recorded as a note, its reservation counting what
it reserved, settled again by the session's next step (here: the COMMIT again; one of a
reservation already settled answers 0, so a retry never counts twice), which then takes the
full round (docs/reference/stores.md, "Settling after the response").

Any failure before that leaves things as they were (what was reserved is released, or kept
for the full round to settle) and returns None: the full round then decides, and fails
closed and records it when the store is down."""

from __future__ import annotations

import logging
from typing import Any, Callable

from governor.policy import (
    Decision,
    ModelCall,
    SessionState,
    UsageReport,
    advance,
    quiet_model_call,
    quiet_settlement,
)
from governor.policy.expected import expected_charges
from governor.runtime.late_settlement import LateSettlements, Unsettled
from governor.runtime.session import LiveSession, Ticket
from governor.store.base import UnknownReservation

log = logging.getLogger("governor.runtime")


class RemoteSteps:
    """The model call's fast path on a remote store; `counters()` gives the store's asyncio
    client for the running loop (None: there is none, the full round is used)."""

    def __init__(self, *, counters: Callable[[], Any], agent_id: str, clock: Callable[[], float],
                 advanced: Callable[[LiveSession, SessionState, float], None]) -> None:
        self._counters = counters
        self._agent_id = agent_id
        self._clock = clock
        self._advanced = advanced
        self._late = LateSettlements(chain_in_store=False)  # settlements the store failed after their response

    async def admit(self, live: LiveSession, step: ModelCall) -> tuple[Decision, Ticket] | None:
        if live.ended or live.state.halted:
            return None
        if live.unsettled:  # a settlement failed after its response: settled again first, then the full round
            await self._late.settle_again(live)
            return None
        limits = live.limits
        charges = expected_charges(limits, step)
        counters = self._counters() if charges is not None else None
        if counters is None:
            return None
        now = self._clock()
        try:
            snapshot, held = await counters.reserve_within(self._agent_id, live.id, limits.counter_keys(step),
                                                           charges, now)
        except Exception:
            log.debug("session %s: reserving a model call at once failed", live.id, exc_info=True)
            return None
        if not held.ok or held.id is None:  # a cap refused it: the full round reports it
            return None
        if live.lock.locked():  # a full round may be between deciding and advancing: after it
            async with live.lock:
                admitted = self._take(live, step, snapshot, held.id, charges, now)
        else:
            admitted = self._take(live, step, snapshot, held.id, charges, now)
        if admitted is None:  # not a quiet permit after all (rare): the full round decides
            try:
                await counters.release(held.id)
            except Exception:  # it keeps counting until settled: the store errs on counting
                log.warning("session %s: could not release reservation %s", live.id, held.id, exc_info=True)
        return admitted

    def _take(self, live: LiveSession, step: ModelCall, snapshot: dict, reservation: str, charges: tuple,
              now: float) -> tuple[Decision, Ticket] | None:
        """Decide and advance with no await in between: the engine's quiet permit, or None."""
        if live.ended:
            return None
        quiet = quiet_model_call(live.limits, live.state, step, snapshot, now)
        if quiet is None or quiet[0].charges != charges:
            return None
        decision, state = quiet
        self._advanced(live, state, now)
        return decision, Ticket("model", None, decision.charges, reservation, in_flight=True)

    async def settle(self, live: LiveSession, ticket: Ticket, report: UsageReport) -> Decision | None:
        if not report.final or not ticket.in_flight or ticket.reservation is None or live.ended:
            return None
        step = report.with_reserved(ticket.charges, True)
        settled = quiet_settlement(live.limits, live.state, step)
        counters = self._counters() if settled is not None else None
        if counters is None:
            return None
        decision = settled[0]  # type: ignore[index]
        reservation, now = ticket.reservation, self._clock()
        charges = decision.charges

        def committed(failure: Exception | None) -> None:
            if failure is not None:
                self._late.failed(live, Unsettled(reservation, charges, now,
                                                  lambda: self._commit_again(reservation, charges, now)), failure)

        try:  # queued before anything this session does next; not awaited
            counters.commit_soon(reservation, charges, now, committed)
        except Exception:  # not usable: the full round settles it (and fails closed, recorded)
            log.debug("session %s: settling a model call at once failed", live.id, exc_info=True)
            return None
        ticket.reservation, ticket.in_flight = None, False  # claimed: finish() holds nothing now
        if live.lock.locked():
            async with live.lock:
                self._settled(live, step, decision, now)
        else:
            self._settled(live, step, decision, now)
        return decision

    def _settled(self, live: LiveSession, step: UsageReport, decision: Decision, now: float) -> None:
        if live.ended:
            return
        quiet = quiet_settlement(live.limits, live.state, step)
        state = quiet[1] if quiet is not None else advance(live.limits, live.state, step, decision, now)
        self._advanced(live, state, now)

    async def _commit_again(self, reservation: str, charges: tuple, now: float) -> bool:
        """Settle again a settlement the store failed to take (runtime/late_settlement.py): a
        local session's state moved on already, so its COMMIT is all that is left. False: the
        store failed again."""
        counters = self._counters()
        if counters is None:
            return False
        try:
            await counters.commit(reservation, charges, now)
        except UnknownReservation:  # settled after all (its reply was lost), or released
            pass
        except Exception:
            log.debug("settling reservation %s again failed", reservation, exc_info=True)
            return False
        return True

    async def drain(self) -> None:
        """At a stop: every queued settlement sent and its reply handled (a failure journaled)."""
        counters = self._counters()
        if counters is not None:
            await counters.drain()
        await self._late.drain()
