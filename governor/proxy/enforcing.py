"""Refusals applied to an exchange already forwarded upstream: a governed stream cut (its
adapter's terminal event, then the end), or an answer injected in place of the upstream's
(governor.proxy.transit does both on mitmproxy's connection).

`Enforcer` is the collaborator the answers' addon, the in-flight addon and the stream relay
share; it holds this master's Proxyserver addon, whose connections transit works on.
"""

from __future__ import annotations

import logging
from typing import Any

from mitmproxy import http

from governor.adapters.refusals import describe
from governor.policy.steps import Decision
from governor.proxy import recording, refusals, transit
from governor.proxy.flow_state import Flight
from governor.proxy.refusing import Refuser, as_raw
from governor.runtime.api import RuntimeAPI

log = logging.getLogger("governor.proxy")


class Enforcer:
    """Cuts and injected answers on exchanges in flight."""

    def __init__(self, refuser: Refuser, runtime: RuntimeAPI, recording_: recording.Recording, *,
                 metrics: Any = None, proxyserver: Any = None) -> None:
        self.refuser = refuser
        self.runtime = runtime
        self.recording = recording_
        self.metrics = metrics  # governor.runtime.metrics.Metrics, optional
        self.proxyserver = proxyserver  # mitmproxy's Proxyserver addon (None: no master, as in tests)

    def enforce(self, flow: http.HTTPFlow, flight: Flight, decision: Decision, gov: dict[str, Any]) -> None:
        """Apply a refusal to an exchange already forwarded upstream."""
        if flight.finished or flight.refusal is not None:
            return
        flight.refusal = (decision, gov)
        if flight.relay is not None:
            self.cut(flow, flight, decision, gov)
        elif flow.response is None:
            reply = self.refuser.refusal_reply(flight.exchange.adapter, decision, gov, flight.exchange)
            self.answer(flow, as_raw(reply, decision.action.value))
        # else: a plain response is being read; the response hook replaces it.

    def cut(self, flow: http.HTTPFlow, flight: Flight, decision: Decision, gov: dict[str, Any]) -> None:
        relay = flight.relay
        assert relay is not None
        if relay.cut(describe(gov), gov):
            log.info("governor: cutting the stream of %s in session %s (%s)", flow.request.pretty_url,
                     flight.exchange.session, gov.get("cause") or gov.get("reason"))
            if self.metrics is not None:
                self.metrics.stream_cut(gov.get("cause"), flight.exchange.adapter.name)
            transit.end_stream(self.proxyserver, flow)

    def answer(self, flow: http.HTTPFlow, raw: bytes) -> None:
        """`raw` (a whole HTTP/1.1 response) answers the client in place of the upstream."""
        transit.answer(self.proxyserver, flow, raw)

    def gate(self, flow: http.HTTPFlow) -> transit.Gate | None:
        return transit.gate(self.proxyserver, flow)

    async def ping(self, flow: http.HTTPFlow, data: bytes) -> bool:
        return await transit.ping(self.proxyserver, flow, data)

    def record_refusal(self, session: str, code: str, detail: dict[str, Any]) -> None:
        """Record a cut in its session from a task of its own (for the synchronous relay):
        a stop awaits it."""
        self.recording.spawn(refusals.record(self.runtime, self.metrics, session, code, detail))
