"""The OpenAI Realtime WebSocket through the real proxy on the real runtime (the bundled
example passport: 20,000 tokens per session, on_budget_exhausted halt), driven by the
official `openai` SDK's realtime client (`client.realtime.connect`, over the `websockets`
package) configured only through its environment (HTTPS_PROXY, SSL_CERT_FILE), against a
loopback mock that speaks the Realtime event protocol (tests/realtime_upstream.py).
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from tests.proxy_harness import AGENT_NAMED, run_python
from tests.realtime_upstream import RealtimeMock, Turn
from tests.upstreams import make_tls

pytestmark = pytest.mark.asyncio(loop_scope="module")

PRELUDE = """
import asyncio, json, openai
client = openai.AsyncOpenAI(max_retries=0)
out = {"events": []}
def plain(event):
    return event.to_dict() if hasattr(event, "to_dict") else event
async def talk(session, steps, model="gpt-realtime"):
    try:
        async with client.realtime.connect(model=model, extra_headers={"ADL-Session": session}) as conn:
            await steps(conn)
    except Exception as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        body = getattr(getattr(e, "response", None), "body", None)
        out["raised"] = {"type": type(e).__name__, "status": status,
                         "body": json.loads(body) if body else None,
                         "code": getattr(getattr(e, "rcvd", None), "code", None),
                         "reason": getattr(getattr(e, "rcvd", None), "reason", None)}
async def until(conn, last):
    async for event in conn:
        out["events"].append(plain(event))
        if event.type in last:
            return event
"""


PRICING = """currency: USD
unit: per_million_tokens
as_of: "2025-11-15"
models:
  gpt-realtime: {input: 4.00, cached_input: 0.40, output: 16.00}
"""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    from governor.proxy.server import Settings, serve

    tmp = tmp_path_factory.mktemp("realtime")
    tls = make_tls(tmp / "tls")
    mock = RealtimeMock(tls)
    await mock.start()
    pricing = tmp / "pricing.yaml"  # the bundled table has no Realtime model: priced here (its text rates)
    pricing.write_text(PRICING)
    settings = Settings(listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data", upstream_ca=tls.ca_file,
                        tick_interval=0, pricing=pricing, **AGENT_NAMED)
    running = await serve(settings)
    sdk_env = {"HTTPS_PROXY": running.proxy_url, "SSL_CERT_FILE": str(running.ca_file), "OPENAI_API_KEY": "sk-test",
               "OPENAI_BASE_URL": f"{mock.base_url}/v1"}
    try:
        yield running, mock, sdk_env
    finally:
        await running.stop()
        await mock.stop()


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


async def tokens_used(running, session: str) -> float:
    view = await running.runtime.session_view(session)
    return next(b["used"] for b in view["budgets"]
                if b["dimension"] == "tokens" and b["scope"] == "per_session" and b["persona"] is None)


async def iterations(running, session: str) -> int:
    return (await running.runtime.session_view(session))["iterations"]


def verified(running, record) -> bool:
    from governor.evidence import load_public_key, verify_record

    keys = running.settings.data_dir / "keys"
    return verify_record(record, public_key=load_public_key(keys / "governor-pub.pem")).ok


async def test_a_response_is_admitted_and_charged_from_response_done(env):
    running, mock, sdk_env = env
    mock.script(Turn(text="It is sunny in Oslo.", deltas=4, input_tokens=120, output_tokens=30, audio_in=80,
                     audio_out=10, cached=20))
    code = PRELUDE + """
async def steps(conn):
    await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
    await conn.conversation.item.create(item={"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "weather in Oslo?"}]})
    await conn.response.create(response={"max_output_tokens": 200})
    done = await until(conn, ("response.done",))
    out["usage"] = done.response.usage.total_tokens
    out["text"] = "".join(e["delta"] for e in out["events"] if e["type"] == "response.output_text.delta")
asyncio.run(talk("rt-happy", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert "raised" not in out, out
    assert out["usage"] == 150 and out["text"] == "It is sunny in Oslo."
    assert await tokens_used(running, "rt-happy") == 150
    assert await iterations(running, "rt-happy") == 2  # the upgrade and the response
    # the ADL-Session header did not reach the provider; the response.create got an event_id
    assert all(not k.lower().startswith("adl-") for k in mock.upgrades[0])
    created = [e for e in mock.events if e["type"] == "response.create"]
    assert len(created) == 1 and created[0]["event_id"].startswith("event_governor_")
    record = await running.runtime.end_session("rt-happy")
    assert verified(running, record)


async def test_at_the_cap_the_socket_is_cut_with_an_error_event_and_a_halted_session_cannot_reopen(env):
    running, mock, sdk_env = env
    # the provider's usage says 30,000 tokens: past the session's 20,000
    mock.script(Turn(input_tokens=100, output_tokens=30_000))
    code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 300})
    await until(conn, ("response.done", "error"))
    await until(conn, ("response.done",))  # the close frame ends it
asyncio.run(talk("rt-cap", steps))
out["first"], out["events"] = out.pop("raised", None), []
async def again(conn):
    await conn.response.create(response={"max_output_tokens": 300})
    await until(conn, ("response.done",))
asyncio.run(talk("rt-cap", again))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    # the SDK surfaced the governor's error event, then the close (1008: policy violation)
    first = out["first"]
    assert first["type"] == "ConnectionClosedError" and first["code"] == 1008, out
    assert "on_budget_exhausted" in first["reason"]
    # the halted session: the upgrade itself is refused, readable
    refused = out["raised"]
    assert refused["type"] == "InvalidStatus" and refused["status"] == 429, refused
    assert refused["body"]["error"]["governor"]["cause"] == "on_budget_exhausted"
    assert (await running.runtime.session_view("rt-cap"))["state"] == "halted"
    assert len(mock.upgrades) == 1 and mock.closes  # the upstream's socket was closed too
    record = await running.runtime.end_session("rt-cap")
    assert verified(running, record)


async def test_the_error_event_reaches_the_sdk_before_the_close(env):
    running, mock, sdk_env = env
    mock.script(Turn(input_tokens=100, output_tokens=30_000))
    code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 300})
    while True:
        event = await conn.recv()
        out["events"].append(plain(event))
        if event.type == "error":
            out["error"] = {"message": event.error.message, "code": event.error.code,
                            "governor": event.error.to_dict().get("governor")}
asyncio.run(talk("rt-error-event", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    error = out["error"]
    assert error["code"] == "on_budget_exhausted" and error["governor"]["cause"] == "on_budget_exhausted"
    assert "Budget exhausted" in error["message"]
    assert [e["type"] for e in out["events"]][-1] == "error"  # nothing after it
    assert "response.done" not in [e["type"] for e in out["events"]]  # the over-cap answer is not delivered


async def test_a_response_crossing_the_cap_mid_way_is_cut_and_the_upstream_stops(env):
    running, mock, sdk_env = env
    # 60 deltas of 2,000 characters: past 20,000 tokens (at 4 bytes a token) after about 40
    mock.script(Turn(text="w" * 120_000, deltas=60, delay=0.02, output_tokens=30_000))
    code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 1000})
    await until(conn, ("response.done", "error"))
    await until(conn, ("response.done",))
asyncio.run(talk("rt-mid", steps))
print(json.dumps({"raised": out.get("raised"), "deltas": sum(1 for e in out["events"] if e["type"] == "response.output_text.delta"),
                  "last": out["events"][-1]["type"]}))
"""
    out = await run_python(code, sdk_env)
    assert out["raised"]["code"] == 1008 and out["last"] == "error", out
    log = mock.responses[0]
    await asyncio.wait_for(log.finished.wait(), 5)
    assert log.cut and not log.done and log.sent_deltas < 60
    assert out["deltas"] < 45


async def test_a_halted_session_cannot_continue_an_open_socket(env):
    running, mock, sdk_env = env
    mock.script(Turn(output_tokens=10), Turn(input_tokens=100, output_tokens=30_000))
    code = PRELUDE + """
async def steps(conn):
    await conn.response.create(response={"max_output_tokens": 100})
    await until(conn, ("response.done",))
    # meanwhile another socket of the session crosses the cap
    async with client.realtime.connect(model="gpt-realtime", extra_headers={"ADL-Session": "rt-open"}) as other:
        await other.response.create(response={"max_output_tokens": 100})
        try:
            await until(other, ("response.done",))
        except Exception as e:
            out["other"] = type(e).__name__
    await conn.conversation.item.create(item={"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "more"}]})
    await until(conn, ("response.done",))
asyncio.run(talk("rt-open", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["other"] == "ConnectionClosedError"
    assert out["raised"]["code"] == 1008 and "halt" in out["raised"]["reason"], out
    assert out["events"][-1]["type"] == "error"
    # the item the halted session sent never reached the provider
    assert [e["type"] for e in mock.events].count("conversation.item.create") == 0


async def test_a_response_the_server_starts_itself_is_admitted_and_charged(env):
    running, mock, sdk_env = env
    mock.script(Turn(input_tokens=300, output_tokens=50, audio_in=250, audio_out=40))
    code = PRELUDE + """
async def steps(conn):
    await conn.session.update(session={"type": "realtime", "max_output_tokens": 500})
    await conn.input_audio_buffer.append(audio="AAAA")
    await conn.input_audio_buffer.commit()  # server VAD: the server answers on its own
    done = await until(conn, ("response.done",))
    out["usage"] = done.response.usage.total_tokens
asyncio.run(talk("rt-vad", steps))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["usage"] == 350, out
    assert await tokens_used(running, "rt-vad") == 350
    assert await iterations(running, "rt-vad") == 2
    assert [e["type"] for e in mock.events].count("response.create") == 0
