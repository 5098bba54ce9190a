"""The A2A adapter: matching, peer resolution (discovery, card, static map, cache),
delegation depth, refusals and fallbacks, against a loopback A2A peer."""

from __future__ import annotations

import json

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.adapters.a2a import A2AAdapter, DEPTH_HEADER, PeerResolver, admission_verifier
from governor.adapters.base import AdapterConfig
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE, parse_events
from governor.policy.steps import Action, Decision, Delegation
from tests.control_harness import A2APeer, peer_passport


def send(method="message/send", rpc_id=11, text="summarize 2401.00001"):
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": {"message": {
        "kind": "message", "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": text}]}}}


def view(body, *, port=443, host="peer.example.com", scheme="https", path="/a2a", headers=None) -> RequestView:
    return RequestView("POST", host, path, {"content-type": "application/json", **(headers or {})},
                       orjson.dumps(body), port=port, scheme=scheme)


def peer_view(peer: A2APeer, body, headers=None) -> RequestView:
    return view(body, host="127.0.0.1", port=peer.port, scheme="http", headers=headers)


@pytest.fixture
def key():
    return Ed25519PrivateKey.generate()


@pytest.fixture
async def peers():
    started: list[A2APeer] = []
    resolvers: list[PeerResolver] = []

    async def start(passports, **kwargs) -> A2APeer:
        peer = await A2APeer(passports, **kwargs).start()
        started.append(peer)
        return peer

    start.resolvers = resolvers
    yield start
    for resolver in resolvers:
        await resolver.close()
    for peer in started:
        await peer.stop()


def resolver(peers, **kwargs) -> PeerResolver:
    r = PeerResolver(admission_verifier(), **kwargs)
    peers.resolvers.append(r)
    return r


# --- matching --------------------------------------------------------------------------


@pytest.mark.parametrize("body, expected", [
    (send(), True),
    (send("message/stream"), True),
    ({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "t1"}}, True),
    ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x"}}, False),  # MCP
    ({"messages": []}, False),
])
def test_match_by_body_shape(body, expected):
    assert A2AAdapter().match(view(body)) is expected


# --- peer resolution -------------------------------------------------------------------


async def test_discovered_and_verified_peer_is_a_verified_delegation(peers, key):
    doc = peer_passport(key)
    peer = await peers({"summarizer.json": doc})
    adapter = A2AAdapter(AdapterConfig(extra={"a2a_peers": resolver(peers)}))
    exchange = adapter.open(peer_view(peer, send()), session="s", persona=None)
    [step] = await adapter.steps(exchange)
    assert isinstance(step, Delegation)
    assert step.peer_id == doc["id"] and step.peer_verified is True
    assert step.peer_passport["security"]["authentication"]["scopes"] == ["papers:read"]
    assert step.chain_depth == 1 and step.peer_url == f"{peer.url}/a2a"
    assert exchange.upstream_headers == {DEPTH_HEADER: "1"}


async def test_resolution_is_cached_per_origin(peers, key):
    peer = await peers({"summarizer.json": peer_passport(key)})
    r = resolver(peers)
    first = await r.resolve(f"{peer.url}/a2a")
    second = await r.resolve(f"{peer.url}/other/endpoint")
    assert first == second and first.verified
    assert peer.hits == {"/.well-known/adl-agents": 1, "/passports/summarizer.json": 1}


async def test_failures_are_cached_only_for_the_negative_ttl(peers, key):
    now = [1000.0]
    peer = await peers({"summarizer.json": peer_passport(key)},
                       discovery={"adl_discovery": "1.0", "agents": []})
    r = resolver(peers, negative_ttl=30, clock=lambda: now[0])
    assert not (await r.resolve(f"{peer.url}/a2a")).verified
    assert not (await r.resolve(f"{peer.url}/a2a")).verified
    assert peer.hits["/.well-known/adl-agents"] == 1
    peer.discovery = None  # the peer fixes its discovery document
    now[0] += 31
    assert (await r.resolve(f"{peer.url}/a2a")).verified


async def test_several_agents_are_told_apart_by_the_agent_card(peers, key):
    other = peer_passport(Ed25519PrivateKey.generate(), name="translator")
    mine = peer_passport(key, name="summarizer")
    peer = await peers({"translator.json": other, "summarizer.json": mine}, card_name="summarizer")
    identity = await resolver(peers).resolve(f"{peer.url}/a2a")
    assert identity.verified and identity.peer_id == mine["id"]
    assert peer.hits["/passports/summarizer.json"] == 1 and "/passports/translator.json" not in peer.hits


async def test_several_agents_without_a_card_stay_unverified(peers, key):
    peer = await peers({"a.json": peer_passport(key, name="a"),
                        "b.json": peer_passport(Ed25519PrivateKey.generate(), name="b")})
    identity = await resolver(peers).resolve(f"{peer.url}/a2a")
    assert not identity.verified and "lists 2 agents" in identity.reason


@pytest.mark.parametrize("tamper, fragment", [
    (lambda d: d.update(description="changed after signing"), "signature"),
    (lambda d: d.update(id="https://peer.example.com/agents/someone-else"), "is not the discovered id"),
    (lambda d: d.pop("version"), "schema"),
])
async def test_a_passport_that_fails_admission_is_unverified(peers, key, tamper, fragment):
    doc = peer_passport(key)
    discovery = {"adl_discovery": "1.0", "agents": [
        {"id": doc["id"], "name": doc["name"], "adl_document": "/passports/summarizer.json"}]}
    tamper(doc)
    peer = await peers({"summarizer.json": doc}, discovery=discovery)
    r = resolver(peers)
    adapter = A2AAdapter(AdapterConfig(extra={"a2a_peers": r}))
    [step] = await adapter.steps(adapter.open(peer_view(peer, send()), session="s", persona=None))
    assert step.peer_verified is False and step.peer_passport is None
    assert fragment in (await r.resolve(f"{peer.url}/a2a")).reason  # cached: same answer, with the reason


@pytest.mark.parametrize("identifier, fragment", [
    ("https://example.com/agents/summarizer", "of domain example.com"),  # another domain's identity
    ("urn:adl:agent:example:summarizer:1.0.0", "names no domain"),
])
async def test_a_peer_speaks_only_for_its_own_domain(peers, key, identifier, fragment):
    peer = await peers({"summarizer.json": peer_passport(key, identifier=identifier)})
    identity = await resolver(peers).resolve(f"{peer.url}/a2a")
    assert not identity.verified and identity.passport is None
    assert f"the peer at 127.0.0.1 claims identity {identifier!r}" in identity.reason and fragment in identity.reason


async def test_unsigned_peer_passport_is_refused_by_default(peers):
    doc = peer_passport(Ed25519PrivateKey.generate())
    del doc["security"]["attestation"]
    peer = await peers({"summarizer.json": doc})
    identity = await resolver(peers).resolve(f"{peer.url}/a2a")
    assert not identity.verified and "signature" in identity.reason


async def test_unreachable_or_garbled_discovery_is_unverified(peers, key):
    r = resolver(peers, timeout=2)
    gone = await r.resolve("http://127.0.0.1:9/a2a")  # discard port: nothing listens
    assert not gone.verified and "GET http://127.0.0.1:9/.well-known/adl-agents" in gone.reason
    peer = await peers({}, discovery={"agents": "nope"})
    garbled = await r.resolve(f"{peer.url}/a2a")
    assert not garbled.verified and "not an ADL discovery document" in garbled.reason


async def test_static_map_resolves_offline(peers, key, tmp_path):
    doc = peer_passport(key, domain="offline.example.com")
    path = tmp_path / "peer.json"
    path.write_text(json.dumps(doc))
    r = resolver(peers, static={"https://offline.example.com/a2a": path})
    identity = await r.resolve("https://offline.example.com/a2a")
    assert identity.verified and identity.source == "static" and identity.peer_id == doc["id"]
    missing = resolver(peers, static={"https://gone.example.com": tmp_path / "missing.json"})
    assert not (await missing.resolve("https://gone.example.com/a2a")).verified


async def test_no_resolver_configured_means_unverified():
    adapter = A2AAdapter()
    [step] = await adapter.steps(adapter.open(view(send()), session="s", persona=None))
    assert step == Delegation(peer_id="https://peer.example.com/a2a", peer_passport=None, peer_verified=False,
                              chain_depth=1, peer_url="https://peer.example.com/a2a")


# --- depth -----------------------------------------------------------------------------


@pytest.mark.parametrize("header, floor, expected", [
    (None, 0, 1), ("0", 0, 1), ("2", 0, 3), ("1", 3, 4), (" 4 ", 1, 5),
])
async def test_depth_is_incoming_plus_one_never_below_the_floor(header, floor, expected):
    adapter = A2AAdapter(AdapterConfig(extra={"delegation_depth": floor}))
    headers = {} if header is None else {DEPTH_HEADER.lower(): header}
    exchange = adapter.open(view(send(), headers=headers), session="s", persona=None)
    [step] = await adapter.steps(exchange)
    assert step.chain_depth == expected
    assert exchange.upstream_headers[DEPTH_HEADER] == str(expected)


@pytest.mark.parametrize("header", ["-1", "two", "", "1.5"])
def test_a_malformed_depth_header_is_refused(header):
    with pytest.raises(BadRequest, match=DEPTH_HEADER):
        A2AAdapter().open(view(send(), headers={DEPTH_HEADER.lower(): header}), session="s", persona=None)


async def test_task_methods_are_not_delegations():
    adapter = A2AAdapter()
    exchange = adapter.open(view({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": "t"}}),
                            session="s", persona=None)
    assert await adapter.steps(exchange) == []


# --- refusals and fallbacks ------------------------------------------------------------


def test_refusal_is_a_jsonrpc_error_with_the_same_id():
    adapter = A2AAdapter()
    exchange = adapter.open(view(send(rpc_id="r-1")), session="s", persona=None)
    governor = {"cause": "on_delegation_denied", "action": "halt", "reason": "peer matches deny"}
    reply = adapter.error_response(403, "governor: halt (on_delegation_denied)", governor, exchange)
    payload = orjson.loads(reply.body)
    assert reply.status == 200 and payload["id"] == "r-1"
    assert payload["error"]["code"] == GOVERNOR_ERROR_CODE
    assert payload["error"]["data"]["governor"] == governor


def test_streaming_refusal_is_a_one_event_stream():
    adapter = A2AAdapter()
    exchange = adapter.open(view(send("message/stream", rpc_id=5)), session="s", persona=None)
    reply = adapter.error_response(403, "denied", {"cause": "on_delegation_denied"}, exchange)
    assert reply.status == 200 and reply.headers["content-type"] == "text/event-stream"
    [event] = parse_events(reply.body)
    assert orjson.loads(event.data)["error"]["data"]["governor"]["cause"] == "on_delegation_denied"


def test_an_object_fallback_value_is_a_data_part():
    adapter = A2AAdapter()
    exchange = adapter.open(view(send(rpc_id=3)), session="s", persona=None)
    decision = Decision(action=Action.FALLBACK, cause="on_delegation_denied", fallback_value={"error": "denied"},
                        fallback_message="not that agent")
    payload = orjson.loads(adapter.fallback_response(exchange, decision, {}).body)
    assert payload["result"]["parts"] == [{"kind": "data", "data": {"error": "denied"}}]


@pytest.mark.parametrize("method", ["message/send", "message/stream"])
def test_fallback_is_an_agent_message(method):
    adapter = A2AAdapter()
    exchange = adapter.open(view(send(method, rpc_id=9)), session="s", persona=None)
    decision = Decision(action=Action.FALLBACK, cause="on_delegation_denied", fallback_message="no peer today")
    reply = adapter.fallback_response(exchange, decision, {"cause": "on_delegation_denied"})
    body = parse_events(reply.body)[0].data.encode() if method == "message/stream" else reply.body
    payload = orjson.loads(body)
    assert payload["id"] == 9 and payload["result"]["kind"] == "message"
    assert payload["result"]["parts"][0] == {"kind": "text", "text": "no peer today"}
    assert payload["result"]["metadata"]["governor"]["cause"] == "on_delegation_denied"
