"""The in-flight addon: the exchanges a session has in flight, the wall-clock ticker of each
such session, the watchdog of upstream timeouts, and the end of an exchange (its tickets
released, no state of ours left on its flow).

It runs after the admission addon in the `request` hook (it tracks the `Flight` admission
put on the flow's state) and after the answers' addon in `response` and `error` (the answer
read, the exchange ends here). One ticker per session and one watchdog pass a second, not a
timer per request. Refusals of exchanges in flight go through the Enforcer
(governor.proxy.enforcing).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from mitmproxy import http

from governor.policy.reasons import governor_object
from governor.policy.steps import Action, Decision, Tick
from governor.proxy.enforcing import Enforcer
from governor.proxy.flow_state import STATE_KEY, Flight, FlowState, live_flight
from governor.proxy.policy import ProxyPolicy
from governor.proxy.refusing import as_raw, governor_error, governor_error_object
from governor.proxy.runtime_calls import RuntimeCalls

log = logging.getLogger("governor.proxy")


class InFlight:
    """The mitmproxy addon for exchanges in flight: ticks, timeouts and their end."""

    def __init__(self, policy: ProxyPolicy, calls: RuntimeCalls, enforcer: Enforcer, *, metrics: Any = None) -> None:
        self.policy = policy
        self.calls = calls
        self.enforcer = enforcer
        self.metrics = metrics  # governor.runtime.metrics.Metrics, optional
        self.in_flight: dict[str, dict[Flight, http.HTTPFlow]] = {}  # session -> exchanges in flight
        self.tickers: dict[str, asyncio.Task] = {}  # session -> its wall-clock ticker
        self.watchdog: asyncio.Task | None = None  # upstream timeouts, while anything is in flight

    # --- mitmproxy hooks ---------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> None:
        state: FlowState | None = flow.metadata.get(STATE_KEY)
        if state is not None and state.flight is not None:  # admitted and forwarded
            self._track(flow, state.flight)

    async def response(self, flow: http.HTTPFlow) -> None:
        flight = live_flight(flow)
        if flight is None:
            return
        await self._finish(flight, upstream_error(flow, flight))
        forget(flow, flight, stream_over=True)

    async def error(self, flow: http.HTTPFlow) -> None:
        flight = live_flight(flow)
        if flight is None:
            return
        message = flow.error.msg if flow.error else "exchange failed"
        if flow.response is None and self.metrics is not None:  # the upstream never answered
            self.metrics.upstream_error(flight.exchange.adapter.name)
        await self._finish(flight, message)
        forget(flow, flight, stream_over=False)

    async def done(self) -> None:
        await self.calls.tasks.stop()

    # --- in flight ---------------------------------------------------------------------

    async def _watch(self) -> None:
        """The upstream timeout of every exchange in flight (no response headers, or a stream
        gone silent), checked every min(1 s, timeout / 4): one periodic pass over what is in
        flight instead of a timer armed and cancelled per request."""
        timeout = self.policy.upstream_timeout
        period = min(1.0, timeout / 4)
        try:
            while self.in_flight:
                await asyncio.sleep(period)
                now = time.monotonic()
                for live in list(self.in_flight.values()):
                    for flight, flow in list(live.items()):
                        self._check_upstream(flow, flight, now, timeout)
        finally:
            self.watchdog = None

    def _check_upstream(self, flow: http.HTTPFlow, flight: Flight, now: float, timeout: float) -> None:
        if flight.finished or flight.refusal is not None:
            return
        relay = flight.relay
        if relay is not None and relay.holds:  # waiting for us (an admission), not for the upstream
            flight.last_activity = now
        elif relay is not None and relay.ended:
            return
        elif now - flight.last_activity >= timeout:
            self._upstream_timeout(flow, flight, timeout)

    def _track(self, flow: http.HTTPFlow, flight: Flight) -> None:
        """Count the exchange as in flight: for its session's wall-clock ticker and the
        upstream-timeout watchdog."""
        session = flight.exchange.session
        live = self.in_flight.setdefault(session, {})
        live[flight] = flow
        if self.policy.tick_interval > 0 and session not in self.tickers:
            self.tickers[session] = self.calls.tasks.spawn(self._tick(session))
        if self.watchdog is None or self.watchdog.done():
            self.watchdog = self.calls.tasks.spawn(self._watch())

    async def _tick(self, session: str) -> None:
        """While a session has exchanges in flight, admit a Tick every tick_interval: the
        runtime charges wall-clock and checks its limits, and a refusal cuts (or answers)
        every exchange of the session still in flight."""
        try:
            while self.in_flight.get(session):
                await asyncio.sleep(self.policy.tick_interval)
                if not self.in_flight.get(session):
                    return
                try:
                    with self.calls.tasks.recording:
                        admission = await self.calls.runtime.admit(session, Tick())
                    await self.calls.release(session, admission.ticket)
                    decision = admission.decision
                    gov = admission.governor_object or governor_object(decision, session)
                except Exception:
                    log.exception("governor: wall-clock check failed in session %s", session)
                    decision, gov = governor_error(), governor_error_object(session)
                if decision.blocks:
                    for flight, flow in list(self.in_flight.get(session, {}).items()):
                        self.enforcer.enforce(flow, flight, decision, gov)
        except asyncio.CancelledError:
            pass
        finally:
            self.tickers.pop(session, None)

    def _upstream_timeout(self, flow: http.HTTPFlow, flight: Flight, timeout: float) -> None:
        exchange = flight.exchange
        phase = "sent no response" if flow.response is None else "went silent"
        reason = f"upstream {phase} for {timeout:g}s; the request was aborted"
        gov = {"cause": None, "action": "deny", "reason": reason, "session": exchange.session}
        decision = Decision(action=Action.DENY)
        flight.refusal = (decision, gov)
        log.warning("governor: %s (%s)", reason, flow.request.pretty_url)
        if flight.relay is not None:
            self.enforcer.cut(flow, flight, decision, gov)
        elif flow.response is None:
            reply = exchange.adapter.error_response(504, f"governor: {reason}", gov, exchange)
            self.enforcer.answer(flow, as_raw(reply, "deny"))

    async def _finish(self, flight: Flight, error: str | None) -> None:
        if flight.finished:
            return
        flight.finished = True
        live = self.in_flight.get(flight.exchange.session)
        if live is not None:
            live.pop(flight, None)
            if not live:
                del self.in_flight[flight.exchange.session]
        for admission in flight.admissions:
            await self.calls.release(flight.exchange.session, admission.ticket, error)


def forget(flow: http.HTTPFlow, flight: Flight, *, stream_over: bool) -> None:
    """A finished exchange leaves no state of ours on its flow. mitmproxy's flows are
    reference cycles, freed only by the cyclic collector: what hangs off one waits for it
    too, and makes each young collection longer. Off the flow, the flight, watcher,
    tickets and decisions are freed as soon as the hook and any task still using them
    return. A stream's relay comes off its response once mitmproxy has called the response
    hook (the stream is over; it calls the relay no more), and off the flight, which
    `InFlight._finish` closed to every later use of it."""
    flow.metadata.pop(STATE_KEY, None)
    if stream_over and flight.relay is not None and flow.response is not None:
        flow.response.stream, flight.relay = True, None


def upstream_error(flow: http.HTTPFlow, flight: Flight) -> str | None:
    """What went wrong with the exchange, for its record (None: the upstream answered it)."""
    if flight.refusal is not None:
        gov = flight.refusal[1]
        return f"governor: {gov.get('cause') or gov.get('reason')}"
    if flow.response is None:
        return None
    replaced = flight.replaced
    if replaced is not None:  # the governor answered, not the upstream: say so
        upstream, cause = replaced
        before = f"upstream answered {upstream}, " if upstream is not None else ""
        return f"{before}governor refused it with {flow.response.status_code} ({cause})"
    if flow.response.status_code >= 400:
        return f"upstream answered {flow.response.status_code}"
    return None
