"""Answering instead of the upstream: the refusals the proxy makes before anything went
upstream, or in place of an upstream's answer (a blocked step, a request its adapter cannot
open, failing closed), and the replies they are made of.

`Refuser` is a collaborator each addon that refuses is given (governor.proxy.chain); the
reply builders are module functions the in-flight side and the stream relay share too. A
refusal is in the protocol's own error shape (the adapter's), OpenAI's for traffic no
adapter speaks, and carries `ADL-Governor-Action` and `x-should-retry: false`.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from mitmproxy import http

from governor.adapters import Refusal
from governor.adapters.base import Adapter, Exchange, Reply
from governor.adapters.refusals import describe, status_for
from governor.policy.reasons import governor_object
from governor.policy.steps import Action, Decision
from governor.proxy import refusals
from governor.proxy.fields import PASSPORT_HEADER
from governor.proxy.flow_state import Flight
from governor.runtime.api import Admission, RuntimeAPI

log = logging.getLogger("governor.proxy")

ACTION_HEADER = "ADL-Governor-Action"  # on responses the governor made or changed

STATUS_TEXT = {400: "Bad Request", 403: "Forbidden", 413: "Payload Too Large", 429: "Too Many Requests",
               502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


class Refuser:
    """The refusals of a flow not yet (or no longer) the upstream's to answer. Refusals that
    belong to a session are recorded there (governor.proxy.refusals) through `runtime`."""

    def __init__(self, runtime: RuntimeAPI, metrics: Any = None) -> None:
        self.runtime = runtime
        self.metrics = metrics  # governor.runtime.metrics.Metrics, optional

    def refusal_reply(self, adapter: Adapter | None, decision: Decision, gov: dict[str, Any],
                       exchange: Exchange | None) -> Reply:
        if decision.action is Action.FALLBACK and adapter is not None and exchange is not None:
            return adapter.fallback_response(exchange, decision, gov)
        status = status_for(decision)
        if adapter is None:
            reply = generic_error(status, describe(gov), gov)
        else:
            reply = adapter.error_response(status, describe(gov), gov, exchange)
        details = decision.details
        retry_after = details.get("retry_after") if details.get("retryable") else None
        if retry_after is not None:  # a transient refusal (the store unreachable): the client may retry
            reply = Reply(reply.status, {**reply.headers, "Retry-After": str(retry_after)}, reply.body)
        return reply

    def refuse(self, flow: http.HTTPFlow, adapter: Adapter | None, admission: Admission, session: str,
                exchange: Exchange | None = None) -> None:
        decision = admission.decision
        gov = admission.governor_object or governor_object(decision, session)
        reply = self.refusal_reply(adapter, decision, gov, exchange)
        flow.response = as_response(reply, decision.action.value)
        log.info("governor: %s %s %s in session %s (%s)", decision.action.value, flow.request.method,
                 flow.request.pretty_url, session, decision.cause,
                 extra={"session": session, "cause": decision.cause, "action": decision.action.value})

    def refuse_presented(self, flow: http.HTTPFlow, adapter: Adapter | None, admission: Admission, session: str,
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

    def replace_blocked(self, flow: http.HTTPFlow, flight: Flight | None, exchange: Exchange,
                        admission: Admission) -> None:
        """The answer of an exchange whose step the admission blocks: its refusal."""
        decision, session = admission.decision, exchange.session
        self.replace(flow, flight, exchange.adapter, decision, session,
                     admission.governor_object or governor_object(decision, session), exchange)

    def replace(self, flow: http.HTTPFlow, flight: Flight | None, adapter: Adapter, decision: Decision,
                session: str, gov: dict[str, Any] | None = None, exchange: Exchange | None = None) -> None:
        """The answer replaced by a refusal; `flight` (None on a held answer's shadow flow,
        governor.proxy.holds.shadow_of) keeps who answered, for the exchange's record."""
        gov = gov or governor_object(decision, session)
        if flight is not None:
            # who answered, for the log: the upstream's status (None: it was never asked) and our cause
            flight.replaced = (flow.response.status_code if flow.response is not None else None,
                              gov.get("cause") or gov.get("reason"))
        flow.response = as_response(self.refusal_reply(adapter, decision, gov, exchange), decision.action.value)

    async def bad_request(self, flow: http.HTTPFlow, adapter: Adapter, session: str, message: str,
                          status: int = 400) -> None:
        """A request its adapter cannot open (malformed, too large, a bad ADL-Persona): recorded
        in its session (governor.proxy.refusals), then answered in its protocol's format."""
        reason = refusals.BODY_TOO_LARGE if status == 413 else refusals.UNGOVERNED_ENDPOINT if status == 403 \
            else refusals.BAD_REQUEST
        await refusals.record(self.runtime, self.metrics, session, reason,
                              refusals.detail(reason, status, flow.request, message))
        gov = {"cause": None, "action": "deny", "reason": message, "session": session}
        flow.response = as_response(adapter.error_response(status, f"governor: {message}", gov), "deny")
        log.info("governor: refused %s %s: %s", flow.request.method, flow.request.pretty_url, message)

    async def refuse_unselected(self, flow: http.HTTPFlow, refusal: Refusal, session: str) -> None:
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

    async def refuse_traffic(self, flow: http.HTTPFlow, session: str, reason: str, message: str,
                             gov: Mapping[str, Any] | None = None, adapter: Adapter | None = None) -> None:
        """403 for traffic refused before any adapter opened it (default deny, a host outside
        the passport's allowed_hosts, a halted session's ungoverned traffic): recorded in its
        session ("" or None: it belongs to none, counted only), answered in `adapter`'s error
        format when the path is its endpoint, else the generic one."""
        await refusals.record(self.runtime, self.metrics, session or None, reason,
                              refusals.detail(reason, 403, flow.request, message))
        gov = {"cause": None, "action": "deny", "reason": message, "session": session or None, "refusal": reason,
               **(gov or {})}
        reply = None
        if adapter is not None:
            try:
                reply = adapter.error_response(403, f"governor: {message}", gov)
            except Exception:
                log.exception("governor: adapter %s could not build a refusal", adapter.name)
        flow.response = as_response(reply or generic_error(403, f"governor: {message}", gov), gov["action"])
        log.info("governor: refused %s %s: %s", flow.request.method, flow.request.pretty_url, message,
                 extra={"session": session, "cause": gov["cause"], "action": gov["action"]})

    async def refuse_draining(self, flow: http.HTTPFlow, session: str, message: str, retry_after: int,
                              adapter: Adapter | None = None) -> None:
        """503 for a request that arrives while the governor drains (governor.proxy.drain):
        recorded in its session, answered in `adapter`'s format (else the generic one) with
        Retry-After, retryable, and the connection closed after it so that a retry reaches
        another replica."""
        reason = refusals.SHUTTING_DOWN
        await refusals.record(self.runtime, self.metrics, session or None, reason,
                              refusals.detail(reason, 503, flow.request, message))
        gov = {"cause": None, "action": "deny", "reason": message, "session": session or None, "refusal": reason}
        reply = None
        if adapter is not None:
            try:
                reply = adapter.error_response(503, f"governor: {message}", gov)
            except Exception:
                log.exception("governor: adapter %s could not build a refusal", adapter.name)
        response = as_response(reply or generic_error(503, f"governor: {message}", gov), "deny")
        response.headers["Retry-After"] = str(retry_after)
        response.headers["x-should-retry"] = "true"  # unlike a refusal: the call may succeed elsewhere
        response.headers["Connection"] = "close"
        flow.response = response
        log.info("governor: refused %s %s while draining (session %s)", flow.request.method,
                 flow.request.pretty_url, session or "none", extra={"session": session, "action": "deny"})

    def fail_closed(self, flow: http.HTTPFlow, session: str, message: str) -> None:
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
        # SDKs would otherwise retry a refusal (429, 503); a retryable one says when
        headers["x-should-retry"] = "true" if "Retry-After" in reply.headers else "false"
    return http.Response.make(reply.status, reply.body, headers)


def as_raw(reply: Reply, action: str) -> bytes:
    """A complete HTTP/1.1 response, as an upstream would have sent it."""
    head = [f"HTTP/1.1 {reply.status} {STATUS_TEXT.get(reply.status, 'Error')}"]
    headers = {**reply.headers, ACTION_HEADER: action, "content-length": str(len(reply.body))}
    if reply.status >= 400:
        headers["x-should-retry"] = "true" if "Retry-After" in reply.headers else "false"
    head += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + reply.body
