"""Rate limits per window, applied: a step's draws taken from the window counters before it
is decided, given back when the decision refuses it, corrected to a model call's usage at
its end (governor.policy.rates says what a limit is; governor.store.windows keeps the counts).

A full window refuses the step, retryable (Retry-After: when the window rolls), and the
refusal is recorded in the session's journal before it is answered; a refusal that cannot
be recorded is still a refusal (failing closed). A store that cannot count the step refuses
it through the same route as a budget reservation (governor.runtime.refusals.store_refusal):
unreachable, as retryable; a window counter edited in the store (not a count), not retryable,
until an operator deletes the counter (the session goes on); a store that lost its data, as a
governor error. None of this runs when no limit is set.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable

from governor.policy import governor_error
from governor.policy.rates import RateDraw, RateLimit, rate_draws, rate_refusal, usage_corrections
from governor.policy.steps import Decision, Step, UsageReport
from governor.runtime.refusals import store_refusal, transient, unrecorded_failure
from governor.store import StoreError
from governor.store.windows import WindowCharge, WindowCounters, windows_for

log = logging.getLogger("governor.runtime")


@dataclass(slots=True)
class RateHold:
    """What an admitted step drew on the windows: corrected at its end, given back if refused."""

    draws: tuple[RateDraw, ...]
    charges: tuple[WindowCharge, ...]
    indexes: tuple[int, ...]
    pricing: Any  # the prices the draws were made with


class RateLimiter:
    """The governor's rate limits over one store's window counters (`call` runs a store call:
    inline for a local store, in a worker thread for Redis)."""

    def __init__(self, limits: tuple[RateLimit, ...], windows: WindowCounters, *, agent_id: str,
                 clock: Callable[[], float], call: Callable[..., Any], metrics: Any = None) -> None:
        self.limits = limits
        self.windows = windows
        self.agent_id = agent_id
        self.clock = clock
        self.call = call
        self.metrics = metrics

    async def take(self, live: Any, step: Step) -> tuple[RateHold | None, Decision | None]:
        """Draw `step` on every window it counts against: (the hold, None), or (None, the recorded
        refusal). (None, None): the step counts against no limit."""
        pricing = live.limits.pricing
        draws = rate_draws(self.limits, self.agent_id, step, pricing)
        if isinstance(draws, str):  # a cost limit and an unpriced model: refused, fail closed
            return None, await self._recorded(live, step, rate_refusal(step, None, 0.0, 0.0, draws))
        if not draws:
            return None, None
        charges = tuple(WindowCharge(d.counter, d.limit.window_sec, d.amount, d.limit.limit) for d in draws)
        now = self.clock()
        try:
            taken = await self.call(self.windows.take_window, charges, now)
        except StoreError as exc:  # refused and recorded as a budget reservation's store error is
            if self.metrics is not None:
                self.metrics.store_error()
            log.log(logging.WARNING if transient(exc) else logging.ERROR,
                    "session %s: the rate limits could not count a step: %s", live.id, exc)
            decision = store_refusal(live.limits, live.state, step, exc) or \
                governor_error(live.limits, live.state, step, exc)
            return None, await self._recorded(live, step, decision)
        if not taken.ok:
            failed = taken.failed or 0
            decision = rate_refusal(step, draws[failed], taken.observed, taken.rolls_at - now)
            return None, await self._recorded(live, step, decision)
        return RateHold(draws, charges, taken.indexes, pricing), None

    async def keep(self, hold: RateHold, ticket: Any, decision: Decision) -> None:
        """The step's decision: an admitted step's ticket keeps what it drew; one that does not
        go ahead (refused, held for a review, which admits it again) gives it back."""
        if ticket is None or decision.blocks:
            await self.give_back(hold)
        else:
            ticket.rates = hold

    async def give_back(self, hold: RateHold) -> None:
        """The step did not go ahead (the decision refused it): what it drew leaves the windows."""
        await self._adjust(hold, [(c, i, -c.amount) for c, i in zip(hold.charges, hold.indexes)])

    async def settle(self, hold: RateHold, report: UsageReport) -> None:
        """A model call's final usage: its token and cost draws corrected to what it used."""
        corrections = usage_corrections(hold.draws, report, hold.pricing)
        if corrections:
            where = {id(d): k for k, d in enumerate(hold.draws)}
            await self._adjust(hold, [(hold.charges[where[id(d)]], hold.indexes[where[id(d)]], delta)
                                      for d, delta in corrections])

    async def _adjust(self, hold: RateHold, adjustments: list[tuple[WindowCharge, int, float]]) -> None:
        try:
            await self.call(self.windows.adjust_window, adjustments)
        except StoreError:  # the window keeps what was drawn: it errs on counting
            if self.metrics is not None:
                self.metrics.store_error()
            log.warning("could not correct the rate limits' window counters", exc_info=True)

    async def _recorded(self, live: Any, step: Step, decision: Decision) -> Decision:
        """The refusal's event in the session's journal before it is answered; a journal that
        cannot take it leaves the step refused (failing closed), as a refusal it could not record."""
        now = self.clock()
        try:
            async with live.lock:
                live.last_activity = now
                for event in decision.events:
                    await asyncio.to_thread(live.journal.append, event["cause"], event["action"], now,
                                            event.get("detail"))
        except Exception as exc:
            log.exception("session %s: could not record a rate limit's refusal", live.id)
            decision = unrecorded_failure(step, exc)
        if self.metrics is not None:
            self.metrics.decided(decision, 0.0)  # counted by cause with every other decision
        return decision


def rate_limiter(limits: tuple[RateLimit, ...], *, store: Any, agent_id: str, clock: Callable[[], float],
                 call: Callable[..., Any], metrics: Any = None) -> RateLimiter | None:
    """The limiter of a runtime over `store`'s window counters; None when no limit is set."""
    if not limits:
        return None
    return RateLimiter(tuple(limits), windows_for(store), agent_id=agent_id, clock=clock, call=call, metrics=metrics)
