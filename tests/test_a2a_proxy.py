"""A2A through the real governor with the real runtime: an agent's JSON-RPC messages to
loopback peers (each serving its ADL discovery document and signed passport) are
Delegation steps; permitted peers answer, refused ones never see the message."""

from __future__ import annotations

import copy

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.adapters.a2a import DEPTH_HEADER, PeerResolver, admission_verifier
from governor.adapters.base import AdapterConfig
from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE, parse_events
from governor.proxy.server import Settings, serve
from tests.control_harness import A2APeer, peer_passport, real_runtime
from tests.test_a2a_delegation import OURS
from tests.test_adapter_a2a import send
from tests.proxy_harness import AGENT_NAMED


@pytest.fixture
async def peers():
    started = {}
    for name, scopes, tokens in [("summarizer", ("papers:read",), (1000, 5000)),
                                 ("untrusted-bot", ("papers:read",), (1000, 5000)),
                                 ("greedy", ("papers:read", "mail:send"), (1000, 5000))]:
        doc = peer_passport(Ed25519PrivateKey.generate(), name=name, scopes=scopes, tokens=tokens)
        started[name] = await A2APeer({f"{name}.json": doc}).start()
    yield started
    for peer in started.values():
        await peer.stop()


async def _governor(document, tmp_path, **settings):
    runtime, _ = real_runtime(document, tmp_path)
    resolver = PeerResolver(admission_verifier())
    settings = Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp_path,
                        adapters=AdapterConfig(extra={"a2a_peers": resolver}), **settings)
    return await serve(settings, runtime), resolver


@pytest.fixture
async def governor(tmp_path):
    # the peer resolver serve() builds itself, as `governor run` has it
    runtime, _ = real_runtime(OURS, tmp_path)
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp_path), runtime)
    yield running
    await running.stop()


async def test_a_statically_mapped_peer_is_verified_from_its_file_without_discovery(tmp_path, peers):
    import json

    peer = peers["summarizer"]
    document = peer.passports["summarizer.json"]
    passport_file = tmp_path / "summarizer-passport.json"
    passport_file.write_text(json.dumps(document))
    runtime, _ = real_runtime(OURS, tmp_path)
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp_path,
                                   peers={peer.url: str(passport_file)}), runtime)
    try:
        resp = await _delegate(running, peer, "static-1")
    finally:
        await running.stop()
    assert resp.status_code == 200 and len(peer.received) == 1
    assert peer.hits.get("/.well-known/adl-agents", 0) == 0  # the map answered, nothing was fetched


async def _delegate(running, peer: A2APeer, session: str, method: str = "message/send", headers=None) -> httpx.Response:
    async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30) as client:
        return await client.post(f"{peer.url}/a2a", json=send(method),
                                 headers={"ADL-Session": session, **(headers or {})})


async def test_a_permitted_peer_gets_the_message_with_the_delegation_depth(governor, peers):
    peer = peers["summarizer"]
    resp = await _delegate(governor, peer, "ok-1", headers={DEPTH_HEADER: "0"})
    assert resp.status_code == 200
    assert resp.json()["result"]["parts"][0]["text"] == "done: summarize 2401.00001"
    [(headers, _)] = peer.received
    assert headers[DEPTH_HEADER] == "1"  # this call's depth, set by the governor
    assert "ADL-Session" not in headers  # the agent's ADL-* headers never reach the peer


async def test_a_streamed_delegation_to_a_permitted_peer_flows(governor, peers):
    resp = await _delegate(governor, peers["summarizer"], "ok-2", method="message/stream")
    assert resp.headers["content-type"].startswith("text/event-stream")
    [event] = parse_events(resp.content)
    assert event.json()["result"]["kind"] == "message"


@pytest.mark.parametrize("name, headers, reason", [
    ("untrusted-bot", None, "identity_denied"),
    ("summarizer", {DEPTH_HEADER: "2"}, "max_depth_exceeded"),
    ("greedy", None, "attenuation_failed"),
])
async def test_a_refused_peer_never_sees_the_message(governor, peers, name, headers, reason):
    peer = peers[name]
    resp = await _delegate(governor, peer, f"refused-{name}-{reason}", headers=headers)
    assert resp.status_code == 200  # a JSON-RPC error, as A2A clients read them
    error = resp.json()["error"]
    assert error["code"] == GOVERNOR_ERROR_CODE
    assert error["data"]["governor"]["cause"] == "on_delegation_denied"
    assert error["data"]["governor"]["action"] == "halt"
    assert error["data"]["governor"]["reason"] == reason
    assert peer.received == []


async def test_a_streamed_refusal_is_an_sse_error_event(governor, peers):
    resp = await _delegate(governor, peers["untrusted-bot"], "refused-stream", method="message/stream")
    assert resp.headers["content-type"].startswith("text/event-stream")
    [event] = parse_events(resp.content)
    assert event.json()["error"]["data"]["governor"]["cause"] == "on_delegation_denied"


async def test_a_declared_fallback_answers_as_the_peer_would(tmp_path, peers):
    document = copy.deepcopy(OURS)
    document["runtime"] = {"degradation": {"on_delegation_denied": {
        "action": "fallback", "value": "no delegation today", "message": "That agent is not one we may call."}}}
    running, resolver = await _governor(document, tmp_path)
    try:
        resp = await _delegate(running, peers["untrusted-bot"], "fallback-1")
    finally:
        await running.stop()
        await resolver.close()
    result = resp.json()["result"]
    assert result["kind"] == "message" and result["role"] == "agent"
    assert result["parts"] == [{"kind": "text", "text": "no delegation today"}]
    assert result["metadata"]["governor"]["cause"] == "on_delegation_denied"
    assert peers["untrusted-bot"].received == []
