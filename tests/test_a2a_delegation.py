"""Peer admission end to end in the decision point: the A2A adapter resolves a loopback
peer's signed passport, and the real policy engine applies §4.2 to the Delegation step."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.runtime.prices import price_book
from governor.adapters.a2a import A2AAdapter, DEPTH_HEADER, PeerResolver, admission_verifier
from governor.adapters.base import AdapterConfig
from governor.policy import SessionState, compile_limits, decide
from governor.policy.pricing import load_pricing
from tests.conftest import REPO
from governor.policy.steps import ON_DELEGATION_DENIED, Action, Tier
from tests.control_harness import A2APeer, peer_passport
from tests.test_adapter_a2a import peer_view, send

OURS = {
    "adl_spec": "0.4.0", "name": "orchestrator", "description": "delegates summaries", "version": "1.0.0",
    "id": "https://example.com/agents/orchestrator", "data_classification": {"sensitivity": "internal"},
    "security": {"authentication": {"type": "api_key", "scopes": ["papers:read", "notes:write"]}},
    "permissions": {
        "resource_limits": {"budget": {"tokens": {"per_session": 2000, "per_day": 10000}}},
        "delegation": {
            "match": ["https://127.0.0.1/agents/*"],
            "deny": ["https://127.0.0.1/agents/untrusted-*"],
            "max_depth": 2,
            "attenuation": {"scopes_subset": True, "budget_subset": True},
        },
    },
}


@pytest.fixture
async def world():
    peer_keys = {}
    passports = {}
    for name, scopes, tokens in [
        ("summarizer", ("papers:read",), (1000, 5000)),
        ("untrusted-bot", ("papers:read",), (1000, 5000)),
        ("greedy", ("papers:read", "mail:send"), (1000, 5000)),
        ("big-spender", ("papers:read",), (3000, 5000)),
    ]:
        peer_keys[name] = Ed25519PrivateKey.generate()
        passports[name] = peer_passport(peer_keys[name], name=name, scopes=scopes, tokens=tokens)
    peers = {}
    for name, doc in passports.items():  # one peer server per agent, each serving its own discovery
        peers[name] = await A2APeer({f"{name}.json": doc}).start()
    stranger = peer_passport(Ed25519PrivateKey.generate(), name="stranger",
                             identifier="https://127.0.0.1/elsewhere/stranger")
    peers["stranger"] = await A2APeer({"stranger.json": stranger}).start()
    resolver = PeerResolver(admission_verifier())
    adapter = A2AAdapter(AdapterConfig(extra={"a2a_peers": resolver}))
    pricing = price_book()
    limits = compile_limits(OURS, tier=Tier.R2, pricing=pricing)
    yield adapter, peers, limits
    await resolver.close()
    for peer in peers.values():
        await peer.stop()


async def _decide(adapter, limits, peer, headers=None):
    exchange = adapter.open(peer_view(peer, send(), headers), session="s1", persona=None)
    [step] = await adapter.steps(exchange)
    now = time.time()
    return step, decide(limits, SessionState.start("s1", now), step, now)


async def test_a_permitted_peer_is_admitted(world):
    adapter, peers, limits = world
    step, decision = await _decide(adapter, limits, peers["summarizer"])
    assert step.peer_verified and step.peer_id == "https://127.0.0.1/agents/summarizer"
    assert decision.action is Action.PERMIT and not decision.blocks


@pytest.mark.parametrize("name, headers, reason", [
    ("untrusted-bot", None, "identity_denied"),
    ("stranger", None, "identity_not_matched"),
    ("summarizer", {DEPTH_HEADER.lower(): "2"}, "max_depth_exceeded"),  # this call would be depth 3
    ("greedy", None, "attenuation_failed"),  # a scope we do not hold
    ("big-spender", None, "attenuation_failed"),  # a per-session token cap above ours
])
async def test_a_refused_peer_is_on_delegation_denied(world, name, headers, reason):
    adapter, peers, limits = world
    step, decision = await _decide(adapter, limits, peers[name], headers)
    assert step.peer_verified
    assert decision.cause == ON_DELEGATION_DENIED and decision.blocks
    assert decision.action is Action.HALT and decision.fail_closed  # nothing declared: fail closed
    assert decision.event["detail"]["reason"] == reason


async def test_an_unverifiable_peer_is_denied(world):
    adapter, peers, limits = world
    peers["summarizer"].passports["summarizer.json"]["description"] = "tampered"
    step, decision = await _decide(adapter, limits, peers["summarizer"])
    assert not step.peer_verified
    assert decision.cause == ON_DELEGATION_DENIED and decision.blocks
