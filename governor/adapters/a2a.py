"""A2A JSON-RPC: a message to a peer agent is a Delegation step (Runtime §4.2).

Recognised by body shape: a POST whose body is a JSON-RPC 2.0 request with an A2A
method. `message/send` and `message/stream` (0.2/0.3; the pre-0.2 `tasks/send`,
`tasks/sendSubscribe`) and A2A 1.0's `SendMessage` and `SendStreamingMessage` are
delegations; the other task methods act on a task already delegated and pass, as does
the GET of a peer's agent card (`/.well-known/agent-card.json`, `agent.json`: what an A2A
client reads first; not with a query string or a body). A2A 1.0's
HTTP+JSON binding is recognised by its operation paths, `POST {base}/message:send` and
`{base}/message:stream` (a delegation to the agent at {base}); its refusals are
google.rpc.Status errors (`rest_error`).

Who is the peer? The governor resolves the peer's passport before the policy
sees the step (`PeerResolver`), from, in order:
  1. a static map in the configuration (URL prefix -> passport file), for offline
     and pinned peers;
  2. the peer's ADL discovery document, `{origin}/.well-known/adl-agents` (ADL Core
     §6.4): its one entry, or when it lists several, the entry whose `name` is the
     `name` of the peer's A2A agent card (`/.well-known/agent-card.json`, then
     `/.well-known/agent.json`); the passport is fetched from the entry's
     `adl_document`, its `id` must equal the entry's `id`, and that identity's
     domain (the https id's host, or the did:web domain) must be the peer's host
     or a parent of it: a self-signed passport proves nothing about who may use
     an identity, so a peer only speaks for its own domain.
The passport is then verified with the admission code (signature, schema,
expiry, lifecycle). Anything that fails leaves the step unverified
(`Delegation(peer_verified=False)`), which the policy denies (fail closed), and
the reason goes into the step's record detail via the policy. Results are cached
per origin (verified for `ttl`, failures for `negative_ttl`). Fetches go directly
from the governor, not through its own proxy, never follow redirects, and are
bounded in time and size.

Depth: the `ADL-Delegation-Depth` request header is the depth of the delegation
the calling agent is itself serving (0 for a root agent; absent = 0). The
governor never trusts it downwards: the configured floor
(`AdapterConfig.extra["delegation_depth"]`, the depth this deployment is known
to run at) wins when higher. This call's depth is that + 1, and the request goes
to the peer carrying it in the same header (`Exchange.upstream_headers`; the
agent's own ADL-* headers are stripped), so the peer's governor continues the count.

A refusal is a JSON-RPC error with the request's id, code -32050 and
`error.data.governor`, HTTP 200; for `message/stream` it is sent as a one-event
SSE stream, the shape streaming A2A clients read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urljoin, urlsplit

import aiohttp
import orjson

from governor.adapters import jsonrpc, sse
from governor.adapters.endpoints import GOVERNED, Endpoint, Probe
from governor.adapters.base import Adapter, Exchange, Observation, Reply, StreamWatcher
from governor.adapters.refusals import describe
from governor.adapters.request_view import BadRequest, RequestView
from governor.passport import AdmissionConfig, Retrieval, admit, parse_passport
from governor.passport.admission import identity_domain
from governor.policy.steps import Decision, Delegation, Step

# A2A 1.0 names its JSON-RPC methods after the protocol's operations (SendMessage, ...); 0.2
# and 0.3 used paths (message/send, ...), and pre-0.2 tasks/send. All are read.
V1_DELEGATING = frozenset({"SendMessage", "SendStreamingMessage"})
DELEGATING = frozenset({"message/send", "message/stream", "tasks/send", "tasks/sendSubscribe"}) | V1_DELEGATING
STREAMING = frozenset({"message/stream", "tasks/sendSubscribe", "SendStreamingMessage"})
A2A_METHODS = DELEGATING | frozenset({
    "tasks/get", "tasks/cancel", "tasks/resubscribe",
    "tasks/pushNotificationConfig/set", "tasks/pushNotificationConfig/get",
    "tasks/pushNotificationConfig/list", "tasks/pushNotificationConfig/delete",
    "agent/getAuthenticatedExtendedCard",
    "GetTask", "ListTasks", "CancelTask", "SubscribeToTask", "GetExtendedAgentCard",
    "CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
})
# A2A 1.0's HTTP+JSON binding: POST {base}/message:send and {base}/message:stream (a tenant may
# prefix the path); the body is the SendMessageRequest itself, no JSON-RPC envelope
REST_SEND, REST_STREAM = "/message:send", "/message:stream"
REST_ERROR_DOMAIN = "adl-governor"
DEPTH_HEADER = "ADL-Delegation-Depth"
DISCOVERY_PATH = "/.well-known/adl-agents"
AGENT_CARD_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent.json")

Verifier = Callable[[Mapping[str, Any], str], Mapping[str, Any]]
"""verify(document, source) -> the admitted passport; raises when it cannot be admitted."""


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    peer_id: str
    passport: Mapping[str, Any] | None
    verified: bool
    reason: str = ""  # why not verified
    source: str = ""  # "static" | "discovery"


class PeerError(Exception):
    """The peer's passport could not be found, read or admitted."""


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class PeerResolver:
    """Finds and verifies the passport of the peer agent at a URL, with a cache.

    `static` maps URL prefixes to passport files (the longest matching prefix wins);
    `verify` is the admission check (see `admission_verifier`).
    """

    def __init__(self, verify: Verifier, *, static: Mapping[str, str | Path] | None = None,
                 ttl: float = 300.0, negative_ttl: float = 30.0, timeout: float = 5.0,
                 max_bytes: int = 1 << 20, clock: Callable[[], float] = time.monotonic) -> None:
        self._verify = verify
        self._static = sorted(((prefix.rstrip("/"), Path(path)) for prefix, path in (static or {}).items()),
                              key=lambda item: len(item[0]), reverse=True)
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_bytes = max_bytes
        self._clock = clock
        self._cache: dict[str, tuple[float, PeerIdentity]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._http: aiohttp.ClientSession | None = None

    async def resolve(self, url: str) -> PeerIdentity:
        static = next((path for prefix, path in self._static
                       if url == prefix or url.startswith(prefix + "/")), None)
        key = f"static:{static}" if static is not None else origin_of(url)
        cached = self._cache.get(key)
        if cached is not None and cached[0] > self._clock():
            return cached[1]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > self._clock():
                return cached[1]
            identity = await (self._from_file(static, url) if static is not None else self._discover(url))
            ttl = self._ttl if identity.verified else self._negative_ttl
            self._cache[key] = (self._clock() + ttl, identity)
            return identity

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    # --- sources -----------------------------------------------------------------------

    async def _from_file(self, path: Path, url: str) -> PeerIdentity:
        try:
            raw = await asyncio.to_thread(path.read_bytes)
            document = await asyncio.to_thread(parse_passport, raw, source=str(path))  # bounded, off the loop
        except Exception as exc:  # unreadable or unparseable: the peer stays unverified
            return PeerIdentity(url, None, False, f"static passport {path}: {exc}", "static")
        return self._admit(document, str(path), url, "static")

    async def _discover(self, url: str) -> PeerIdentity:
        origin = origin_of(url)
        try:
            discovery = await self._get_json(origin + DISCOVERY_PATH)
            entry = await self._entry(discovery, origin)
            source = urljoin(origin + "/", entry["adl_document"])
            # a peer's bytes: the bounded reader, in a thread (a large YAML costs up to seconds)
            document = await asyncio.to_thread(parse_passport, await self._get(source), source=source)
        except PeerError as exc:
            return PeerIdentity(url, None, False, str(exc), "discovery")
        except Exception as exc:  # a malformed passport, typically
            return PeerIdentity(url, None, False, f"peer passport: {exc}", "discovery")
        if document.get("id") != entry["id"]:
            return PeerIdentity(entry["id"], None, False,
                                f"passport id {document.get('id')!r} is not the discovered id {entry['id']!r}",
                                "discovery")
        host = (urlsplit(url).hostname or "").lower()
        domain = identity_domain(document)
        if not domain or not (host == domain or host.endswith("." + domain)):
            # An inline key proves nothing about who may use an identity: a peer may
            # only claim one of its own domain (a static map entry is the operator's word).
            return PeerIdentity(entry["id"], None, False,
                                f"the peer at {host} claims identity {entry['id']!r}, "
                                + (f"of domain {domain}" if domain else "which names no domain"), "discovery")
        return self._admit(document, source, url, "discovery")

    async def _entry(self, discovery: Any, origin: str) -> dict[str, Any]:
        agents = discovery.get("agents") if isinstance(discovery, dict) else None
        if not isinstance(agents, list) or discovery.get("adl_discovery") != "1.0":
            raise PeerError(f"{origin}{DISCOVERY_PATH} is not an ADL discovery document (adl_discovery 1.0)")
        entries = [a for a in agents if isinstance(a, dict) and isinstance(a.get("id"), str)
                   and isinstance(a.get("adl_document"), str)]
        if len(entries) == 1:
            return entries[0]
        if not entries:
            raise PeerError(f"{origin}{DISCOVERY_PATH} lists no agent with an id and adl_document")
        card_name = await self._card_name(origin)
        named = [e for e in entries if card_name is not None and e.get("name") == card_name]
        if len(named) != 1:
            raise PeerError(
                f"{origin}{DISCOVERY_PATH} lists {len(entries)} agents and "
                + (f"{len(named)} are named {card_name!r} like the agent card" if card_name is not None
                   else "the peer serves no A2A agent card naming one of them"))
        return named[0]

    async def _card_name(self, origin: str) -> str | None:
        for path in AGENT_CARD_PATHS:
            try:
                card = await self._get_json(origin + path)
            except PeerError:
                continue
            if isinstance(card, dict) and isinstance(card.get("name"), str):
                return card["name"]
        return None

    def _admit(self, document: Mapping[str, Any], source: str, url: str, how: str) -> PeerIdentity:
        peer_id = document.get("id") if isinstance(document.get("id"), str) else url
        try:
            admitted = self._verify(document, source)
        except Exception as exc:  # any admission failure: unverified, with the reason
            return PeerIdentity(peer_id, None, False, f"peer passport not admitted: {exc}", how)
        return PeerIdentity(peer_id, admitted, True, "", how)

    # --- HTTP --------------------------------------------------------------------------

    async def _get(self, url: str) -> bytes:
        if urlsplit(url).scheme not in ("http", "https"):
            raise PeerError(f"refusing to fetch {url!r}: only http(s) URLs")
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self._timeout, trust_env=False)
        try:
            async with self._http.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise PeerError(f"GET {url}: HTTP {resp.status}")
                body = await resp.content.read(self._max_bytes + 1)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise PeerError(f"GET {url}: {exc.__class__.__name__} {exc}".rstrip()) from exc
        if len(body) > self._max_bytes:
            raise PeerError(f"GET {url}: larger than {self._max_bytes} bytes")
        return body

    async def _get_json(self, url: str) -> Any:
        body = await self._get(url)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise PeerError(f"GET {url}: not JSON ({exc})") from exc


# --- the adapter -----------------------------------------------------------------------


def _depth(request: RequestView, floor: int) -> int:
    raw = request.headers.get(DEPTH_HEADER.lower())  # headers: case-insensitive, or lower-case keys
    if raw is None:
        return floor
    try:
        incoming = int(raw.strip())
    except ValueError:
        incoming = -1
    if incoming < 0:
        raise BadRequest(f"{DEPTH_HEADER} must be a non-negative integer, not {raw!r}")
    return max(incoming, floor)


def _method(message: Any) -> str | None:
    """A JSON-RPC message's method when it is a string (a list there is not hashable)."""
    method = message.get("method") if isinstance(message, dict) else None
    return method if isinstance(method, str) else None


class A2AAdapter(Adapter):
    name = "a2a"

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self._peers: PeerResolver | None = self.config.extra.get("a2a_peers")
        self._depth_floor = int(self.config.extra.get("delegation_depth", 0))

    def match(self, request: RequestView) -> bool:
        if request.method != "POST":
            # an A2A client reads the peer's agent card before it sends anything: discovery,
            # spending nothing, passed as a step-less exchange of the session (as tasks/get
            # is); with a query string or a body it is not a card read and is not claimed
            return (request.method == "GET" and "?" not in request.path and not request.content
                    and request.match_route.endswith(AGENT_CARD_PATHS))
        if ":" in request.path and request.match_route.endswith((REST_SEND, REST_STREAM)):
            return True
        return jsonrpc.is_call(request.json_or_none(), A2A_METHODS)

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        if request.method == "GET":  # the agent card (match)
            return Exchange(self, request.method, request.host, request.path, None, session, persona)
        body = request.json()
        route = request.match_route
        if route.endswith((REST_SEND, REST_STREAM)):
            return self._open_rest(request, body, session, persona)
        if isinstance(body, list):
            if any(isinstance(m, dict) and _method(m) in DELEGATING for m in body):
                raise BadRequest("A2A has no JSON-RPC batches; send each message in its own request")
            return Exchange(self, request.method, request.host, request.path, body, session, persona)
        exchange = Exchange(self, request.method, request.host, request.path, body, session, persona)
        method = _method(body)
        exchange.stream = method in STREAMING
        exchange.state["rpc_id"] = body.get("id") if isinstance(body, dict) else None
        if method in DELEGATING:
            exchange.state["version"] = "1.0" if method in V1_DELEGATING else "0.3"
            self._delegating(request, exchange, request.route)
        return exchange

    def _open_rest(self, request: RequestView, body: Any, session: str, persona: str | None) -> Exchange:
        """A 1.0 HTTP+JSON SendMessage: the peer is the base URL the operation is under."""
        if not isinstance(body, dict) or not isinstance(body.get("message"), dict):
            raise BadRequest("an A2A SendMessageRequest is a JSON object with a message object")
        exchange = Exchange(self, request.method, request.host, request.path, body, session, persona)
        exchange.stream = request.match_route.endswith(REST_STREAM)
        exchange.state["version"] = "1.0"
        exchange.state["rest"] = True
        route = request.route
        base = route[: route.rindex("/message:")] if "/message:" in route else route
        self._delegating(request, exchange, base)
        return exchange

    def _delegating(self, request: RequestView, exchange: Exchange, path: str) -> None:
        port = "" if (request.scheme, request.port) in (("https", 443), ("http", 80)) else f":{request.port}"
        exchange.state["peer_url"] = f"{request.scheme}://{request.host}{port}{path}"
        depth = _depth(request, self._depth_floor) + 1
        exchange.state["delegation_depth"] = depth
        exchange.upstream_headers[DEPTH_HEADER] = str(depth)

    async def steps(self, exchange: Exchange) -> list[Step]:
        url = exchange.state.get("peer_url")
        if url is None:
            return []
        if self._peers is None:
            peer = PeerIdentity(url, None, False, "no peer resolution configured")
        else:
            peer = await self._peers.resolve(url)
        exchange.state["peer"] = peer
        return [Delegation(peer_id=peer.peer_id, peer_passport=peer.passport, peer_verified=peer.verified,
                           chain_depth=exchange.state["delegation_depth"], peer_url=url, persona=exchange.persona)]

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        return Observation()

    def stream_watcher(self, exchange: Exchange, status: int, headers: Mapping[str, str]) -> StreamWatcher | None:
        if not jsonrpc.is_sse(headers) or exchange.state.get("rest"):
            return None
        return jsonrpc.RpcStreamWatcher(exchange.state.get("rpc_id"))

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        if exchange is not None and exchange.state.get("rest"):
            return rest_error(status, message or describe(governor or {}), governor, exchange.stream)
        return jsonrpc.error_reply(status, message, governor, exchange,
                                   stream=exchange is not None and exchange.stream)

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        """A §6 fallback: the peer's answer replaced by an agent message holding the declared
        value (an object value as a data part) or message, the governor object in metadata."""
        value = decision.fallback_value
        if exchange.state.get("version") == "1.0":  # a SendMessageResponse / StreamResponse holding a message
            part = {"data": value} if isinstance(value, dict) else {"text": jsonrpc.fallback_text(decision)}
            result: dict[str, Any] = {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_AGENT",
                                                  "parts": [part], "metadata": {"governor": dict(governor)}}}
            if exchange.state.get("rest"):
                if exchange.stream:
                    return Reply(200, jsonrpc.SSE_HEADERS, jsonrpc.sse_event(result))
                return Reply.json(200, result)
            payload = jsonrpc.result(exchange.state.get("rpc_id"), result)
            if exchange.stream:
                return Reply(200, jsonrpc.SSE_HEADERS, jsonrpc.sse_event(payload))
            return Reply.json(200, payload)
        part = {"kind": "data", "data": value} if isinstance(value, dict) else \
            {"kind": "text", "text": jsonrpc.fallback_text(decision)}
        message = {"kind": "message", "role": "agent", "messageId": str(uuid.uuid4()), "parts": [part],
                   "metadata": {"governor": dict(governor)}}
        payload = jsonrpc.result(exchange.state.get("rpc_id"), message)
        if exchange.stream:
            return Reply(200, jsonrpc.SSE_HEADERS, jsonrpc.sse_event(payload))
        return Reply.json(200, payload)


def rest_error(status: int, message: str, governor: Mapping[str, Any] | None, stream: bool) -> Reply:
    """A refusal in the HTTP+JSON binding's error shape (google.rpc.Status, an ErrorInfo in
    `details`): the a2a SDK reads `message`; the governor object travels as the ErrorInfo's
    metadata (string values, as ErrorInfo requires) and whole under `governor`."""
    status = status if status >= 400 else 403
    info: dict[str, Any] = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "GOVERNOR_REFUSED",
                            "domain": REST_ERROR_DOMAIN,
                            "metadata": {str(k): str(v) for k, v in (governor or {}).items()}}
    payload: dict[str, Any] = {"error": {"code": status, "status": "PERMISSION_DENIED" if status == 403 else
                                         "FAILED_PRECONDITION", "message": message, "details": [info]}}
    if governor is not None:
        payload["governor"] = dict(governor)
    if stream:  # an `error` event: what the SDK's streaming REST client raises from, message and all
        return Reply(200, jsonrpc.SSE_HEADERS, sse.encode(payload, "error"))
    return Reply.json(status, payload)


def admission_verifier(base: AdmissionConfig | None = None, *, clock: Callable[[], float] = time.time,
                       requesting_agent: Mapping[str, Any] | None = None) -> Verifier:
    """The governor's passport admission (Trust §1.1) as a peer verifier.

    `base` is an `AdmissionConfig` (its `now` is replaced by `clock()` at each
    admission); by default a peer's passport must be signed. `requesting_agent`
    (this agent's passport) enables the §1.1.9 caller-sensitivity check.
    Returns the admitted document (a plain copy); raises PeerError saying which step failed.
    """
    base = base if base is not None else AdmissionConfig(now=clock(), require_signature=True)

    def verify(document: Mapping[str, Any], source: str) -> Mapping[str, Any]:
        parts = urlsplit(source)
        retrieval = Retrieval(parts.scheme, parts.netloc) if parts.scheme in ("http", "https") else Retrieval()
        report = admit(document, dataclasses.replace(base, now=clock()), retrieval=retrieval,
                       requesting_agent=requesting_agent)
        if not report.verified or report.pinned is None:
            step = report.step(report.blocked_at_section or "")
            why = f"{step.title}: {step.message}" if step is not None else "not verified"
            raise PeerError(f"Trust §{report.blocked_at_section} {why}")
        return report.pinned.document  # plain lists and dicts, as the policy engine reads them

    return verify


ADAPTERS = (A2AAdapter,)

__all__ = ["A2AAdapter", "PeerIdentity", "PeerResolver", "admission_verifier", "DEPTH_HEADER"]


ENDPOINTS = (
    Endpoint("A2A", "message/send, message/stream", "POST", "{any path: matched by JSON-RPC body}", GOVERNED, "a2a",
             Probe("POST", "/a2a", b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":'
                                   b'{"role":"user","messageId":"m1","parts":[{"kind":"text","text":"hi"}]}}}'),
             "a Delegation step: the peer's passport resolved and verified, depth counted"),
    Endpoint("A2A", "SendMessage, SendStreamingMessage (1.0)", "POST", "{any path: matched by JSON-RPC body}",
             GOVERNED, "a2a",
             Probe("POST", "/a2a", b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":'
                                   b'{"role":"ROLE_USER","messageId":"m1","parts":[{"text":"hi"}]}}}',
                   headers=(("a2a-version", "1.0"),)),
             "a Delegation step, as message/send"),
    Endpoint("A2A", "message:send, message:stream (1.0 HTTP+JSON)", "POST", "{base}/message:send, {base}/message:stream",
             GOVERNED, "a2a",
             Probe("POST", "/a2a/message:send", b'{"message":{"role":"ROLE_USER","messageId":"m1",'
                                                b'"parts":[{"text":"hi"}]}}',
                   headers=(("a2a-version", "1.0"),)),
             "a Delegation step to the agent at {base}"),
)
