"""OpenAI Realtime: the WebSocket `GET …/realtime?model=...` governed event by event, its
ephemeral keys refused unless allowed, its WebRTC/SIP calls refused (docs/realtime.md).

Every path with a `/realtime` segment at its end or before a last part is this adapter's,
whatever the method, so nothing under it passes as unknown traffic:

  …/realtime                       the WebSocket: a GET with `Upgrade: websocket` is a step
                                   (a ModelCall expecting nothing: counted, refused after a
                                   halt); then every event of the socket is governed by the
                                   proxy's WebSocket addon through `RealtimeConversation`
                                   (governor/adapters/realtime_events.py). Anything else: 400.
  …/realtime/client_secrets,       ephemeral keys: a client holding one talks to the provider
  …/realtime/sessions,             directly, ungoverned. Refused (403) unless the operator
  …/realtime/transcription_sessions, sets `realtime_client_secrets: allow`; then a POST is a
  …/realtime/translations/client_secrets  step (counted, refused after a halt, recorded)
                                   and the tools its session offers are withheld
  …/realtime/calls[/…]             WebRTC (SDP) and SIP calls: refused (403); the media and
                                   the model's events would not pass through the governor
  any other …/realtime/…           refused (403): not an endpoint the governor knows
"""

from __future__ import annotations

import urllib.parse
from typing import Any, Mapping

import orjson

from governor.adapters import withhold
from governor.adapters.base import Adapter, Exchange, Observation, Reply
from governor.adapters.refusals import describe
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.endpoints import GOVERNED, REFUSED, Endpoint, Probe
from governor.adapters.realtime_events import RealtimeConversation
from governor.policy.steps import Decision, ModelCall, Step

SOCKET = "socket"
MINT = "mint"
CALLS = "calls"
OTHER = "other"

# AdapterConfig.extra key: "allow" lets ephemeral keys be minted (governor run --realtime-client-secrets)
CLIENT_SECRETS = "realtime_client_secrets"
_MINTS = ("client_secrets", "sessions", "transcription_sessions", "translations/client_secrets")

ERROR_TYPES = {400: "invalid_request_error", 403: "governor_denied", 429: "governor_limit_reached",
               503: "governor_unavailable"}


def _kind(route: str) -> str | None:
    """The Realtime endpoint a normalized, lower-case route names (None: not Realtime)."""
    if route.endswith("/realtime"):
        return SOCKET
    at = route.find("/realtime/")
    if at < 0:
        return None
    rest = route[at + 10:]
    if rest in _MINTS:
        return MINT
    if rest == "calls" or rest.startswith("calls/"):
        return CALLS
    return OTHER


def _is_upgrade(request: RequestView) -> bool:
    return "websocket" in (request.headers.get("upgrade") or "").lower()


class RealtimeAdapter(Adapter):
    name = "realtime"
    provider = "openai"

    def claims(self, route: str) -> bool:
        return "/realtime" in route and _kind(route) is not None

    def match(self, request: RequestView) -> bool:
        return _kind(request.match_route) is not None  # every method: governed or refused in open()

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        kind = _kind(request.match_route)
        route = request.normal_route
        if kind == SOCKET:
            return self._socket(request, session, persona)
        if kind == MINT:
            return self._mint(request, session, persona)
        if kind == CALLS:
            raise BadRequest(f"{request.method} {route}: Realtime calls over WebRTC or SIP are refused: the audio and "
                             "the model's events would go between the client and the provider, where the governor "
                             "cannot meter them; use the Realtime WebSocket (GET …/v1/realtime?model=...) through "
                             "the governor", status=403)
        raise BadRequest(f"{request.method} {route} is not a Realtime endpoint the governor governs; refused rather "
                         "than forwarded ungoverned", status=403)

    def _socket(self, request: RequestView, session: str, persona: str | None) -> Exchange:
        if request.method != "GET" or not _is_upgrade(request):
            raise BadRequest(f"{request.method} {request.normal_route} is the Realtime WebSocket: the governor "
                             "governs it as a WebSocket upgrade (GET with Upgrade: websocket) and refuses "
                             "anything else there")
        if request.content:
            raise BadRequest("a WebSocket upgrade carries no body")
        query = urllib.parse.parse_qs(request.path.partition("?")[2])
        names = query.get("model") or query.get("deployment") or [""]  # Azure names a deployment
        model = names[0][:256]
        exchange = Exchange(adapter=self, method=request.method, host=request.host, path=request.path, body=None,
                            session=session, persona=persona, model=model,
                            state={"kind": SOCKET, "expected_input": 0, "expected_output": 0})
        return exchange

    def _mint(self, request: RequestView, session: str, persona: str | None) -> Exchange:
        if self.config.extra.get(CLIENT_SECRETS) != "allow":
            raise BadRequest(f"{request.method} {request.normal_route} mints an ephemeral Realtime key, which lets "
                             "a client talk to the provider directly, ungoverned: refused. An operator who accepts "
                             "that can allow it (governor run --realtime-client-secrets allow); then each minting "
                             "is a counted, recorded step", status=403)
        if request.method != "POST":
            raise BadRequest(f"{request.method} {request.normal_route}: ephemeral keys are minted with POST; "
                             "refused", status=405)
        body = request.json() if request.content else {}
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        config = body.get("session") if isinstance(body.get("session"), dict) else body
        model = config.get("model")
        transcription = config.get("input_audio_transcription")
        if not isinstance(model, str) and isinstance(transcription, dict):
            model = transcription.get("model")
        state: dict[str, Any] = {"kind": MINT, "expected_input": 0, "expected_output": 0, "config": config}
        if config.get("tools") is not None:
            state["tools"] = withhold.read_tools(config["tools"], "tools", withhold.openai_names)
        return Exchange(adapter=self, method=request.method, host=request.host, path=request.path, body=body,
                        session=session, persona=persona, model=model[:256] if isinstance(model, str) else "",
                        state=state)

    async def steps(self, exchange: Exchange) -> list[Step]:
        tools = exchange.state.get("tools")
        return [ModelCall(model=exchange.model, expected_input_tokens=0, expected_output_tokens=0,
                          tools_offered=withhold.flat(tools) if tools else (), persona=exchange.persona,
                          provider=self.provider)]

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        state = exchange.state
        if state["kind"] != MINT or decision.allowed_tools is None or "tools" not in state:
            return None
        withheld = withhold.withhold_openai(state["config"], decision.allowed_tools, state["tools"], None)
        if withheld is None:
            return None
        state["withheld"] = withheld
        return orjson.dumps(exchange.body)

    def conversation(self, exchange: Exchange) -> RealtimeConversation:
        """The socket's protocol state, once the upgrade is answered (the proxy's WebSocket addon)."""
        return RealtimeConversation(self.config, exchange.model, exchange.persona)

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        return Observation()  # the upgrade's 101, or a minted key: nothing charged here

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        error: dict[str, Any] = {"message": message, "type": ERROR_TYPES.get(status, "governor_error"),
                                 "param": None, "code": (governor or {}).get("cause")}
        if governor is not None:
            error["governor"] = dict(governor)
        return Reply.json(status, {"error": error})

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        return self.error_response(403, describe(governor), governor, exchange)  # nothing to substitute


ADAPTERS = (RealtimeAdapter,)

_UPGRADE = (("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="))

ENDPOINTS = (
    Endpoint("OpenAI", "realtime WebSocket", "GET", "/v1/realtime?model={model}", GOVERNED, "realtime",
             Probe("GET", "/v1/realtime?model=gpt-realtime", b"", content_type="", headers=_UPGRADE),
             "the upgrade is a step; each response.create (and each response the server starts) a model call, "
             "charged from response.done's usage, cut with an error event at the cap"),
    Endpoint("OpenAI", "realtime client secrets", "POST", "/v1/realtime/client_secrets", REFUSED, "realtime",
             Probe("POST", "/v1/realtime/client_secrets", b'{"session":{"type":"realtime","model":"gpt-realtime"}}'),
             "an ephemeral key spends ungoverned: refused unless --realtime-client-secrets allow"),
    Endpoint("OpenAI", "realtime sessions (beta)", "POST", "/v1/realtime/sessions", REFUSED, "realtime",
             Probe("POST", "/v1/realtime/sessions", b'{"model":"gpt-4o-realtime-preview"}'),
             "an ephemeral key spends ungoverned: refused unless --realtime-client-secrets allow"),
    Endpoint("OpenAI", "realtime transcription sessions (beta)", "POST", "/v1/realtime/transcription_sessions",
             REFUSED, "realtime",
             Probe("POST", "/v1/realtime/transcription_sessions",
                   b'{"input_audio_transcription":{"model":"gpt-4o-transcribe"}}'),
             "an ephemeral key spends ungoverned: refused unless --realtime-client-secrets allow"),
    Endpoint("OpenAI", "realtime calls (WebRTC SDP)", "POST", "/v1/realtime/calls", REFUSED, "realtime",
             Probe("POST", "/v1/realtime/calls", b"v=0\r\n", content_type="application/sdp"),
             "the media and events would bypass the governor: refused"),
    Endpoint("OpenAI", "realtime calls (SIP control)", "POST", "/v1/realtime/calls/{call_id}/accept", REFUSED,
             "realtime",
             Probe("POST", "/v1/realtime/calls/rtc_1/accept", b'{"type":"realtime","model":"gpt-realtime"}'),
             "refused, as every other /realtime/... path"),
)

__all__ = ["RealtimeAdapter", "ADAPTERS", "ENDPOINTS", "CLIENT_SECRETS", "SOCKET", "MINT", "CALLS", "OTHER"]
