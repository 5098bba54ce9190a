"""JSON-RPC 2.0 over HTTP, plain or as server-sent events: what MCP and A2A share.

Both protocols POST a JSON-RPC request and answer with either one JSON body or a
text/event-stream whose `message` events carry JSON-RPC messages. The governor
refuses with a JSON-RPC error carrying the request's id, code -32050 (in the
implementation-defined server-error range, unused by MCP and by A2A, whose own
codes are -32001..-32007) and `error.data.governor`, over HTTP 200 because JSON-RPC
clients (the `mcp` and `a2a` SDKs) raise on HTTP errors without reading the body.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

import orjson

from governor.adapters import sse
from governor.adapters.base import Exchange, Reply, StreamEvent, StreamWatcher
from governor.adapters.refusals import describe
from governor.policy.steps import Decision

GOVERNOR_ERROR_CODE = -32050
INVALID_REQUEST = -32600
SSE_HEADERS: Mapping[str, str] = {"content-type": "text/event-stream", "cache-control": "no-store"}


def is_call(body: Any, methods: frozenset[str], prefixes: tuple[str, ...] = ()) -> bool:
    """A JSON-RPC 2.0 request/notification (or a batch of them) naming one of `methods`
    (or a method starting with one of `prefixes`)."""
    items = body if isinstance(body, list) else [body]
    if not items:
        return False
    for item in items:
        if not isinstance(item, dict) or item.get("jsonrpc") != "2.0":
            return False
        method = item.get("method")
        if not isinstance(method, str) or not (method in methods or method.startswith(prefixes)):
            return False
    return True


def error(rpc_id: Any, code: int, message: str, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = dict(data)
    return {"jsonrpc": "2.0", "id": rpc_id, "error": body}


def result(rpc_id: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": value}


def response_for(messages: list[Any], rpc_id: Any) -> dict[str, Any] | None:
    """The response (result or error) to request `rpc_id` among JSON-RPC messages."""
    for message in messages:
        if isinstance(message, dict) and "method" not in message and message.get("id") == rpc_id \
                and ("result" in message or "error" in message):
            return message
    return None


def error_reply(status: int, message: str, governor: Mapping[str, Any] | None,
                exchange: Exchange | None, *, stream: bool = False) -> Reply:
    """A refusal as a JSON-RPC error. With the request's id it goes out as HTTP 200 (as an
    SSE event when `stream`); without one (an unreadable request) with `status`."""
    rpc_id = exchange.state.get("rpc_id") if exchange is not None else None
    if governor is not None:
        payload = error(rpc_id, GOVERNOR_ERROR_CODE, message or describe(governor), {"governor": dict(governor)})
    else:
        payload = error(rpc_id, INVALID_REQUEST if status == 400 else GOVERNOR_ERROR_CODE, message)
    if rpc_id is None:
        return Reply.json(status, payload)
    if stream:
        return Reply(200, SSE_HEADERS, sse_event(payload))
    return Reply.json(200, payload)


def fallback_text(decision: Decision) -> str:
    """A §6 fallback's substitute as text: the declared value (JSON when not a string),
    else the declared message."""
    value = decision.fallback_value
    if value is None:
        return decision.fallback_message or ""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


# --- server-sent events (framing in governor.adapters.sse) ------------------------------

_LINE_END = re.compile(rb"\r\n|\n|\r")
EVENT_SEPARATOR = re.compile(rb"(?:\r\n|\r(?!\n)|\n){2}")  # a line end, then an empty line


def parse_events(body: bytes) -> list[sse.SSEEvent]:
    """Every event of a complete SSE body (a last event without its blank line included)."""
    decoder = sse.SSEDecoder()
    return decoder.feed(body) + decoder.close()


def json_messages(events: list[sse.SSEEvent]) -> list[Any]:
    """The JSON payloads of `message` events (other events and unparseable data skipped)."""
    out = []
    for event in events:
        if event.event in (None, "message") and (payload := event.json()) is not None:
            out.append(payload)
    return out


def body_messages(headers: Mapping[str, str], body: bytes) -> list[Any]:
    """The JSON-RPC messages of a complete response body, JSON or SSE."""
    if is_sse(headers):
        return json_messages(parse_events(body))
    try:
        return [orjson.loads(body)]
    except orjson.JSONDecodeError:
        return []


def sse_event(payload: Any) -> bytes:
    return sse.encode(payload, "message")


def is_sse(headers: Mapping[str, str]) -> bool:
    return (headers.get("content-type") or "").split(";", 1)[0].strip().lower() == "text/event-stream"


def replace_sse_response(body: bytes, rpc_id: Any, response: dict[str, Any]) -> bytes:
    """An SSE body with the event answering `rpc_id` rewritten to `response`, every other byte kept."""
    out = []
    pos = 0
    for separator in EVENT_SEPARATOR.finditer(body):
        block = body[pos:separator.start()]
        if response_for(json_messages(parse_events(block)), rpc_id) is not None:
            # the event's own id/retry lines are kept; only its data is replaced
            kept = [line for line in _LINE_END.split(block) if line.startswith((b"id:", b"retry:"))]
            out.append(b"".join(line + b"\n" for line in kept) + sse_event(response)[:-2])  # without its blank line
        else:
            out.append(block)
        out.append(separator.group())
        pos = separator.end()
    out.append(body[pos:])
    return b"".join(out)


class RpcStreamWatcher(StreamWatcher):
    """Watches an SSE answer to one JSON-RPC request without changing a byte.

    `on_response` turns the response to the request into stream events (e.g. a
    failed MCP tool call into a ToolError). When the governor cuts the stream
    before that response, `terminal` ends it with a JSON-RPC error for the request.
    """

    def __init__(self, rpc_id: Any, on_response: Callable[[dict[str, Any]], list[StreamEvent]] | None = None) -> None:
        self._decoder = sse.SSEDecoder()
        self._tail = sse.EventFramer()  # bytes after the last complete event
        self._rpc_id = rpc_id
        self._on_response = on_response
        self._answered = False

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        self._tail.feed(chunk)
        return self._seen(self._decoder.feed(chunk))

    def close(self) -> list[StreamEvent]:
        return self._seen(self._decoder.close())

    def _seen(self, events: list[sse.SSEEvent]) -> list[StreamEvent]:
        if self._answered or self._rpc_id is None or not events:
            return []
        response = response_for(json_messages(events), self._rpc_id)
        if response is None:
            return []
        self._answered = True
        return self._on_response(response) if self._on_response is not None else []

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        # A half-sent event is ended first (the client drops it as unparseable).
        prefix = b"\n\n" if self._tail.rest().strip(b"\r\n") else b""
        if self._answered or self._rpc_id is None:
            return prefix
        return prefix + sse_event(error(self._rpc_id, GOVERNOR_ERROR_CODE, message, {"governor": dict(governor)}))

    @property
    def usage(self) -> None:
        return None
