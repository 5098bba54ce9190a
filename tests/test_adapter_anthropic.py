"""The Anthropic adapter alone: Messages parsing, tool limits, usage normalisation
(cache reads and writes are input), cumulative message_delta usage, terminal events."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.adapters.anthropic import AnthropicAdapter
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.sse import SSEDecoder
from governor.policy.steps import Action, Decision, ModelCall, ToolCall, UsageReport

ADAPTER = AnthropicAdapter()
TOOLS = [{"name": "search_papers", "input_schema": {}}, {"name": "send_email", "input_schema": {}}]


def open_(body: object):
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return ADAPTER.open(RequestView("POST", "api.anthropic.com", "/v1/messages", {}, raw), session="s", persona=None)


def test_match_and_steps():
    assert ADAPTER.match(RequestView("POST", "h", "/v1/messages", {}, b""))
    assert not ADAPTER.match(RequestView("POST", "h", "/v1/messages/count_tokens", {}, b""))
    assert not ADAPTER.match(RequestView("POST", "h", "/v1/messages/batches", {}, b""))
    exchange = open_({"model": "claude-x", "max_tokens": 300, "messages": [], "tools": TOOLS})
    [step] = asyncio.run(ADAPTER.steps(exchange))
    assert step.tools_offered == ("search_papers", "send_email") and step.expected_output_tokens == 300
    assert isinstance(step, ModelCall) and step.provider == "anthropic"


@pytest.mark.parametrize("body, message", [
    (b"", "not valid JSON"), ({"messages": []}, "'model'"), ({"model": "m", "messages": {}}, "'messages'"),
])
def test_bad_requests(body, message):
    with pytest.raises(BadRequest, match=message):
        open_(body)


def test_rewrite_limits_tools():
    exchange = open_({"model": "m", "messages": [], "tools": TOOLS,
                      "tool_choice": {"type": "tool", "name": "send_email"}})
    body = orjson.loads(ADAPTER.rewrite_request(exchange, Decision(allowed_tools=frozenset({"search_papers"}))))
    assert body["tools"] == [TOOLS[0]] and "tool_choice" not in body
    exchange = open_({"model": "m", "messages": [], "tools": TOOLS, "tool_choice": {"type": "any"}})
    body = orjson.loads(ADAPTER.rewrite_request(exchange, Decision(allowed_tools=frozenset())))
    assert "tools" not in body and "tool_choice" not in body
    assert ADAPTER.rewrite_request(open_({"model": "m", "messages": [], "tools": TOOLS}), Decision()) is None


def test_observe_counts_cache_reads_and_writes_as_input():
    exchange = open_({"model": "m", "messages": []})
    body = orjson.dumps({"model": "m", "content": [
        {"type": "text", "text": "hi"}, {"type": "tool_use", "name": "read_note", "input": {"path": "/n"}}],
        "usage": {"input_tokens": 5, "output_tokens": 7, "cache_creation_input_tokens": 11,
                  "cache_read_input_tokens": 13}})
    observation = ADAPTER.observe_response(exchange, 200, {}, body)
    assert observation.usage == UsageReport(model="m", input_tokens=29, output_tokens=7, cached_input_tokens=13)
    assert observation.steps == [ToolCall(tool="read_note", arguments={"path": "/n"}, target_path="/n", origin="model")]


def stream() -> bytes:
    events = [
        ("message_start", {"message": {"model": "claude-x", "usage": {
            "input_tokens": 40, "output_tokens": 1, "cache_read_input_tokens": 60}}}),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ("ping", {}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "x" * 8}}),
        ("message_delta", {"delta": {}, "usage": {"output_tokens": 5}}),
        ("content_block_stop", {"index": 0}),
        ("content_block_start", {"index": 1, "content_block": {"type": "tool_use", "name": "write_note", "input": {}}}),
        ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"path": '}}),
        ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '"/n/b"}'}}),
        ("content_block_stop", {"index": 1}),
        ("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 12}}),
        ("message_stop", {}),
    ]
    return b"".join(b"event: " + n.encode() + b"\ndata: " + orjson.dumps({"type": n, **d}) + b"\n\n"
                    for n, d in events)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3000), max_size=12))
def test_stream_usage_is_cumulative_whatever_the_chunking(cuts):
    data = stream()
    points = sorted({c % (len(data) + 1) for c in cuts})
    exchange = open_({"model": "m", "messages": [], "stream": True})
    watcher = ADAPTER.stream_watcher(exchange, 200, {"content-type": "text/event-stream"})
    events = []
    for a, b in zip([0, *points], [*points, len(data)]):
        events += watcher.feed(data[a:b])
    events += watcher.close()
    assert [e for e in events if isinstance(e, ToolCall)] == [
        ToolCall(tool="write_note", arguments={"path": "/n/b"}, target_path="/n/b", origin="model")]
    # 12 output tokens: the LAST cumulative figure, never 1 + 5 + 12
    assert events[-1] == UsageReport(model="claude-x", input_tokens=100, output_tokens=12, cached_input_tokens=60)
    assert all(not e.final for e in events[:-1] if isinstance(e, UsageReport))


def test_terminal_is_an_error_event_with_the_governor_object():
    exchange = open_({"model": "m", "messages": [], "stream": True})
    watcher = ADAPTER.stream_watcher(exchange, 200, {"content-type": "text/event-stream"})
    [event] = SSEDecoder().feed(watcher.terminal("budget", {"cause": "on_budget_exhausted", "action": "halt"}))
    assert event.event == "error"
    assert orjson.loads(event.data) == {"type": "error", "error": {"type": "rate_limit_error", "message": "budget"},
                                        "governor": {"cause": "on_budget_exhausted", "action": "halt"}}
    assert ADAPTER.stream_watcher(exchange, 400, {"content-type": "text/event-stream"}) is None


def test_fallback_message_shape():
    exchange = open_({"model": "m", "messages": []})
    reply = ADAPTER.fallback_response(exchange, Decision(action=Action.FALLBACK, fallback_value={"error": "x"}),
                                      {"cause": "on_delegation_denied"})
    body = orjson.loads(reply.body)
    assert body["type"] == "message" and body["content"] == [{"type": "text", "text": '{"error":"x"}'}]
