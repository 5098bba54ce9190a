"""Persona instances and peer delegations end to end: an agent's real HTTP through the real
proxy and runtime (SQLite state, a loopback model and A2A peers), the signed record checked
by the evidence verifier. What docs/personas.md defines: `ADL-Persona: name[; instance=id]`,
an instance lives from its first request until ended (control plane) or idle, its spawn and
end are recorded, max_parallel counts live instances, and the persona's wall-clock share
is charged while one lives."""

from __future__ import annotations

import asyncio
import copy
import socket
import time

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.adapters.a2a import PeerResolver, admission_verifier
from governor.adapters.base import AdapterConfig
from governor.demo.mock_llm import MockLLM
from governor.evidence.verify import verify_record
from governor.proxy.server import Settings, serve
from tests.control_harness import A2APeer, peer_passport, real_runtime
from tests.test_a2a_delegation import OURS
from tests.test_adapter_a2a import send
from tests.proxy_harness import AGENT_NAMED

LEAD = {
    "adl_spec": "0.4.0", "name": "lead", "description": "runs reviewers", "version": "1.0.0",
    "id": "https://example.com/agents/lead", "data_classification": {"sensitivity": "internal"},
    "security": {"authentication": {"type": "api_key", "scopes": ["papers:read"]}},
    "permissions": {
        "resource_limits": {"budget": {"tokens": {"per_session": 100_000, "per_day": 1_000_000}}},
        "sub_agents": [
            {"name": "reviewer", "description": "reviews drafts", "max_parallel": 2},
            {"name": "timed", "description": "has one second of wall-clock",
             "budget_share": {"wall_clock_sec": {"per_session": 1}}},
            {"name": "patient", "description": "has a minute of wall-clock",
             "budget_share": {"wall_clock_sec": {"per_session": 60}}},
        ],
    },
}


def _with_fallback(document):
    document = copy.deepcopy(document)
    document["runtime"] = {"degradation": {"on_sub_agent_denied": {
        "action": "fallback", "message": "no more reviewers right now"}}}
    return document


class World:
    def __init__(self, running, runtime, passport, llm, agent, control):
        self.running, self.runtime, self.passport = running, runtime, passport
        self.llm, self.agent, self.control = llm, agent, control

    async def chat(self, session: str, persona: str | None = None, **headers) -> httpx.Response:
        if persona is not None:
            headers["ADL-Persona"] = persona
        return await self.agent.post(f"{self.llm.url}/chat/completions", headers={"ADL-Session": session, **headers},
                                     json={"model": "gpt-4o-mini", "max_tokens": 50,
                                           "messages": [{"role": "user", "content": "review this"}]})

    async def verified(self, session: str, end: bool = True) -> dict:
        """The session's signed record (ended first), checked by the evidence verifier."""
        if end:
            answer = await self.control.post(f"/v1/sessions/{session}/end")
            assert answer.status_code == 200, answer.text
            record = answer.json()
        else:
            record = (await self.control.get(f"/v1/sessions/{session}/record")).json()
        report = verify_record(record, public_key=self.runtime.key.public_key(), passport=self.passport)
        assert report.ok, report.summary()
        return record


async def _world(tmp_path, document, **runtime_options):
    llm = MockLLM(prompt_tokens=20, completion_tokens=10)
    await llm.start()
    runtime, passport = real_runtime(document, tmp_path, **runtime_options)
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path,
                                   tick_interval=0.2), runtime)
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30)
    return World(running, runtime, passport, llm, agent, control)


async def _close(world: World) -> None:
    await world.agent.aclose()
    await world.control.aclose()
    await world.running.stop()
    await world.llm.stop()


@pytest.fixture
async def world(tmp_path):
    world = await _world(tmp_path, LEAD)
    yield world
    await _close(world)


@pytest.fixture
async def lenient(tmp_path):
    """on_sub_agent_denied: fallback, so a refused spawn leaves the session running."""
    world = await _world(tmp_path, _with_fallback(LEAD))
    yield world
    await _close(world)


def _events(record) -> list[tuple[str, str]]:
    return [(e["cause"], e["action"]) for e in record["events"]]


# --- spawns and delegations in the record (§4.1.5, §4.2.5) -----------------------------------


async def test_a_permitted_spawn_is_in_the_verified_record_once_per_instance(world):
    for _ in range(2):  # the second request is the same instance: no second spawn
        assert (await world.chat("spawn", "reviewer; instance=r1")).status_code == 200
    record = await world.verified("spawn")
    assert _events(record) == [("on_governor_sub_agent_spawned", "continue"), ("on_governor_sub_agent_ended", "continue")]
    spawned, ended = (e["detail"] for e in record["events"])
    assert (spawned["persona"], spawned["instance"], spawned["decision"]) == ("reviewer", "r1", "permit")
    assert spawned["matched_rule"] == "permissions.sub_agents[0]" and spawned["max_parallel"] == 2
    assert "overridden_cause" not in spawned  # a permitted spawn overrides nothing
    assert (ended["instance"], ended["reason"]) == ("r1", "session_end")
    assert world.llm.served == 2


async def test_requests_without_an_instance_share_the_implicit_one(world):
    for _ in range(3):
        assert (await world.chat("implicit", "reviewer")).status_code == 200
    listed = (await world.control.get("/v1/sessions/implicit/personas")).json()["instances"]
    assert [(i["persona"], i["instance"]) for i in listed] == [("reviewer", None)]
    record = await world.verified("implicit")
    assert _events(record).count(("on_governor_sub_agent_spawned", "continue")) == 1


@pytest.fixture
async def peers():
    started = {}
    for name in ("summarizer", "untrusted-bot"):
        doc = peer_passport(Ed25519PrivateKey.generate(), name=name, scopes=("papers:read",), tokens=(1000, 5000))
        started[name] = await A2APeer({f"{name}.json": doc}).start()
    yield started
    for peer in started.values():
        await peer.stop()


async def test_a_permitted_delegation_is_in_the_verified_record(tmp_path, peers):
    document = copy.deepcopy(OURS)
    document["permissions"]["sub_agents"] = [{"name": "scout", "description": "finds summaries"}]
    runtime, passport = real_runtime(document, tmp_path)
    resolver = PeerResolver(admission_verifier())
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp_path,
                                   adapters=AdapterConfig(extra={"a2a_peers": resolver})), runtime)
    try:
        async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30) as client:
            sent = await client.post(f"{peers['summarizer'].url}/a2a", json=send("message/send"),
                                     headers={"ADL-Session": "delegating"})
            refused = await client.post(f"{peers['untrusted-bot'].url}/a2a", json=send("message/send"),
                                        headers={"ADL-Session": "delegating-2"})
            by_persona = await client.post(f"{peers['summarizer'].url}/a2a", json=send("message/send"),
                                           headers={"ADL-Session": "delegating-3", "ADL-Persona": "scout"})
        scouted = await runtime.end_session("delegating-3")
        record = await runtime.end_session("delegating")
    finally:
        await running.stop()
        await resolver.close()
    assert sent.status_code == 200 and "result" in sent.json()
    assert "error" in refused.json()  # a refused peer: on_delegation_denied, not an admission
    report = verify_record(record, public_key=runtime.key.public_key(), passport=passport)
    assert report.ok, report.summary()
    [event] = record["events"]
    assert (event["cause"], event["action"]) == ("on_governor_delegation_admitted", "continue")
    detail = event["detail"]
    assert detail["peer"] == "https://127.0.0.1/agents/summarizer" and detail["decision"] == "permit"
    assert detail["matched_rule"] == "match:https://127.0.0.1/agents/*" and detail["chain_depth"] == 1
    assert detail["attenuation"]["scopes_subset"]["ok"] is True
    assert by_persona.status_code == 200 and "result" in by_persona.json()
    assert verify_record(scouted, public_key=runtime.key.public_key(), passport=passport).ok
    assert [(e["cause"], e["detail"].get("persona")) for e in scouted["events"]] == [
        ("on_governor_sub_agent_spawned", "scout"), ("on_governor_delegation_admitted", "scout"), ("on_governor_sub_agent_ended", "scout")]


async def test_persona_refusals_on_a2a_are_json_rpc_errors_and_the_peer_sees_nothing(tmp_path, peers):
    from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE

    runtime, _ = real_runtime(OURS, tmp_path)  # declares no persona
    resolver = PeerResolver(admission_verifier())
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp_path,
                                   adapters=AdapterConfig(extra={"a2a_peers": resolver})), runtime)
    peer = peers["summarizer"]
    try:
        async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30) as client:
            undeclared = await client.post(f"{peer.url}/a2a", json=send("message/send"),
                                           headers={"ADL-Session": "a2a-ghost", "ADL-Persona": "ghost"})
            malformed = await client.post(f"{peer.url}/a2a", json=send("message/send"),
                                          headers={"ADL-Session": "a2a-bad", "ADL-Persona": "x; instance=a/b"})
    finally:
        await running.stop()
        await resolver.close()
    error = undeclared.json()["error"]
    assert error["code"] == GOVERNOR_ERROR_CODE
    assert undeclared.json()["id"] == send("message/send")["id"]
    assert (error["data"]["governor"]["cause"], error["data"]["governor"]["reason"]) == (
        "on_sub_agent_denied", "undeclared_persona")
    assert malformed.status_code == 400 and "instance must be" in malformed.json()["error"]["message"]
    assert peer.received == []


# --- max_parallel at the wire ---------------------------------------------------------------


async def test_max_parallel_2_refuses_the_third_live_instance_and_records_it(world):
    for instance in ("a", "b"):
        assert (await world.chat("parallel", f"reviewer; instance={instance}")).status_code == 200
    third = await world.chat("parallel", "reviewer; instance=c")
    assert third.status_code == 403
    governor = third.json()["error"]["governor"]
    assert (governor["cause"], governor["reason"], governor["limit"]) == ("on_sub_agent_denied", "max_parallel", 2)
    assert world.llm.served == 2  # the third never reached the model
    record = await world.verified("parallel")
    assert _events(record)[:3] == [("on_governor_sub_agent_spawned", "continue"), ("on_governor_sub_agent_spawned", "continue"),
                                   ("on_sub_agent_denied", "halt")]
    denied = record["events"][2]["detail"]
    assert (denied["persona"], denied["observed"], denied["limit"]) == ("reviewer", 2, 2)


async def test_concurrent_first_requests_of_instances_never_exceed_max_parallel(lenient):
    answers = await asyncio.gather(*(lenient.chat("race", f"reviewer; instance=i{n % 4}") for n in range(12)))
    assert all(a.status_code == 200 for a in answers)
    listed = (await lenient.control.get("/v1/sessions/race/personas")).json()["instances"]
    assert len(listed) == 2  # two of the four instances live, the others were refused (fallback)
    record = await lenient.verified("race")
    assert _events(record).count(("on_governor_sub_agent_spawned", "continue")) == 2


async def test_an_instance_ended_through_the_control_plane_frees_its_slot(lenient):
    for instance in ("a", "b"):
        assert (await lenient.chat("slots", f"reviewer; instance={instance}")).status_code == 200
    refused = await lenient.chat("slots", "reviewer; instance=c")
    assert "no more reviewers" in refused.json()["choices"][0]["message"]["content"]  # the declared fallback
    assert lenient.llm.served == 2
    ended = await lenient.control.post("/v1/sessions/slots/personas/reviewer/end", json={"instance": "a"})
    assert ended.status_code == 200 and ended.json()["reason"] == "ended_by_control"
    again = await lenient.control.post("/v1/sessions/slots/personas/reviewer/end", json={"instance": "a"})
    assert again.status_code == 404 and again.json()["error"]["code"] == "unknown_persona_instance"
    assert (await lenient.chat("slots", "reviewer; instance=c")).status_code == 200
    assert lenient.llm.served == 3
    record = await lenient.verified("slots")
    assert _events(record)[:5] == [
        ("on_governor_sub_agent_spawned", "continue"), ("on_governor_sub_agent_spawned", "continue"),
        ("on_sub_agent_denied", "fallback"), ("on_governor_sub_agent_ended", "continue"), ("on_governor_sub_agent_spawned", "continue")]
    assert record["events"][3]["detail"]["instance"] == "a"


async def test_an_idle_instance_ends_by_itself_and_frees_its_slot(tmp_path):
    world = await _world(tmp_path, _with_fallback(LEAD), sweep_interval_sec=0.1)
    world.runtime.personas.idle_sec = 0.5
    try:
        for instance in ("a", "b"):
            assert (await world.chat("idle", f"reviewer; instance={instance}")).status_code == 200
        deadline = time.monotonic() + 10
        while (await world.control.get("/v1/sessions/idle/personas")).json()["instances"]:
            assert time.monotonic() < deadline, "the idle instances never ended"
            await asyncio.sleep(0.1)
        assert (await world.chat("idle", "reviewer; instance=c")).status_code == 200
        assert world.llm.served == 3  # c was admitted, not answered by the fallback
        record = await world.verified("idle")
    finally:
        await _close(world)
    ends = [e["detail"] for e in record["events"] if e["cause"] == "on_governor_sub_agent_ended"]
    assert [(d["instance"], d["reason"]) for d in ends][:2] == [("a", "idle"), ("b", "idle")]


# --- the persona's wall-clock share at the wire ---------------------------------------------


async def test_a_personas_wall_clock_share_cap_fires_through_the_proxy(tmp_path):
    world = await _world(tmp_path, LEAD, sweep_interval_sec=0.1)
    try:
        assert (await world.chat("clock", "timed")).status_code == 200
        deadline = time.monotonic() + 10
        while (await world.control.get("/v1/sessions/clock")).json()["state"] != "halted":
            assert time.monotonic() < deadline, "the persona's wall-clock share never fired"
            await asyncio.sleep(0.1)
        refused = await world.chat("clock", "timed")
        assert refused.status_code == 429
        governor = refused.json()["error"]["governor"]
        assert (governor["cause"], governor["halt_cause"]) == ("on_budget_exhausted", "on_budget_exhausted")
        assert world.llm.served == 1
        record = await world.verified("clock")
    finally:
        await _close(world)
    assert _events(record)[:2] == [("on_governor_sub_agent_spawned", "continue"), ("on_budget_exhausted", "halt")]
    fired = record["events"][1]["detail"]
    assert (fired["dimension"], fired["budget_share"], fired["limit"]) == ("wall_clock_sec", "timed", 1)
    assert fired["projected"] > 1


async def test_an_ended_instance_stops_drawing_on_the_wall_clock_share(tmp_path):
    world = await _world(tmp_path, LEAD, sweep_interval_sec=0.1)

    async def used() -> float:
        view = (await world.control.get("/v1/sessions/stopped")).json()
        [share] = [b for b in view["budgets"] if b["persona"] == "patient" and b["scope"] == "per_session"]
        return share["used"]

    try:
        assert (await world.chat("stopped", "patient")).status_code == 200
        await asyncio.sleep(0.5)
        assert (await world.control.post("/v1/sessions/stopped/personas/patient/end")).status_code == 200
        at_end = await used()
        await asyncio.sleep(1.0)  # ticks go on for the session, not for the ended persona
        assert (await world.chat("stopped")).status_code == 200
        later = await used()
    finally:
        await _close(world)
    assert at_end >= 0.5 and later == at_end


# --- hostile ADL-Persona values ---------------------------------------------------------------


@pytest.mark.parametrize("value, message", [
    ("r" * 129, "longer than 128"),
    ("reviewer; instance=" + "x" * 129, "instance must be"),
    ("reviewer; instance=a b", "instance must be"),
    ("reviewer; instance=../../etc", "instance must be"),
    ("reviewer; instance=", "instance must be"),
    ("reviewer; colour=blue", "one parameter"),
    ("reviewer, reviewer", "more than once"),
    ("; instance=a", "names no persona"),
])
async def test_a_malformed_persona_header_is_refused_clearly_and_touches_nothing(world, value, message):
    refused = await world.chat("hostile", value)
    assert refused.status_code == 400
    assert message in refused.json()["error"]["message"]
    assert world.llm.served == 0
    assert (await world.chat("bystander", "reviewer")).status_code == 200  # the proxy and others go on
    # the refusal is its session's only event (governor.proxy.refusals): no persona instance
    # was spawned, no step decided
    record = (await world.control.get("/v1/sessions/hostile/record")).json()
    assert [(e["cause"], e["detail"]["reason"]) for e in record["events"]] == [("on_governor_request_refused", "bad_request")]


async def test_control_characters_in_the_persona_header_are_refused(world):
    host, port = world.running.proxy_url.removeprefix("http://").split(":")
    target = f"{world.llm.url}/chat/completions"
    body = b'{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"x"}]}'

    def raw() -> bytes:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST " + target.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"ADL-Session: ctl\r\nADL-Persona: revi\x01ewer\x7f\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            return answer

    answer = await asyncio.to_thread(raw)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert world.llm.served == 0
    assert (await world.chat("bystander", "reviewer")).status_code == 200


async def test_an_undeclared_persona_is_refused_recorded_and_halts_only_its_session(world):
    assert (await world.chat("other", "reviewer")).status_code == 200
    refused = await world.chat("ghostly", "ghost")
    assert refused.status_code == 403
    governor = refused.json()["error"]["governor"]
    assert (governor["cause"], governor["reason"]) == ("on_sub_agent_denied", "undeclared_persona")
    assert (await world.chat("other", "reviewer")).status_code == 200  # another session is untouched
    record = await world.verified("ghostly")
    assert _events(record) == [("on_sub_agent_denied", "halt")]
    other = await world.verified("other")
    assert _events(other) == [("on_governor_sub_agent_spawned", "continue"), ("on_governor_sub_agent_ended", "continue")]


async def test_ending_an_unknown_instance_or_session_is_a_clear_404(world):
    answer = await world.control.post("/v1/sessions/nobody/personas/reviewer/end", json={"instance": "z"})
    assert answer.status_code == 404 and "no live instance 'z'" in answer.json()["error"]["message"]
    bad = await world.control.post("/v1/sessions/nobody/personas/reviewer/end", json={"instance": 7})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_instance"
    assert (await world.control.get("/v1/sessions/nobody/personas")).status_code == 404
