"""The exchanges in flight, by session, and how one ends: its tickets released, no state of
ours left on its flow.

Shared by the in-flight addon (governor.proxy.in_flight: it tracks each exchange, ticks and
watches it, and ends it in the `response` and `error` hooks) and the answers' addon
(governor.proxy.answers), which ends an exchange itself when its own hook is cancelled, since
mitmproxy then calls no addon after it.
"""

from __future__ import annotations

from mitmproxy import http

from governor.proxy.flow_state import STATE_KEY, Flight
from governor.proxy.runtime_calls import RuntimeCalls


class Exchanges:
    """The governed exchanges in flight (`by_session`: session -> flight -> flow)."""

    def __init__(self, calls: RuntimeCalls) -> None:
        self.calls = calls
        self.by_session: dict[str, dict[Flight, http.HTTPFlow]] = {}

    async def end(self, flow: http.HTTPFlow, flight: Flight, error: str | None, *, stream_over: bool) -> None:
        """The exchange is over (once: a later call does nothing): off the table, its tickets
        released, nothing of ours left on the flow."""
        try:
            await self._finish(flight, error)
        finally:
            forget(flow, flight, stream_over=stream_over)

    async def _finish(self, flight: Flight, error: str | None) -> None:
        if flight.finished:
            return
        flight.finished = True
        live = self.by_session.get(flight.exchange.session)
        if live is not None:
            live.pop(flight, None)
            if not live:
                del self.by_session[flight.exchange.session]
        for admission in flight.admissions:
            await self.calls.release(flight.exchange.session, admission.ticket, error)


def forget(flow: http.HTTPFlow, flight: Flight, *, stream_over: bool) -> None:
    """A finished exchange leaves no state of ours on its flow. mitmproxy's flows are
    reference cycles, freed only by the cyclic collector: what hangs off one waits for it
    too, and makes each young collection longer. Off the flow, the flight, watcher,
    tickets and decisions are freed as soon as the hook and any task still using them
    return. A stream's relay comes off its response once mitmproxy has called the response
    hook (the stream is over; it calls the relay no more), and off the flight, which
    `Exchanges.end` closed to every later use of it."""
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
