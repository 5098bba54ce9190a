"""The in-flight addon: the exchanges a session has in flight, the wall-clock ticker of each
such session, the watchdog of upstream timeouts, and the end of an exchange (through the
shared `Exchanges`, governor.proxy.exchanges: its tickets released, nothing of ours left on
its flow). As the chain's last request hook it also takes the FlowState off every flow it
does not track.

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
from typing import Any, Coroutine

from mitmproxy import http

from governor.policy.reasons import governor_object
from governor.policy.steps import Action, Decision, Tick
from governor.proxy.enforcing import Enforcer
from governor.proxy.exchanges import Exchanges, upstream_error
from governor.proxy.flow_state import STATE_KEY, Flight, FlowState, live_flight
from governor.proxy.policy import ProxyPolicy
from governor.proxy.refusing import as_raw, governor_error, governor_error_object
from governor.proxy.runtime_calls import RuntimeCalls

log = logging.getLogger("governor.proxy")


class InFlight:
    """The mitmproxy addon for exchanges in flight: ticks, timeouts and their end."""

    def __init__(self, policy: ProxyPolicy, calls: RuntimeCalls, enforcer: Enforcer, exchanges: Exchanges, *,
                 metrics: Any = None) -> None:
        self.policy = policy
        self.calls = calls
        self.enforcer = enforcer
        self.exchanges = exchanges
        self.metrics = metrics  # governor.runtime.metrics.Metrics, optional
        self.in_flight = exchanges.by_session  # session -> exchanges in flight (read by the ticker and watchdog)
        self.tickers: dict[str, asyncio.Task] = {}  # session -> its wall-clock ticker
        self.watchdog: asyncio.Task | None = None  # upstream timeouts, while anything is in flight

    # --- mitmproxy hooks ---------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> Coroutine[Any, Any, None] | None:
        """The last of the chain's request hooks: an admitted exchange is tracked; any other
        flow (refused, or not the governor's) keeps nothing of ours, not even the request as
        the agent sent it, which would wait for the cyclic collector with the flow."""
        state: FlowState | None = flow.metadata.get(STATE_KEY)
        if state is None:
            return None
        flight = state.flight
        if flight is None:
            del flow.metadata[STATE_KEY]
            return None
        try:
            self._track(flow, flight)
        except Exception:  # fail closed: an exchange we cannot watch does not go upstream
            return self._untracked(flow, flight)
        return None

    async def _untracked(self, flow: http.HTTPFlow, flight: Flight) -> None:
        log.exception("governor: internal error on %s", flow.request.url)
        await self.exchanges.end(flow, flight, "governor error", stream_over=False)
        self.enforcer.refuser.fail_closed(flow, flight.exchange.session, "internal error while governing the request")

    async def response(self, flow: http.HTTPFlow) -> None:
        flight = live_flight(flow)
        if flight is None:
            return
        await self.exchanges.end(flow, flight, upstream_error(flow, flight), stream_over=True)

    async def error(self, flow: http.HTTPFlow) -> None:
        flight = live_flight(flow)
        if flight is None:
            return
        message = flow.error.msg if flow.error else "exchange failed"
        if flow.response is None and self.metrics is not None:  # the upstream never answered
            self.metrics.upstream_error(flight.exchange.adapter.name)
        await self.exchanges.end(flow, flight, message, stream_over=False)

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
