"""Each §2-§7 limit observed end to end: an agent's real HTTP through the governor (the
bundled example passport, tier R3, SQLite state, the control plane with a reviewer
token), one session per limit; each session's signed record is then checked offline by
the `governor verify` command and must list exactly the events that fired.

The example passport: tokens 20000 per session (on_budget_exhausted: halt),
max_iterations 12 (on_iteration_limit: fallback), loop window 3 (on_detected: halt),
on_sub_agent_denied: continue, delegation only to example.com agents
(on_delegation_denied: fallback), delete_note requires confirmation, an anomaly
baseline whose cost range starts at $0.01 (so a cheap session's end is an on_anomaly),
and nothing declared for on_governor_session_integrity (fail closed).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.cli import main as governor_cli
from governor.demo.mock_llm import MockLLM
from governor.demo.mock_tools import MockTools
from governor.passport import example_passport_path
from governor.policy import Tier
from governor.proxy.server import Settings, serve
from tests.control_harness import A2APeer, peer_passport
from tests.proxy_harness import AGENT_NAMED

REVIEWER = "reviewer-token-for-e2e-tests-0123456789"


@pytest.fixture
async def world(tmp_path):
    llm, tools = MockLLM(prompt_tokens=100, completion_tokens=50), MockTools({"/workspace/notes/old.md": "x"})
    await llm.start()
    await tools.start()
    peer = await A2APeer({"p.json": peer_passport(Ed25519PrivateKey.generate(), name="helper")}).start()
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path / "data",
                                   tier=Tier.R3, reviewer_tokens=(REVIEWER,), tick_interval=0.5))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30)
    yield running, llm, tools, peer, agent, control
    await agent.aclose()
    await control.aclose()
    await running.stop()
    await peer.stop()
    await tools.stop()
    await llm.stop()


async def chat(world, session, max_tokens=100, answers=1, **headers):
    _, llm, *_rest = world
    agent = world[4]
    return await agent.post(f"{llm.url}/chat/completions", headers={"ADL-Session": session, **headers},
                            json={"model": "gpt-4o-mini", "max_tokens": max_tokens, "n": answers,
                                  "messages": [{"role": "user", "content": "find papers on governance"}]})


async def call_tool(world, session, name, arguments):
    tools, agent = world[2], world[4]
    return await agent.post(tools.url, headers={"ADL-Session": session},
                            json={"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                  "params": {"name": name, "arguments": arguments}})


async def approve_when_pending(control, session):
    for _ in range(200):
        pending = [a for a in (await control.get("/v1/approvals")).json()["approvals"] if a["session"] == session]
        if pending:
            answer = await control.post(f"/v1/approvals/{pending[0]['id']}", json={"decision": "approve", "reviewer": "lead"},
                                        headers={"Authorization": f"Bearer {REVIEWER}"})
            assert answer.status_code == 200, answer.text
            return pending[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing paused in session {session}")


async def verified_events(world, session, tmp_path, capsys):
    """End the session, save its record, run `governor verify` on it; the events' (cause, action)."""
    running, control = world[0], world[5]
    ended = await control.post(f"/v1/sessions/{session}/end")
    assert ended.status_code == 200, ended.text
    record = ended.json()
    path = tmp_path / f"{session}.json"
    path.write_text(json.dumps(record))
    keys = running.settings.data_dir / "keys"
    capsys.readouterr()
    code = governor_cli(["verify", str(path), "--offline", "--key", str(keys / "governor-pub.pem"),
                         "--passport", str(example_passport_path()), "--no-nonce"])
    out = capsys.readouterr().out
    assert code == 3 and "\nINCOMPLETE: not every step ran in full: 2 (governor key) partial" in out and "FAIL " not in out, out  # every step but the key's resolution
    return [(e["cause"], e["action"]) for e in record["events"]], record


async def test_s2_budget_exhaustion_halts_and_is_the_only_event(world, tmp_path, capsys):
    # 100 answers: output fitting could give each at most 199 tokens, under its floor (256)
    refused = await chat(world, "budget", max_tokens=25_000, answers=100)
    assert refused.status_code == 429
    assert refused.json()["error"]["governor"]["cause"] == "on_budget_exhausted"
    events, record = await verified_events(world, "budget", tmp_path, capsys)
    assert events == [("on_budget_exhausted", "halt")] and record["outcome"] == "halted"
    assert world[1].served == 0  # it never reached the model


async def test_s3_iteration_limit_resolves_the_declared_fallback(world, tmp_path, capsys):
    for _ in range(12):
        assert (await chat(world, "iterations")).status_code == 200
    thirteenth = await chat(world, "iterations")
    assert thirteenth.status_code == 200  # a fallback answers in the protocol's normal shape
    assert "iteration limit" in thirteenth.json()["choices"][0]["message"]["content"]
    assert world[1].served == 12
    events, _ = await verified_events(world, "iterations", tmp_path, capsys)
    # the cheap session's end is below the baseline's cost range: an R3 anomaly
    assert events == [("on_iteration_limit", "fallback"), ("on_anomaly", "pause")]


async def test_s3_loop_detection_halts_on_the_third_identical_call(world, tmp_path, capsys):
    for _ in range(2):
        ok = await call_tool(world, "loop", "search_papers", {"query": "agents"})
        assert ok.status_code == 200 and "error" not in ok.json()
    looped = await call_tool(world, "loop", "search_papers", {"query": "agents"})
    assert looped.json()["error"]["data"]["governor"]["cause"] == "on_iteration_limit"
    assert len(world[2].calls) == 2
    events, record = await verified_events(world, "loop", tmp_path, capsys)
    assert events == [("on_iteration_limit", "halt")] and record["events"][0]["detail"]["loop"] is True


async def test_s4_1_an_undeclared_persona_is_recorded_with_the_declared_continue(world, tmp_path, capsys):
    answered = await chat(world, "persona", **{"ADL-Persona": "ghost"})
    assert answered.status_code == 200  # on_sub_agent_denied: continue (fail-open, declared, recorded)
    events, record = await verified_events(world, "persona", tmp_path, capsys)
    # the spawn of the undeclared persona (denied, continued, so the instance lives and is
    # recorded as spawned), its model call (denied, continued), its end with the session
    assert events == [("on_sub_agent_denied", "continue"), ("on_governor_sub_agent_spawned", "continue"),
                      ("on_sub_agent_denied", "continue"), ("on_governor_sub_agent_ended", "continue"), ("on_anomaly", "pause")]
    assert record["events"][0]["detail"]["overridden_cause"] == "on_sub_agent_denied"
    assert record["events"][0]["detail"]["step"] == "persona_spawn"


async def test_s4_2_an_unmatched_peer_is_refused_with_the_declared_fallback(world, tmp_path, capsys):
    peer, agent = world[3], world[4]
    answered = await agent.post(f"{peer.url}/a2a", headers={"ADL-Session": "peer"},
                                json={"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
                                    "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hi"}]}}})
    assert answered.status_code == 200 and peer.received == []  # the peer never saw it
    events, record = await verified_events(world, "peer", tmp_path, capsys)
    assert events == [("on_delegation_denied", "fallback"), ("on_anomaly", "pause")]
    assert record["events"][0]["detail"]["reason"] == "identity_not_matched"


async def test_s5_a_confirmation_is_held_approved_and_recorded_with_the_reviewer(world, tmp_path, capsys):
    call = asyncio.create_task(call_tool(world, "oversight", "delete_note", {"path": "/workspace/notes/old.md"}))
    await asyncio.sleep(0.2)
    assert world[2].calls == []  # held, not forwarded
    await approve_when_pending(world[5], "oversight")
    done = await asyncio.wait_for(call, 30)
    assert done.json()["result"]["content"][0]["text"] == "deleted /workspace/notes/old.md"
    events, record = await verified_events(world, "oversight", tmp_path, capsys)
    assert events == [("on_governor_oversight_trigger", "pause"), ("on_governor_oversight_trigger", "pause"), ("on_anomaly", "pause")]
    assert record["events"][1]["detail"]["reviewer"] == "lead"


async def test_s6_a_passport_swap_fails_closed_when_nothing_is_declared(world, tmp_path, capsys):
    swapped = await chat(world, "swap", **{"ADL-Passport": "sha256=" + "A" * 43})
    assert swapped.status_code == 403
    assert swapped.json()["error"]["governor"]["cause"] == "on_governor_session_integrity"
    events, record = await verified_events(world, "swap", tmp_path, capsys)
    assert events == [("on_governor_session_integrity", "halt")]
    assert record["events"][0]["detail"]["fail_closed"] is True


async def test_s7_a_data_class_outside_the_baseline_is_an_anomaly(world, tmp_path, capsys):
    # send_email touches pii, outside the baseline's data classes: at R3 an anomaly (declared:
    # pause) on top of the tool's own confirmation. The request stays held through both
    # reviews (one per cause: the confirmation also covers the confidential-data trigger),
    # then goes out; the demo tool server has no send_email, so its error comes back as
    # on_tool_error (declared: continue).
    call = asyncio.create_task(call_tool(world, "anomaly", "send_email", {"to": "a@b", "subject": "s", "body": "b"}))
    reviewed = []
    while len(reviewed) < 2:
        reviewed.append(await approve_when_pending(world[5], "anomaly"))
    done = await asyncio.wait_for(call, 30)
    assert done.json()["error"]["code"] == -32602  # the tool server's own answer: it got there
    assert [a["trigger"] for a in reviewed] == ["tools.send_email.requires_confirmation", "on_anomaly"]
    events, record = await verified_events(world, "anomaly", tmp_path, capsys)
    assert events == [
        ("on_governor_oversight_trigger", "pause"), ("on_governor_oversight_trigger", "pause"),
        ("on_anomaly", "pause"), ("on_anomaly", "pause"),  # paused, then approved
        ("on_tool_error", "continue"),
        ("on_anomaly", "pause"),  # the session's cost ends below the baseline's range
    ]
    assert {d["kind"] for d in record["events"][2]["detail"]["deviations"]} == {"data_class"}
