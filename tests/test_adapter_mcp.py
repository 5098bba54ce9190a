"""The MCP adapter: matching, steps, tools/list filtering, tool errors, refusals."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from governor.adapters import AdapterRegistry
from governor.adapters.base import AdapterConfig
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE, parse_events
from governor.adapters.mcp import MCPAdapter, target_path
from governor.policy.steps import Action, Decision, ToolCall, ToolError

JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream"}


def view(body, *, method="POST", path="/mcp", headers=None, host="tools.internal") -> RequestView:
    content = body if isinstance(body, bytes) else (b"" if body is None else orjson.dumps(body))
    return RequestView(method, host, path, {**JSON, **(headers or {})}, content, port=8000, scheme="http")


def call(name="read_file", arguments=None, rpc_id=7):
    params = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}


def listing(rpc_id=3):
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/list", "params": {}}


TOOLS = [{"name": n, "inputSchema": {"type": "object"}} for n in ("read_file", "delete_file", "shell")]


def sse(*payloads, event_ids=None) -> bytes:
    out = b""
    for i, payload in enumerate(payloads):
        if event_ids:
            out += f"id: {event_ids[i]}\r\n".encode()
        out += b"event: message\r\ndata: " + orjson.dumps(payload) + b"\r\n\r\n"
    return out


# --- matching --------------------------------------------------------------------------


@pytest.mark.parametrize("body, headers, method, expected", [
    (call(), {}, "POST", True),
    ({"jsonrpc": "2.0", "method": "notifications/initialized"}, {}, "POST", True),
    ([{"jsonrpc": "2.0", "method": "notifications/initialized"}, listing()], {}, "POST", True),
    (None, {"mcp-session-id": "abc"}, "GET", True),  # the server-to-client event stream
    (None, {"mcp-session-id": "abc"}, "DELETE", True),
    ({"jsonrpc": "2.0", "id": 1, "result": {}}, {"mcp-protocol-version": "2025-06-18"}, "POST", True),
    ({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}}, {}, "POST", False),  # A2A
    ({"model": "gpt-4o", "messages": []}, {}, "POST", False),
    ({"jsonrpc": "1.0", "id": 1, "method": "tools/call"}, {}, "POST", False),
    (b"not json", {}, "POST", False),
    (call(), {}, "GET", False),
])
def test_match_by_body_shape_or_transport_headers(body, headers, method, expected):
    assert MCPAdapter().match(view(body, method=method, headers=headers)) is expected


def test_registry_picks_mcp_on_any_host_and_path():
    registry = AdapterRegistry.default()
    chosen = registry.select(view(call(), path="/some/where", host="10.1.2.3"))
    assert getattr(chosen, "name", None) == "mcp"


# --- steps -----------------------------------------------------------------------------


async def test_tools_call_is_a_tool_call_step_with_target_path():
    adapter = MCPAdapter()
    exchange = adapter.open(view(call("read_file", {"Path": "/etc/hosts", "n": 3})), session="s", persona="helper")
    steps = await adapter.steps(exchange)
    assert steps == [ToolCall(tool="read_file", arguments={"Path": "/etc/hosts", "n": 3},
                              target_path="/etc/hosts", persona="helper")]


@pytest.mark.parametrize("arguments, expected", [
    ({"uri": "file:///srv/data/a%20b.txt"}, "/srv/data/a b.txt"),
    ({"url": "https://example.com/x"}, "https://example.com/x"),
    ({"file": "notes.md", "path": "/first/wins"}, "/first/wins"),
    ({"query": "select 1"}, None),
    ({"path": 42}, None),
    ({}, None),
])
def test_target_path_rule(arguments, expected):
    assert target_path(arguments) == expected


async def test_calls_without_arguments_and_other_methods():
    adapter = MCPAdapter()
    no_args = adapter.open(view(call("list_things")), session="s", persona=None)
    assert await adapter.steps(no_args) == [ToolCall(tool="list_things", arguments={})]
    init = adapter.open(view({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}),
                        session="s", persona=None)
    assert await adapter.steps(init) == []


@pytest.mark.parametrize("body, fragment", [
    ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}, "params.name"),
    ({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}, "params.name"),
    (call("x", arguments=[1, 2]), "must be an object"),
    ([call("a", {}, 1), call("b", {}, 2)], "batch"),
    ([listing(), {"jsonrpc": "2.0", "method": "notifications/initialized"}], "batch"),
])
def test_ungovernable_requests_are_refused(body, fragment):
    with pytest.raises(BadRequest, match=fragment):
        MCPAdapter().open(view(body), session="s", persona=None)


async def test_a_batch_without_governed_methods_passes():
    adapter = MCPAdapter()
    batch = [{"jsonrpc": "2.0", "method": "notifications/initialized"}, {"jsonrpc": "2.0", "id": 1, "method": "ping"}]
    assert await adapter.steps(adapter.open(view(batch), session="s", persona=None)) == []


# --- tools/list filtering --------------------------------------------------------------


def _allowed(session, persona):
    return {None: frozenset({"read_file", "shell"}), "reader": frozenset({"read_file"})}[persona]


async def _allowed_async(session, persona):
    await asyncio.sleep(0)
    return _allowed(session, persona)


@pytest.mark.parametrize("provider", [_allowed, _allowed_async])
async def test_tools_list_json_answer_is_filtered(provider):
    adapter = MCPAdapter(AdapterConfig(extra={"allowed_tools": provider}))
    exchange = adapter.open(view(listing()), session="s", persona="reader")
    assert await adapter.steps(exchange) == []
    body = orjson.dumps({"jsonrpc": "2.0", "id": 3, "result": {"tools": TOOLS, "nextCursor": "c2"}})
    assert adapter.stream_watcher(exchange, 200, JSON) is None
    observed = adapter.observe_response(exchange, 200, JSON, body)
    result = orjson.loads(observed.replace_body)["result"]
    assert [t["name"] for t in result["tools"]] == ["read_file"] and result["nextCursor"] == "c2"


async def test_tools_list_sse_answer_is_filtered_in_place():
    adapter = MCPAdapter(AdapterConfig(extra={"allowed_tools": _allowed}))
    exchange = adapter.open(view(listing(rpc_id="L1")), session="s", persona=None)
    await adapter.steps(exchange)
    progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
    answer = {"jsonrpc": "2.0", "id": "L1", "result": {"tools": TOOLS}}
    body = b": keep-alive\r\n\r\n" + sse(progress, answer, event_ids=["e1", "e2"])
    assert adapter.stream_watcher(exchange, 200, SSE) is None  # buffered so it can be rewritten
    new = adapter.observe_response(exchange, 200, SSE, body).replace_body
    events = parse_events(new)
    assert orjson.loads(events[0].data) == progress
    assert [t["name"] for t in orjson.loads(events[1].data)["result"]["tools"]] == ["read_file", "shell"]
    # Every other byte is kept, the rewritten event keeps its id.
    assert new.startswith(b": keep-alive\r\n\r\n" + sse(progress, event_ids=["e1"]) + b"id: e2\nevent: message\ndata: ")


async def test_tools_list_untouched_without_a_provider_or_when_all_allowed():
    plain = MCPAdapter()
    exchange = plain.open(view(listing()), session="s", persona=None)
    await plain.steps(exchange)
    body = orjson.dumps({"jsonrpc": "2.0", "id": 3, "result": {"tools": TOOLS}})
    assert plain.observe_response(exchange, 200, JSON, body).replace_body is None
    everything = MCPAdapter(AdapterConfig(extra={"allowed_tools": lambda s, p: None}))
    exchange = everything.open(view(listing()), session="s", persona=None)
    await everything.steps(exchange)
    assert everything.observe_response(exchange, 200, JSON, body).replace_body is None


# --- tool results ----------------------------------------------------------------------


def _observe(response_payload=None, *, status=200, headers=JSON, body=None):
    adapter = MCPAdapter()
    exchange = adapter.open(view(call("shell", {"cmd": "ls"})), session="s", persona="ops")
    if body is None:
        body = orjson.dumps(response_payload)
    return adapter.observe_response(exchange, status, headers, body)


def test_is_error_result_is_a_tool_error_step():
    observed = _observe({"jsonrpc": "2.0", "id": 7, "result": {
        "content": [{"type": "text", "text": "permission denied"}], "isError": True}})
    assert observed.steps == [ToolError("shell", "permission denied", "ops")]


def test_jsonrpc_error_and_5xx_are_tool_errors_success_is_not():
    observed = _observe({"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "Unknown tool"}})
    assert observed.steps == [ToolError("shell", "JSON-RPC error: Unknown tool", "ops")]
    assert _observe(status=502, body=b"bad gateway").steps == [ToolError("shell", "tool server answered HTTP 502", "ops")]
    ok = _observe({"jsonrpc": "2.0", "id": 7, "result": {"content": [], "isError": False}})
    assert ok.steps == [] and ok.replace_body is None
    assert _observe(body=b"{garbage").steps == []
    other_id = _observe({"jsonrpc": "2.0", "id": 8, "result": {"content": [], "isError": True}})
    assert other_id.steps == []


async def test_streamed_tool_error_is_seen_whatever_the_chunking():
    adapter = MCPAdapter()
    exchange = adapter.open(view(call("shell", {"cmd": "ls"}, rpc_id="c-9")), session="s", persona=None)
    body = sse({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 0.5}},
               {"jsonrpc": "2.0", "id": "c-9", "result": {"content": [{"type": "text", "text": "boom"}],
                                                          "isError": True}})
    for size in (1, 2, 7, len(body)):
        watcher = adapter.stream_watcher(exchange, 200, SSE)
        seen = []
        for i in range(0, len(body), size):
            seen += watcher.feed(body[i:i + size])
        seen += watcher.close()
        assert seen == [ToolError("shell", "boom", None)], size
        assert watcher.usage is None


async def test_cut_stream_ends_with_a_jsonrpc_error_for_the_pending_call():
    adapter = MCPAdapter()
    exchange = adapter.open(view(call("shell", {}, rpc_id=5)), session="s", persona=None)
    watcher = adapter.stream_watcher(exchange, 200, SSE)
    watcher.feed(b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/pro')
    tail = watcher.terminal("governor: halt (on_oversight_timeout)", {"cause": "on_oversight_timeout"})
    assert tail.startswith(b"\n\n")
    events = parse_events(tail)
    last = orjson.loads(events[-1].data)
    assert last["id"] == 5 and last["error"]["code"] == GOVERNOR_ERROR_CODE
    assert last["error"]["data"]["governor"]["cause"] == "on_oversight_timeout"


# --- refusals and fallbacks ------------------------------------------------------------


def test_refusal_is_a_jsonrpc_error_with_the_same_id_over_http_200():
    adapter = MCPAdapter()
    exchange = adapter.open(view(call("delete_file", {"path": "/x"}, rpc_id="abc")), session="s", persona=None)
    governor = {"cause": "on_tool_error", "action": "halt", "tool": "delete_file"}
    reply = adapter.error_response(403, "governor: halt", governor, exchange)
    payload = orjson.loads(reply.body)
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    assert payload == {"jsonrpc": "2.0", "id": "abc", "error": {
        "code": GOVERNOR_ERROR_CODE, "message": "governor: halt", "data": {"governor": governor}}}


def test_unreadable_request_refusal_has_null_id_and_the_status():
    reply = MCPAdapter().error_response(400, "request body is not valid JSON", None)
    payload = orjson.loads(reply.body)
    assert reply.status == 400 and payload["id"] is None and payload["error"]["code"] == -32600


def test_fallback_message_stands_in_when_no_value_is_declared():
    adapter = MCPAdapter()
    exchange = adapter.open(view(call("search", {"q": "x"}, rpc_id=5)), session="s", persona=None)
    decision = Decision(action=Action.FALLBACK, cause="on_tool_error", fallback_message="try later")
    result = orjson.loads(adapter.fallback_response(exchange, decision, {}).body)["result"]
    assert result["content"] == [{"type": "text", "text": "try later"}] and "structuredContent" not in result


def test_fallback_is_a_successful_tool_result_with_the_declared_value():
    adapter = MCPAdapter()
    exchange = adapter.open(view(call("search", {"q": "x"}, rpc_id=4)), session="s", persona=None)
    decision = Decision(action=Action.FALLBACK, cause="on_budget_exhausted", fallback_value={"hits": []},
                        fallback_message="search unavailable")
    payload = orjson.loads(adapter.fallback_response(exchange, decision, {"cause": "on_budget_exhausted"}).body)
    assert payload["id"] == 4
    result = payload["result"]
    assert result["isError"] is False and orjson.loads(result["content"][0]["text"]) == {"hits": []}
    assert result["structuredContent"] == {"hits": []}
    assert result["_meta"]["governor"]["cause"] == "on_budget_exhausted"
