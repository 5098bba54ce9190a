"""A hostile A2A peer serving a billion-laughs passport (issue #20 finding 1, peer side):
the governor reads it with the bounded reader, off the event loop, and the delegation is
refused; the peer never sees the message."""

from __future__ import annotations

import asyncio

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE
from governor.proxy.server import Settings, serve
from tests.control_harness import A2APeer, peer_passport, real_runtime
from tests.hostile_documents import alias_bomb
from tests.test_a2a_delegation import OURS
from tests.test_adapter_a2a import send
from tests.proxy_harness import AGENT_NAMED

ANSWER_BOUND = 5.0  # seconds: a hang bound, not a speed check


class BombPeer(A2APeer):
    """Discovery names a passport file whose bytes are a YAML alias bomb."""

    async def _passport(self, request):
        from aiohttp import web

        self._hit(request)
        return web.Response(body=alias_bomb(8), content_type="application/yaml")


async def test_a_peer_serving_an_alias_bomb_is_refused_at_once(tmp_path):
    document = peer_passport(Ed25519PrivateKey.generate(), name="laughing", scopes=("papers:read",),
                             tokens=(1000, 5000))
    peer = await BombPeer({"laughing.yaml": document}).start()
    runtime, _ = real_runtime(OURS, tmp_path)
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp_path), runtime)
    try:
        async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30) as client:
            resp = await asyncio.wait_for(
                client.post(f"{peer.url}/a2a", json=send("message/send"), headers={"ADL-Session": "bomb-peer"}),
                ANSWER_BOUND)
    finally:
        await running.stop()
        await peer.stop()
    assert peer.hits.get("/passports/laughing.yaml") == 1  # it was fetched, and read
    error = resp.json()["error"]
    assert error["code"] == GOVERNOR_ERROR_CODE
    assert error["data"]["governor"]["cause"] == "on_delegation_denied"
    assert error["data"]["governor"]["reason"] == "unverified_peer"
    assert peer.received == []
