"""The proxy's own refusals, made before any step was decided, and their evidence.

Selection and the body bounds refuse some requests outright (a model call on a path no
adapter claims: 403; another method at a model endpoint: 405; a body too large: 413; an
encoding the governor cannot read: 415; an unreadable or malformed body: 400), so do
default deny (traffic no adapter governs and no allow-list entry names: 403), the
passport's `allowed_hosts` (403) and a halted session (its ungoverned traffic: 403), and a
relay cuts a stream whose output, kept back while a step awaits admission, outgrows its
bound. None of these reach the decision point, so none would be in a record: here each is

  * recorded in the session it belongs to (the request carried a valid session token, or
    went to the default session): cause `on_governor_request_refused`, action `fallback` (the
    request or stream was replaced by the governor's error answer; the session goes on),
    detail {reason, status, method, host, route, message};
  * counted, `governor_proxy_refusals_total{reason, recorded}`: recorded="false" when it
    belongs to no session (its request named none it may act in: the session refusal
    answered it) or the session's record had ended;
  * logged by the caller.

Every label value is one of the reasons below, never anything the agent sent; the detail's
agent-controlled text is cut to a few hundred characters.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

log = logging.getLogger("governor.proxy")

UNCLAIMED_MODEL_CALL = "unclaimed_model_call"
METHOD_NOT_ALLOWED = "method_not_allowed"
BODY_TOO_LARGE = "body_too_large"
ENCODING_UNSUPPORTED = "encoding_unsupported"
BAD_REQUEST = "bad_request"
HELD_OUTPUT_EXCEEDED = "held_output_exceeded"  # a stream's kept-back output outgrew max_held_stream_bytes
EVENT_TOO_LARGE = "event_too_large"  # an upstream event (or a line without a boundary) outgrew sse.MAX_EVENT_BYTES
UNREADABLE_ANSWER = "unreadable_answer"  # a stream event an adapter cannot read (adapters.base.UnreadableAnswer)
UPSTREAM_EVENT_UNREADABLE = "upstream_event_unreadable"  # a Realtime upstream sent a message the governor cannot read
UNGOVERNED_ENDPOINT = "ungoverned_endpoint"  # an endpoint its adapter refuses outright (Realtime keys, WebRTC calls)
UNKNOWN_TRAFFIC = "unknown_traffic"  # no adapter governs it and no allow-list entry names it (default deny)
HOST_NOT_ALLOWED = "host_not_allowed"  # outside the passport's permissions.network.allowed_hosts
SESSION_HALTED = "session_halted"  # traffic no adapter governs (allowed or not), in a halted session
SHUTTING_DOWN = "shutting_down"  # a request during a drain (503), or a call cut when the drain is over (proxy/drain.py)

_BY_STATUS = {403: UNCLAIMED_MODEL_CALL, 405: METHOD_NOT_ALLOWED, 413: BODY_TOO_LARGE, 415: ENCODING_UNSUPPORTED}
_TEXT = 300  # characters of agent- or upstream-controlled text kept in a detail


def reason_for(status: int) -> str:
    """The reason of a refusal answered with `status` before any adapter opened the request."""
    return _BY_STATUS.get(status, BAD_REQUEST)


def detail(reason: str, status: int, request: Any, message: str) -> dict[str, Any]:
    """The event's detail for a refusal of `request` (a mitmproxy Request)."""
    return {"reason": reason, "status": status, "method": request.method[:16], "host": request.host[:_TEXT],
            "route": request.path.split("?", 1)[0][:_TEXT], "message": message[:_TEXT * 2]}


async def record(runtime: Any, metrics: Any, session: str | None, reason: str, event: Mapping[str, Any]) -> bool:
    """Record the refusal in `session` (None: it belongs to none) and count it; True when
    it is in the session's record. Never raises: the request is refused all the same."""
    recorded = False
    recorder = getattr(runtime, "record_refusal", None)
    if session and recorder is not None:
        try:
            recorded = await recorder(session, dict(event))
        except Exception:  # refused all the same (the safe side); the count says it is not recorded
            log.exception("governor: the refusal (%s) could not be recorded in session %s", reason, session)
    if metrics is not None:
        metrics.proxy_refused(reason, recorded)
    return recorded
