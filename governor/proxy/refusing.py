"""Answering instead of the upstream: the refusals the addon makes (a session it may not
act in, a blocked step, a request its adapter cannot open, unknown traffic, failing closed)
and the replies they are made of.

`Refusing` is mixed into `governor.proxy.addon.Governor` (kept apart: addon.py was long
enough); the reply builders are module functions the addon's other mixins and the stream
relay share. A refusal is in the protocol's own error shape (the adapter's), OpenAI's for
traffic no adapter speaks, and carries `ADL-Governor-Action` and `x-should-retry: false`.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from mitmproxy import http

from governor.adapters import IGNORE, Refusal
from governor.adapters.base import (Adapter, Exchange, RawHeaders, Reply, RequestView, describe, governor_object,
                                    status_for)
from governor.policy.steps import Action, Decision
from governor.proxy import refusals
from governor.proxy.fields import GOVERNOR_PREFIX, PASSPORT_HEADER
from governor.runtime.api import Admission
from governor.sessions import halted_reason

log = logging.getLogger("governor.proxy")

ACTION_HEADER = "ADL-Governor-Action"  # on responses the governor made or changed
REPLACED_KEY = "governor.replaced"  # flow.metadata: set when the governor replaced the answer

STATUS_TEXT = {400: "Bad Request", 403: "Forbidden", 413: "Payload Too Large", 429: "Too Many Requests",
               502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


class Refusing:
    """The addon's refusals, for `governor.proxy.addon.Governor`."""

    async def _refuse_session(self, flow: http.HTTPFlow, refusal: Any) -> None:
        """A request that names no session it may act in: answered 403 in its protocol's
        error shape (an IGNORE route passes, as it always does), counted and logged."""
        request = flow.request
        view = RequestView(request.method, request.host, request.path, RawHeaders(request.headers.fields),
                           request.raw_content, port=request.port, scheme=request.scheme)
        selected = self.registry.select(view)
        ungoverned = selected is None and refusal.code == "session_token_required" \
            and self.policy.unknown_traffic == "forward"
        if selected == IGNORE or ungoverned:
            # an IGNORE route, or token-less traffic no adapter governs (a package download, a
            # web page: nothing a session meters, and no library adds ADL-Session to it) passes
            # as it would without sessions; a lock or a bad token still refuses it
            flow.request.headers.fields = tuple(
                f for f in request.headers.fields if f[0][:4].lower() != GOVERNOR_PREFIX)
            if ungoverned:
                self._unknown(flow, "")
            return
        if isinstance(selected, Refusal):  # refused at selection too; it belongs to no session
            await refusals.record(self.runtime, self.metrics, None, refusals.reason_for(selected.status), {})
            log.info("governor: %s %s would also be refused at selection (%s): counted, not recorded (no session)",
                     request.method, request.pretty_url, selected.status)
        if refusal.audit is not None:
            try:
                await self.sessions.record_refusal(refusal)
            except Exception:  # refused all the same: the safe side
                log.exception("governor: the refusal %s could not be recorded in the audit journal", refusal.code)
        gov = refusal.governor_object()
        message = f"governor: {refusal.message}"
        if isinstance(selected, Adapter):
            try:
                reply = selected.error_response(403, message, gov)
            except Exception:
                log.exception("governor: adapter %s could not build a refusal", selected.name)
                reply = generic_error(403, message, gov)
        else:
            reply = generic_error(403, message, gov)
        flow.response = as_response(reply, gov["action"])
        log.info("governor: refused %s %s: %s (%s)", request.method, request.pretty_url, refusal.code,
                 refusal.session or "no session")

    def _refusal_reply(self, adapter: Adapter | None, decision: Decision, gov: dict[str, Any],
                       exchange: Exchange | None) -> Reply:
        if decision.action is Action.FALLBACK and adapter is not None and exchange is not None:
            return adapter.fallback_response(exchange, decision, gov)
        status = status_for(decision)
        if adapter is None:
            return generic_error(status, describe(gov), gov)
        return adapter.error_response(status, describe(gov), gov, exchange)

    def _refuse(self, flow: http.HTTPFlow, adapter: Adapter | None, admission: Admission, session: str,
                exchange: Exchange | None = None) -> None:
        decision = admission.decision
        gov = admission.governor_object or governor_object(decision, session)
        reply = self._refusal_reply(adapter, decision, gov, exchange)
        flow.response = as_response(reply, decision.action.value)
        log.info("governor: %s %s %s in session %s (%s)", decision.action.value, flow.request.method,
                 flow.request.pretty_url, session, decision.cause,
                 extra={"session": session, "cause": decision.cause, "action": decision.action.value})

    def _refuse_presented(self, flow: http.HTTPFlow, adapter: Adapter | None, admission: Admission, session: str,
                          reason: str) -> None:
        """400 for an ADL-Passport header that is not a readable passport, saying why; the
        governor object is the PassportPresented admission's (the recorded mismatch)."""
        decision = admission.decision
        gov = {**(admission.governor_object or governor_object(decision, session)),
               "passport_error": f"{PASSPORT_HEADER} header refused: {reason}"}
        message = f"governor: {gov['passport_error']}"
        reply = adapter.error_response(400, message, gov) if adapter is not None else generic_error(400, message, gov)
        flow.response = as_response(reply, decision.action.value if decision.blocks else "deny")
        log.info("governor: refused %s %s in session %s: %s", flow.request.method, flow.request.pretty_url,
                 session, message)

    def _replace_blocked(self, flow: http.HTTPFlow, exchange: Exchange, admission: Admission) -> None:
        """The answer of an exchange whose step the admission blocks: its refusal."""
        decision, session = admission.decision, exchange.session
        self._replace(flow, exchange.adapter, decision, session,
                      admission.governor_object or governor_object(decision, session), exchange)

    def _replace(self, flow: http.HTTPFlow, adapter: Adapter, decision: Decision, session: str,
                 gov: dict[str, Any] | None = None, exchange: Exchange | None = None) -> None:
        gov = gov or governor_object(decision, session)
        # who answered, for the log: the upstream's status (None: it was never asked) and our cause
        flow.metadata[REPLACED_KEY] = (flow.response.status_code if flow.response is not None else None,
                                       gov.get("cause") or gov.get("reason"))
        flow.response = as_response(self._refusal_reply(adapter, decision, gov, exchange), decision.action.value)

    async def _bad_request(self, flow: http.HTTPFlow, adapter: Adapter, session: str, message: str,
                           status: int = 400) -> None:
        """A request its adapter cannot open (malformed, too large, a bad ADL-Persona): recorded
        in its session (governor.proxy.refusals), then answered in its protocol's format."""
        reason = refusals.BODY_TOO_LARGE if status == 413 else refusals.BAD_REQUEST
        await refusals.record(self.runtime, self.metrics, session, reason,
                              refusals.detail(reason, status, flow.request, message))
        gov = {"cause": None, "action": "deny", "reason": message, "session": session}
        flow.response = as_response(adapter.error_response(status, f"governor: {message}", gov), "deny")
        log.info("governor: refused %s %s: %s", flow.request.method, flow.request.pretty_url, message)

    async def _refuse_unselected(self, flow: http.HTTPFlow, refusal: Refusal, session: str) -> None:
        """A request refused before any adapter opened it (selection, body decoding): recorded
        in its session (governor.proxy.refusals), then answered in the format of the adapter
        whose endpoint the path is, else the generic one."""
        reason = refusals.reason_for(refusal.status)
        await refusals.record(self.runtime, self.metrics, session, reason,
                              refusals.detail(reason, refusal.status, flow.request, refusal.message))
        message = f"governor: {refusal.message}"
        gov = {"cause": None, "action": "deny", "reason": refusal.message, "session": session}
        adapter = refusal.adapter
        reply = (adapter.error_response(refusal.status, message, gov) if adapter is not None
                 else generic_error(refusal.status, message, gov))
        flow.response = as_response(reply, "deny")
        log.info("governor: refused %s %s: %s", flow.request.method, flow.request.pretty_url, refusal.message)

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

    def _fail_closed(self, flow: http.HTTPFlow, session: str, message: str) -> None:
        gov = {"cause": "on_governor_error", "action": "deny", "fail_closed": True, "reason": message,
               "session": session}
        flow.response = as_response(generic_error(503, f"governor: {message}", gov), "deny")


def governor_error() -> Decision:
    return Decision(action=Action.HALT, cause="on_governor_error", fail_closed=True)


def governor_error_object(session: str) -> dict[str, Any]:
    return {"cause": "on_governor_error", "action": "halt", "fail_closed": True, "session": session,
            "reason": "the governor could not decide"}


def generic_error(status: int, message: str, gov: Mapping[str, Any]) -> Reply:
    """A refusal for traffic no adapter speaks: OpenAI's error shape, the most widely understood."""
    return Reply.json(status, {"error": {"message": message, "type": "governor_error",
                                         "code": gov.get("cause"), "governor": dict(gov)}})


def plain_error(status: int, message: str) -> http.Response:
    return as_response(generic_error(status, message, {"cause": None, "action": "deny", "reason": message}), "deny")


def as_response(reply: Reply, action: str) -> http.Response:
    headers = {**reply.headers, ACTION_HEADER: action}
    if reply.status >= 400:
        headers["x-should-retry"] = "false"  # SDKs would otherwise retry a refusal (429, 503)
    return http.Response.make(reply.status, reply.body, headers)


def as_raw(reply: Reply, action: str) -> bytes:
    """A complete HTTP/1.1 response, as an upstream would have sent it."""
    head = [f"HTTP/1.1 {reply.status} {STATUS_TEXT.get(reply.status, 'Error')}"]
    headers = {**reply.headers, ACTION_HEADER: action, "content-length": str(len(reply.body))}
    if reply.status >= 400:
        headers["x-should-retry"] = "false"
    head += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + reply.body
