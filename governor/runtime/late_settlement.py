"""A settlement the store failed to take after its call was answered: one route for both of
Redis's session modes (docs/reference/stores.md, "Settling after the response").

The usual model call's settlement is queued on the store's pipeline and not awaited
(runtime/remote_steps.py for `sessions=local`, runtime/shared_fast.py for shared sessions;
a shared session's settlement that could not be queued is awaited, and takes this route too
when the store fails it). When the store then fails (down, paused, its fence lost), the call
was already answered and nothing is refused: `failed` logs it, records one note in the session's journal
(`on_governor_error`, action `continue`, detail `deferred_settlement: true`, `fail_closed:
false`, the reservation and the error) and keeps the settlement in `live.unsettled`, its
reservation counting what it reserved (never less than the settlement: the store errs on
counting). The session's next model call settles it again first (`settle_again`; what still
fails stays for the step after) and then takes the full round, which is refused as retryable
and recorded while the store is down.

Only where a session's chain and state live differs between the modes:
  * the note is appended to the session's journal on disk (local), or kept to be chained
    first once the store answers (shared: the chain is in the store that just failed;
    `SharedJournal.defer`, durable on the spool meanwhile);
  * settling again is the mode's own `Unsettled.again`: a COMMIT of the reservation for a
    local session (its state is this process's and has moved on already), the usage decided
    again on the shared state as it stands and saved with it for a shared one (the state in
    the store never got it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, NamedTuple

from governor.policy.steps import ON_GOVERNOR_ERROR
from governor.store.base import UnknownReservation

log = logging.getLogger("governor.runtime")


class Unsettled(NamedTuple):
    """A settlement the store failed to take, kept in `LiveSession.unsettled` until settled."""

    reservation: str
    charges: tuple
    at: float  # when it was decided
    # settles it again: True when done (or nothing is left to settle), False when the store failed again
    again: Callable[[], Awaitable[bool]]


def deferred_settlement_note(reservation: str, failure: Exception, held: bool) -> dict[str, Any]:
    """The note's detail: the same in both session modes."""
    return {
        "step": "usage_report",
        "error": f"{type(failure).__name__}: {failure}"[:500],
        "fail_closed": False,  # a note: the call was answered, nothing refused (the reservation keeps counting)
        "deferred_settlement": True,
        "reservation": reservation,
        "reason": "the call's usage could not be written to the store once the call was answered: "
                  + ("its reservation keeps counting what it reserved, and the session's next step settles "
                     "it again" if held else "the store no longer holds its reservation"),
    }


class LateSettlements:
    """Settlements that failed after their response: recorded, kept, settled again.
    `chain_in_store`: the session's journal is a chain in the store (shared sessions)."""

    def __init__(self, *, chain_in_store: bool) -> None:
        self._chain_in_store = chain_in_store
        self._recording: set[asyncio.Task] = set()  # notes being journaled

    def failed(self, live: Any, late: Unsettled, failure: Exception) -> None:
        """The queued settlement failed (called on the event loop, from its reply): kept for the
        next step to settle (unless the store no longer holds its reservation), the failure
        logged and its note recorded."""
        held = not isinstance(failure, UnknownReservation)
        if held:
            live.unsettled.append(late)
        log.warning("session %s: the usage of a call already answered could not be settled (%s: %s); %s", live.id,
                    type(failure).__name__, failure, "its reservation keeps counting what it reserved until the "
                    "session's next step settles it" if held else "the store no longer holds its reservation")
        task = asyncio.get_running_loop().create_task(
            self._record(live, deferred_settlement_note(late.reservation, failure, held), late.at))
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _record(self, live: Any, detail: dict[str, Any], now: float) -> None:
        # a shared session's chain is in the store that just failed: kept to be chained first
        record = live.journal.defer if self._chain_in_store else live.journal.append
        async with live.lock:  # between rounds: their events stay in order
            try:
                await asyncio.to_thread(record, ON_GOVERNOR_ERROR, "continue", now, detail)
            except Exception:  # ended meanwhile, a full disk: the log line is what is left
                log.exception("session %s: could not record a failed settlement", live.id)

    async def settle_again(self, live: Any) -> None:
        """Settle the session's failed settlements again, in order; what still fails (the store
        down still) stays for the next step."""
        held, live.unsettled = live.unsettled, []
        for at, late in enumerate(held):
            try:
                taken = await late.again()
            except Exception:
                log.exception("session %s: settling reservation %s again failed", live.id, late.reservation)
                taken = False
            if not taken:
                live.unsettled[:0] = held[at:]
                return
            log.info("session %s: reservation %s settled after the store answered again", live.id, late.reservation)

    async def drain(self) -> None:
        """At a stop: every note being recorded, recorded."""
        while self._recording:
            await asyncio.gather(*self._recording, return_exceptions=True)


__all__ = ["LateSettlements", "Unsettled", "deferred_settlement_note"]
