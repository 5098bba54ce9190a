"""The `mcp` SDK through the real governor with the REAL runtime: a signed test passport
declaring the notes tools (delete_note and send_email require confirmation, `shell`
is not declared), the policy engine, the SQLite store and the journal. The reviewer
answers over the control plane; the enforcement record of each session is checked.

The oversight timeout is made quick with the runtime's clock: once the step is
pending, the clock jumps past its response time and the runtime's sweeper expires it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator

import aiohttp
import pytest
from mcp.shared.exceptions import McpError

from governor.adapters.base import AdapterConfig
from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE
from governor.runtime.metrics import Metrics
from governor.proxy.server import Settings, serve
from tests.control_harness import real_runtime
from tests.test_mcp_sdk import REVIEWER, NotesServer, _answer_when_pending, mcp_session
from tests.proxy_harness import AGENT_NAMED


def _tool(name: str, *, confirm: bool = False, **properties) -> dict:
    tool = {"name": name, "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {k: {"type": v} for k, v in properties.items()}}}
    if confirm:
        tool["requires_confirmation"] = True
    return tool


PASSPORT = {
    "adl_spec": "0.4.0", "name": "notes-agent", "description": "keeps research notes", "version": "1.0.0",
    "id": "https://example.com/agents/notes-agent", "data_classification": {"sensitivity": "internal"},
    "lifecycle": {"status": "active"},
    "tools": [
        _tool("read_note", path="string"),
        _tool("flaky", path="string"),
        _tool("delete_note", confirm=True, path="string"),
        _tool("send_email", confirm=True, to="string", subject="string", body="string"),
    ],
    "runtime": {"degradation": {"on_tool_error": {"action": "continue"}}},
}


class JumpingClock:
    """Wall-clock time plus an offset a test can move forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@contextlib.asynccontextmanager
async def notes_world(tmp_path, document: dict = PASSPORT, tier: str = "R2", **server_options) -> AsyncIterator[tuple]:
    """The notes server (NotesServer(**server_options)) behind the real governor on the real
    runtime with `document`, session notes-1: (server, runtime, governor, clock)."""
    clock = JumpingClock()
    metrics = Metrics()
    runtime, _ = real_runtime(document, tmp_path, metrics=metrics, clock=clock, sweep_interval_sec=0.05, tier=tier)
    server = NotesServer(**server_options).start()
    settings = Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path,
                        reviewer_tokens=(REVIEWER,), session="notes-1",
                        adapters=AdapterConfig(extra={"allowed_tools": runtime.allowed_tools}))
    governor = await serve(settings, runtime, metrics=metrics)
    try:
        yield server, runtime, governor, clock
    finally:
        await governor.stop()
        server.stop()


@pytest.fixture
async def world(tmp_path):
    async with notes_world(tmp_path) as parts:
        yield parts


async def session_record(governor) -> dict:
    """The enforcement record of session notes-1, from the control plane."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{governor.control_url}/v1/sessions/notes-1/record") as resp:
            assert resp.status == 200
            return await resp.json()


async def test_declared_tools_pass_and_the_listing_shows_only_them(world):
    server, runtime, governor, _ = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        listed = await session.list_tools()
        result = await session.call_tool("read_note", {"path": "/notes/a.md"})
    assert sorted(t.name for t in listed.tools) == ["delete_note", "flaky", "read_note", "send_email"]
    assert result.content[0].text == "contents of /notes/a.md"


async def test_an_undeclared_tool_is_refused_and_fails_closed(world):
    server, runtime, governor, _ = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        with pytest.raises(McpError) as refused:
            await session.call_tool("shell", {"cmd": "id"})
    governor_object = refused.value.error.data["governor"]
    assert refused.value.error.code == GOVERNOR_ERROR_CODE
    assert governor_object["tool"] == "shell" and governor_object["action"] == "halt"
    assert not any(name == "shell" for name, _ in server.calls)
    record = await session_record(governor)
    assert any(e["detail"].get("tool") == "shell" for e in record["events"])


async def test_confirmation_is_approved_by_a_reviewer_then_the_call_completes(world):
    server, runtime, governor, _ = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        call = asyncio.create_task(session.call_tool("delete_note", {"path": "/notes/old.md"}))
        approval = await _answer_when_pending(governor.control_url, "approve", "lab-lead")
        result = await asyncio.wait_for(call, 30)
        after = await session.call_tool("read_note", {"path": "/notes/b.md"})
    assert approval["tool"] == "delete_note" and approval["arguments"] == {"path": "/notes/old.md"}
    assert result.content[0].text == "deleted /notes/old.md" and not after.isError
    assert ("delete_note", {"path": "/notes/old.md"}) in server.calls


async def test_a_rejected_confirmation_is_refused_and_the_tool_never_runs(world):
    server, runtime, governor, _ = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        call = asyncio.create_task(session.call_tool("send_email", {"to": "a@example.org", "subject": "s", "body": "b"}))
        approval = await _answer_when_pending(governor.control_url, "reject", "lab-lead")
        with pytest.raises(McpError) as refused:
            await asyncio.wait_for(call, 30)
        after = await session.call_tool("read_note", {"path": "/notes/e.md"})  # a rejection is not a halt
    governor_object = refused.value.error.data["governor"]
    assert governor_object["action"] == "deny" and governor_object["approval_id"] == approval["id"]
    assert not after.isError
    assert not any(name == "send_email" for name, _ in server.calls)


async def test_an_unanswered_confirmation_times_out_and_halts_the_session(world):
    server, runtime, governor, clock = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        call = asyncio.create_task(session.call_tool("delete_note", {"path": "/notes/keep.md"}))
        for _ in range(500):
            if runtime.approvals():
                break
            await asyncio.sleep(0.02)
        assert runtime.approvals(), "the call was not paused"
        clock.offset += 16 * 60  # past the default 15-minute response time
        with pytest.raises(McpError) as timed_out:
            await asyncio.wait_for(call, 30)
        with pytest.raises(McpError) as after:
            await session.call_tool("read_note", {"path": "/notes/c.md"})
    assert timed_out.value.error.data["governor"]["cause"] == "on_oversight_timeout"
    assert timed_out.value.error.data["governor"]["action"] == "halt"
    assert after.value.error.data["governor"]["action"] == "halt"
    assert not any(name == "delete_note" for name, _ in server.calls)
    record = await session_record(governor)
    assert record["outcome"] == "halted"
    assert [e["cause"] for e in record["events"]][-1] == "on_oversight_timeout"


async def test_a_failing_tool_is_an_on_tool_error_event(world):
    server, runtime, governor, _ = world
    async with mcp_session(server.url, governor.proxy_url) as session:
        result = await session.call_tool("flaky", {"path": "/data/x"})
        after = await session.call_tool("read_note", {"path": "/notes/d.md"})  # declared: continue
    assert result.isError and not after.isError
    record = await session_record(governor)
    errors = [e for e in record["events"] if e["cause"] == "on_tool_error"]
    assert len(errors) == 1 and errors[0]["action"] == "continue" and errors[0]["detail"]["tool"] == "flaky"
