"""Every cut reaches the client (issue #22 item 4), whatever the upstream's HTTP version.

The real governor (a passport with a 3,000-token session budget) in front of an upstream
served by hypercorn over TLS offering h2 and http/1.1 (tests/h2_upstream.py). The official
SDKs, in a subprocess, talk to the proxy with an httpx client: with http2=True, mitmproxy
speaks HTTP/2 to the upstream too; with HTTP/1.1, HTTP/1.1. A cut stream must end with the
protocol's error event (which the SDK raises) and a clean end, never a reset or a silent
truncation; a stream whose usage, reported only at its end, crosses the cap must get its
error before that end.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl

import httpx2
import orjson
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.passport import sign_passport
from governor.proxy.server import Settings, serve
from tests.h2_upstream import H2Stream, H2Upstream
from tests.proxy_harness import AGENT_NAMED, run_python
from tests.upstreams import make_tls

pytestmark = pytest.mark.asyncio(loop_scope="module")

CAP = 3000
PASSPORT = {
    "adl_spec": "0.4.0", "name": "cut-agent", "description": "streams past its budget", "version": "1.0.0",
    "id": "https://example.com/agents/cut-agent", "data_classification": {"sensitivity": "internal"},
    "lifecycle": {"status": "active"},
    "permissions": {"resource_limits": {"budget": {"tokens": {"per_session": CAP}}}},
}
VERSIONS = [pytest.param(True, id="http2"), pytest.param(False, id="http1.1")]

# the SDK's client speaks HTTP/2 (H2=1) or HTTP/1.1 to the proxy, which speaks the same upstream
PRELUDE = """
import json, os, ssl, httpx2
http = httpx2.Client(http2=os.environ["H2"] == "1", proxy=os.environ["PROXY"],
                     verify=ssl.create_default_context(cafile=os.environ["CA"]),
                     trust_env=False, timeout=30)
session = os.environ["SESSION"]
"""

OPENAI = PRELUDE + """
import openai
client = openai.OpenAI(max_retries=0, http_client=http, api_key="sk-test", base_url=os.environ["BASE"] + "/v1")
seen, out = [], {}
try:
    if os.environ["API"] == "responses":
        for event in client.responses.create(model="gpt-4o-mini", max_output_tokens=500, stream=True, input="go",
                                             extra_headers={"ADL-Session": session}):
            seen.append(getattr(event, "delta", "") or "")
    else:
        for chunk in client.chat.completions.create(model="gpt-4o-mini", max_tokens=500, stream=True,
                messages=[{"role": "user", "content": "go"}], stream_options={"include_usage": True},
                extra_headers={"ADL-Session": session}):
            if chunk.choices:
                seen.append(chunk.choices[0].delta.content or "")
    out = {"completed": True}
except openai.APIError as e:
    out = {"raised": type(e).__name__, "message": e.message, "body": e.body}
except Exception as e:
    out = {"other": f"{type(e).__name__}: {e}"}
out["text"] = "".join(seen)
print(json.dumps(out))
"""

ANTHROPIC = PRELUDE + """
import anthropic
client = anthropic.Anthropic(max_retries=0, http_client=http, api_key="sk-test", base_url=os.environ["BASE"])
text, out = [], {}
try:
    with client.messages.stream(model="claude-haiku-4-5", max_tokens=500, messages=[{"role": "user", "content": "go"}],
                                extra_headers={"ADL-Session": session}) as stream:
        for piece in stream.text_stream:
            text.append(piece)
    out = {"completed": True}
except anthropic.APIError as e:
    out = {"raised": type(e).__name__, "message": e.message, "body": e.body}
except Exception as e:
    out = {"other": f"{type(e).__name__}: {e}"}
out["text"] = "".join(text)
print(json.dumps(out))
"""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stream-cuts")
    tls = make_tls(tmp / "tls")
    upstream = H2Upstream(tls)
    await upstream.start()
    passport = tmp / "passport.json"
    passport.write_text(json.dumps(sign_passport(PASSPORT, Ed25519PrivateKey.generate())))
    running = await serve(Settings(**AGENT_NAMED, passport=passport, listen=("127.0.0.1", 0), control=None,
                                   data_dir=tmp / "data", upstream_ca=tls.ca_file, tick_interval=0))
    yield running, upstream
    await running.stop()
    await upstream.stop()


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


async def sdk(code: str, running, upstream, session: str, http2: bool, api: str = "chat") -> dict:
    return await run_python(code, {"H2": "1" if http2 else "0", "PROXY": running.proxy_url,
                                   "CA": str(running.ca_file), "SESSION": session, "API": api,
                                   "BASE": upstream.base_url})


def events_of(running, session: str) -> list[dict]:
    return running.runtime.record(session)["events"]


@pytest.mark.parametrize("http2", VERSIONS)
async def test_a_mid_stream_cut_raises_in_the_openai_sdk_with_the_real_figures(env, http2):
    running, upstream = env
    session = f"cut-{http2}"
    # 20 tokens a delta, 6,000 in all, from an upstream that ignores max_tokens=500
    upstream.script(H2Stream(deltas=300, piece="abcd" * 20, delay=0.002))
    out = await sdk(OPENAI, running, upstream, session, http2)
    assert out.get("raised") == "APIError", out  # the error event, not a connection error
    governor = out["body"]["governor"]
    assert governor["cause"] == "on_budget_exhausted" and governor["limit"] == CAP
    (version, _, _, _), log = upstream.requests[0], upstream.streams[0]
    assert version == ("2" if http2 else "1.1")
    assert log.disconnected and not log.completed and log.events_sent < log.events_planned  # generation stopped
    delivered = len(out["text"]) // 4
    assert 2500 < delivered <= CAP
    # the message names what was used (this call's tokens so far), not "used 0"
    used = int(re.search(r"used (\d+) > limit 3000", out["message"]).group(1))
    assert CAP < used <= CAP + 400, out["message"]  # past the cap by what the last chunk(s) carried
    assert used == governor["projected"] == governor["call_used"] + governor["observed"]
    assert governor["call_used"] >= delivered and governor["call_reserved"] <= CAP
    assert f"this call {governor['call_used']} so far, {governor['call_reserved']} reserved for it" in out["message"]
    assert "used 0" not in out["message"]
    # the stream's running count crossed the 80% warning first: recorded once, then the cut
    assert [e["cause"] for e in events_of(running, session)] == ["on_governor_budget_warning", "on_budget_exhausted"]


@pytest.mark.parametrize("http2", VERSIONS)
async def test_a_final_usage_past_the_cap_raises_in_the_openai_sdk_before_the_end(env, http2):
    running, upstream = env
    session = f"end-{http2}"
    # 50 tokens of text, but the usage chunk at the end reports 4,000 (hidden reasoning, say)
    upstream.script(H2Stream(deltas=50, output_tokens=4000, delay=0.002))
    out = await sdk(OPENAI, running, upstream, session, http2)
    assert out.get("raised") == "APIError", out
    assert out["body"]["governor"]["cause"] == "on_budget_exhausted"
    log = upstream.streams[0]
    # the upstream sent it all up to the usage chunk; its [DONE] may or may not be written before
    # the governor, having cut, closes the upstream (transit closes its socket at once)
    assert log.events_sent >= log.events_planned - 1
    # what came before the chunk that reported the usage came through (the governor keeps back
    # that chunk and what follows it: the usage, the finish and the [DONE]), then the error
    assert 0 < len(out["text"]) <= 50 * 4
    events = events_of(running, session)
    assert [e["cause"] for e in events] == ["on_budget_exhausted"]  # the overrun is recorded
    assert events[0]["detail"]["projected"] > CAP


@pytest.mark.parametrize("http2", VERSIONS)
async def test_a_final_usage_past_the_cap_raises_in_the_anthropic_sdk_before_the_end(env, http2):
    running, upstream = env
    session = f"anthropic-end-{http2}"
    upstream.script(H2Stream(deltas=50, output_tokens=4000))  # message_delta's usage at the end: 4,000
    out = await sdk(ANTHROPIC, running, upstream, session, http2)
    assert "raised" in out, out
    assert out["body"]["governor"]["cause"] == "on_budget_exhausted"
    assert upstream.requests[0][0] == ("2" if http2 else "1.1")
    assert [e["cause"] for e in events_of(running, session)] == ["on_budget_exhausted"]


@pytest.mark.parametrize("http2", VERSIONS)
async def test_a_responses_stream_cut_raises_in_the_openai_sdk(env, http2):
    running, upstream = env
    upstream.script(H2Stream(deltas=300, piece="abcd" * 20, delay=0.002))
    out = await sdk(OPENAI, running, upstream, f"responses-{http2}", http2, api="responses")
    assert out.get("raised") == "APIError", out
    assert out["body"]["governor"]["cause"] == "on_budget_exhausted"
    assert upstream.streams[0].disconnected


@pytest.mark.parametrize("http2", VERSIONS)
async def test_a_stream_within_the_cap_is_delivered_whole(env, http2):
    running, upstream = env
    upstream.script(H2Stream(deltas=40, output_tokens=100))
    out = await sdk(OPENAI, running, upstream, f"whole-{http2}", http2)
    assert out.get("completed") is True and len(out["text"]) == 40 * 4, out
    assert events_of(running, f"whole-{http2}") == []


async def test_an_http2_cut_resets_its_stream_only_and_its_sibling_goes_on(env):
    """Two streams of one client connection share one HTTP/2 upstream connection: cutting
    one (its session's budget crossed) leaves the other running to its [DONE]."""
    running, upstream = env
    upstream.script(H2Stream(deltas=300, piece="abcd" * 20, delay=0.004),  # crosses 3,000 tokens
                    H2Stream(deltas=200, delay=0.004))  # 200 tokens, streaming as long
    async with httpx2.AsyncClient(http2=True, proxy=running.proxy_url,
                                  verify=ssl.create_default_context(cafile=str(running.ca_file)),
                                  trust_env=False, timeout=30) as client:
        async def stream(session: str) -> tuple[int, list[dict], bool, str]:
            body = {"model": "gpt-4o-mini", "max_tokens": 500, "stream": True,
                    "messages": [{"role": "user", "content": "go"}]}
            events, done = [], False
            async with client.stream("POST", f"{upstream.base_url}/v1/chat/completions", json=body,
                                     headers={"ADL-Session": session}) as response:
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        events.append(orjson.loads(line[6:]))
                return response.status_code, events, done, response.http_version

        async def later(session: str):
            for _ in range(500):  # once the first is streaming, the second joins its connection
                if upstream.streams and upstream.streams[0].events_sent:
                    break
                await asyncio.sleep(0.01)
            return await stream(session)

        cut, sibling = await asyncio.wait_for(asyncio.gather(stream("sibling-cut"), later("sibling-ok")), 60)
    assert cut[0] == sibling[0] == 200 and cut[3] == sibling[3] == "HTTP/2"
    errors = [e for e in cut[1] if "error" in e]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "on_budget_exhausted" and cut[2]  # error, then [DONE]
    assert not any("error" in e for e in sibling[1]) and sibling[2]
    assert sum(len(c["delta"].get("content") or "") for e in sibling[1] for c in e["choices"]) == 200 * 4
    (v1, _, _, peer1), (v2, _, _, peer2) = upstream.requests
    assert v1 == v2 == "2" and peer1 == peer2  # one upstream connection, two streams
    first, second = upstream.streams
    assert first.disconnected and not first.completed
    assert second.completed and not second.disconnected


async def test_an_http2_upstream_that_sends_no_headers_gets_the_governors_504(tmp_path):
    """The upstream timeout before any response header, over HTTP/2: the governor's 504 in
    the provider's format (the openai SDK raises it), the upstream stream reset."""
    tls = make_tls(tmp_path / "tls")
    upstream = H2Upstream(tls)
    await upstream.start()
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp_path / "data",
                                   upstream_ca=tls.ca_file, tick_interval=0, upstream_timeout=1.0))
    try:
        upstream.script(H2Stream(hang=20))
        code = OPENAI.replace("except openai.APIError as e:", "except openai.APIStatusError as e:\n"
                              "    out = {'raised': type(e).__name__, 'status': e.status_code, 'body': e.body}\n"
                              "except openai.APIError as e:")
        out = await asyncio.wait_for(sdk(code, running, upstream, "hung", True), 30)
        assert out.get("status") == 504, out
        assert "upstream sent no response for 1s" in out["body"]["message"]
        assert upstream.requests[0][0] == "2"
        await asyncio.wait_for(upstream.streams[0].done.wait(), 10)
        assert upstream.streams[0].disconnected  # the upstream stream was reset, not left hanging
    finally:
        await running.stop()
        await upstream.stop()
