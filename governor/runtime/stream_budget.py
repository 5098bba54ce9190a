"""A stream spends only what it reserved: the runtime's side of growing a reservation.

A streamed model call holds a reservation made at admission (`Ticket.charges`). When
its running usage (a UsageReport with final=False, from the stream watcher) passes
that, the proxy keeps the chunk back (`StreamRelay.hold`) and the runtime, under the
session's lock, asks the store to extend the reservation (`Store.extend`, atomic
against every cap, in every store and across replicas sharing Redis): first with
headroom (`governor.policy.extension.headroom`), then exactly. Granted, the ticket
holds more and the chunk goes out; refused, the running report is decided against
the counters as they stand, its projection crosses the cap (on_budget_exhausted,
recorded) and the proxy cuts the stream before the chunk that crossed.

Synchronous: called inline for a local store, from a worker thread for Redis.
"""

from __future__ import annotations

from typing import Any, Callable

from governor.policy import Decision, Limits, SessionState, UsageReport, decide
from governor.policy.extension import extension, grown, headroom

# rounds of "extension refused, yet the counters now leave room": a concurrent step
# released between the two; past this many the counters keep moving, fail closed
MAX_ROUNDS = 4


def grow(store: Any, limits: Limits, ticket: Any, step: UsageReport, now: float) -> bool | None:
    """Extend the ticket's reservation to cover `step` (plus headroom, else exactly).
    True: it covers it now; False: the store refused (a cap would be crossed); None:
    nothing can cover it (the usage cannot be priced)."""
    if limits.within_reservation(step.with_reserved(ticket.charges)):
        return True
    for extra in (headroom(step), 0):
        more = extension(limits, step, ticket.charges, extra)
        if more is None:
            return None
        if not more:
            return True
        held = store.extend(ticket.reservation, more, now)
        if held.ok:
            ticket.charges = grown(ticket.charges, more)
            return True
    return False


def decide_running(store: Any, limits: Limits, state: SessionState, step: UsageReport, ticket: Any, now: float,
                   counters: Callable[[], dict]) -> tuple[SessionState, Decision]:
    """A running report of a call whose reservation is outstanding, in a session not halted:
    grow the reservation, then decide the report with what the ticket holds. `counters`
    reads the snapshot the decision needs (after the extension, which it includes)."""
    for _ in range(MAX_ROUNDS):
        covered = grow(store, limits, ticket, step, now)
        report = step.with_reserved(ticket.charges)
        decided_state = state.with_counters(counters())
        decision = decide(limits, decided_state, report, now)
        if covered is not False or decision.blocks:
            return decided_state, decision
        # refused, yet the projection found room: a concurrent step released meanwhile; try again
    raise RuntimeError("budget counters kept changing under a growing stream; refusing rather than guessing")


def is_running(step: Any, ticket: Any, state: SessionState) -> bool:
    """Whether `step` is a running report whose call still holds a reservation to grow."""
    return (type(step) is UsageReport and not step.final and ticket is not None
            and getattr(ticket, "reservation", None) is not None and not state.halted)
