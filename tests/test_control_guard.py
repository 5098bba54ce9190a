"""The control plane against a hostile web page and hostile bodies (issue 20, finding 8):
cross-origin form POSTs, text/plain POSTs, DNS rebinding (a foreign Host), deep JSON.
Real HTTP on loopback, the scripted runtime behind it."""

from __future__ import annotations

import aiohttp
import pytest

from governor.control import ControlContext, ProxyOrigin, create_app, start_control
from governor.control.guard import ControlGuard, Refusal, host_name, json_object
from governor.runtime.metrics import Metrics
from governor.policy.steps import ToolCall
from tests.control_harness import ScriptedRuntime, control_planes  # noqa: F401  (the `serve` fixture)

REVIEWER = "reviewer-token-0123456789abcdef"
EVIL = "http://evil.example"


async def _session(runtime: ScriptedRuntime, name: str = "alpha") -> None:
    await runtime.admit(name, ToolCall(tool="read_file"))


async def _error(resp: aiohttp.ClientResponse) -> tuple[int, str]:
    assert resp.content_type == "application/json", await resp.text()
    return resp.status, (await resp.json())["error"]["code"]


# --- a web page's writes ---------------------------------------------------------------


async def test_cross_origin_form_post_does_not_end_a_session(serve):
    runtime = ScriptedRuntime()
    await _session(runtime)
    ctl = await serve(runtime)
    # what <form method=post action=http://127.0.0.1:8081/v1/sessions/alpha/end> sends
    async with ctl.http.post(f"{ctl.url}/v1/sessions/alpha/end", data="x=1",
                             headers={"Origin": EVIL, "Content-Type": "application/x-www-form-urlencoded",
                                      "Sec-Fetch-Site": "cross-site"}) as resp:
        assert await _error(resp) == (403, "cross_origin")
    # fetch(..., {mode: "no-cors", method: "POST"}) with no body: still carries the Origin
    async with ctl.http.post(f"{ctl.url}/v1/sessions/alpha/end", headers={"Origin": EVIL}) as resp:
        assert await _error(resp) == (403, "cross_origin")
    async with ctl.http.post(f"{ctl.url}/v1/sessions/alpha/end", headers={"Origin": "null"}) as resp:
        assert await _error(resp) == (403, "cross_origin")
    # the same form body without an Origin (not a browser) is still not JSON
    async with ctl.http.post(f"{ctl.url}/v1/sessions/alpha/end", data="x=1",
                             headers={"Content-Type": "application/x-www-form-urlencoded"}) as resp:
        assert await _error(resp) == (415, "json_required")
    assert "alpha" not in runtime.ended
    # an operator's tool: no body, or a JSON one, no Origin: the session ends
    async with ctl.http.post(f"{ctl.url}/v1/sessions/alpha/end", json={}) as resp:
        assert resp.status == 200
    assert "alpha" in runtime.ended


async def test_text_plain_post_creates_no_nonce(serve):
    ctl = await serve()
    for content_type in ("text/plain", "text/plain;charset=UTF-8", "multipart/form-data; boundary=x"):
        async with ctl.http.post(f"{ctl.url}/v1/nonces", data='{"nonce": "abcdefghijklmnopqrstuvwxyz012345"}',
                                 headers={"Content-Type": content_type}) as resp:
            status, code = await _error(resp)
            assert (status, code) == (415, "json_required"), content_type
            assert "application/json" in (await resp.json())["error"]["message"]
    # a body with no Content-Type at all is not JSON either
    async with ctl.http.post(f"{ctl.url}/v1/nonces", data=b'{"nonce": "abcdefghijklmnopqrstuvwxyz012345"}',
                             headers={"Content-Type": ""}) as resp:
        assert resp.status == 415
    assert not ctl.runtime.steps  # nothing reached the runtime
    async with ctl.http.post(f"{ctl.url}/v1/nonces", json={"nonce": "abcdefghijklmnopqrstuvwxyz012345"}) as resp:
        assert resp.status == 201, await resp.text()


async def test_same_origin_json_post_is_served(serve):
    ctl = await serve()
    origin = f"http://127.0.0.1:{ctl.port}"
    async with ctl.http.post(f"{ctl.url}/v1/nonces", json={}, headers={"Origin": origin}) as resp:
        assert resp.status == 201
    async with ctl.http.get(f"{ctl.url}/v1/sessions", headers={"Origin": EVIL}) as resp:
        assert await _error(resp) == (403, "cross_origin")  # a page cannot read either


async def test_reviewer_token_does_not_excuse_a_form_post(serve):
    runtime = ScriptedRuntime()
    ctl = await serve(runtime, reviewer_tokens=[REVIEWER])
    async with ctl.http.post(f"{ctl.url}/v1/approvals/a1", data="decision=approve&reviewer=x",
                             headers={"Authorization": f"Bearer {REVIEWER}",
                                      "Content-Type": "application/x-www-form-urlencoded"}) as resp:
        assert await _error(resp) == (415, "json_required")


# --- DNS rebinding ---------------------------------------------------------------------


async def test_foreign_host_is_refused_probes_are_not(serve):
    runtime = ScriptedRuntime()
    await _session(runtime)
    ctl = await serve(runtime)
    for host in (f"rebind.evil.example:{ctl.port}", "evil.example", "127.0.0.1.evil.example"):
        async with ctl.http.get(f"{ctl.url}/v1/sessions", headers={"Host": host}) as resp:
            status, code = await _error(resp)
            assert (status, code) == (421, "unknown_host"), host
        async with ctl.http.post(f"{ctl.url}/v1/sessions/alpha/end", headers={"Host": host}) as resp:
            assert resp.status == 421
    assert "alpha" not in runtime.ended
    for host in (f"localhost:{ctl.port}", f"127.0.0.1:{ctl.port}", f"[::1]:{ctl.port}", "LOCALHOST"):
        async with ctl.http.get(f"{ctl.url}/v1/sessions", headers={"Host": host}) as resp:
            assert resp.status == 200, host
    async with ctl.http.get(f"{ctl.url}/healthz", headers={"Host": "evil.example"}) as resp:
        assert resp.status == 200  # probes come by any name and reveal nothing


async def test_configured_control_hosts(serve):
    ctl = await serve(control_hosts=["governor-control.ops.svc"])
    async with ctl.http.get(f"{ctl.url}/v1/sessions", headers={"Host": "governor-control.ops.svc:8081"}) as resp:
        assert resp.status == 200
    async with ctl.http.get(f"{ctl.url}/v1/sessions", headers={"Host": "other.svc"}) as resp:
        assert resp.status == 421
    anything = await serve(control_hosts=["*"])
    async with anything.http.get(f"{anything.url}/v1/sessions", headers={"Host": "other.svc"}) as resp:
        assert resp.status == 200


# --- deep JSON -------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [100, 30_000])
async def test_deeply_nested_json_is_a_clear_400(serve, depth):
    ctl = await serve(reviewer_tokens=[REVIEWER])
    body = '{"nonce":' + "[" * depth + "]" * depth + "}"
    async with ctl.http.post(f"{ctl.url}/v1/nonces", data=body, headers={"Content-Type": "application/json"}) as resp:
        assert await _error(resp) == (400, "json_too_deep")
    async with ctl.http.post(f"{ctl.url}/v1/approvals/a1", data=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {REVIEWER}"}) as resp:
        assert await _error(resp) == (400, "json_too_deep")


async def test_hundred_thousand_levels_are_refused_by_size(serve):
    ctl = await serve()
    body = "[" * 100_000 + "]" * 100_000  # 200 kB: past the 64 KiB body limit before any parse
    async with ctl.http.post(f"{ctl.url}/v1/nonces", data=body, headers={"Content-Type": "application/json"}) as resp:
        status, _ = await _error(resp)
        assert status == 413


# --- the rules themselves --------------------------------------------------------------


def test_host_name_forms():
    assert host_name("LocalHost:8081") == "localhost"
    assert host_name("[::1]:8081") == "::1"
    assert host_name("::1") == "::1"
    assert host_name("example.com.") == "example.com"


def test_json_object_refusals():
    assert json_object(b'{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    for raw, code in ((b"[1]", "bad_json"), (b"{", "bad_json"), (b"\xff\xfe", "bad_json"),
                      (b'{"a":' + b"[" * 65 + b"]" * 65 + b"}", "json_too_deep"),
                      (b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}", "json_too_deep")):
        with pytest.raises(Refusal) as refused:
            json_object(raw)
        assert refused.value.code == code and refused.value.status == 400


def test_guard_bound_to_all_interfaces_knows_this_host():
    import socket

    guard = ControlGuard()
    guard.listening([("0.0.0.0", 8081)])
    guard.check("GET", "/v1/sessions", {"Host": f"{socket.gethostname()}:8081"}, False)
    with pytest.raises(Refusal):
        guard.check("GET", "/v1/sessions", {"Host": "attacker.example"}, False)


# --- slow clients ----------------------------------------------------------------------


async def test_half_sent_and_dribbled_requests_are_closed(serve):
    import asyncio
    import time

    runtime = ScriptedRuntime()
    app = create_app(ControlContext.build(runtime, metrics=Metrics(), origin=ProxyOrigin()))
    runner = await start_control(app, "127.0.0.1", 0, keepalive_timeout=1.0)
    port = runner.addresses[0][1]
    try:
        opened = time.monotonic()
        half = await asyncio.open_connection("127.0.0.1", port)
        half[1].write(b"GET /v1/sess")
        dribbler = await asyncio.open_connection("127.0.0.1", port)
        dribbler[1].write(b"GET /v1/sessions?x=")
        closed = asyncio.gather(half[0].read(), dribbler[0].read())
        for _ in range(8):  # a byte every 0.5 s: never idle, never a whole request
            if closed.done():
                break
            dribbler[1].write(b"a")
            await asyncio.sleep(0.5)
        assert await asyncio.wait_for(closed, 5) == [b"", b""]
        assert time.monotonic() - opened < 4.0
        for _, writer in (half, dribbler):
            writer.close()
    finally:
        await runner.cleanup()


async def test_control_connections_are_capped_oldest_idle_first():
    import asyncio

    app = create_app(ControlContext.build(ScriptedRuntime(), metrics=Metrics(), origin=ProxyOrigin()))
    runner = await start_control(app, "127.0.0.1", 0, max_connections=5)
    port = runner.addresses[0][1]
    held = []
    try:
        for _ in range(20):  # half-sent requests, as a flood would hold them
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /v1/sess")
            held.append((reader, writer))
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert len(runner.server.connections) <= 5
        closed = [await asyncio.wait_for(reader.read(), 5) for reader, _ in held[:15]]
        assert closed == [b""] * 15  # the oldest were closed to make room
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200
    finally:
        for _, writer in held:
            writer.close()
        await runner.cleanup()
