"""The addon's exchanges in flight: the wall-clock ticker of each session with exchanges in
flight, the watchdog of upstream timeouts, refusals applied to an exchange already
forwarded (a stream cut, or an answer injected in place of the upstream's), and the end of
an exchange (its tickets released, no state of ours left on its flow).

`InFlight` is mixed into `governor.proxy.addon.Governor` (kept apart: addon.py was long
enough). One ticker per session and one watchdog pass a second, not a timer per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from mitmproxy import http

from governor.adapters.base import describe, governor_object
from governor.policy.steps import Action, Decision, Tick
from governor.proxy import transit
from governor.proxy.refusing import REPLACED_KEY, as_raw, governor_error, governor_error_object
from governor.proxy.relay import METADATA_KEY, Flight

log = logging.getLogger("governor.proxy")


class InFlight:
    """Ticks, timeouts, cuts and the end of an exchange, for `governor.proxy.addon.Governor`."""

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
            self.tickers[session] = self._spawn(self._tick(session))
        if self.watchdog is None or self.watchdog.done():
            self.watchdog = self._spawn(self._watch())

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
                    with self.recording:
                        admission = await self.runtime.admit(session, Tick())
                    await self._release(session, admission.ticket)
                    decision = admission.decision
                    gov = admission.governor_object or governor_object(decision, session)
                except Exception:
                    log.exception("governor: wall-clock check failed in session %s", session)
                    decision, gov = governor_error(), governor_error_object(session)
                if decision.blocks:
                    for flight, flow in list(self.in_flight.get(session, {}).items()):
                        self._enforce_in_flight(flow, flight, decision, gov)
        except asyncio.CancelledError:
            pass
        finally:
            self.tickers.pop(session, None)

    def gate(self, flow: http.HTTPFlow) -> transit.Gate | None:
        return transit.gate(self.proxyserver, flow)

    def _enforce_in_flight(self, flow: http.HTTPFlow, flight: Flight, decision: Decision,
                           gov: dict[str, Any]) -> None:
        """Apply a refusal to an exchange already forwarded upstream."""
        if flight.finished or flight.refusal is not None:
            return
        flight.refusal = (decision, gov)
        if flight.relay is not None:
            self._cut(flow, flight, decision, gov)
        elif flow.response is None:
            reply = self._refusal_reply(flight.exchange.adapter, decision, gov, flight.exchange)
            transit.answer(self.proxyserver, flow, as_raw(reply, decision.action.value))
        # else: a plain response is being read; the response hook replaces it.

    def _cut(self, flow: http.HTTPFlow, flight: Flight, decision: Decision, gov: dict[str, Any]) -> None:
        relay = flight.relay
        assert relay is not None
        if relay.cut(describe(gov), gov):
            log.info("governor: cutting the stream of %s in session %s (%s)", flow.request.pretty_url,
                     flight.exchange.session, gov.get("cause") or gov.get("reason"))
            if self.metrics is not None:
                self.metrics.stream_cut(gov.get("cause"), flight.exchange.adapter.name)
            transit.end_stream(self.proxyserver, flow)

    def _upstream_timeout(self, flow: http.HTTPFlow, flight: Flight, timeout: float) -> None:
        exchange = flight.exchange
        phase = "sent no response" if flow.response is None else "went silent"
        reason = f"upstream {phase} for {timeout:g}s; the request was aborted"
        gov = {"cause": None, "action": "deny", "reason": reason, "session": exchange.session}
        decision = Decision(action=Action.DENY)
        flight.refusal = (decision, gov)
        log.warning("governor: %s (%s)", reason, flow.request.pretty_url)
        if flight.relay is not None:
            self._cut(flow, flight, decision, gov)
        elif flow.response is None:
            reply = exchange.adapter.error_response(504, f"governor: {reason}", gov, exchange)
            transit.answer(self.proxyserver, flow, as_raw(reply, "deny"))

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
            await self._release(flight.exchange.session, admission.ticket, error)

    @staticmethod
    def _forget(flow: http.HTTPFlow, flight: Flight, *, stream_over: bool) -> None:
        """A finished exchange leaves no state of ours on its flow. mitmproxy's flows are
        reference cycles, freed only by the cyclic collector: what hangs off one waits for it
        too, and makes each young collection longer. Off the flow, the flight, watcher,
        tickets and decisions are freed as soon as the hook and any task still using them
        return. A stream's relay comes off its response once mitmproxy has called the response
        hook (the stream is over; it calls the relay no more), and off the flight, which
        `_finish` closed to every later use of it."""
        flow.metadata.pop(METADATA_KEY, None)
        if stream_over and flight.relay is not None and flow.response is not None:
            flow.response.stream, flight.relay = True, None

    def _upstream_error(self, flow: http.HTTPFlow) -> str | None:
        flight: Flight | None = flow.metadata.get(METADATA_KEY)
        if flight is not None and flight.refusal is not None:
            gov = flight.refusal[1]
            return f"governor: {gov.get('cause') or gov.get('reason')}"
        if flow.response is None:
            return None
        replaced = flow.metadata.get(REPLACED_KEY)
        if replaced is not None:  # the governor answered, not the upstream: say so
            upstream, cause = replaced
            before = f"upstream answered {upstream}, " if upstream is not None else ""
            return f"{before}governor refused it with {flow.response.status_code} ({cause})"
        if flow.response.status_code >= 400:
            return f"upstream answered {flow.response.status_code}"
        return None
