"""What binds every tier (issue #32 item 2), through the real proxy with the official `mcp` SDK
and the real runtime at R1: R1 observes, except that a `requires_confirmation` tool is held for
a human (§5: "regardless"; "MUST NOT invoke it autonomously") and a passport swap fails closed
(§1.3, the Security Considerations: no tier exemption). On main before this change both went
through at R1: delete_note ran with no approval, and a swap was recorded while the session
went on."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import orjson
import pytest
from mcp.shared.exceptions import McpError

from tests.test_mcp_sdk import REVIEWER, _answer_when_pending, mcp_session
from tests.test_mcp_sdk_runtime import notes_world, session_record


@pytest.fixture
async def r1(tmp_path):
    async with notes_world(tmp_path, tier="R1") as parts:
        yield parts


async def _pending(runtime) -> list[dict]:
    for _ in range(500):
        if runtime.approvals():
            return runtime.approvals()
        await asyncio.sleep(0.02)
    raise AssertionError("the call was not held for a reviewer")


async def test_r1_holds_a_requires_confirmation_tool_until_a_human_approves(r1):
    server, runtime, governor, _ = r1
    async with mcp_session(server.url, governor.proxy_url) as session:
        call = asyncio.create_task(session.call_tool("delete_note", {"path": "/notes/old.md"}))
        await _pending(runtime)
        await asyncio.sleep(0.3)  # held: the tool has not run while nobody answered
        assert not call.done() and not any(name == "delete_note" for name, _ in server.calls)
        approval = await _answer_when_pending(governor.control_url, "approve", "lab-lead")
        result = await asyncio.wait_for(call, 30)
        # R1 observes everything else: an undeclared tool still runs, recorded as R2 would refuse it
        undeclared = await session.call_tool("shell", {"cmd": "true"})
    assert approval["tool"] == "delete_note"
    assert result.content[0].text == "deleted /notes/old.md" and not undeclared.isError
    assert ("delete_note", {"path": "/notes/old.md"}) in server.calls and any(n == "shell" for n, _ in server.calls)
    record = await session_record(governor)
    assert record["tier"] == "R1"
    pause = next(e for e in record["events"] if e["action"] == "pause")
    assert pause["cause"] == "on_governor_oversight_trigger" and pause["detail"]["requires_confirmation"] is True
    approved = next(e for e in record["events"] if e["detail"].get("review") == "approved")
    assert approved["detail"]["reviewer"] == "lab-lead"
    shell = next(e for e in record["events"] if e["detail"].get("tool") == "shell")
    assert shell["action"] == "continue" and shell["detail"]["observed_only"] is True


async def test_r1_an_unanswered_confirmation_never_runs_and_the_session_goes_on(r1):
    server, runtime, governor, clock = r1
    async with mcp_session(server.url, governor.proxy_url) as session:
        call = asyncio.create_task(session.call_tool("send_email", {"to": "a@example.org", "subject": "s", "body": "b"}))
        await _pending(runtime)
        clock.offset += 16 * 60  # past the default 15-minute response time
        with pytest.raises(McpError) as timed_out:
            await asyncio.wait_for(call, 30)
        after = await session.call_tool("read_note", {"path": "/notes/c.md"})
    assert timed_out.value.error.data["governor"]["cause"] == "on_oversight_timeout"
    assert not after.isError  # R1 records the timeout's halt as what R2 would do
    assert not any(name == "send_email" for name, _ in server.calls)
    record = await session_record(governor)
    timeout = next(e for e in record["events"] if e["cause"] == "on_oversight_timeout")
    assert timeout["detail"]["would"] == "halt" and timeout["detail"]["held_step"] == "not_executed"


async def test_r1_a_held_confirmation_is_not_released_by_the_agent_or_a_wrong_token(r1):
    """Hostile: the agent retries the held call and tries to answer its own review without a
    reviewer's token; the tool never runs."""
    server, runtime, governor, clock = r1
    async with mcp_session(server.url, governor.proxy_url) as session:
        call = asyncio.create_task(session.call_tool("delete_note", {"path": "/notes/x.md"}))
        approval = (await _pending(runtime))[0]
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer not-" + REVIEWER}):
                async with http.post(f"{governor.control_url}/v1/approvals/{approval['id']}", headers=headers,
                                     json={"decision": "approve", "reviewer": "agent"}) as resp:
                    assert resp.status in (401, 403), await resp.text()
        assert not call.done()
        clock.offset += 16 * 60
        with pytest.raises(McpError):
            await asyncio.wait_for(call, 30)
    assert not any(name == "delete_note" for name, _ in server.calls)


async def test_r1_a_passport_swap_mid_session_halts_it(r1):
    server, runtime, governor, _ = r1
    async with mcp_session(server.url, governor.proxy_url) as honest:
        assert not (await honest.call_tool("read_note", {"path": "/notes/a.md"})).isError
        # the same agent's next tools/call presents a digest that is not the pin
        swapped = {"ADL-Passport": "sha256=" + "A" * 43, "Accept": "application/json, text/event-stream"}
        call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "read_note", "arguments": {"path": "/notes/b.md"}}}
        async with httpx.AsyncClient(proxy=governor.proxy_url, trust_env=False, timeout=30) as agent:
            refused = await agent.post(server.url, json=call, headers=swapped)
        with pytest.raises(McpError) as after:  # the session is halted for everyone in it
            await honest.call_tool("read_note", {"path": "/notes/c.md"})
    assert refused.status_code == 403, refused.text
    assert orjson.loads(refused.content)["error"]["data"]["governor"]["cause"] == "on_governor_session_integrity"
    assert after.value.error.data["governor"]["action"] == "halt"
    assert [p["path"] for name, p in server.calls if name == "read_note"] == ["/notes/a.md"]
    record = await session_record(governor)
    integrity = next(e for e in record["events"] if e["cause"] == "on_governor_session_integrity")
    assert integrity["action"] == "halt" and integrity["detail"]["reason"] == "passport_changed"
    assert "observed_only" not in integrity["detail"] and record["outcome"] == "halted"


async def test_r1_presenting_the_pinned_passport_is_not_a_swap(r1):
    server, runtime, governor, _ = r1
    pinned = {"ADL-Passport": "sha256=" + runtime.limits.passport_digest}
    async with mcp_session(server.url, governor.proxy_url, headers=pinned) as session:
        first = await session.call_tool("read_note", {"path": "/notes/a.md"})
        second = await session.call_tool("read_note", {"path": "/notes/b.md"})
    assert not first.isError and not second.isError
    record = await session_record(governor)
    assert not any(e["cause"] == "on_governor_session_integrity" for e in record["events"])


async def test_r1_holds_a_confirmation_tool_the_model_proposes_until_a_human_approves(tmp_path):
    """The openai SDK at R1: the model's answer asks for delete_note (requires_confirmation);
    the answer is held for a reviewer, as at R2, and reaches the agent once approved."""
    from governor.policy import Tier
    from tests.oversight_world import Reviewer, oversight_world, run_sdk

    async with oversight_world(tmp_path, tier=Tier.R1) as world:
        reviewer = Reviewer(world, "r1-held", 1.0)
        out = await run_sdk(world, 'record("held", chat(openai.OpenAI(timeout=30), "r1-held"))\n', reviewer)
        pauses = await world.pauses("r1-held")
    assert out["held"] == {"tool": "delete_note", "args": '{"path":"/workspace/notes/old.md"}'}, out
    assert out["held_seconds"] > 1.0 and len(reviewer.answered) == 1
    assert len(pauses) == 1 and pauses[0]["detail"]["requires_confirmation"] is True
