"""The unknown-traffic addon: what becomes of a request no adapter governs (marked unclaimed
on its flow's state by the session binding or the admission addon).

In this order:
  * its session is halted (or ended): refused, whatever the allow-list says;
  * the operator's allow-list names it (governor.adapters.allow, or an `ignore` route):
    forwarded, unrecorded, counted per host (`allowed_seen`);
  * `unknown_traffic: deny` (the default): refused with a 403 naming the options that let it
    through;
  * `unknown_traffic: forward` (the explicit opt-out): forwarded ungoverned, logged once per
    host and counted (`unknown_seen`).
Every refusal is recorded in its session (`on_governor_request_refused`, governor.proxy.refusals).
Raw TCP that is not HTTP (a tunnel the proxy cannot read) is closed unless the opt-out is
set: it is traffic no adapter governs either.
"""

from __future__ import annotations

import logging
from typing import Any, Coroutine

from mitmproxy import http

from governor.proxy import refusals
from governor.proxy.egress import EgressHosts
from governor.proxy.flow_state import STATE_KEY, FlowState
from governor.proxy.policy import ProxyPolicy
from governor.proxy.refusing import Refuser
from governor.runtime.api import RuntimeAPI
from governor.sessions.entries import halted_reason

log = logging.getLogger("governor.proxy")

HOW_TO_ALLOW = ("no adapter governs it, and traffic no adapter governs is refused (default deny); an operator "
                "lets a destination that spends nothing through with an allow-list entry (`allow` in the config "
                "file, --allow HOST[/PATH], $GOVERNOR_ALLOW), or forwards all such traffic ungoverned with "
                "--unknown-traffic forward")


class UnknownTraffic:
    """The mitmproxy addon for traffic no adapter claims (the `request` and `tcp_start` hooks)."""

    def __init__(self, runtime: RuntimeAPI, policy: ProxyPolicy, refuser: Refuser,
                 egress: EgressHosts | None = None) -> None:
        self.runtime = runtime
        self.egress = egress  # the passport's allowed_hosts: a raw stream outside it is refused even forwarding
        self.policy = policy
        self.refuser = refuser
        self.unknown_seen: dict[str, int] = {}  # host -> requests forwarded ungoverned (unknown_traffic: forward)
        self.allowed_seen: dict[str, int] = {}  # host -> requests the allow-list let through

    def request(self, flow: http.HTTPFlow) -> Coroutine[Any, Any, None] | None:
        """Nothing (no coroutine) for a governed request; a coroutine for mitmproxy to await
        for one no adapter governs."""
        state: FlowState | None = flow.metadata.get(STATE_KEY)
        if state is None or not state.unclaimed or flow.response is not None:
            return None
        return self._guarded(flow, state)

    async def _guarded(self, flow: http.HTTPFlow, state: FlowState) -> None:
        try:
            await self._unknown(flow, state)
        except Exception:  # fail closed: never forward what could not be governed
            log.exception("governor: internal error on %s", flow.request.url)
            self.refuser.fail_closed(flow, state.session, "internal error while governing the request")

    async def _unknown(self, flow: http.HTTPFlow, state: FlowState) -> None:
        request = flow.request
        host, session = request.host, state.session
        halted = getattr(self.runtime, "halted", None)
        cause = halted(session) if halted is not None and session else None
        if cause is not None:  # after a halt the session refuses everything: allowed and ungoverned traffic too
            await self.refuser.refuse_traffic(
                flow, session, refusals.SESSION_HALTED, f"session halted ({cause}): {halted_reason(cause)}",
                {"cause": cause, "action": "halt", "reason": halted_reason(cause)})
            return
        if state.allowed:
            self._count(self.allowed_seen, host, "letting through traffic the allow-list names", request)
            return
        if self.policy.unknown_traffic != "forward":
            what = f"{request.method} {host}{request.path.split('?', 1)[0][:200]}"
            await self.refuser.refuse_traffic(flow, session, refusals.UNKNOWN_TRAFFIC,
                                              f"unknown traffic: {what} is refused: {HOW_TO_ALLOW}")
            return
        self._count(self.unknown_seen, host, "forwarding ungoverned traffic (--unknown-traffic forward)", request)

    @staticmethod
    def _count(seen: dict[str, int], host: str, what: str, request: Any) -> None:
        count = seen.get(host, 0)
        seen[host] = count + 1
        if count == 0:
            log.info("governor: %s to %s (no adapter governs %s %s)", what, host, request.method,
                     request.path.split("?", 1)[0][:200])

    def tcp_start(self, flow: Any) -> None:
        """A tunnel that is not HTTP (after CONNECT, or redirected): no adapter reads it."""
        server = flow.server_conn
        host = server.address[0] if server.address else ""
        if self.egress is not None and not self.egress.allows(host):
            message = self.egress.message(host)
        elif self.policy.unknown_traffic == "forward":
            return
        else:
            message = ("traffic no adapter governs (a TCP stream that is not HTTP) is refused by default; "
                       "--unknown-traffic forward lets it through")
        log.info("governor: refused a raw TCP stream to %s: %s", server.address, message)
        # the TCP layer opens the upstream after this hook: mitmproxy refuses to open a server
        # connection that has an error (its `server_connect` path), and closes the client's
        if server.timestamp_start is None:
            server.error = f"refused by the governor: {message}"
        flow.kill()

    @staticmethod
    def tcp_message(flow: Any) -> None:
        """A refused stream whose upstream was already open: nothing is relayed either way."""
        if flow.error is not None and not flow.live and flow.messages:
            flow.messages[-1].content = b""
