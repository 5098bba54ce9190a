"""Hostile bytes on a governed Realtime WebSocket, both ways, and the Realtime HTTP endpoints
the governor refuses: through the real proxy on the real runtime, a raw `websockets` client
(what the openai SDK uses underneath) sending what the SDK never would, against the loopback
Realtime mock (tests/realtime_upstream.py). Every refusal is recorded in the session."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from governor.adapters.base import AdapterConfig
from tests.proxy_harness import RawClient, run_python
from tests.realtime_harness import PRELUDE, events_of, iterations, realtime_env, realtime_governor, tokens_used, \
    verified
from tests.realtime_upstream import Turn

pytestmark = pytest.mark.asyncio(loop_scope="module")

env = realtime_env("realtime-hostile")

RAW = """
import asyncio, json, os
from websockets.asyncio.client import connect
out = {"received": []}
async def raw(session, actions, path="/v1/realtime?model=gpt-realtime", compression="deflate"):
    base = os.environ["OPENAI_BASE_URL"].rsplit("/v1", 1)[0]
    uri = base.replace("https://", "wss://").replace("http://", "ws://") + path
    try:
        async with connect(uri, additional_headers={"ADL-Session": session, "Authorization": "Bearer sk-test"},
                           max_size=None, open_timeout=10, compression=compression) as ws:
            await actions(ws)
    except Exception as e:
        rcvd = getattr(e, "rcvd", None)
        out["raised"] = {"type": type(e).__name__, "code": getattr(rcvd, "code", None),
                         "reason": getattr(rcvd, "reason", None)}
async def recv_until(ws, kinds):
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
        out["received"].append(msg)
        if msg["type"] in kinds:
            return msg
"""


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


def refused_reasons(record) -> list[str]:
    return [e["detail"]["reason"] for e in events_of(record, "on_governor_request_refused")]


async def test_unreadable_client_events_are_not_forwarded_and_the_socket_goes_on(env):
    running, mock, sdk_env = env
    bad = ["{not json", "[1, 2]", '{"type": 7}', '{"type": "response.create_v2"}', '"just a string"',
           '{"type": "response.create", "response": []}',
           '{"type": "response.create", "response": {"max_output_tokens": "lots"}}',
           '{"type": "session.update", "session": {"tools": [{"type": "function"}]}}',
           '{"type": "session.update", "session": "everything"}']
    code = RAW + f"""
async def actions(ws):
    await recv_until(ws, ("session.created",))
    for text in {bad!r}:
        await ws.send(text)
        error = await recv_until(ws, ("error",))
    await ws.send(json.dumps({{"type": "response.create", "response": {{"max_output_tokens": 50}}}}))
    done = await recv_until(ws, ("response.done",))
    out["done"] = done["response"]["status"]
asyncio.run(raw("rt-bad-client", actions))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert "raised" not in out and out["done"] == "completed", out
    errors = [m for m in out["received"] if m["type"] == "error"]
    assert len(errors) == len(bad)
    assert all(e["error"]["type"] == "invalid_request_error" and e["error"]["message"].startswith("governor: ")
               for e in errors)
    assert "not valid JSON" in errors[0]["error"]["message"]
    assert "response.create_v2" in errors[3]["error"]["message"]
    # only the valid response.create reached the provider
    assert [e["type"] for e in mock.events] == ["response.create"]
    record = await running.runtime.end_session("rt-bad-client")
    assert refused_reasons(record) == ["bad_request"] * len(bad) and verified(running, record)


async def test_a_binary_client_message_cuts_the_socket(env):
    running, mock, sdk_env = env
    code = RAW + """
async def actions(ws):
    await recv_until(ws, ("session.created",))
    await ws.send(b"\\x00\\x01 audio as binary")
    await recv_until(ws, ("never",))
asyncio.run(raw("rt-binary", actions))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["raised"]["code"] == 1003, out
    assert out["received"][-1]["type"] == "error" and "binary" in out["received"][-1]["error"]["message"]
    assert not [kind for kind, _ in mock.raw if kind == "binary"]
    record = await running.runtime.end_session("rt-binary")
    assert refused_reasons(record) == ["bad_request"]


@pytest.mark.parametrize("compression", ["deflate", None], ids=["whole-in-one-read", "across-reads"])
async def test_an_oversize_client_message_closes_the_socket_1009(env, compression):
    # compressed, 17 MiB of one letter arrive in one read and are judged whole in the hook;
    # uncompressed, they arrive over many reads and are cut while still arriving
    running, mock, sdk_env = env
    session = f"rt-oversize-{compression}"
    code = RAW + f"""
async def actions(ws):
    await recv_until(ws, ("session.created",))
    await ws.send(json.dumps({{"type": "input_audio_buffer.append", "audio": "A" * (17 * 1024 * 1024)}}))
    await recv_until(ws, ("never",))
asyncio.run(raw({session!r}, actions, compression={compression!r}))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["raised"]["code"] == 1009, out
    assert mock.events == []
    await asyncio.sleep(0.2)  # websocket_end records it
    record = await running.runtime.end_session(session)
    assert refused_reasons(record) == ["event_too_large"] and verified(running, record)


SLOW = dict(text="w" * 200, deltas=20, delay=0.05)  # still generating when the governor cuts


@pytest.mark.parametrize("turn", [Turn(raw_after_created=b"{garbage", **SLOW),
                                  Turn(raw_after_created=b'{"no": "type"}', **SLOW),
                                  Turn(binary_after_created=True, **SLOW)], ids=["not-json", "no-type", "binary"])
async def test_an_unreadable_upstream_event_cuts_the_socket_and_the_response_is_charged(env, turn):
    running, mock, sdk_env = env
    mock.script(turn)
    session = f"rt-bad-upstream-{id(turn)}"
    code = RAW + f"""
async def actions(ws):
    await recv_until(ws, ("session.created",))
    await ws.send(json.dumps({{"type": "response.create", "response": {{"max_output_tokens": 100}}}}))
    await recv_until(ws, ("never",))
asyncio.run(raw({session!r}, actions))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["raised"]["code"] == 1003, out
    assert out["received"][-1]["type"] == "error"
    assert out["received"][-1]["error"]["type"] == "upstream_error"
    await asyncio.wait_for(mock.responses[0].finished.wait(), 5)
    assert mock.responses[0].cut  # the upstream's socket was closed mid-response
    await asyncio.sleep(0.2)
    # forwarded and never settled: charged what it reserved
    assert await tokens_used(running, session) >= 100
    record = await running.runtime.end_session(session)
    assert refused_reasons(record) == ["upstream_event_unreadable"] and verified(running, record)


async def test_missing_or_lying_usage_is_charged_at_least_what_was_relayed_or_reserved(env):
    running, mock, sdk_env = env
    mock.script(Turn(usage=False), Turn(text="word " * 800, deltas=8, input_tokens=10, output_tokens=1))
    code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 300})
    await until(conn, ("response.done",))
    await conn.response.create(response={"max_output_tokens": 3000})
    await until(conn, ("response.done",))
asyncio.run(talk("rt-usage", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert "raised" not in out, out
    used = await tokens_used(running, "rt-usage")
    # no usage: the reservation (its input estimate + 300); lying usage: 10 + the count of the text relayed
    assert used >= 300 + 10 + 800
    kinds = {d["kind"] for e in running.runtime.record("rt-usage")["events"]
             for d in (e.get("detail") or {}).get("deviations", ()) if d.get("kind", "").startswith("usage_")}
    assert kinds == {"usage_missing", "usage_below_count"}


# --- the HTTP side ---------------------------------------------------------------------


async def send(running, mock, method: str, path: str, body: bytes, session: str,
               headers: dict[str, str] | None = None, content_type: str | None = "application/json"):
    client = await asyncio.to_thread(RawClient, running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
    try:
        await asyncio.to_thread(client.send, method, path, body, {"ADL-Session": session, **(headers or {})},
                                content_type=content_type)
        return await asyncio.to_thread(client.read_response)
    finally:
        client.close()


async def test_ephemeral_keys_calls_and_other_realtime_paths_are_refused_by_default(env):
    running, mock, sdk_env = env
    cases = [
        ("POST", "/v1/realtime/client_secrets", b'{"session":{"type":"realtime","model":"gpt-realtime"}}', 403,
         "--realtime-client-secrets allow"),
        ("POST", "/v1/realtime/sessions", b'{"model":"gpt-4o-realtime-preview"}', 403, "ungoverned"),
        ("POST", "/v1/realtime/transcription_sessions", b"{}", 403, "ephemeral"),
        ("POST", "/V1/Realtime/Client_Secrets/", b"{}", 403, "ephemeral"),  # any spelling the upstream serves
        ("POST", "/v1/realtime/calls", b"v=0\r\n", 403, "WebRTC or SIP"),
        ("POST", "/v1/realtime/calls/rtc_1/accept", b'{"type":"realtime"}', 403, "WebRTC or SIP"),
        ("POST", "/v1/realtime/translations", b"{}", 403, "not a Realtime endpoint"),
        ("GET", "/v1/realtime?model=gpt-realtime", b"", 400, "WebSocket upgrade"),
        ("POST", "/v1/realtime?model=gpt-realtime", b"{}", 400, "WebSocket upgrade"),
    ]
    for method, path, body, status, says in cases:
        got, headers, data = await send(running, mock, method, path, body, "rt-http",
                                        content_type="application/sdp" if b"v=0" in body else "application/json")
        assert got == status, (path, got, data)
        error = orjson.loads(data)["error"]
        assert says in error["message"] and error["governor"]["action"] == "deny", (path, error)
    assert mock.raw == [] and mock.upgrades == []
    record = await running.runtime.end_session("rt-http")
    assert refused_reasons(record) == ["ungoverned_endpoint"] * 7 + ["bad_request"] * 2
    assert verified(running, record)


async def test_minting_when_allowed_is_a_counted_recorded_step_refused_after_a_halt(tmp_path):
    allow = AdapterConfig(extra={"realtime_client_secrets": "allow"})
    async with realtime_governor(tmp_path, adapters=allow) as (running, mock, sdk_env):
        body = orjson.dumps({"session": {"type": "realtime", "model": "gpt-realtime", "tools": [
            {"type": "function", "name": "search_papers"}, {"type": "function", "name": "run_shell"}]}})
        status, headers, data = await send(running, mock, "POST", "/v1/realtime/client_secrets", body, "rt-mint")
        assert status == 200 and orjson.loads(data)["client_secret"]["value"] == "ek_mock"
        assert await iterations(running, "rt-mint") == 1
        forwarded = orjson.loads(mock.raw[0][1].split(b" ", 2)[2])
        assert [t["name"] for t in forwarded["session"]["tools"]] == ["search_papers"]  # withheld
        # the session halts (a socket crossing the cap); its next minting is refused
        mock.script(Turn(input_tokens=100, output_tokens=30_000))
        code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 100})
    await until(conn, ("response.done",))
asyncio.run(talk("rt-mint", steps))
print(json.dumps(out))
"""
        out = await run_python(code, sdk_env)
        assert out["raised"]["code"] == 1008
        status, _, data = await send(running, mock, "POST", "/v1/realtime/client_secrets", body, "rt-mint")
        assert status == 429 and orjson.loads(data)["error"]["governor"]["cause"] == "on_budget_exhausted"
        assert len([kind for kind, _ in mock.raw if kind == "http"]) == 1
        record = await running.runtime.end_session("rt-mint")
        minted = events_of(record, "on_governor_key_minted")
        assert len(minted) == 1 and minted[0]["action"] == "continue" and verified(running, record)


async def test_reverse_mode_governs_the_socket_too(tmp_path):
    async with realtime_governor(tmp_path, reverse=True) as (running, mock, sdk_env):
        mock.script(Turn(text="reverse", input_tokens=10, output_tokens=4), Turn(output_tokens=30_000))
        code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 100})
    done = await until(conn, ("response.done",))
    out["usage"] = done.response.usage.total_tokens
    await conn.response.create(response={"max_output_tokens": 100})
    await until(conn, ("response.done",))
asyncio.run(talk("rt-reverse", steps))
print(json.dumps(out))
"""
        out = await run_python(code, sdk_env)
        assert out["usage"] == 14 and out["raised"]["code"] == 1008, out
        assert out["events"][-1]["type"] == "error"
        assert (await running.runtime.session_view("rt-reverse"))["state"] == "halted"
