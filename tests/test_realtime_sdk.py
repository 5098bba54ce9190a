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
  gpt-realtime: {input: 32.00, cached_input: 0.40, output: 64.00}
"""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    from governor.proxy.server import Settings, serve

    tmp = tmp_path_factory.mktemp("realtime")
    tls = make_tls(tmp / "tls")
    mock = RealtimeMock(tls)
    await mock.start()
    pricing = tmp / "pricing.yaml"  # the bundled table has no Realtime model: priced here at its audio rates
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
    live = running.runtime.sessions_live[session] if hasattr(running.runtime, "sessions_live") else None
    if live is not None:
        return live.state.iterations
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
    # the ADL-Session header did not reach the provider; the response.create got an event_id
    assert all(not k.lower().startswith("adl-") for k in mock.upgrades[0])
    created = [e for e in mock.events if e["type"] == "response.create"]
    assert len(created) == 1 and created[0]["event_id"].startswith("event_governor_")
    record = await running.runtime.end_session("rt-happy")
    assert verified(running, record)
