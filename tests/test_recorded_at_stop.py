"""Events recorded from the proxy's own tasks survive a graceful stop (governor/proxy/recording.py).

A stream held back while a tool call awaits admission (the bundled example passport: a
reviewer must approve delete_note) is cut when the upstream floods past
`max_held_stream_bytes`; the relay records that refusal from a task. A stop right after the
cut must still find it (and the held call's own events) in the session's final record:

  * `governor run` stopped with SIGTERM as soon as the agent sees the cut; the final record
    on disk is checked by `governor verify`;
  * in process, the same with the event loop's worker threads busy (a slow disk: every
    journal append waits for one) when the stop begins: before, the done hook cancelled the
    task recording the refusal and the one admitting the held call, and their appends,
    still queued, never ran; now the stop waits for them.

The runtime's sweeper likewise: a pass in progress at close() (here: expiring a review
nobody answered, on_oversight_timeout) ends before the final records are signed.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import orjson

from governor.cli import main as governor_cli
from governor.evidence import KeyFiles, record_path
from governor.proxy.server import Settings, serve
from tests.governor_process import GovernorProcess
from tests.proxy_harness import AGENT_NAMED
from governor.policy import ToolCall
from governor.policy.steps import ON_OVERSIGHT_TIMEOUT
from tests.test_runtime import Clock, make_runtime
from tests.test_runtime import pinned  # noqa: F401  (the fixture)
from tests.test_proxy_held_output import FLOOD_EVENTS, flood_event, stream
from tests.upstreams import Behaviour, MockLLM

FLOODING = Behaviour(text="Deleting it.", chunks=2, tool_calls=(("delete_note", {"path": "/workspace/notes/old.md"}),),
                     after_finish=(flood_event(), FLOOD_EVENTS))


def assert_cut(status: int, received: bytes) -> None:
    assert status == 200
    events = [orjson.loads(line[6:]) for line in received.split(b"\n") if line.startswith(b"data: {")]
    assert events[-1]["error"]["type"] == "governor_stream_cut" and b"FLOOD" not in received


async def until_cut(agent: httpx.AsyncClient, url: str, session: str) -> bytes:
    body = {"model": "gpt-4o-mini", "stream": True, "max_tokens": 200,
            "messages": [{"role": "user", "content": "tidy my notes"}]}
    received = b""
    async with agent.stream("POST", url, json=body, headers={"ADL-Session": session}) as answer:
        assert answer.status_code == 200
        async for chunk in answer.aiter_bytes():
            received += chunk
            if b"governor_stream_cut" in received:
                return received
    raise AssertionError(f"the stream ended without the cut: {received[-500:]!r}")


def verified_final_record(data_dir, session: str, capsys) -> dict:
    path = record_path(data_dir, session)
    capsys.readouterr()
    code = governor_cli(["verify", str(path), "--offline", "--key", str(KeyFiles(data_dir / "keys").public_key)])
    out = capsys.readouterr().out
    assert code == 3 and "\nINCOMPLETE" in out and "FAIL " not in out, out  # pinned key: not VALID
    return json.loads(path.read_text())


def refusals(record: dict) -> list[tuple[str, str]]:
    return [(e["action"], e["detail"]["reason"]) for e in record["events"] if e["cause"] == "on_governor_request_refused"]


async def test_the_cut_is_in_the_final_record_when_governor_run_is_stopped_right_after_it(tmp_path, capsys):
    mock = MockLLM()
    await mock.start()
    governor = await GovernorProcess(tmp_path / "data", ["--upstream-timeout", "60"]).start()
    try:
        mock.default = FLOODING
        async with httpx.AsyncClient(proxy="http://%s:%d" % governor.proxy, trust_env=False, timeout=30) as agent:
            status, received = await asyncio.wait_for(
                stream(agent, f"{mock.base_url}/v1/chat/completions", "cut-then-stopped"), 30)
            assert governor.proc is not None
            governor.proc.send_signal(15)  # SIGTERM the moment the agent has the cut
        assert_cut(status, received)
        assert await governor.stop(timeout=30) == 0  # graceful: exit 0
    finally:
        await governor.stop()
        await mock.stop()
    record = verified_final_record(tmp_path / "data", "cut-then-stopped", capsys)
    assert refusals(record) == [("fallback", "held_output_exceeded")]
    assert record["events"][0]["cause"] == "on_governor_oversight_trigger"  # the pause that held the stream


async def test_a_stop_waits_for_the_cut_and_the_held_call_to_be_recorded_when_appends_are_slow(tmp_path, capsys):
    mock = MockLLM()
    await mock.start()
    data_dir = tmp_path / "data"
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=data_dir,
                                   tick_interval=0))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    gate = threading.Event()
    loop = asyncio.get_running_loop()
    stopped = False
    try:
        # the session opened (its journal created) and the agent's connection made first:
        # both need the worker threads about to be made busy
        answer = await agent.post(f"{mock.base_url}/v1/chat/completions", headers={"ADL-Session": "slow-disk"},
                                  json={"model": "gpt-4o-mini", "max_tokens": 20,
                                        "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200, answer.text
        # every worker thread of the loop busy (more than its most, 32): a journal append waits
        busy = [loop.run_in_executor(None, gate.wait, 60) for _ in range(40)]
        mock.default = FLOODING
        # the agent reads until the cut (the stream's end waits for the held call's admission)
        received = await asyncio.wait_for(until_cut(agent, f"{mock.base_url}/v1/chat/completions", "slow-disk"), 30)
        assert b"FLOOD" not in received
        # neither the pause of the held call nor the cut's refusal is journaled yet; stop now,
        # and let the disk catch up a second into the stop
        loop.call_later(1.0, gate.set)
        await asyncio.wait_for(running.stop(), 30)
        stopped = True
        await asyncio.gather(*busy)
    finally:
        gate.set()
        await agent.aclose()
        if not stopped:
            await running.stop()
        await mock.stop()
    record = verified_final_record(data_dir, "slow-disk", capsys)
    assert refusals(record) == [("fallback", "held_output_exceeded")]
    assert [e["cause"] for e in record["events"]][:1] == ["on_governor_oversight_trigger"]  # the held call, recorded too


async def test_close_lets_a_sweep_pass_record_an_expiry_when_appends_are_slow(pinned, tmp_path):  # noqa: F811
    clock = Clock()
    runtime = make_runtime(pinned, tmp_path, clock)
    runtime.sweep_interval_sec = 0.05
    gate = threading.Event()
    loop = asyncio.get_running_loop()
    try:
        paused = await runtime.admit("s", ToolCall(tool="delete_note", arguments={"path": "/workspace/notes/x"}))
        assert paused.decision.action.value == "pause"
        clock.t += 15 * 60 + 1  # the reviewer's time is up: the next pass expires the approval
        busy = [loop.run_in_executor(None, gate.wait, 60) for _ in range(40)]
        runtime.start()
        for _ in range(200):  # the pass has begun (its expiry's append waits for a worker thread)
            if runtime.sweeper.sweeping:
                break
            await asyncio.sleep(0.01)
        assert runtime.sweeper.sweeping
        loop.call_later(0.5, gate.set)
        await asyncio.wait_for(runtime.close(), 30)
        await asyncio.gather(*busy)
    finally:
        gate.set()
    record = json.loads(record_path(tmp_path, "s").read_text())
    causes = [e["cause"] for e in record["events"]]
    assert causes[:2] == ["on_governor_oversight_trigger", ON_OVERSIGHT_TIMEOUT], causes
    assert record["outcome"] == "halted"  # the undeclared timeout fails closed
