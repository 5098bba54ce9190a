"""The unknown-traffic addon: what becomes of a request no adapter governs (marked unclaimed
on its flow's state by the session binding or the admission addon): forwarded, logged once
per host and counted (`unknown_seen`), or refused when the policy says "deny"; after a halt
its session refuses it too.
"""

from __future__ import annotations

import logging

from mitmproxy import http

from governor.proxy.flow_state import STATE_KEY, FlowState
from governor.proxy.policy import ProxyPolicy
from governor.proxy.refusing import Refuser, as_response, generic_error
from governor.runtime.api import RuntimeAPI
from governor.sessions.book import halted_reason

log = logging.getLogger("governor.proxy")


class UnknownTraffic:
    """The mitmproxy addon for traffic no adapter claims (the `request` hook)."""

    def __init__(self, runtime: RuntimeAPI, policy: ProxyPolicy, refuser: Refuser) -> None:
        self.runtime = runtime
        self.policy = policy
        self.refuser = refuser
        self.unknown_seen: dict[str, int] = {}  # host -> requests forwarded ungoverned

    def request(self, flow: http.HTTPFlow) -> None:
        state: FlowState | None = flow.metadata.get(STATE_KEY)
        if state is None or not state.unclaimed or flow.response is not None:
            return
        try:
            self._unknown(flow, state.session)
        except Exception:  # fail closed: never forward what could not be governed
            log.exception("governor: internal error on %s", flow.request.url)
            self.refuser.fail_closed(flow, state.session, "internal error while governing the request")

    def _unknown(self, flow: http.HTTPFlow, session: str) -> None:
        host = flow.request.host
        halted = getattr(self.runtime, "halted", None)
        cause = halted(session) if halted is not None else None
        if cause is not None:  # after a halt the session refuses everything, ungoverned traffic too
            gov = {"cause": cause, "action": "halt", "reason": halted_reason(cause), "session": session}
            flow.response = as_response(generic_error(403, f"governor: session halted ({cause})", gov), "halt")
            return
        if self.policy.unknown_traffic == "deny":
            message = f"no adapter governs {flow.request.method} {host}{flow.request.path.split('?', 1)[0]}"
            gov = {"cause": None, "action": "deny", "reason": f"unknown traffic: {message}", "session": session}
            flow.response = as_response(generic_error(403, f"governor: {gov['reason']}", gov), "deny")
            return
        count = self.unknown_seen.get(host, 0)
        self.unknown_seen[host] = count + 1
        if count == 0:
            log.info("governor: forwarding ungoverned traffic to %s (no adapter matched %s %s)",
                     host, flow.request.method, flow.request.path.split("?", 1)[0])
