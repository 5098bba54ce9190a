"""The runtime's side of the statistical envelope (policy/envelope.py, #32 item 7), at R3.

`EnvelopeWatch` counts what the agent's sessions do (model calls, tool calls, tokens, cost)
in a small pending tally, O(1) per step, and hands it to the envelope book of the store
(`governor.store.envelope_books`): a local book (the store's SQLite file) at most once every
FLUSH_SEC and at each window boundary, before the next step is decided, the tally fed at the
time it was counted; a Redis book (one hash for the fleet) right after the steps that were
counted, in one background flush for the steps of a loop turn (one EVALSHA, off the loop), so
each governor's counts reach the fleet's window they belong to before another governor
closes it.
A flush that closes a window judges it (pure) and marks the agent's sticky deviation in the
book; while a deviation stands, each of the agent's sessions records it once as on_anomaly,
resolved through §6 (`EnvelopeDeviation`, decided by the PDP) before its next step: a halt or
a refusal stops that step, a declared pause holds the session for a reviewer first.

The principal clears the deviation (`reset`: POST /v1/envelope/reset, `governor envelope
reset`); the reset is recorded in the audit journal (cause on_governor_envelope_reset).
On Redis every governor of the fleet learns a deviation, or its reset, at its next flush.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Awaitable, Callable

from governor.policy import envelope
from governor.policy.envelope import EnvelopeConfig
from governor.policy.steps import Action, Decision, EnvelopeDeviation, ModelCall, Step, ToolCall, UsageReport
from governor.runtime.session import LiveSession
from governor.policy.causes import ON_GOVERNOR_ENVELOPE_RESET

log = logging.getLogger("governor.runtime")

FLUSH_SEC = 1.0  # the pending tally reaches the store at most this often (and at each window boundary)


class EnvelopeWatch:
    def __init__(self, *, open_book: Callable[[], Any], agent_id: str, clock: Callable[[], float], remote: bool,
                 apply: Callable[..., Awaitable[tuple[Decision, Any]]], hold: Callable[..., None],
                 await_approval: Callable[[str, str], Awaitable[Any]],
                 record_audit: Callable[..., Awaitable[None]], config: EnvelopeConfig | None = None) -> None:
        self._open_book = open_book  # opened at the first flush: nothing below R3
        self._book: Any = None
        self.agent_id = agent_id
        self.clock = clock
        self.remote = remote  # the book crosses the network: its calls go off the loop
        self.apply = apply
        self.hold = hold
        self.await_approval = await_approval
        self.record_audit = record_audit
        self.config = config or EnvelopeConfig()
        self.deviation: dict[str, Any] | None = None  # the standing deviation, as of the last flush
        self._counts: dict[str, float] = {}
        self._tools: dict[str, int] = {}
        self._pending_at = 0.0  # when the tally was last added to
        self._flushed_at = -math.inf
        self._flushing = asyncio.Lock()
        self._soon: asyncio.Task[None] | None = None  # a scheduled flush (remote books)

    # --- per step ----------------------------------------------------------------------

    def observed(self, step: Step, decision: Decision, limits: Any) -> None:
        """Count a decided step in the pending tally (O(1), no I/O)."""
        kind = type(step)
        counts = self._counts
        if kind is ModelCall:
            if decision.blocks:
                return
            counts["requests"] = counts.get("requests", 0.0) + 1
        elif kind is ToolCall:
            if decision.blocks:
                return
            counts["tool_calls"] = counts.get("tool_calls", 0.0) + 1
            self._tools[step.tool] = self._tools.get(step.tool, 0) + 1  # type: ignore[union-attr]
        elif kind is UsageReport and step.final:  # type: ignore[union-attr]
            counts["tokens"] = counts.get("tokens", 0.0) + step.input_tokens + step.output_tokens  # type: ignore[union-attr]
            cost = limits.pricing.cost(step.model, step.input_tokens, step.output_tokens,  # type: ignore[union-attr]
                                       step.cached_input_tokens, step.units)  # type: ignore[union-attr]
            if cost:
                counts["cost_usd"] = counts.get("cost_usd", 0.0) + cost
        else:
            return
        self._pending_at = self.clock()
        if self.remote and self._soon is None:  # the fleet's window gets it now, not at our next step
            self._soon = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        self._soon = None  # a step counted from here on schedules the next flush
        await self.flush()

    async def before(self, live: LiveSession) -> Decision | None:
        """Before a step of `live` is decided: flush when due, then the standing deviation's
        §6 resolution when this session has not recorded it. The decision that stops the step,
        or None to go on."""
        now = self.clock()
        if now - self._flushed_at >= FLUSH_SEC or self.config.window_of(now) != self.config.window_of(self._flushed_at):
            await self.flush(now)
        deviation = self.deviation
        if deviation is None or live.state.halted or envelope.session_key(deviation) in live.state.deviations:
            return None  # (a halted session refuses the step on its own)
        async with live.lock:
            if envelope.session_key(deviation) in live.state.deviations or live.ended:
                return None
            step = EnvelopeDeviation(deviation)
            decision, _ = await self.apply(live, step, None)
        if decision.enforced and decision.action is Action.PAUSE and decision.approval is not None:
            self.hold(live, step, decision)  # a reviewer answers before the session goes on
            decision = (await self.await_approval(live.id, decision.approval.id)).decision
        return decision if decision.blocks else None

    # --- the book ----------------------------------------------------------------------

    async def flush(self, now: float | None = None) -> None:
        """Hand the pending tally to the book and judge a window it closes. A failing book
        is logged and the tally kept (the per-session checks go on; the next flush retries)."""
        async with self._flushing:
            now = self.clock() if now is None else now
            self._flushed_at = now
            counts, tools, at = self._counts, self._tools, self._pending_at
            self._counts, self._tools = {}, {}
            try:
                if (counts or tools) and self.config.window_of(at) < self.config.window_of(now):
                    await self._feed(at, counts, tools)  # the tally belongs to the window it was counted in
                    counts, tools = {}, {}
                await self._feed(now, counts, tools)
            except Exception:
                log.exception("the statistical envelope could not be updated; kept for the next flush")
                for metric, amount in counts.items():
                    self._counts[metric] = self._counts.get(metric, 0.0) + amount
                for tool, c in tools.items():
                    self._tools[tool] = self._tools.get(tool, 0) + c

    async def _feed(self, at: float, counts: dict[str, float], tools: dict[str, int]) -> None:
        state, closed = await self._call(self.book.feed, self.agent_id, self.config, at, counts, tools)
        deviation = state.deviation
        if closed is not None:
            found = envelope.judge(self.config, closed)
            if found:
                deviation = await self._call(self.book.mark, self.agent_id,
                                             envelope.deviation_of(self.agent_id, closed, found))
                log.warning("agent %s: statistical envelope deviation in window %s: %s", self.agent_id,
                            closed.index, ", ".join(d["kind"] for d in found))
        self.deviation = dict(deviation) if deviation is not None else None

    @property
    def opened(self) -> bool:
        """Whether the book was opened (never below R3)."""
        return self._book is not None

    @property
    def book(self) -> Any:
        if self._book is None:
            self._book = self._open_book()
        return self._book

    async def _call(self, call: Callable[..., Any], *args: Any) -> Any:
        if self.remote:
            return await asyncio.to_thread(call, *args)
        return call(*args)

    # --- the principal -----------------------------------------------------------------

    async def view(self) -> dict[str, Any]:
        await self.flush()
        state = await self._call(self.book.load, self.agent_id)
        return {"agent": self.agent_id, "deviation": state.deviation, "window": state.window,
                "closed_windows": state.closed_windows,
                "cold_start": state.closed_windows < self.config.min_windows,
                "current": dict(state.counts), "current_tools": dict(state.tools),
                "baseline": {m: {"mean": w.mean, "sd": w.sd} for m, w in state.stats.items()},
                "monitored": envelope.monitored(self.config)}

    async def reset(self, by: str) -> dict[str, Any]:
        """Clear the agent's deviation (the principal's act), recorded in the audit journal."""
        cleared = await self._call(self.book.reset, self.agent_id)
        self.deviation = None
        detail = {"agent": self.agent_id, "reset_by": by, "cleared": cleared}
        await self.record_audit(ON_GOVERNOR_ENVELOPE_RESET, "continue", detail)
        return {"agent": self.agent_id, "reset": cleared is not None, "cleared": cleared}

    async def close(self) -> None:
        if self._book is None:
            return
        if self._soon is not None:
            await self._soon
        await self.flush()
        try:
            await self._call(self._book.close)
        except Exception:
            log.exception("the envelope book could not be closed cleanly")


__all__ = ["ON_GOVERNOR_ENVELOPE_RESET", "FLUSH_SEC", "EnvelopeWatch"]
