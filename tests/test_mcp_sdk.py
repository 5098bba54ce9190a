"""The `mcp` SDK through the real governor proxy: an SDK client session to a FastMCP
server over streamable HTTP (SSE and JSON answers), with approvals answered over the
control plane by real HTTP requests.

The runtime behind the proxy is the scripted one (tests/control_harness.py): these
tests check the wire path (SDK -> proxy -> MCP adapter -> decision -> what the SDK
raises or returns, reviewer -> control plane -> held request released), not the
policy's verdicts, which tests/test_mcp_sdk_runtime.py checks with the real runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import AsyncIterator

import aiohttp
import httpx
import pytest
import uvicorn
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.fastmcp import FastMCP
from mcp.shared.exceptions import McpError

from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE
from governor.policy.steps import Action, Decision, ToolCall, ToolError
from governor.proxy.server import Settings, serve
from tests.control_harness import ScriptedRuntime, pause_decision, tool_is
from tests.proxy_harness import AGENT_NAMED

REVIEWER = "mcp-sdk-reviewer-token-0123456789"


class NotesServer:
    """Tools named like the example passport's notes and mail tools, plus one it does not declare."""

    def __init__(self, *, json_response: bool = False, stateless: bool = False) -> None:
        self.calls: list[tuple[str, dict]] = []
        mcp = FastMCP("notes", json_response=json_response, stateless_http=stateless, log_level="WARNING")

        @mcp.tool()
        def read_note(path: str) -> str:
            """Read a research note."""
            self.calls.append(("read_note", {"path": path}))
            return f"contents of {path}"

        @mcp.tool()
        def delete_note(path: str) -> str:
            """Delete a research note."""
            self.calls.append(("delete_note", {"path": path}))
            return f"deleted {path}"

        @mcp.tool()
        def send_email(to: str, subject: str, body: str) -> str:
            """Send an email."""
            self.calls.append(("send_email", {"to": to}))
            return f"sent to {to}"

        @mcp.tool()
        def shell(cmd: str) -> str:
            """Run a shell command (declared by no passport)."""
            self.calls.append(("shell", {"cmd": cmd}))
            return "ran"

        @mcp.tool()
        def flaky(path: str) -> str:
            """Always fails."""
            raise RuntimeError(f"disk error reading {path}")

        config = uvicorn.Config(mcp.streamable_http_app(), host="127.0.0.1", port=0, log_level="warning",
                                lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="mcp-server", daemon=True)
        self.url = ""

    def start(self) -> "NotesServer":
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the MCP test server did not start")
            time.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/mcp"
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


@contextlib.asynccontextmanager
async def mcp_session(url: str, proxy: str | None, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session to `url`, through `proxy` (an HTTP proxy URL)."""
    timeout = httpx.Timeout(30.0, read=120.0)
    async with httpx.AsyncClient(proxy=proxy, headers=headers or {}, timeout=timeout, trust_env=False) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


# --- the governed world ----------------------------------------------------------------


def _scripted_runtime() -> ScriptedRuntime:
    counter = iter(range(1, 1000))

    def pause(response_time: float):
        return lambda session, step: pause_decision(f"appr-{next(counter)}", response_time=response_time)

    def undeclared(session, step):
        return Decision(action=Action.DENY, cause="on_anomaly", details={"tool": step.tool, "reason": "not declared"})

    return ScriptedRuntime([
        (tool_is("shell"), undeclared),
        (tool_is("delete_note"), pause(30.0)),
        (tool_is("send_email"), pause(30.0)),
        (lambda s, st: isinstance(st, ToolCall) and st.tool == "read_note" and st.arguments.get("path") == "slow",
         pause(0.5)),
    ], allowed={None: frozenset({"read_note", "delete_note", "send_email", "flaky"})})


@pytest.fixture(params=["sse", "json"])
async def world(request, tmp_path):
    server = NotesServer(json_response=request.param == "json").start()
    runtime = _scripted_runtime()
    from governor.adapters.base import AdapterConfig

    settings = Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path,
                        reviewer_tokens=(REVIEWER,), session="s1",
                        adapters=AdapterConfig(extra={"allowed_tools": runtime.allowed_tools}))
    governor = await serve(settings, runtime)
    try:
        yield server, runtime, governor
    finally:
        await governor.stop()
        server.stop()


async def _answer_when_pending(control_url: str, decision: str, reviewer: str, *, token: str = REVIEWER) -> dict:
    """Wait for a pending approval, then answer it over HTTP as a reviewer would."""
    async with aiohttp.ClientSession() as http:
        for _ in range(500):
            async with http.get(f"{control_url}/v1/approvals") as resp:
                pending = (await resp.json())["approvals"]
            if pending:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("no approval became pending")
        async with http.post(f"{control_url}/v1/approvals/{pending[0]['id']}",
                             headers={"Authorization": f"Bearer {token}"},
                             json={"decision": decision, "reviewer": reviewer}) as resp:
            assert resp.status == 200, await resp.text()
            return pending[0]


# --- tests -----------------------------------------------------------------------------


async def test_a_permitted_call_passes_and_the_listing_is_filtered(world):
    server, runtime, governor = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        listed = await session.list_tools()
        result = await session.call_tool("read_note", {"path": "/workspace/notes/a.md"})
    assert sorted(t.name for t in listed.tools) == ["delete_note", "flaky", "read_note", "send_email"]
    assert not result.isError and result.content[0].text == "contents of /workspace/notes/a.md"
    assert ("read_note", {"path": "/workspace/notes/a.md"}) in server.calls
    steps = [step for session, step in runtime.steps if isinstance(step, ToolCall)]
    assert steps == [ToolCall(tool="read_note", arguments={"path": "/workspace/notes/a.md"},
                              target_path="/workspace/notes/a.md")]


async def test_an_undeclared_tool_is_refused_with_the_governor_reason(world):
    server, runtime, governor = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        with pytest.raises(McpError) as refused:
            await session.call_tool("shell", {"cmd": "rm -rf /"})
        # The session goes on after a refusal.
        assert not (await session.call_tool("read_note", {"path": "x"})).isError
    error = refused.value.error
    assert error.code == GOVERNOR_ERROR_CODE
    assert error.data["governor"]["action"] == "deny" and error.data["governor"]["tool"] == "shell"
    assert not any(name == "shell" for name, _ in server.calls)


async def test_a_paused_call_completes_once_a_reviewer_approves(world):
    server, runtime, governor = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        call = asyncio.create_task(session.call_tool("delete_note", {"path": "/workspace/notes/old.md"}))
        approval = await _answer_when_pending(governor.control_url, "approve", "lab-lead")
        result = await asyncio.wait_for(call, 30)
    assert approval["tool"] == "delete_note"
    assert result.content[0].text == "deleted /workspace/notes/old.md"
    assert runtime.answers[approval["id"]] == (True, "lab-lead")


async def test_a_rejected_call_is_refused_and_never_reaches_the_tool(world):
    server, runtime, governor = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        call = asyncio.create_task(session.call_tool("send_email", {"to": "x@example.org", "subject": "s", "body": "b"}))
        await _answer_when_pending(governor.control_url, "reject", "lab-lead")
        with pytest.raises(McpError) as refused:
            await asyncio.wait_for(call, 30)
    assert refused.value.error.data["governor"]["action"] == "deny"
    assert not any(name == "send_email" for name, _ in server.calls)


async def test_the_agent_cannot_approve_through_the_proxy(world):
    server, runtime, governor = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        call = asyncio.create_task(session.call_tool("delete_note", {"path": "/workspace/notes/x.md"}))
        for _ in range(500):
            if runtime.pending:
                break
            await asyncio.sleep(0.02)
        approval_id = next(iter(runtime.pending))
        # The agent holds a reviewer token (it should not) and sends the answer through its proxy.
        async with httpx.AsyncClient(proxy=governor.proxy_url, trust_env=False) as agent_http:
            resp = await agent_http.post(f"{governor.control_url}/v1/approvals/{approval_id}",
                                         headers={"Authorization": f"Bearer {REVIEWER}"},
                                         json={"decision": "approve", "reviewer": "agent"})
        assert resp.status_code == 403
        assert approval_id in runtime.pending
        await _answer_when_pending(governor.control_url, "reject", "lab-lead")
        with pytest.raises(McpError):
            await asyncio.wait_for(call, 30)


async def test_an_unanswered_pause_times_out_and_halts_the_session(world):
    server, runtime, governor = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        with pytest.raises(McpError) as timed_out:
            await session.call_tool("read_note", {"path": "slow"})
        with pytest.raises(McpError) as after:
            await session.call_tool("read_note", {"path": "fine"})
    assert timed_out.value.error.data["governor"]["cause"] == "on_oversight_timeout"
    assert timed_out.value.error.data["governor"]["action"] == "halt"
    assert after.value.error.data["governor"]["action"] == "halt"
    assert not any(args.get("path") in ("slow", "fine") for _, args in server.calls)


async def test_a_failing_tool_is_reported_as_a_tool_error_step(world):
    server, runtime, governor = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        result = await session.call_tool("flaky", {"path": "/data/x"})
    assert result.isError
    errors = [step for _, step in runtime.steps if isinstance(step, ToolError)]
    assert len(errors) == 1 and errors[0].tool == "flaky" and "disk error reading /data/x" in errors[0].message
