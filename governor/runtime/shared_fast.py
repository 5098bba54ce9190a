"""The usual model call on a session shared by replicas (a Redis store), admitted and
settled with one round trip each, with no lock held across a network wait: optimistic
concurrency on the session's saved state (docs/reference/shared-sessions.md).

The replica keeps the state it last saw in the store with that state's version, the SHA-1
of its saved bytes (`LiveSession.shared_head`). It decides on that state (the engine's
quiet permit, as bounds on the counters: governor.policy.quiet_bounds), then one script
(governor.store.redis_shared_scripts) checks that the saved state is still that version and
that no replica's decision round holds the session, and, atomically, checks the bounds on
the counters as they stand, reserves (or settles), and saves the new state and the
session's activity. On a version conflict the script answers the state as it stands: the
replica adopts it and decides again (at most MAX_TRIES times; then the full round decides,
waiting for the session's round: bounded, then 503 as before). A replica that has not seen
the state gets it in the first reply.

A quiet permit records no event and a quiet settlement neither, so nothing here is chained;
whatever would record something (a cause, a warning, a cap's refusal), a round that holds
the session, a store that does not answer: None, and the caller's full round decides,
records and fails closed as before.

Steps of one replica on one session chain their scripts: a step decides on the version the
scripts this replica queued before it will leave (`shared_head` is set to each script's
state when it is queued: the replica's prediction) and its script is queued behind theirs on
the store's pipeline (governor.store.redis_pipeline: FIFO on one connection), so the steps of
a hot session share round trips instead of taking turns for them. A prediction proven wrong
(a cap refused the script before, another replica wrote, the store failed) is dropped, and
every script queued behind it finds a version that was never saved: a conflict, whose reply
brings the state as it stands, decided on again as above. (Without either, concurrent calls
on one hot session conflicted with each other, each conflict a trip, until most fell back to
full rounds: 32 concurrent calls on one session, 175 conflicts for 12 steps done.) A step
that finds a round of this replica on the session waits for it before sending its script.

The settlement is not awaited (`_settle_soon`): decided on the predicted state, its script
queued, the state moved on and the decision returned at once; the script's check still guards
the save. A conflict or a round in its reply takes it up after the response (`_settle_late`):
decided again on the state as it stands, else by the runtime's full round, which records what
it decides. A store that failed to take it (or an awaited one: `settle` when it could not be
queued) sends it the route local sessions take too (governor.runtime.late_settlement: a note
recorded, the reservation counting what it reserved, the session's next step settling it
again first, here on the shared state as it stands, and taking the full round)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any, Awaitable, Callable

import orjson

from governor.policy import Decision, ModelCall, SessionState, UsageReport, quiet_settlement
from governor.policy.expected import expected_charges
from governor.policy.quiet_bounds import quiet_model_call_bounds
from governor.runtime.late_settlement import LateSettlements, Unsettled
from governor.runtime.refusals import transient, unrecorded_failure
from governor.runtime.session import LiveSession, Ticket
from governor.store.base import encode_state

log = logging.getLogger("governor.runtime")

MAX_TRIES = 8  # version conflicts one step re-decides through before the full round takes over

DONE, CONFLICT, ROUND = 1, -1, -2
ROUND_PAUSE_SEC = 0.002  # another replica's round on the session: how long before trying again


def version(saved: bytes) -> str:
    """A saved state's version, as the store's script computes it (redis.sha1hex)."""
    return hashlib.sha1(saved).hexdigest()


class SharedFastSteps:
    """The model call's one-round-trip path on shared sessions; `counters()` gives the store's
    asyncio client for the running loop (None: there is none, the full round is used);
    `adopt(live, saved, head_only)` takes a state another replica saved (SharedSteps.adopt_saved);
    `settle_round(live, ticket, report)` is the runtime's full round for a usage report;
    `retried(reason)` counts a script answered other than done (Metrics.shared_retry)."""

    def __init__(self, *, counters: Callable[[], Any], agent_id: str, clock: Callable[[], float],
                 advanced: Callable[[LiveSession, SessionState, float], None],
                 adopt: Callable[[LiveSession, bytes, bool], None],
                 settle_round: Callable[[LiveSession, Ticket, UsageReport], Awaitable[Any]],
                 retried: Callable[[str], None]) -> None:
        self._retried = retried
        self._counters = counters
        self._settle_round = settle_round  # the runtime's full round for a usage report
        self._late: set[asyncio.Task] = set()  # settlements being settled again after their response
        self._unsettled = LateSettlements(chain_in_store=True)  # settlements the store failed after their response
        self._agent_id = agent_id
        self._clock = clock
        self._advanced = advanced
        self._adopt = adopt

    async def admit(self, live: LiveSession, step: ModelCall) -> tuple[Decision, Ticket | None] | None:
        if live.ended:
            return None
        if live.unsettled:  # a settlement the store failed to take: settled again first, then the full round
            await self._unsettled.settle_again(live)
            return None
        limits = live.limits
        charges = expected_charges(limits, step)
        counters = self._counters() if charges is not None else None
        if counters is None:
            return None
        keys = list(limits.counter_keys(step))
        for _ in range(MAX_TRIES):
            await _after_own_round(live)  # its script would find the round's hold, then its new state
            head = live.shared_head
            now = self._clock()
            if head is None:  # not seen yet: the first reply brings it
                expected, saved, bounded = "", b"", None
            else:
                expected, state = head
                if state.ended or state.halted:
                    return None
                bounded = quiet_model_call_bounds(limits, state, step, now)
                if bounded is None or bounded[1].charges != charges:
                    return None
                saved = encode_state(live.saved_state_of(bounded[2]))
            bounds = []
            for key, addend, limit, strict in bounded[0] if bounded is not None else ():
                if key not in keys:
                    keys.append(key)
                bounds.append((keys.index(key) + 1, addend, limit, strict))  # Lua counts from 1
            predicted = _predict(live, saved, bounded[2]) if bounded is not None else None
            try:  # queued now, behind this replica's earlier scripts (module docstring)
                code, current, snapshot, held = await counters.shared_admit(
                    self._agent_id, live.id, keys, charges, now, expected, saved, bounds)
            except Exception:
                _unpredict(live, predicted)
                log.debug("session %s: admitting a model call in one round trip failed", live.id, exc_info=True)
                return None
            if code != DONE:
                _unpredict(live, predicted)
            if code == CONFLICT:
                self._retried("conflict")
                if (failed := self._take_current(live, current, step)) is not None:
                    return failed, None
                continue
            if code == ROUND:
                self._retried("round")
                await self._round_over(live)
                continue
            if code != DONE or bounded is None or held is None or held.id is None:
                self._retried("fallback")
                return None  # refused by a cap, not quiet on these counters, a round holds it: the full round
            _, decision, next_state = bounded
            self._saved(live, predicted[0], next_state, next_state.evolve(counters=snapshot), now)  # type: ignore[index]
            return decision, Ticket("model", None, decision.charges, held.id, in_flight=True)
        self._retried("fallback")  # out of tries
        return None

    async def settle(self, live: LiveSession, ticket: Ticket, report: UsageReport) -> Decision | None:
        if not report.final or not ticket.in_flight or ticket.reservation is None or live.ended:
            return None
        counters = self._counters()
        if counters is None:
            return None
        step = report.with_reserved(ticket.charges, True)
        if (decision := self._settle_soon(live, counters, ticket, report, step)) is not None:
            return decision
        reservation = ticket.reservation
        ticket.reservation, ticket.in_flight = None, False  # claimed: finish() holds nothing now
        answers: list = []
        decision = await self._settle_rounds(live, counters, reservation, step, answers)
        if decision is None and answers and isinstance(answers[-1], Exception) and transient(answers[-1]):
            decision = await self._store_failed(live, ticket, report, step, reservation, answers[-1])
        if decision is None:
            ticket.reservation, ticket.in_flight = reservation, True  # the full round settles it
        return decision

    async def _store_failed(self, live: LiveSession, ticket: Ticket, report: UsageReport, step: UsageReport,
                            reservation: str, failure: Exception) -> Decision | None:
        """An awaited settlement the store failed to take: the route of one that failed after
        its response (runtime/late_settlement.py), decided on this replica's state, rather than
        the full round refusing the usage of a call already answered (and leaving its slot taken
        in the saved state). None: no quiet settlement on that state (the full round decides).
        Only for a store that is unreachable: one that lost data fails closed in the full round,
        as a local session's settlement does when the loss is known before it is queued."""
        await _after_own_round(live)  # a round may be between deciding and advancing: after it
        settled = quiet_settlement(live.limits, live.state, step) if not (live.ended or live.state.ended) else None
        if settled is None:
            return None
        decision, state = settled
        now = self._clock()
        self._advanced(live, state, now)
        self._keep_unsettled(live, ticket, report, step, reservation, decision, now, failure)
        return decision

    def _keep_unsettled(self, live: LiveSession, ticket: Ticket, report: UsageReport, step: UsageReport,
                        reservation: str, decision: Decision, now: float, failure: Exception) -> None:
        """A settlement the store failed to take: runtime/late_settlement.py's route, settled
        again by `_settle_unsettled`."""
        self._unsettled.failed(live, Unsettled(reservation, decision.charges, now, lambda: self._settle_unsettled(
            live, ticket, report, step, reservation)), failure)

    def _settle_soon(self, live: LiveSession, counters: Any, ticket: Ticket, report: UsageReport,
                     step: UsageReport) -> Decision | None:
        """Settle on the predicted state without awaiting the store (module docstring): the
        script queued now, the state moved on at once, the decision returned; a reply other
        than done hands the settlement to `_settle_late`. None: not here (no state known, not
        a quiet settlement on it, a round on the session, a late settlement of it under way)."""
        head = live.shared_head
        if head is None or live.unsettled or live.lock.locked():
            return None
        expected, state = head
        settled = quiet_settlement(live.limits, state, step) if not state.ended else None
        if settled is None:
            return None
        decision, next_state = settled
        saved = encode_state(live.saved_state_of(next_state))
        reservation, now = ticket.reservation, self._clock()
        predicted = _predict(live, saved, next_state)

        def replied(code: int | None, current: bytes | None, failure: Exception | None) -> None:
            if code == DONE:
                return
            _unpredict(live, predicted)
            self._retried("late")
            if failure is not None:  # the store failed: the session's next steps take the full round until it is taken
                self._keep_unsettled(live, ticket, report, step, reservation, decision, now, failure)
                return
            task = asyncio.get_running_loop().create_task(
                self._settle_late(live, ticket, report, step, reservation, code, current))
            self._late.add(task)
            task.add_done_callback(self._late.discard)

        try:  # queued before anything this session does next; not awaited
            counters.shared_settle_soon(reservation, decision.charges, now, live.id, expected, saved, replied)
        except Exception:  # not usable: settled the awaited way (which fails to the full round)
            _unpredict(live, predicted)
            log.debug("session %s: settling a model call at once failed", live.id, exc_info=True)
            return None
        ticket.reservation, ticket.in_flight = None, False  # claimed: finish() holds nothing now
        self._saved(live, predicted[0], next_state, next_state, now)
        return decision

    async def _settle_late(self, live: LiveSession, ticket: Ticket, report: UsageReport, step: UsageReport,
                           reservation: str, code: int | None, current: bytes | None) -> None:
        """A settlement queued by `_settle_soon` that the store answered but did not apply (a
        conflict, a round, after its response): decided again on the state as it stands (one
        trip a try, as `settle`), else by the full round, which records what it decides. (One
        the store failed to take takes runtime/late_settlement.py's route.)"""
        try:
            decision = None
            if code in (CONFLICT, ROUND) and not live.ended:
                if code == ROUND:
                    await self._round_over(live)
                if code != CONFLICT or self._take_current(live, current, step) is None:
                    counters = self._counters()
                    if counters is not None:
                        decision = await self._settle_rounds(live, counters, reservation, step)
            if decision is None:
                log.debug("session %s: a call's settlement did not apply after its response (answer %s); the full "
                          "round settles it", live.id, code)
                ticket.reservation, ticket.in_flight = reservation, True
                await self._settle_round(live, ticket, report)
        except Exception:  # the full round records what it can; what is left is in the log
            log.exception("session %s: settling reservation %s after its response failed", live.id, reservation)

    async def _settle_unsettled(self, live: LiveSession, ticket: Ticket, report: UsageReport, step: UsageReport,
                                reservation: str) -> bool:
        """Settle again a settlement the store failed to take (runtime/late_settlement.py): on
        the shared state as it stands, which never got it, as `settle` does; else by the full
        round. True when taken (or its reservation is no longer outstanding: its script ran
        after all, its reply lost); False when the store failed again (kept for the next step)."""
        counters = self._counters()
        if counters is None or live.ended:
            return live.ended  # an ended session's reservation counts what it reserved until forgotten
        answers: list = []
        if await self._settle_rounds(live, counters, reservation, step, answers) is not None or answers[-1:] == [0]:
            return True
        if answers and isinstance(answers[-1], Exception):
            return False
        ticket.reservation, ticket.in_flight = reservation, True  # not quiet on the state as it stands
        await self._settle_round(live, ticket, report)
        return True

    async def _settle_rounds(self, live: LiveSession, counters: Any, reservation: str,
                             step: UsageReport, answers: list | None = None) -> Decision | None:
        """Settle in one awaited trip a try, re-deciding on conflicts; None: the full round's
        (`answers` gets each trip's code, or what failed)."""
        for _ in range(MAX_TRIES):
            await _after_own_round(live)  # its script would find the round's hold, then its new state
            head = live.shared_head
            now = self._clock()
            settled = None
            if head is None:
                expected, saved = "", b""
            else:
                expected, state = head
                settled = quiet_settlement(live.limits, state, step)
                if settled is None or state.ended:
                    break
                saved = encode_state(live.saved_state_of(settled[1]))
            predicted = _predict(live, saved, settled[1]) if settled is not None else None
            try:
                code, current = await counters.shared_settle(reservation, settled[0].charges if settled else (),
                                                             now, live.id, expected, saved)
            except Exception as exc:
                _unpredict(live, predicted)
                log.debug("session %s: settling a model call in one round trip failed", live.id, exc_info=True)
                if answers is not None:
                    answers.append(exc)
                break
            if answers is not None:
                answers.append(code)
            if code != DONE:
                _unpredict(live, predicted)
            if code == CONFLICT:
                self._retried("conflict")
                if self._take_current(live, current, step) is not None:
                    break  # damaged: the full round fails it closed
                continue
            if code == ROUND:
                self._retried("round")
                await self._round_over(live)
                continue
            if code != DONE or settled is None:
                break
            decision, next_state = settled
            self._saved(live, predicted[0], next_state, next_state, now)  # type: ignore[index]
            return decision
        self._retried("fallback")
        return None

    async def drain(self) -> None:
        """At a stop: every call queued on the store's pipeline answered, and every settlement
        that then did not apply settled by `_settle_late` (or, failed, recorded)."""
        while True:
            counters = self._counters()
            if counters is not None:
                await counters.drain()
            await self._unsettled.drain()
            if not self._late:
                return
            await asyncio.gather(*self._late, return_exceptions=True)

    def _take_current(self, live: LiveSession, current: bytes | None, step: Any) -> Decision | None:
        """Adopt the state another writer saved (the conflict's reply); a refusal when it cannot
        be read (recorded as a damaged session by `adopt`).

        The scripts queued behind one that conflicts conflict too, and their replies bring the
        same bytes: the first reply's step adopted them and queued its script again on them,
        predicting its new state; the next ones keep that prediction and queue behind it. (Each
        adopting the same bytes again undid the one before's prediction: of N such steps one
        got through per wave and the rest conflicted again, about N*N/2 conflicts, many then out
        of tries and on the full round, whose end began the next storm.) A prediction that does
        not hold is dropped when its script's reply comes, as any other."""
        if current is None:
            live.shared_head = None
            return None
        if live.shared_head is not None and current == live.shared_seen:
            return None  # adopted already: the head is that state, or a prediction queued on it
        try:  # a round of this replica on it keeps its live state: one adopted mid-round would undo its advance
            self._adopt(live, current, live.lock.locked())
        except Exception as exc:
            live.shared_head = None
            live.shared_seen = None
            return unrecorded_failure(step, exc)
        live.shared_seen = current
        return None

    @staticmethod
    async def _round_over(live: LiveSession) -> None:
        """A decision round holds the session: after it (this replica's: when its lock is free;
        another's: a moment later), the step tries again rather than queueing a round of its
        own behind it (rounds queued behind rounds kept a hot session off this path)."""
        if live.lock.locked():
            await _after_own_round(live)
        else:
            await asyncio.sleep(ROUND_PAUSE_SEC)

    def _saved(self, live: LiveSession, saved: str, head: SessionState, state: SessionState, now: float) -> None:
        """The script saved `head` (version `saved`: hashed once, when predicted): the newest
        this replica knows, unless a later version reached it first (replies of concurrent
        steps can come in any order)."""
        if live.lock.locked():  # a round began after the script: it adopts what the store holds
            return
        known = live.shared_head
        if known is None or head.seq >= known[1].seq:
            live.shared_head = (saved, head)
        if state.seq >= live.state.seq:
            self._advanced(live, state, now)
            live.unsaved = False  # saved by the script


async def _after_own_round(live: LiveSession) -> None:
    """After the decision round this replica holds on the session, if any (a tick, a step's
    full round): a step then decides on the state that round left."""
    if live.lock.locked():
        async with live.lock:
            pass


def _predict(live: LiveSession, saved: bytes, state: SessionState) -> tuple[str, SessionState]:
    """The version a script being queued will leave: what the next step decides on."""
    predicted = (version(saved), state)
    live.shared_head = predicted
    return predicted


def _unpredict(live: LiveSession, predicted: tuple[str, SessionState] | None) -> None:
    """A script that did not save its state (or may not have): its prediction dropped, unless
    a later one replaced it (that one's script then conflicts, and drops its own)."""
    if predicted is not None and live.shared_head is predicted:
        live.shared_head = None


__all__ = ["MAX_TRIES", "SharedFastSteps", "version"]
