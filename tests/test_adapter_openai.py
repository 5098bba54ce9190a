"""The OpenAI adapter alone: matching, parsing, estimation, rewriting, observing, and the
stream watchers fed the same stream cut at arbitrary byte boundaries."""

from __future__ import annotations

import asyncio
import types
from unittest import mock

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.adapters import AdapterRegistry
from governor.adapters.base import AdapterConfig
from governor.adapters.refusals import status_for
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters import openai_streams
from governor.adapters.openai import OpenAIAdapter
from governor.adapters.openai_streams import OpenAIWatcher as StreamWatcherBase  # the general path: the line decoder
from governor.adapters.sse import SSEDecoder, last_boundary
from governor.policy.steps import Action, Decision, ModelCall, ToolCall, UsageReport

ADAPTER = OpenAIAdapter(AdapterConfig(default_output_tokens=1234))


def view(path: str, body: object, method: str = "POST") -> RequestView:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return RequestView(method, "llm.internal", path, {"content-type": "application/json"}, raw)


def open_(path: str, body: object):
    return ADAPTER.open(view(path, body), session="s", persona="p")


CHAT_TOOLS = [{"type": "function", "function": {"name": "search_papers"}},
              {"type": "function", "function": {"name": "send_email"}}]


@pytest.mark.parametrize("path, expected", [
    ("/v1/chat/completions", True),
    ("/openai/deployments/gpt4/chat/completions?api-version=2024-10-21", True),  # Azure
    ("/v1/responses", True),
    ("/v1/responses/resp_123", False),  # retrieve, not a model call
    ("/v1/embeddings", True),  # billable input tokens
    ("/v1/completions", True),  # legacy text completions
    ("/openai/deployments/Ada/embeddings?api-version=2024-10-21", True),
    ("/V1/Chat/Completions/", True),  # as case-folding, slash-stripping routers route it
    ("/v1/chat%2Fcompletions", True),  # as percent-decoding routers route it
    ("/v1//chat/./completions", True),
    ("/v1/models", False),
    ("/v1/moderations", False),
    ("/v1/messages", False),
])
def test_match_by_path_not_host(path, expected):
    assert ADAPTER.match(view(path, {})) is expected
    assert ADAPTER.match(view(path, {}, method="GET")) is False


def test_registry_picks_adapters_in_order():
    registry = AdapterRegistry.default()
    assert registry.select(view("/v1/chat/completions", {})).name == "openai"
    assert registry.select(view("/v1/messages", {})).name == "anthropic"
    assert registry.select(view("/v1/embeddings", {})).name == "openai"
    assert registry.select(view("/v1/models", {}, method="GET")) is None


def test_open_estimates_expected_tokens():
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 10,
            "max_completion_tokens": 77, "tools": CHAT_TOOLS}
    exchange = open_("/v1/chat/completions", body)
    [step] = asyncio.run(ADAPTER.steps(exchange))
    assert step == ModelCall(model="gpt-4o", expected_input_tokens=-(-len(orjson.dumps(body)) // 4),
                             expected_output_tokens=77, tools_offered=("search_papers", "send_email"),
                             persona="p", provider="openai", output_floor=256)  # fitting on, by default
    responses = open_("/v1/responses", {"model": "o3", "input": "hi"})
    assert responses.state["expected_output"] == 1234  # no max_output_tokens: the configured default
    azure = open_("/openai/deployments/my-gpt/chat/completions", {"messages": []})
    assert azure.model == "my-gpt"


@pytest.mark.parametrize("body, message", [
    (b"{nope", "not valid JSON"),
    ([1, 2], "JSON object"),
    ({"model": "m"}, "'messages'"),
    ({"model": 3, "messages": []}, "'model'"),
    ({"model": "m", "messages": [], "tools": "all"}, "'tools'"),
])
def test_open_rejects_what_it_cannot_govern(body, message):
    with pytest.raises(BadRequest, match=message):
        open_("/v1/chat/completions", body)


def test_rewrite_limits_tools_and_asks_for_stream_usage():
    exchange = open_("/v1/chat/completions", {
        "model": "m", "stream": True, "messages": [], "tools": CHAT_TOOLS, "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "function": {"name": "send_email"}},
        "stream_options": {"include_obfuscation": False}})
    body = orjson.loads(ADAPTER.rewrite_request(exchange, Decision(allowed_tools=frozenset({"search_papers"}))))
    assert [t["function"]["name"] for t in body["tools"]] == ["search_papers"]
    assert "tool_choice" not in body and body["parallel_tool_calls"] is False
    assert body["stream_options"] == {"include_obfuscation": False, "include_usage": True}
    # nothing allowed: no tools, and nothing that only makes sense with tools
    exchange = open_("/v1/chat/completions", {"model": "m", "messages": [], "tools": CHAT_TOOLS,
                                              "tool_choice": "required", "parallel_tool_calls": True})
    body = orjson.loads(ADAPTER.rewrite_request(exchange, Decision(allowed_tools=frozenset())))
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(body)
    # nothing to change: the client's bytes go upstream untouched
    exchange = open_("/v1/chat/completions", {"model": "m", "messages": [], "tools": CHAT_TOOLS,
                                              "stream": True, "stream_options": {"include_usage": True}})
    assert ADAPTER.rewrite_request(exchange, Decision()) is None


def test_observe_plain_responses():
    chat = open_("/v1/chat/completions", {"model": "m", "messages": []})
    body = orjson.dumps({"model": "m-2024", "choices": [{"message": {"tool_calls": [
        {"function": {"name": "read_note", "arguments": '{"path": "/n/a.md"}'}},
        {"function": {"name": "bad_args", "arguments": "{oops"}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}}})
    observation = ADAPTER.observe_response(chat, 200, {}, body)
    assert observation.usage == UsageReport(model="m-2024", input_tokens=10, output_tokens=5,
                                            cached_input_tokens=4, persona="p")
    assert observation.steps == [
        ToolCall(tool="read_note", arguments={"path": "/n/a.md"}, target_path="/n/a.md", persona="p", origin="model"),
        ToolCall(tool="bad_args", arguments={"_raw": "{oops"}, persona="p", origin="model")]
    assert ADAPTER.observe_response(chat, 200, {}, b"<html>").usage is None
    assert ADAPTER.observe_response(chat, 500, {}, body).usage is None


def test_errors_and_status_mapping():
    reply = ADAPTER.error_response(429, "no", {"cause": "on_budget_exhausted", "action": "halt"})
    assert reply.status == 429
    assert orjson.loads(reply.body) == {"error": {"message": "no", "type": "governor_limit_reached", "param": None,
                                                  "code": "on_budget_exhausted",
                                                  "governor": {"cause": "on_budget_exhausted", "action": "halt"}}}
    assert status_for(Decision(action=Action.HALT, cause="on_budget_exhausted")) == 429
    assert status_for(Decision(action=Action.HALT, cause="on_governor_error")) == 503
    assert status_for(Decision(action=Action.DENY, cause="on_delegation_denied")) == 403


# --- streams ---------------------------------------------------------------------------


def chat_stream() -> bytes:
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hé"}}]},
        {**chunk, "choices": [{"index": 0, "delta": {"content": "llo"}}]},
        {**chunk, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "a", "function": {"name": "search_papers", "arguments": '{"que'}}]}}]},
        {**chunk, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": 'ry": "llm"}'}}]}}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {**chunk, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9,
                                           "prompt_tokens_details": {"cached_tokens": 2}}},
    ]
    return b"".join(b"data: " + orjson.dumps(e) + b"\r\n\r\n" for e in events) + b": keep-alive\n\ndata: [DONE]\n\n"


def run_watcher(adapter, exchange, chunks):
    watcher = adapter.stream_watcher(exchange, 200, {"content-type": "text/event-stream"})
    events = []
    for chunk in chunks:
        events += watcher.feed(chunk)
    return watcher, events + watcher.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_chat_watcher_is_indifferent_to_chunk_boundaries(cuts):
    data = chat_stream()
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]
    # max_tokens 1: the running figures soon pass what the call was admitted with
    exchange = open_("/v1/chat/completions", {"model": "m", "stream": True, "messages": [], "max_tokens": 1})
    watcher, events = run_watcher(ADAPTER, exchange, chunks)
    tools = [e for e in events if isinstance(e, ToolCall)]
    assert tools == [ToolCall(tool="search_papers", arguments={"query": "llm"}, persona="p", origin="model")]
    final = events[-1]
    assert final == UsageReport(model="m", input_tokens=7, output_tokens=9, cached_input_tokens=2, persona="p")
    running = [e for e in events[:-1] if isinstance(e, UsageReport)]
    assert running and all(not r.final for r in running)
    assert all(r.output_tokens > 1 for r in running)  # only figures past the admission
    assert [r.output_tokens for r in running] == sorted(r.output_tokens for r in running)  # never goes down


def test_running_figures_within_the_admission_are_not_reported():
    exchange = open_("/v1/chat/completions", {"model": "m", "stream": True, "messages": [], "max_tokens": 100})
    _, events = run_watcher(ADAPTER, exchange, [chat_stream()])
    reports = [e for e in events if isinstance(e, UsageReport)]
    assert reports == [UsageReport(model="m", input_tokens=7, output_tokens=9, cached_input_tokens=2, persona="p")]


def test_chat_terminal_is_what_the_sdk_raises_on():
    exchange = open_("/v1/chat/completions", {"model": "m", "stream": True, "messages": []})
    data = chat_stream()
    watcher, _ = run_watcher(ADAPTER, exchange, [data[: data.index(b"\r\n\r\n") + 4]])
    terminal = watcher.terminal("cut", {"cause": "on_budget_exhausted"})
    decoder = SSEDecoder()
    events = decoder.feed(terminal)
    assert last_boundary(terminal) == len(terminal)
    assert orjson.loads(events[0].data)["choices"][0]["finish_reason"] == "length"
    assert orjson.loads(events[0].data)["id"] == "c1"
    assert orjson.loads(events[1].data)["error"]["governor"] == {"cause": "on_budget_exhausted"}
    assert events[2].data == "[DONE]"


def test_cut_chat_stream_charges_the_estimate_not_less():
    exchange = open_("/v1/chat/completions", {"model": "m", "stream": True, "messages": []})
    text = b"".join(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + b"x" * 40 + b'"}}]}\n\n'
                    for _ in range(10))
    watcher, events = run_watcher(ADAPTER, exchange, [text])
    final = events[-1]
    assert final.final and final.output_tokens == 100  # 400 bytes / 4
    assert final.input_tokens == exchange.state["expected_input"]


def test_responses_watcher_usage_tool_calls_and_terminal():
    exchange = open_("/v1/responses", {"model": "m", "stream": True, "input": "hi"})
    events = [
        ("response.output_text.delta", {"delta": "abcd"}),
        ("response.output_item.done", {"item": {"type": "function_call", "name": "fetch_paper",
                                                "arguments": '{"paper_id": "p1"}'}}),
        ("response.completed", {"response": {"model": "m-x", "usage": {
            "input_tokens": 30, "output_tokens": 8, "input_tokens_details": {"cached_tokens": 3}}}}),
    ]
    raw = b"".join(b"event: " + n.encode() + b"\ndata: " + orjson.dumps({"type": n, "sequence_number": i, **d})
                   + b"\n\n" for i, (n, d) in enumerate(events))
    watcher, out = run_watcher(ADAPTER, exchange, [raw[:50], raw[50:]])
    assert [e.tool for e in out if isinstance(e, ToolCall)] == ["fetch_paper"]
    assert out[-1] == UsageReport(model="m-x", input_tokens=30, output_tokens=8, cached_input_tokens=3, persona="p")
    [event] = SSEDecoder().feed(watcher.terminal("cut", {"cause": "on_budget_exhausted"}))
    data = orjson.loads(event.data)
    assert event.event == "error" and data["sequence_number"] == 3
    assert data["error"]["governor"]["cause"] == "on_budget_exhausted"


@pytest.mark.parametrize("text_bytes, reported", [(40, False), (41, True)])
def test_a_running_estimate_is_reported_from_the_first_byte_past_the_admission(text_bytes, reported):
    # max_tokens 10 at 4 bytes per token: the admission covers 40 bytes of output
    exchange = open_("/v1/chat/completions", {"model": "m", "stream": True, "messages": [], "max_tokens": 10})
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": {"content": "x" * text_bytes}}]}
    watcher = ADAPTER.stream_watcher(exchange, 200, {"content-type": "text/event-stream"})
    running = [e for e in watcher.feed(b"data: " + orjson.dumps(chunk) + b"\n\n") if isinstance(e, UsageReport)]
    assert [r.output_tokens for r in running] == ([11] if reported else [])


# A chat chunk as providers send them, with the parts that matter to the watcher drawn at
# random: text (any Unicode), tool-call deltas, finish reasons, usage, errors, garbage.
_chunk_text = st.text(max_size=12)
_chat_deltas = st.one_of(
    st.fixed_dictionaries({"content": _chunk_text}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.one_of(st.none(), _chunk_text)}),
    st.fixed_dictionaries({"tool_calls": st.lists(st.fixed_dictionaries({
        "index": st.integers(0, 2), "function": st.fixed_dictionaries(
            {}, optional={"name": st.sampled_from(["search_papers", "send_email"]), "arguments": _chunk_text})}),
        max_size=2)}),
    st.just({}),
)
_chat_chunks = st.one_of(
    st.builds(lambda delta, finish, usage: {
        "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": usage},
        _chat_deltas, st.sampled_from([None, None, None, "stop", "tool_calls"]),
        st.one_of(st.none(), st.none(), st.fixed_dictionaries(
            {"prompt_tokens": st.integers(0, 99), "completion_tokens": st.integers(0, 99)}))),
    st.just({"error": {"message": "overloaded"}}),
    st.just({"id": "c1", "choices": [{"index": 0, "delta": {"content": "a\"b\\c"}}]}),  # escapes
    # shapes the watcher's shortest path (one choice, text only) must leave to the general one
    st.builds(lambda a, b: {"id": "c1", "choices": [{"index": 0, "delta": {"content": a}},
                                                    {"index": 1, "delta": {"content": b}}]}, _chunk_text, _chunk_text),
    st.builds(lambda text: {"choices": [{"index": 0, "delta": {"content": text}}]}, _chunk_text),  # no id
    st.builds(lambda text: {"id": "c2", "model": "m2", "created": 2,
                            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}, _chunk_text),
)
_chat_events = st.lists(st.one_of(
    _chat_chunks.map(orjson.dumps), st.just(b"[DONE]"), st.just(b"{not json"),
    # invalid UTF-8 in a tool call: read leniently (U+FFFD), as the line decoder reads it
    st.just(b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"send_email",'
            b'"arguments":"{\\"to\\": \\"\xff\\"}"}}]},"finish_reason":"tool_calls"}]}')), max_size=12)


@settings(max_examples=200, deadline=None)
@given(_chat_events, st.integers(1, 40))
def test_whole_event_chunks_read_as_the_line_decoder_reads_them(events, max_tokens):
    """One event per chunk takes the watcher's short path (the JSON parsed from the bytes as
    they came); the same stream in one chunk goes through the line decoder. Both must see
    the same tool calls, running figures and final usage, and count the same text."""
    body = {"model": "m", "stream": True, "messages": [], "max_tokens": max_tokens}
    chunks = [b"data: " + event + b"\n\n" for event in events]
    # a stream that never says when it was created is stamped with the clock when its watcher
    # starts; a fixed clock keeps the two watchers from straddling a second boundary
    with mock.patch.object(openai_streams, "time", types.SimpleNamespace(time=lambda: 1_795_491_011.5)):
        split, split_events = run_watcher(ADAPTER, open_("/v1/chat/completions", body), chunks)
        whole, whole_events = run_watcher(ADAPTER, open_("/v1/chat/completions", body), [b"".join(chunks)])
    assert split_events == whole_events
    # and chunk by chunk: what each chunk reports is what the line decoder reports for it
    short = ADAPTER.stream_watcher(open_("/v1/chat/completions", body), 200, {"content-type": "text/event-stream"})
    general = ADAPTER.stream_watcher(open_("/v1/chat/completions", body), 200, {"content-type": "text/event-stream"})
    for chunk in chunks:
        assert short.feed(chunk) == StreamWatcherBase.feed(general, chunk)
        assert (short.generated_bytes, short.reported, short.usage) == \
            (general.generated_bytes, general.reported, general.usage)
    assert split.generated_bytes == whole.generated_bytes
    assert (split.chunk_id, split.model, split.created) == (whole.chunk_id, whole.model, whole.created)
    assert split.completed == whole.completed


def test_a_chunk_after_a_partial_event_is_not_read_on_its_own():
    """The short path is for chunks that start on an event boundary: after a data line with
    no blank line yet, the next `data:` line belongs to the same event (SSE joins them), and
    two JSON documents joined by a line feed are not a chunk the watcher can read."""
    exchange = open_("/v1/chat/completions", {"model": "m", "stream": True, "messages": [], "max_tokens": 100})
    watcher = ADAPTER.stream_watcher(exchange, 200, {"content-type": "text/event-stream"})
    watcher.feed(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"abc"}}]}\n\n')
    assert watcher.generated_bytes == 3
    assert watcher.feed(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"de"}}]}\n') == []
    watcher.feed(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"fg"}}]}\n\n')
    assert watcher.generated_bytes == 3
