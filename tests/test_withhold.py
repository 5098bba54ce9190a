"""Withhold what the step may not use (issue #22 item 2): offered tools outside the
step's permitted set never reach the model, for every wire protocol, and the client is
told which (ADL-Withheld-Tools).

The real proxy on the real runtime with the bundled example passport (R2; tools[]:
search_papers, fetch_paper, read_note, write_note, delete_note, send_email; persona
`searcher`: search_papers, fetch_paper), a loopback TLS mock upstream recording what it
received, the official openai and anthropic SDKs in subprocesses, httpx for the hostile
bodies, and the `mcp` SDK's FastMCP tool server for tools/list.
"""

from __future__ import annotations

import json
import logging
import ssl

import httpx
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor.runtime.prices import price_book
from governor.adapters import withhold
from governor.adapters.base import AdapterConfig
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.openai import OpenAIAdapter
from governor.policy.steps import Decision
from tests.proxy_harness import real_sdk_env, run_python
from tests.upstreams import Behaviour

module_loop = pytest.mark.asyncio(loop_scope="module")  # the sync tests below need no loop

DECLARED = "search_papers"
FULLWIDTH = "\uff53earch_papers"  # NFKC-equal to search_papers: another tool, not declared


def chat_tool(name, **extra):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}},
            **extra}


def chat_body(*tools, **fields):
    """A chat completion request offering `tools`."""
    return {"model": "gpt-4o-mini", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
            "tools": list(tools), **fields}


def names_of(tools, kind="chat"):
    if kind == "chat":
        return [t["function"]["name"] for t in tools]
    return [t.get("name", t.get("type")) for t in tools]


env = real_sdk_env("withhold")


def _client(running) -> httpx.AsyncClient:
    context = ssl.create_default_context(cafile=str(running.ca_file))
    return httpx.AsyncClient(proxy=running.proxy_url, verify=context, trust_env=False, timeout=30)


async def _post(running, mock, path, body, session, headers=None) -> httpx.Response:
    async with _client(running) as http:
        return await http.post(f"{mock.base_url}{path}", content=json.dumps(body).encode(),
                               headers={"content-type": "application/json", "ADL-Session": session, **(headers or {})})


# --- each protocol, through its official SDK ---------------------------------------------


DROPPED = "<not sent>"
FUNCTION_SCHEMA = {"type": "object", "properties": {}}
RESPONSES_TOOLS = [{"type": "function", "name": DECLARED, "parameters": FUNCTION_SCHEMA},
                   {"type": "function", "name": "shell_exec", "parameters": FUNCTION_SCHEMA},
                   {"type": "web_search_preview"}]
ANTHROPIC_TOOLS = [{"name": DECLARED, "input_schema": FUNCTION_SCHEMA}, {"name": "shell", "input_schema": FUNCTION_SCHEMA}]

# per protocol: the SDK call (its tools and tool_choice), and what must reach the upstream and the client:
# the tools and tool_choice sent (DROPPED: not sent at all), other fields kept as sent, and the ADL-Withheld-Tools header
SDK_CASES = {
    "openai-chat": dict(
        sdk="openai", call="chat.completions", text="choices[0].message.content",
        arguments='model="gpt-4o-mini", max_tokens=64, parallel_tool_calls=True, '
                  'messages=[{"role": "user", "content": "find papers"}]',
        tools=[chat_tool(DECLARED), chat_tool("shell_exec"), chat_tool("Search_Papers"), chat_tool(FULLWIDTH)],
        choice={"type": "function", "function": {"name": "shell_exec"}},
        sent_tools=[chat_tool(DECLARED)],
        sent_choice=DROPPED,  # it named a withheld tool: dropped
        kept={"parallel_tool_calls": True},  # a tool is left: kept
        header="shell_exec, Search_Papers, %EF%BD%93earch_papers"),
    "openai-responses": dict(
        sdk="openai", call="responses", text="output_text",
        arguments='model="gpt-4o-mini", max_output_tokens=64, input="find papers"',
        tools=RESPONSES_TOOLS,
        choice={"type": "allowed_tools", "mode": "auto",
                "tools": [{"type": "function", "name": DECLARED}, {"type": "function", "name": "shell_exec"}]},
        sent_tools=RESPONSES_TOOLS[:1],
        sent_choice={"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": DECLARED}]},
        kept={}, header="shell_exec, web_search_preview"),
    "anthropic-messages": dict(
        sdk="anthropic", call="messages", text="content[0].text",
        arguments='model="claude-sonnet-4", max_tokens=64, messages=[{"role": "user", "content": "find papers"}]',
        tools=ANTHROPIC_TOOLS, choice={"type": "tool", "name": "shell"},
        sent_tools=ANTHROPIC_TOOLS[:1], sent_choice=DROPPED, kept={}, header="shell"),
}


@module_loop
@pytest.mark.parametrize("case", SDK_CASES.values(), ids=SDK_CASES.keys())
async def test_undeclared_offered_tools_never_reach_the_upstream_through_each_sdk(env, case):
    running, mock, sdk_env = env
    mock.reset()
    client = {"openai": "OpenAI", "anthropic": "Anthropic"}[case["sdk"]]
    code = f"""
import json, {case["sdk"]}
client = {case["sdk"]}.{client}(max_retries=0)
raw = client.{case["call"]}.with_raw_response.create({case["arguments"]}, tools={case["tools"]!r},
    tool_choice={case["choice"]!r}, extra_headers={{"ADL-Session": "{case["sdk"]}-{case["call"]}"}})
print(json.dumps({{"header": raw.headers.get("adl-withheld-tools"), "text": raw.parse().{case["text"]}}}))
"""
    out = await run_python(code, sdk_env)
    [received] = mock.requests
    assert received.body["tools"] == case["sent_tools"]
    assert received.body.get("tool_choice", DROPPED) == case["sent_choice"]
    assert {key: received.body.get(key) for key in case["kept"]} == case["kept"]
    assert out["header"] == case["header"]
    assert out["text"] == Behaviour().text


@module_loop
async def test_declared_tools_go_upstream_untouched_with_no_header(env):
    running, mock, _ = env
    mock.reset()
    body = chat_body(chat_tool(DECLARED), chat_tool("fetch_paper"),
                     tool_choice={"type": "function", "function": {"name": "fetch_paper"}})
    answer = await _post(running, mock, "/v1/chat/completions", body, "declared")
    assert answer.status_code == 200 and withhold.HEADER.lower() not in answer.headers
    [received] = mock.requests
    assert received.body == body


@module_loop
async def test_a_persona_is_offered_only_its_own_tools(env, caplog):
    running, mock, _ = env
    mock.reset()
    body = chat_body(chat_tool(DECLARED), chat_tool("read_note"), chat_tool("fetch_paper"))
    with caplog.at_level(logging.INFO, logger="governor.proxy"):
        answer = await _post(running, mock, "/v1/chat/completions", body, "persona", {"ADL-Persona": "searcher"})
    assert answer.status_code == 200 and answer.headers[withhold.HEADER] == "read_note"
    [line] = [r.getMessage() for r in caplog.records if "withheld" in r.getMessage()]
    assert line == (f"governor: withheld 1 tool(s) the step may not use from the request of POST "
                    f"{mock.base_url}/v1/chat/completions in session persona: read_note")
    # the same tools without the persona: the passport declares all three
    await _post(running, mock, "/v1/chat/completions", body, "persona-parent")
    narrowed, parent = mock.requests
    assert names_of(narrowed.body["tools"]) == [DECLARED, "fetch_paper"]
    assert names_of(parent.body["tools"]) == [DECLARED, "read_note", "fetch_paper"]


@module_loop
async def test_an_honest_agent_offering_undeclared_tools_is_not_halted(env):
    """Before: the offered `shell_exec` reached the model, the model called it, and
    on_governor_tool_denied halted the session. Now the model never sees it; the session goes on."""
    running, mock, _ = env
    mock.reset()
    mock.script(Behaviour(tool_calls=((DECLARED, {"query": "agents"}),)), Behaviour(), Behaviour())
    body = chat_body(chat_tool(DECLARED), chat_tool("shell_exec"))
    for _ in range(3):
        answer = await _post(running, mock, "/v1/chat/completions", body, "honest")
        assert answer.status_code == 200, answer.text
    assert all(names_of(r.body["tools"]) == [DECLARED] for r in mock.requests) and len(mock.requests) == 3


@module_loop
async def test_a_call_the_model_makes_anyway_to_a_withheld_tool_is_still_denied(env):
    running, mock, _ = env
    mock.reset()
    mock.script(Behaviour(tool_calls=(("shell_exec", {"cmd": "id"}),)))
    body = chat_body(chat_tool(DECLARED), chat_tool("shell_exec"))
    answer = await _post(running, mock, "/v1/chat/completions", body, "model-anyway")
    assert answer.status_code == 403, answer.text
    governor = answer.json()["error"]["governor"]
    assert governor["cause"] == "on_governor_tool_denied" and governor["tool"] == "shell_exec"
    assert names_of(mock.requests[0].body["tools"]) == [DECLARED]


# --- hostile bodies ----------------------------------------------------------------------


@module_loop
@pytest.mark.parametrize("path, body, message", [
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": 5}}]}, "'tools[0]'"),
    ("/v1/chat/completions", {"tools": ["shell_exec"]}, "'tools[0]'"),
    ("/v1/chat/completions", {"tools": [chat_tool(DECLARED), {"type": "function"}]}, "'tools[1]'"),
    ("/v1/chat/completions", {"tools": [{"type": ["function"], "function": {"name": DECLARED}}]}, "'tools[0]'"),
    ("/v1/chat/completions", {"tools": [chat_tool("")]}, "'tools[0]'"),
    ("/v1/chat/completions", {"functions": [{"name": None}]}, "'functions[0]'"),
    ("/v1/chat/completions", {"tools": {"name": DECLARED}}, "'tools' must be an array"),
    ("/v1/chat/completions", {"tools": [chat_tool(DECLARED)] * (withhold.MAX_TOOLS + 1)}, "at most 10000"),
    ("/v1/responses", {"tools": [{"type": "function", "name": {"x": 1}}]}, "'tools[0]'"),
    ("/v1/messages", {"tools": [{"input_schema": {}}]}, "'tools[0]'"),
    ("/v1/messages", {"tools": [{"name": ["shell"]}]}, "'tools[0]'"),
])
async def test_a_tool_the_governor_cannot_name_is_refused_before_anything_goes_upstream(env, path, body, message):
    running, mock, _ = env
    mock.reset()
    base = {"model": "gpt-4o-mini", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/responses":
        base = {"model": "gpt-4o-mini", "input": "hi"}
    answer = await _post(running, mock, path, {**base, **body}, "unnamed")
    assert answer.status_code == 400, answer.text
    assert message in answer.text
    assert mock.requests == []


@module_loop
async def test_many_undeclared_tools_are_withheld_and_the_header_stays_bounded(env):
    running, mock, _ = env
    mock.reset()
    # compact entries: the input estimate counts the request as sent (withheld tools too),
    # and the example passport allows 20,000 tokens a session
    tools = [{"function": {"name": f"u{i:04d}"}} for i in range(1500)]
    tools.insert(750, chat_tool(DECLARED))
    body = chat_body(*tools)
    answer = await _post(running, mock, "/v1/chat/completions", body, "many")
    assert answer.status_code == 200, answer.text
    header = answer.headers[withhold.HEADER]
    assert len(header) <= withhold.MAX_HEADER_CHARS + 16 and header.endswith(" more")
    assert header.startswith("u0000, u0001, ")
    [received] = mock.requests
    assert names_of(received.body["tools"]) == [DECLARED]


@module_loop
async def test_nothing_undeclared_slips_through_by_shape(env):
    """Duplicates, a second name on the same entry, a header-breaking name, legacy functions."""
    running, mock, _ = env
    mock.reset()
    smuggled = {"type": "function", "function": {"name": DECLARED, "parameters": {}}, "name": "shell_exec"}
    body = chat_body(chat_tool(DECLARED), chat_tool(DECLARED), chat_tool("rm -rf\r\nX-Injected: 1"), smuggled,
                     chat_tool("shell_exec"), functions=[{"name": "fetch_paper"}, {"name": "shell_exec"}],
                     function_call={"name": "shell_exec"})
    answer = await _post(running, mock, "/v1/chat/completions", body, "shapes")
    assert answer.status_code == 200, answer.text
    assert "x-injected" not in answer.headers
    assert answer.headers[withhold.HEADER] == "rm%20-rf%0D%0AX-Injected:%201, shell_exec"
    [received] = mock.requests
    assert received.body["tools"] == [chat_tool(DECLARED), chat_tool(DECLARED)]  # the agent's duplicates, as sent
    assert received.body["functions"] == [{"name": "fetch_paper"}] and "function_call" not in received.body
    # a Responses entry whose `name` is declared but whose `function.name` is not
    mock.reset()
    entry = {"type": "function", "name": DECLARED, "function": {"name": "shell_exec"}}
    answer = await _post(running, mock, "/v1/responses", {"model": "gpt-4o-mini", "input": "hi", "tools": [entry]},
                         "shapes-responses")
    assert answer.status_code == 200 and answer.headers[withhold.HEADER] == "shell_exec"
    assert "tools" not in mock.requests[0].body


# --- MCP tools/list ---------------------------------------------------------------------


class HostileToolServer:
    """A tool server answering tools/list with entries no honest server sends."""

    TOOLS = [{"name": "read_note", "inputSchema": {"type": "object"}}, {"name": ["read_note"]},
             {"name": "Read_Note"}, {"name": "read_note", "description": "a duplicate"}, {"nope": 1}, "read_note",
             {"name": "shell"}]

    async def start(self) -> str:
        async def handle(request: web.Request) -> web.Response:
            message = await request.json()
            return web.json_response({"jsonrpc": "2.0", "id": message.get("id"), "result": {"tools": self.TOOLS}})

        app = web.Application()
        app.router.add_post("/mcp", handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/mcp"  # type: ignore[union-attr]


@module_loop
async def test_mcp_tools_list_keeps_only_declared_tools_and_says_which_went(env):
    running, _, _ = env
    server = HostileToolServer()
    url = await server.start()
    try:
        async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30) as http:
            answer = await http.post(url, json={"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}},
                                     headers={"ADL-Session": "mcp-list"})
            call = await http.post(url, json={"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                                              "params": {"name": "shell", "arguments": {}}},
                                   headers={"ADL-Session": "mcp-list"})
    finally:
        await server.runner.cleanup()
    assert answer.status_code == 200
    listed = answer.json()["result"]["tools"]
    assert listed == [HostileToolServer.TOOLS[0], HostileToolServer.TOOLS[3]]
    assert answer.headers[withhold.HEADER] == "%3Cunnamed%3E, Read_Note, shell"
    # a tools/call of an undeclared tool stays denied, as before
    assert call.json()["error"]["data"]["governor"]["tool"] == "shell"


@module_loop
async def test_mcp_sdk_client_lists_only_declared_tools(env):
    from tests.test_mcp_sdk import NotesServer, mcp_session

    running, _, _ = env
    server = NotesServer().start()
    try:
        async with mcp_session(server.url, running.proxy_url, {"ADL-Session": "mcp-sdk"}) as session:
            listed = await session.list_tools()
    finally:
        server.stop()
    assert sorted(t.name for t in listed.tools) == ["delete_note", "read_note", "send_email"]


# --- the adapter and the rules, without the network ---------------------------------------


def _open(path, body):
    adapter = OpenAIAdapter(AdapterConfig())
    view = RequestView("POST", "api.openai.com", path, {}, json.dumps(body).encode())
    return adapter, adapter.open(view, session="s", persona=None)


def test_a_declared_built_in_passes_and_names_follow_the_protocol():
    assert withhold.openai_names({"type": "web_search_preview"}) == ("web_search_preview",)
    assert withhold.openai_names({"type": "function", "function": {"name": "a"}}) == ("a",)
    assert withhold.openai_names({"type": "custom", "custom": {"name": "c"}}) == ("c",)
    assert withhold.openai_names({"type": "mcp", "server_label": "x"}) == ("mcp",)
    assert withhold.openai_names({"function": {"name": "a"}}) == ("a",)  # vLLM: the type defaults to function
    offered = {"model": "m", "input": "hi", "tools": [{"type": "web_search_preview"}, {"type": "function", "name": "a"}],
               "tool_choice": {"type": "web_search_preview"}}
    adapter, exchange = _open("/v1/responses", offered)
    assert adapter.rewrite_request(exchange, Decision(allowed_tools=frozenset({"a", "web_search_preview"}))) is None
    adapter, exchange = _open("/v1/responses", offered)
    body = json.loads(adapter.rewrite_request(exchange, Decision(allowed_tools=frozenset({"a"}))))
    assert body["tools"] == [{"type": "function", "name": "a"}] and "tool_choice" not in body
    assert exchange.state["withheld"] == ["web_search_preview"]


def test_no_restriction_and_no_tools_cost_no_rewrite():
    adapter, exchange = _open("/v1/chat/completions", {"model": "m", "messages": [], "tools": [chat_tool("x")]})
    assert adapter.rewrite_request(exchange, Decision(allowed_tools=None)) is None
    adapter, exchange = _open("/v1/chat/completions", {"model": "m", "messages": []})
    assert adapter.rewrite_request(exchange, Decision(allowed_tools=frozenset())) is None
    assert "withheld" not in exchange.state


def test_the_header_is_ascii_bounded_and_unambiguous():
    assert withhold.rendered(["a, b", "é"]) == "a%2C%20b, %C3%A9"
    long = withhold.rendered([f"t{i}" * 40 for i in range(200)], limit=300)
    assert len(long) <= 300 + 16 and long.endswith(" more") and long.isascii()
    assert withhold.rendered(["x" * 5000], limit=100) == "x" * 100


def test_open_refuses_an_unnamed_tool_even_without_a_restriction():
    with pytest.raises(BadRequest, match=r"'tools\[0\]'"):
        _open("/v1/chat/completions", {"model": "m", "messages": [], "tools": [{"type": "function"}]})


@module_loop
async def test_a_streamed_answer_carries_the_header_and_the_stream_is_whole(env):
    running, mock, _ = env
    mock.reset()
    body = chat_body(chat_tool(DECLARED), chat_tool("shell_exec"), stream=True)
    answer = await _post(running, mock, "/v1/chat/completions", body, "streamed")
    assert answer.status_code == 200 and answer.headers[withhold.HEADER] == "shell_exec"
    assert answer.text.rstrip().endswith("data: [DONE]")
    assert names_of(mock.requests[0].body["tools"]) == [DECLARED]


def test_the_permitted_set_by_tier_and_persona():
    from governor.passport import example_passport_path, load_passport
    from governor.policy import Tier, compile_limits, load_pricing, step_tools
    from tests.conftest import REPO

    document = load_passport(example_passport_path())
    pricing = price_book()
    r2 = compile_limits(document, tier=Tier.R2, pricing=pricing)
    assert step_tools(r2, None) == {"search_papers", "fetch_paper", "read_note", "write_note", "delete_note",
                                    "send_email"}
    assert step_tools(r2, "searcher") == {"search_papers", "fetch_paper"}
    assert step_tools(r2, "summarizer") == step_tools(r2, None)  # no list of its own: the parent's
    assert step_tools(r2, "stranger") == frozenset()  # an undeclared persona: nothing
    assert step_tools(compile_limits(document, tier=Tier.R1, pricing=pricing), "searcher") is None  # R1 observes
    bare = {k: v for k, v in document.items() if k != "tools"}
    bare["permissions"] = {k: v for k, v in document["permissions"].items() if k != "sub_agents"}
    assert step_tools(compile_limits(bare, tier=Tier.R2, pricing=pricing), None) is None  # no tools declared


def test_tool_choice_forms():
    allowed = frozenset({"a"})

    def cut(choice, tools=(("a",), ("b",))):
        body = {"tools": [{"function": {"name": n}} for (n,) in tools], "tool_choice": choice}
        withheld = withhold.withhold_openai(body, allowed, tuple(tools), None)
        return body.get("tool_choice", "<dropped>"), withheld

    chat_allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}]}}
    assert cut(chat_allowed) == ({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "a"}}]}}, ["b"])
    only_b = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "b"}]}
    assert cut(only_b, (("a",),)) == ("<dropped>", ["b"])
    oversized = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "a"}] * 10_001}
    assert cut(oversized, (("a",),)) == ("<dropped>", [])
    assert cut({"type": "function", "function": {"name": 7}}, (("a",),)) == ("<dropped>", [])  # unreadable
    assert cut("required") == ("required", ["b"])  # a tool is left: the choice stands
    assert cut("required", (("b",),)) == ("<dropped>", ["b"])  # none is: it goes with the tools
    body = {"tools": [{"name": "a"}, {"name": "b"}], "tool_choice": {"type": "any"}}
    assert withhold.withhold_anthropic(body, allowed, (("a",), ("b",))) == ["b"]
    assert body == {"tools": [{"name": "a"}], "tool_choice": {"type": "any"}}


# tool entries of any shape, with the names and keys the readers look at
_NAMES = st.sampled_from(["a", "b", "A", "\uff41", "", "web_search_preview", "function", "custom", "allowed_tools",
                          "tool"])
_ENTRY_KEYS = st.sampled_from(["type", "name", "function", "custom", "input_schema", "allowed_tools", "tools"])
_VALUES = st.recursive(st.none() | st.integers() | _NAMES | st.booleans(),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_ENTRY_KEYS, inner, max_size=4),
                       max_leaves=12)
_TOOLS = st.lists(st.dictionaries(_ENTRY_KEYS, _VALUES, max_size=4) | _VALUES, max_size=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TOOLS, _VALUES | _NAMES, st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/messages"]))
def test_any_tool_shape_is_refused_or_forwarded_with_only_permitted_names(tools, choice, path):
    """Whatever the shapes: a BadRequest at open, or a forwarded body whose every tool entry
    (and tool choice) names only permitted tools as its protocol reads them; never another
    exception."""
    from governor.adapters.anthropic import AnthropicAdapter

    allowed = frozenset({"a", "web_search_preview"})
    body = {"model": "m", "messages": [], "input": "hi", "tools": tools, "tool_choice": choice}
    adapter = AnthropicAdapter(AdapterConfig()) if path == "/v1/messages" else OpenAIAdapter(AdapterConfig())
    reader = withhold.named_only if path == "/v1/messages" else withhold.openai_names
    view = RequestView("POST", "api.example.com", path, {}, json.dumps(body).encode())
    try:
        exchange = adapter.open(view, session="s", persona=None)
    except BadRequest:
        assert any(reader(t) is None for t in tools) or len(tools) > withhold.MAX_TOOLS
        return
    rewritten = adapter.rewrite_request(exchange, Decision(allowed_tools=allowed))
    sent = json.loads(rewritten) if rewritten is not None else body
    for tool in sent.get("tools", []):
        assert set(reader(tool)) <= allowed
    sent_choice = sent.get("tool_choice")
    if isinstance(sent_choice, dict) and path == "/v1/messages":
        assert sent_choice.get("type") != "tool" or sent_choice.get("name") in allowed
    elif isinstance(sent_choice, dict):
        if sent_choice.get("type") == "allowed_tools":
            holder = sent_choice["allowed_tools"] if "allowed_tools" in sent_choice else sent_choice
            refs = holder["tools"]
            assert refs and all(set(withhold.openai_names(ref) or ("<unnamed>",)) <= allowed for ref in refs)
        else:
            assert set(withhold.openai_names(sent_choice) or ("<unnamed>",)) <= allowed
