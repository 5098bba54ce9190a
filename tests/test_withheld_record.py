"""Withheld tools are named in the session's record (docs/tools.md), end to end.

The real proxy on the real runtime with the bundled example passport (R2; tools[]:
search_papers, fetch_paper, read_note, write_note, delete_note, send_email), a loopback TLS
mock upstream, the official openai and anthropic SDKs in subprocesses, the `mcp` SDK's
client and FastMCP server, and a hostile tool server. Each session is ended (its final
record written to <data-dir>/records/) and that file is checked by `governor verify`.

A request (or tools/list answer) that withholds something records one `on_governor_tools_withheld`
/ `fallback` event naming what went, before the request is forwarded or the answer
delivered; one that withholds nothing records no such event; a hostile offer (thousands of
tools, names of a megabyte) records a bounded event.
"""

from __future__ import annotations

import json
import ssl

import httpx
import pytest
import pytest_asyncio
from aiohttp import web

from governor.adapters import withhold
from governor.cli import main as governor_cli
from governor.evidence import KeyFiles, record_path
from governor.proxy.server import Settings, serve
from tests.proxy_harness import AGENT_NAMED, run_python
from tests.upstreams import MockLLM, make_tls

module_loop = pytest.mark.asyncio(loop_scope="module")  # the sync test below needs no loop

DECLARED = "search_papers"
WITHHELD = "on_governor_tools_withheld"


def chat_tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("withheld-record")
    tls = make_tls(tmp / "tls")
    mock = MockLLM(tls)
    await mock.start()
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data",
                                   upstream_ca=tls.ca_file, tick_interval=0))
    sdk_env = {"HTTPS_PROXY": running.proxy_url, "SSL_CERT_FILE": str(running.ca_file),
               "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{mock.base_url}/v1",
               "ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": mock.base_url}
    yield running, mock, sdk_env
    await running.stop()
    await mock.stop()


async def final_record(running, session: str, capsys) -> dict:
    """End `session`; its final record file, checked by `governor verify` (exit 0, VALID)."""
    await running.runtime.end_session(session)
    path = record_path(running.settings.data_dir, session)
    capsys.readouterr()
    code = governor_cli(["verify", str(path), "--offline", "--key", str(KeyFiles(running.settings.data_dir / "keys").public_key)])
    out = capsys.readouterr().out
    assert code == 3 and "\nINCOMPLETE" in out and "FAIL " not in out, out  # pinned key: not VALID
    return json.loads(path.read_text())


def withheld_events(record: dict) -> list[dict]:
    return [e for e in record["events"] if e["cause"] == WITHHELD]


def http_client(running) -> httpx.AsyncClient:
    context = ssl.create_default_context(cafile=str(running.ca_file))
    return httpx.AsyncClient(proxy=running.proxy_url, verify=context, trust_env=False, timeout=60)


# --- each protocol ----------------------------------------------------------------------


@module_loop
async def test_openai_chat_sdk_withheld_tools_are_named_in_the_verified_record(env, capsys):
    running, mock, sdk_env = env
    mock.reset()
    tools = [chat_tool(DECLARED), chat_tool("shell_exec"), chat_tool("Search_Papers")]
    code = f"""
import json, openai
client = openai.OpenAI(max_retries=0)
for _ in range(2):
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", max_tokens=64,
        messages=[{{"role": "user", "content": "find papers"}}], tools={tools!r},
        extra_headers={{"ADL-Session": "chat-withheld"}})
print(json.dumps({{"header": raw.headers.get("adl-withheld-tools")}}))
"""
    out = await run_python(code, sdk_env)
    assert out["header"] == "shell_exec, Search_Papers"
    assert len(mock.requests) == 2
    record = await final_record(running, "chat-withheld", capsys)
    events = withheld_events(record)
    assert len(events) == 2  # one per request that withheld something
    assert events[0]["action"] == "fallback"
    assert events[0]["detail"] == {"decision": "withhold", "step": "model_call", "protocol": "openai",
                                   "route": "/v1/chat/completions", "count": 2,
                                   "tools": ["shell_exec", "Search_Papers"]}
    assert record["outcome"] == "completed"  # withholding halts nothing


@module_loop
async def test_anthropic_sdk_withheld_tools_and_persona_are_in_the_record(env, capsys):
    running, mock, sdk_env = env
    mock.reset()
    tools = [{"name": DECLARED, "input_schema": {"type": "object"}},
             {"name": "read_note", "input_schema": {"type": "object"}},
             {"name": "web_fetch", "input_schema": {"type": "object"}}]
    code = f"""
import json, anthropic
client = anthropic.Anthropic(max_retries=0)
raw = client.messages.with_raw_response.create(model="claude-3-5-haiku-latest", max_tokens=64,
    messages=[{{"role": "user", "content": "find papers"}}], tools={tools!r},
    extra_headers={{"ADL-Session": "anthropic-withheld", "ADL-Persona": "searcher"}})
print(json.dumps({{"header": raw.headers.get("adl-withheld-tools")}}))
"""
    out = await run_python(code, sdk_env)
    assert out["header"] == "read_note, web_fetch"  # the persona `searcher` may use search_papers, fetch_paper
    [received] = mock.requests
    assert [t["name"] for t in received.body["tools"]] == [DECLARED]
    record = await final_record(running, "anthropic-withheld", capsys)
    [event] = withheld_events(record)
    assert event["detail"] == {"decision": "withhold", "step": "model_call", "protocol": "anthropic",
                               "route": "/v1/messages", "count": 2, "tools": ["read_note", "web_fetch"],
                               "persona": "searcher"}
    # recorded before the request went upstream: the spawn of the persona, then the withholding
    causes = [e["cause"] for e in record["events"]]
    assert causes.index("on_governor_sub_agent_spawned") < causes.index(WITHHELD)


@module_loop
async def test_mcp_sdk_tools_list_withheld_tool_is_in_the_record(env, capsys):
    from tests.test_mcp_sdk import NotesServer, mcp_session

    running, _, _ = env
    server = NotesServer().start()
    try:
        async with mcp_session(server.url, running.proxy_url, {"ADL-Session": "mcp-withheld"}) as session:
            listed = await session.list_tools()
    finally:
        server.stop()
    assert sorted(t.name for t in listed.tools) == ["delete_note", "read_note", "send_email"]
    record = await final_record(running, "mcp-withheld", capsys)
    [event] = withheld_events(record)
    assert event["action"] == "fallback"
    assert event["detail"] == {"decision": "withhold", "step": "tools_list", "protocol": "mcp", "route": "/mcp",
                               "count": 2, "tools": ["shell", "flaky"]}  # the two NotesServer tools not declared


@module_loop
async def test_nothing_withheld_records_nothing(env, capsys):
    """Declared tools only, no tools at all, and a tools/list of declared tools: no event."""
    running, mock, _ = env
    mock.reset()
    async with http_client(running) as http:
        for body in ({"tools": [chat_tool(DECLARED), chat_tool("fetch_paper")]}, {}):
            answer = await http.post(f"{mock.base_url}/v1/chat/completions", headers={"ADL-Session": "nothing"},
                                     json={"model": "gpt-4o-mini", "max_tokens": 32,
                                           "messages": [{"role": "user", "content": "hi"}], **body})
            assert answer.status_code == 200 and withhold.HEADER.lower() not in answer.headers
    server = ToolServer([{"name": "read_note", "inputSchema": {"type": "object"}}])
    url = await server.start()
    try:
        async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30) as http:
            answer = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                                     headers={"ADL-Session": "nothing"})
    finally:
        await server.runner.cleanup()
    assert answer.status_code == 200 and withhold.HEADER.lower() not in answer.headers
    record = await final_record(running, "nothing", capsys)
    assert withheld_events(record) == [] and len(mock.requests) == 2


# --- hostile offers: the event stays bounded -----------------------------------------------


class ToolServer:
    """An MCP server answering tools/list with whatever it is given (honest or not)."""

    def __init__(self, tools: list) -> None:
        self.tools = tools

    async def start(self) -> str:
        async def handle(request: web.Request) -> web.Response:
            message = await request.json()
            body = json.dumps({"jsonrpc": "2.0", "id": message.get("id"), "result": {"tools": self.tools}})
            return web.Response(body=body.encode(), content_type="application/json")

        app = web.Application()
        app.router.add_post("/mcp", handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/mcp"  # type: ignore[union-attr]


def assert_bounded(event: dict, count: int) -> None:
    detail = event["detail"]
    assert detail["count"] == count
    assert len(detail["tools"]) == withhold.RECORDED_NAMES
    assert detail["tools_omitted"] == count - withhold.RECORDED_NAMES
    assert all(len(name) <= withhold.RECORDED_NAME_CHARS for name in detail["tools"])
    # a few KiB whatever was offered
    assert len(json.dumps(event, ensure_ascii=False).encode()) < 8 * 1024


@module_loop
async def test_an_agent_offering_thousands_of_tools_and_huge_names_records_a_bounded_event(env, capsys):
    running, mock, _ = env
    mock.reset()
    huge = "h" * 20_000  # a name of 20,000 characters (within the example passport's token budget)
    tools = [{"function": {"name": huge}}] + [{"function": {"name": f"u{i:04d}"}} for i in range(1500)]
    tools.insert(750, chat_tool(DECLARED))
    async with http_client(running) as http:
        answer = await http.post(f"{mock.base_url}/v1/chat/completions", headers={"ADL-Session": "thousands"},
                                 json={"model": "gpt-4o-mini", "max_tokens": 32,
                                       "messages": [{"role": "user", "content": "hi"}], "tools": tools})
    assert answer.status_code == 200, answer.text
    [received] = mock.requests
    assert [t["function"]["name"] for t in received.body["tools"]] == [DECLARED]
    record = await final_record(running, "thousands", capsys)
    [event] = withheld_events(record)
    assert_bounded(event, 1501)
    assert event["detail"]["tools"][:3] == ["h" * withhold.RECORDED_NAME_CHARS, "u0000", "u0001"]
    assert event["detail"]["names_cut"] == 1


async def _listed_through(running, tools, session: str, rpc_id: int) -> httpx.Response:
    """A `tools/list` of a ToolServer listing `tools`, through the proxy in `session`."""
    server = ToolServer(tools)
    url = await server.start()
    try:
        async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=60) as http:
            return await http.post(url, json={"jsonrpc": "2.0", "id": rpc_id, "method": "tools/list", "params": {}},
                                   headers={"ADL-Session": session})
    finally:
        await server.runner.cleanup()


@module_loop
async def test_a_server_listing_thousands_of_tools_with_megabyte_names_records_a_bounded_event(env, capsys):
    running, _, _ = env
    tools = [{"name": "n" * (1024 * 1024)}] + [{"name": f"{i:05d}-" + "x" * 1000} for i in range(5000)]
    tools += [{"name": "read_note"}, {"name": "line\nbreak\u0000and \u202e bidi"}]
    answer = await _listed_through(running, tools, "huge-list", 1)
    assert answer.status_code == 200
    assert answer.json()["result"]["tools"] == [{"name": "read_note"}]
    assert len(answer.headers[withhold.HEADER]) <= withhold.MAX_HEADER_CHARS + 16
    record = await final_record(running, "huge-list", capsys)
    [event] = withheld_events(record)
    assert_bounded(event, 5002)
    assert event["detail"]["names_cut"] == withhold.RECORDED_NAMES  # every listed name was longer than 128


@module_loop
async def test_a_tools_list_answer_the_governor_cannot_read_is_not_delivered(env):
    """A lone surrogate (valid to Python's json, refused by orjson): before, the answer went
    through unfiltered, an undeclared tool included."""
    running, _, _ = env
    answer = await _listed_through(running, [{"name": "read_note"}, {"name": "shell\ud800"}], "unreadable-list", 3)
    assert answer.status_code == 200
    assert b"shell" not in answer.content
    message = answer.json()
    assert message["id"] == 3 and "could not be read" in message["error"]["message"]


def test_the_recorded_detail_is_bounded_and_exact_below_the_bounds():
    assert withhold.recorded_detail(["a", "b"]) == {"count": 2, "tools": ["a", "b"]}
    many = [f"t{i}" for i in range(100)]
    assert withhold.recorded_detail(many) == {"count": 100, "tools": many[:32], "tools_omitted": 68}
    long = ["x" * 129, "y" * 128]
    assert withhold.recorded_detail(long) == {"count": 2, "tools": ["x" * 128, "y" * 128], "names_cut": 1}

