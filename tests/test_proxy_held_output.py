"""A stream's held-back output is bounded (issue 20, hostile upstream), end to end: the real
proxy and runtime on the bundled example passport (delete_note requires confirmation), an
agent's real HTTP client, a hostile upstream.

While a tool call the model asked for in a stream awaits admission (here: a reviewer who
never answers), the governor keeps the stream's output back. An upstream that floods
meanwhile would make that buffer grow without bound; past `max_held_stream_bytes` (1 MiB by
default) the stream is cut with the protocol's terminal error event, nothing kept back is
delivered, the upstream is disconnected, and the cut is recorded in the session.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import orjson
import pytest

from governor.cli import main as governor_cli
from governor.evidence import KeyFiles
from governor.proxy.server import Settings, serve
from tests.proxy_harness import AGENT_NAMED, agent_named_world
from tests.upstreams import Behaviour, MockLLM

BOUND = 1024 * 1024  # the default max_held_stream_bytes
PIECE = 64 * 1024  # one flood event's text
FLOOD_EVENTS = 512  # 32 MiB planned: far more than the bound and than loopback socket buffers hold


def flood_event() -> bytes:
    """An SSE comment: bytes the governor must relay (or keep back) but that carry no
    tokens, so no budget cuts the stream first (text would: the budget bounds that)."""
    return b": FLOOD " + b"x" * PIECE + b"\n\n"


@pytest.fixture
async def world(tmp_path):
    async with agent_named_world(tmp_path) as world:
        yield world


async def stream(agent: httpx.AsyncClient, url: str, session: str) -> tuple[int, bytes]:
    body = {"model": "gpt-4o-mini", "stream": True, "max_tokens": 200,
            "messages": [{"role": "user", "content": "tidy my notes"}]}
    async with agent.stream("POST", url, json=body, headers={"ADL-Session": session}) as answer:
        return answer.status_code, await answer.aread()


async def test_an_upstream_flooding_while_a_tool_call_is_held_is_cut_at_the_bound_and_recorded(world, tmp_path, capsys):
    running, mock, agent = world
    mock.default = Behaviour(text="Deleting it.", chunks=2, tool_calls=(("delete_note", {"path": "/workspace/notes/old.md"}),),
                             after_finish=(flood_event(), FLOOD_EVENTS))
    # without the bound the stream would be held until the reviewer's 15 minutes ran out
    status, received = await asyncio.wait_for(stream(agent, f"{mock.base_url}/v1/chat/completions", "flooded"), 30)
    assert status == 200
    assert b"FLOOD" not in received  # nothing kept back was delivered
    assert len(received) < BOUND  # what reached the client: the events before the hold, and the terminal one
    events = [orjson.loads(line[6:]) for line in received.split(b"\n") if line.startswith(b"data: {")]
    error = events[-1]["error"]
    assert error["type"] == "governor_stream_cut" and "held its output back" in error["message"]
    assert received.rstrip().endswith(b"data: [DONE]")
    # the upstream was disconnected long before its flood was sent
    log = mock.streams[0]
    await asyncio.wait_for(log.done.wait(), 10)
    assert log.disconnected and not log.completed and log.events_sent < FLOOD_EVENTS

    # the cut is in the session's record and counted (by a task: wait for both, bounded)
    counted = 'governor_proxy_refusals_total{reason="held_output_exceeded",recorded="true"} 1.0'
    for _ in range(400):
        record = running.runtime.record("flooded")
        refused = [e for e in record["events"] if e["cause"] == "on_governor_request_refused"]
        if refused and counted in running.runtime.metrics.exposition().decode():
            break
        await asyncio.sleep(0.05)
    assert [(e["action"], e["detail"]["reason"]) for e in refused] == [("fallback", "held_output_exceeded")]
    assert record["events"][0]["cause"] == "on_governor_oversight_trigger"  # the pause that held the stream
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    capsys.readouterr()
    code = governor_cli(["verify", str(path), "--offline", "--key", str(KeyFiles(running.settings.data_dir / "keys").public_key)])
    out = capsys.readouterr().out
    assert code == 3 and "\nINCOMPLETE" in out and "FAIL " not in out, out  # pinned key: not VALID
    assert counted in running.runtime.metrics.exposition().decode()


async def test_output_held_within_the_bound_is_delivered_once_the_call_is_approved(tmp_path):
    """The happy side, with the bound configured lower (256 KiB): a flood of 128 KiB while
    the call is held is kept back, not cut, and arrives whole once a reviewer approves."""
    reviewer = "reviewer-token-for-held-output-tests-0123"
    mock = MockLLM()
    await mock.start()
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0),
                                   data_dir=tmp_path / "data", tick_interval=0, reviewer_tokens=(reviewer,),
                                   max_held_stream_bytes=256 * 1024))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30,
                                headers={"Authorization": f"Bearer {reviewer}"})
    try:
        mock.default = Behaviour(text="Deleting it.", chunks=2,
                                 tool_calls=(("delete_note", {"path": "/workspace/notes/old.md"}),),
                                 after_finish=(flood_event(), 2))
        call = asyncio.create_task(stream(agent, f"{mock.base_url}/v1/chat/completions", "held"))
        for _ in range(200):
            pending = [a for a in (await control.get("/v1/approvals")).json()["approvals"] if a["session"] == "held"]
            if pending:
                break
            await asyncio.sleep(0.05)
        assert pending, "the tool call was not held for review"
        await asyncio.wait_for(mock.streams[0].done.wait(), 10)  # the flood is in, kept back
        assert not call.done()
        answer = await control.post(f"/v1/approvals/{pending[0]['id']}",
                                    json={"decision": "approve", "reviewer": "lead"})
        assert answer.status_code == 200, answer.text
        status, received = await asyncio.wait_for(call, 30)
        assert status == 200
        assert received.count(b"FLOOD") == 2 and b"governor_stream_cut" not in received
        assert received.rstrip().endswith(b"data: [DONE]")
    finally:
        await agent.aclose()
        await control.aclose()
        await running.stop()
        await mock.stop()
