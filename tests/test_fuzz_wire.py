"""Property-based fuzzing of every parser that reads agent- or upstream-controlled bytes and
that selection and the adapters own (issue 20): request bodies (each adapter's `open` and
`steps`, selection, the model-call sniff, path normalization), compressed bodies, answers
(`observe_response`), SSE (the decoder and every stream watcher, under any chunking) and the
`ADL-*` header scan.

The property is the same everywhere: bad input gets a clear, specific error of the kind the
caller handles (BadRequest, BodyError, EventTooLarge) or a governed result, never another
exception; what a stream parser holds stays bounded. Example counts are bounded so the
suite stays fast.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib

import brotli
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mitmproxy import http

from governor.adapters import IGNORE, AdapterRegistry, Refusal
from governor.adapters import sse
from governor.adapters.anthropic import AnthropicAdapter
from governor.adapters.base import Adapter, Observation
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.bedrock import BedrockAdapter
from governor.adapters.mcp import MCPAdapter
from governor.adapters.a2a import A2AAdapter
from governor.adapters.openai import OpenAIAdapter
from governor.adapters.shapes import model_shaped, normalize_path, shape_of
from governor.policy.steps import Step
from governor.proxy import bodies
from governor.proxy.fields import scan_headers

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ_SLOW = settings(FUZZ, max_examples=60)  # each example runs seven watchers, or encodes four ways

# keys the parsers look for, so generated bodies reach their branches, and others
KEYS = st.sampled_from([
    "model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens", "max_output_tokens", "n",
    "best_of", "tools", "tool_choice", "stream", "stream_options", "include_usage", "previous_response_id",
    "function", "name", "type", "role", "content", "arguments", "jsonrpc", "method", "params", "id",
    "message", "anthropic_version", "requests", "endpoint", "input_file_id", "usage", "choices", "delta",
    "tool_calls", "index", "text", "finish_reason", "output", "response", "prompt_tokens", "completion_tokens",
    "input_tokens", "output_tokens", "prompt_tokens_details", "cached_tokens", "content_block", "partial_json",
    "result", "error", "sequence_number", "item", "parts", "kind",
]) | st.text(max_size=6)
SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=12) | st.sampled_from(["2.0", "tools/call", "tools/list", "message/send",
                                                    "message/stream", "function", "tool_use", "[DONE]"]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6),
                    max_leaves=30)
OBJECTS = st.dictionaries(KEYS, JSON, max_size=8)
def dumps(value) -> bytes:
    """JSON as Python writes it (any integer, \\u escapes): what agents built on it send."""
    return json.dumps(value).encode()


BODIES = st.one_of(OBJECTS.map(dumps), JSON.map(dumps), st.binary(max_size=200))

ADAPTERS: list[tuple[Adapter, list[str]]] = [
    (OpenAIAdapter(), ["/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/embeddings",
                       "/openai/deployments/Dep/chat/completions", "/custom/route"]),
    (AnthropicAdapter(), ["/v1/messages"]),
    (MCPAdapter(), ["/mcp"]),
    (A2AAdapter(), ["/a2a"]),
    (BedrockAdapter(), ["/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse",
                        "/model/us.anthropic.claude-3-5-haiku-20241022-v1%3A0/invoke",
                        "/model/meta.llama3-8b-instruct-v1:0/invoke-with-response-stream",
                        "/model/amazon.titan-text-express-v1/invoke", "/model/x.unknown/invoke"]),
]


def view(method: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> RequestView:
    return RequestView(method, "llm.internal", path, headers or {"content-type": "application/json"}, body)


# --- request bodies ----------------------------------------------------------------------


@FUZZ
@given(st.sampled_from([(a, p) for a, paths in ADAPTERS for p in paths]), BODIES)
def test_every_adapter_opens_a_body_or_refuses_it_clearly(adapter_path, body):
    adapter, path = adapter_path
    try:
        exchange = adapter.open(view("POST", path, body), session="s", persona="p")
    except BadRequest as exc:
        assert exc.message and exc.status in (400, 413)
        return
    steps = asyncio.run(adapter.steps(exchange))
    assert isinstance(steps, list) and all(isinstance(step, Step) for step in steps)
    if exchange.decision is None and steps:
        from governor.policy.steps import Decision

        rewritten = adapter.rewrite_request(exchange, Decision())
        assert rewritten is None or isinstance(rewritten, bytes)


@FUZZ
@given(st.sampled_from([a for a, _ in ADAPTERS]), st.integers(100, 599), BODIES)
def test_every_adapter_reads_any_answer_without_raising(adapter, status, answer):
    paths = dict((type(a), p) for a, p in ADAPTERS)[type(adapter)]
    valid = {OpenAIAdapter: {"model": "m", "messages": [], "max_tokens": 5},
             AnthropicAdapter: {"model": "m", "messages": [], "max_tokens": 5},
             MCPAdapter: {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}},
             A2AAdapter: {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {}},
             BedrockAdapter: {"messages": [], "inferenceConfig": {"maxTokens": 5}}}[type(adapter)]
    exchange = adapter.open(view("POST", paths[0], orjson.dumps(valid)), session="s", persona=None)
    observation = adapter.observe_response(exchange, status, {"content-type": "application/json"}, answer)
    assert isinstance(observation, Observation)


METHODS = st.sampled_from(["POST", "GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "post", "QUERY"])
PATHS = st.one_of(
    st.text(max_size=40).map(lambda t: "/" + t),
    st.lists(st.sampled_from(["v1", "V1", "chat", "Chat", "completions", "responses", "embeddings", "messages",
                              "count_tokens", "moderations", "..", ".", "", "%2F", "%2f", "%76", "%2E%2E", "mcp"]),
             max_size=7).map(lambda parts: "/" + "/".join(parts)),
)


@FUZZ
@given(METHODS, PATHS, BODIES, st.sampled_from(["application/json", "text/plain", ""]))
def test_selection_decides_every_request_without_raising(method, path, body, content_type):
    registry = AdapterRegistry.default()
    selected = registry.select(view(method, path, body, {"content-type": content_type}))
    assert selected is None or selected == IGNORE or isinstance(selected, (Adapter, Refusal))
    if isinstance(selected, Refusal):
        assert selected.status in (403, 405) and selected.message


@FUZZ
@given(PATHS)
def test_normalized_paths_have_one_spelling(path):
    route = normalize_path(path)
    assert route.startswith("/") and "//" not in route and "?" not in route
    assert route == "/" or not route.endswith("/")
    assert not any(segment in (".", "..") for segment in route.split("/"))


@FUZZ_SLOW
@given(OBJECTS, st.sampled_from(["messages", "prompt", "input"]),
       st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32"]), st.booleans())
def test_a_model_call_is_recognised_however_its_json_is_encoded(body, key, encoding, escaped):
    body = {**body, "model": "m", key: body.get(key, "x")}
    text = json.dumps(body, ensure_ascii=False)
    if escaped:
        text = text.replace('"model"', '"\\u006dodel"', 1)
    assert model_shaped(text.encode(encoding))


@FUZZ
@given(st.binary(max_size=300) | JSON.map(dumps))
def test_the_sniff_reads_any_bytes_without_raising(content):
    assert model_shaped(content) in (True, False)
    try:
        parsed = orjson.loads(content)
    except orjson.JSONDecodeError:
        return
    if shape_of(parsed):
        assert model_shaped(content)  # the byte search never rules out what a parse finds


# --- compressed bodies -------------------------------------------------------------------

ENCODERS = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress}


@FUZZ
@given(st.binary(max_size=2000), st.lists(st.sampled_from(sorted(ENCODERS)), min_size=1, max_size=3))
def test_compressed_bodies_decode_to_what_was_compressed(data, codings):
    body = data
    for coding in codings:
        body = ENCODERS[coding](body)
    assert bodies.decode(body, codings, bodies.Bounds(1 << 20)) == data


@FUZZ
@given(st.binary(max_size=400), st.sampled_from(["gzip", "x-gzip", "deflate", "br", "zstd", "compress", "base64"]),
       st.integers(0, 64))
def test_any_bytes_under_any_coding_decode_or_fail_clearly(data, coding, flip):
    """Arbitrary bytes, and real compressed bodies with one byte changed or cut short."""
    for body in (data, _damaged(ENCODERS.get(coding, gzip.compress)(data), flip)):
        try:
            out = bodies.decode(body, [coding], bodies.Bounds(4096, ratio=50, ratio_floor=1024))
        except bodies.BodyError as exc:
            assert exc.status in (400, 413, 415) and exc.message
        else:
            assert len(out) <= 4096


def _damaged(body: bytes, flip: int) -> bytes:
    if not body:
        return body
    if flip % 2:
        return body[: flip % len(body)]
    i = flip % len(body)
    return body[:i] + bytes([body[i] ^ 0x55]) + body[i + 1:]


# --- SSE ---------------------------------------------------------------------------------

EVENT_NAMES = st.sampled_from([None, "message", "message_start", "message_delta", "content_block_start",
                               "content_block_delta", "content_block_stop", "message_stop", "error",
                               "response.output_text.delta", "response.completed", "response.output_item.done"])


def _event(name, data) -> bytes:
    return (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + dumps(data) + b"\n\n"


SSE_STREAMS = st.one_of(
    st.lists(st.tuples(EVENT_NAMES, OBJECTS), max_size=12).map(lambda evs: b"".join(_event(n, d) for n, d in evs)),
    st.lists(st.tuples(EVENT_NAMES, OBJECTS), max_size=6).map(
        lambda evs: b"".join(_event(n, d) for n, d in evs) + b"data: [DONE]\n\n"),
    st.binary(max_size=400),
    st.lists(st.sampled_from([b"data: {", b"}\n", b"\r\n", b"\r", b"\n\n", b"data: [DONE]", b": c\n",
                              b"event: x\n", b"\xff\xfe", b"data: {\"choices\": [{\"delta\": {}}]}\n\n"]),
             max_size=30).map(b"".join),
)
CUTS = st.lists(st.integers(0, 10_000), max_size=10)


def chunked(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(stream) + 1) for c in cuts}) + [len(stream)]
    out, start = [], 0
    for point in points:
        if point > start:
            out.append(stream[start:point])
        start = point
    return out


def watchers():
    """A fresh watcher of every kind, each on an exchange opened from a valid request."""
    event_stream = {"content-type": "text/event-stream"}
    made = []
    openai = OpenAIAdapter()
    for path, body in (("/v1/chat/completions", {"model": "m", "messages": [], "stream": True, "max_tokens": 3}),
                       ("/v1/completions", {"model": "m", "prompt": "p", "stream": True, "max_tokens": 3}),
                       ("/v1/responses", {"model": "m", "input": "x", "stream": True, "max_output_tokens": 3})):
        exchange = openai.open(view("POST", path, orjson.dumps(body)), session="s", persona=None)
        made.append(openai.stream_watcher(exchange, 200, event_stream))
    anthropic = AnthropicAdapter()
    exchange = anthropic.open(view("POST", "/v1/messages", orjson.dumps(
        {"model": "m", "messages": [], "stream": True, "max_tokens": 3})), session="s", persona=None)
    made.append(anthropic.stream_watcher(exchange, 200, event_stream))
    mcp = MCPAdapter()
    for method in ("tools/call", "resources/read"):
        exchange = mcp.open(view("POST", "/mcp", orjson.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"name": "t"}})), session="s", persona=None)
        made.append(mcp.stream_watcher(exchange, 200, event_stream))
    a2a = A2AAdapter()
    exchange = a2a.open(view("POST", "/a2a", orjson.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": {}})), session="s", persona=None)
    made.append(a2a.stream_watcher(exchange, 200, event_stream))
    assert all(w is not None for w in made)
    return made


@FUZZ_SLOW
@given(SSE_STREAMS, CUTS)
def test_every_stream_watcher_reads_any_stream_in_any_chunking(stream, cuts):
    for watcher in watchers():
        events = []
        for chunk in chunked(stream, cuts):
            events += watcher.feed(chunk)
        events += watcher.close()
        assert all(isinstance(event, Step) for event in events)
        assert isinstance(watcher.terminal("cut", {"cause": "on_budget_exhausted", "action": "halt"}), bytes)


@FUZZ
@given(st.binary(min_size=1, max_size=64).filter(lambda b: b"\n" not in b and b"\r" not in b),
       st.sampled_from([b"data: ", b"", b": ", b"data:"]), st.integers(1, 300))
def test_a_stream_without_boundaries_is_refused_past_the_limit(line, prefix, lines):
    """An event that never ends (one endless line, or data lines without a blank line)
    raises EventTooLarge once past the limit; until then the decoder holds at most it."""
    limit = 2048
    decoder = sse.SSEDecoder(limit)
    piece = prefix + line + (b"\n" if prefix.startswith(b"data") else b"")
    fed = 0
    try:
        for _ in range(lines):
            decoder.feed(piece)
            fed += len(piece)
            assert len(decoder._buf) + decoder._held <= limit
    except sse.EventTooLarge as exc:
        assert "without an event boundary" in str(exc)
        assert fed + len(piece) > limit
        assert decoder.idle  # what it held is let go
    else:
        # comment lines are dropped as they come; data lines and an endless line stayed under it
        assert prefix == b": " or fed - (lines if prefix.startswith(b"data") else 0) <= limit


# --- ADL-* headers -----------------------------------------------------------------------

NAMES = st.one_of(
    st.sampled_from([b"ADL-Session", b"adl-session", b"ADL-PERSONA", b"Adl-Passport", b"ADL-", b"adl",
                     b"Content-Encoding", b"content-encoding", b"CONTENT-ENCODING", b"X-ADL-Session", b"Host"]),
    st.binary(min_size=1, max_size=12),
)


@FUZZ
@given(st.lists(st.tuples(NAMES, st.binary(max_size=16)), max_size=10))
def test_the_adl_header_scan_reads_any_fields(fields):
    found, encoded = scan_headers(tuple(fields))
    assert encoded is any(name.lower() == b"content-encoding" for name, _ in fields)
    assert all(key.startswith("adl-") and key == key.lower() for key in found)
    headers = http.Headers(fields)
    for name, _ in fields:
        if name[:4].lower() == b"adl-" and name.isascii():
            assert found[name.decode().lower()] == headers.get(name.decode())
