"""The usual model call on a store in this process (memory, SQLite, write-behind): admitted
and settled without a full decision round, each in one synchronous step, no lock taken and
nothing awaited between deciding and advancing.

Admission reserves the charges a quiet permit of the call would make and reads the counters
it is decided on in one store operation (`reserve_within`), then takes the engine's own quiet
decision and state transition (`quiet_model_call`); anything else (a cause would fire, a
warning is due, a cap refused the reservation) releases what it reserved and leaves the step
to the full round, which decides, records and fails closed. Settlement commits a final
report within its reservation (`quiet_settlement`). The property tests hold both equal to
the engine's general decision (tests/test_runtime.py, tests/test_policy_properties.py)."""

from __future__ import annotations

import logging
from typing import Callable

from governor.policy import (Decision, ModelCall, SessionState, UsageReport, quiet_charges, quiet_model_call,
                             quiet_settlement)

from governor.runtime.session import LiveSession, Ticket
from governor.store import Store

log = logging.getLogger("governor.runtime")


def outside_the_round(live: LiveSession) -> bool:
    """Whether a step may be decided and applied at once, without the session's lock. Nothing
    else of the session interleaves with it (no await), but not while a step holds the lock
    (it may be between deciding and advancing: its state would overwrite ours), and not in an
    ended session. (A store across the network, or sessions shared between replicas, never
    take this path: the runtime builds no LocalSteps for them.)"""
    return not (live.ended or live.lock.locked())


class LocalSteps:
    """The model call's fast path on a local store; `advanced` moves a session on after a step
    decided at once, `release` drops a reservation quietly."""

    def __init__(self, *, store: Store, agent_id: str, clock: Callable[[], float],
                 advanced: Callable[[LiveSession, SessionState, float], None],
                 release: Callable[[str], None]) -> None:
        self._store = store
        self._agent_id = agent_id
        self._clock = clock
        self._advanced = advanced
        self._release = release

    def admit(self, live: LiveSession, step: ModelCall) -> tuple[Decision, Ticket] | None:
        """The usual model call, admitted without a full decision round: one that fires
        nothing and warns of nothing (`quiet_model_call`, the engine's own decision and
        state transition for it), its charges reserved, in one synchronous step. What
        the runtime's full round would do for it under the lock, minus the engine's general run.

        Taken only when `outside_the_round` allows it. None: not taken, and nothing changed (a
        reservation it made is released; a failed or refused one holds nothing); the full round
        then decides, records what fires, and fails closed when the store is down."""
        if not outside_the_round(live):
            return None
        now = self._clock()
        limits = live.limits
        held = quiet = None
        try:
            # the counters read and the permit's charges reserved in one store operation (the
            # charges depend on the step alone); anything but that permit releases them
            charges = quiet_charges(limits, live.state, step, now)
            if not charges:
                return None
            counters, held = self._store.reserve_within(self._agent_id, live.id, limits.counter_keys(step), charges, now)
            if held.ok:  # else over a cap, or a concurrent step got there first: the full round reports it
                quiet = quiet_model_call(limits, live.state, step, counters, now)
        except Exception:
            log.debug("session %s: admitting a model call at once failed", live.id, exc_info=True)
        if quiet is None or quiet[0].charges != charges:
            if held is not None and held.ok:
                self._release(held.id)
            return None
        decision, state = quiet
        self._advanced(live, state, now)
        return decision, Ticket("model", None, decision.charges, held.id, in_flight=True)

    def settle(self, live: LiveSession, ticket: Ticket, report: UsageReport) -> Decision | None:
        """The usual end of a model call, without a full decision round: a final report within
        its reservation, in a session not halted, settled (commit) and freed in one synchronous
        step. What the runtime's `usage` would do for it under the lock, minus the counter-key pass and the
        engine's general run: the decision and the next state are the engine's own
        (`quiet_settlement`: the `settlement` that `decide` returns for such a report, and
        what `advance` makes of it).

        Taken only when `outside_the_round` allows it, and not when the commit fails (the full
        round then decides again and fails closed, recorded). None: not taken."""
        if (not report.final or not ticket.in_flight or ticket.reservation is None
                or not outside_the_round(live)):
            return None
        step = report.with_reserved(ticket.charges, True)
        now = self._clock()
        try:
            settled = quiet_settlement(live.limits, live.state, step)
            if settled is None:
                return None
            decision, state = settled
            self._store.commit(ticket.reservation, decision.charges, now)
        except Exception:
            # nothing changed: the full round below tries again, and fails closed and
            # records what it cannot do (decide() turns an error into on_governor_error)
            log.debug("session %s: settling a model call at once failed", live.id, exc_info=True)
            return None
        ticket.reservation = None
        ticket.in_flight = False
        self._advanced(live, state, now)
        return decision
