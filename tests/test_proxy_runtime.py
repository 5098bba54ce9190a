"""End to end with the real runtime: `serve()` on the bundled example passport (tokens
20000 per session, on_budget_exhausted: halt), SQLite state and the journal in a
temporary data directory, the control plane on, the mock upstream over TLS.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
import pytest_asyncio

from governor.control.origin import MARKER_HEADER
from governor.adapters import AllowEntry
from tests.proxy_harness import RawClient, real_governor, run_python, sdk_environment
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    async with real_governor(tmp_path_factory.mktemp("e2e"), control=("127.0.0.1", 0), tick_interval=0.5) as parts:
        yield parts


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


async def send(running, mock, path: str, body: dict | None, session: str, method: str = "POST"):
    """One request of `session` on a connection of its own (body None: empty): (status, headers, body)."""
    client = await asyncio.to_thread(RawClient, running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
    try:
        payload = orjson.dumps(body) if body is not None else b""
        await asyncio.to_thread(client.send, method, path, payload, {"ADL-Session": session})
        return await asyncio.to_thread(client.read_response)
    finally:
        client.close()


async def tokens_used(running, session: str) -> float:
    view = await running.runtime.session_view(session)
    return next(b["used"] for b in view["budgets"]
                if b["dimension"] == "tokens" and b["scope"] == "per_session" and b["persona"] is None)


def chat(max_tokens: int = 100, stream: bool = False, answers: int = 1) -> dict:
    return {"model": "gpt-4o-mini", "max_tokens": max_tokens, "stream": stream, "n": answers,
            "messages": [{"role": "user", "content": "hello"}]}


# A call that cannot fit the example passport's 20,000 tokens even fitted: 100 answers of
# at most 199 tokens each, under the fitting floor of 256 (docs/fitting.md).
UNFITTABLE = {"max_tokens": 30_000, "answers": 100}


def message(max_tokens: int = 100, stream: bool = False) -> dict:
    return {"model": "claude-haiku-4-5", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "hello"}]}


async def test_usage_is_counted_exactly_plain_and_streamed(env):
    running, mock = env
    mock.script(Behaviour(input_tokens=120, output_tokens=30, cached_tokens=20),
                Behaviour(input_tokens=200, output_tokens=50, cached_tokens=100, progressive_usage=True, chunks=5))
    status, _, _ = await send(running, mock, CHAT, chat(), "count")
    assert status == 200
    assert await tokens_used(running, "count") == 150
    status, _, body = await send(running, mock, MESSAGES, message(stream=True), "count")
    assert status == 200 and b"message_stop" in body
    await asyncio.sleep(0.1)  # the final usage is settled in the response hook, after the last byte
    assert await tokens_used(running, "count") == 150 + 250
    # the proxy marks what it forwards, so the control plane can refuse it
    assert all(MARKER_HEADER.lower() in {k.lower() for k in r.headers} for r in mock.requests)


async def test_budget_exhaustion_halts_the_session_with_the_same_reason_after(env):
    running, mock = env
    status, headers, body = await send(running, mock, CHAT, chat(**UNFITTABLE), "broke")
    assert status == 429
    governor = orjson.loads(body)["error"]["governor"]
    assert governor["cause"] == "on_budget_exhausted" and governor["action"] == "halt"
    assert governor["dimension"] == "tokens" and governor["scope"] == "per_session" and governor["limit"] == 20000
    status, _, body = await send(running, mock, MESSAGES, message(), "broke")
    assert status == 429
    assert orjson.loads(body)["governor"]["cause"] == "on_budget_exhausted"
    assert (await running.runtime.session_view("broke"))["state"] == "halted"
    assert mock.requests == []


async def test_the_runtime_cuts_a_stream_that_crosses_the_cap(env):
    running, mock = env
    # the provider reports cumulative usage as it goes, far beyond what was reserved
    mock.script(Behaviour(text="w" * 400, chunks=20, chunk_delay=0.03, input_tokens=100, output_tokens=60_000,
                          progressive_usage=True))
    status, _, body = await send(running, mock, MESSAGES, message(max_tokens=1000, stream=True), "cut")
    assert status == 200
    assert b"event: error" in body and b"message_stop" not in body
    error = orjson.loads(body.rsplit(b"data: ", 1)[1])
    assert error["governor"]["cause"] == "on_budget_exhausted"
    log = mock.streams[0]
    await asyncio.wait_for(log.done.wait(), 5)
    assert log.disconnected and not log.completed
    await asyncio.sleep(0.1)
    assert (await running.runtime.session_view("cut"))["state"] == "halted"


async def test_a_swapped_passport_is_a_session_integrity_fault(env):
    running, mock = env
    pin = running.runtime.limits.passport_digest
    client = await asyncio.to_thread(RawClient, running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
    try:
        body = orjson.dumps(chat())
        await asyncio.to_thread(client.send, "POST", CHAT, body, {"ADL-Session": "swap", "ADL-Passport": f"sha256={pin}"})
        status, _, _ = await asyncio.to_thread(client.read_response)
        assert status == 200  # the pinned passport itself is fine
        await asyncio.to_thread(client.send, "POST", CHAT, body, {"ADL-Session": "swap", "ADL-Passport": "sha256=other"})
        status, _, data = await asyncio.to_thread(client.read_response)
    finally:
        client.close()
    assert status == 403
    governor = orjson.loads(data)["error"]["governor"]
    assert governor["cause"] == "on_governor_session_integrity" and governor["action"] == "halt"


async def test_openai_sdk_through_the_real_runtime(env):
    running, mock = env
    mock.script(Behaviour(input_tokens=40, output_tokens=10), Behaviour(input_tokens=30, output_tokens=5, chunks=3))
    code = """
import json, openai
client = openai.OpenAI()
h = {"ADL-Session": "sdk"}
r = client.chat.completions.create(model="gpt-4o-mini", max_tokens=50, messages=[{"role": "user", "content": "x"}],
                                   extra_headers=h)
s = list(client.chat.completions.create(model="gpt-4o-mini", max_tokens=50, stream=True,
                                        messages=[{"role": "user", "content": "x"}], extra_headers=h))
try:
    client.chat.completions.create(model="gpt-4o-mini", max_tokens=30000, n=100,  # under the fitting floor
                                   messages=[{"role": "user", "content": "x"}], extra_headers=h)
    refused = None
except openai.APIStatusError as e:
    refused = {"type": type(e).__name__, "status": e.status_code, "cause": e.body["governor"]["cause"]}
print(json.dumps({"plain": r.usage.total_tokens, "streamed": s[-1].usage.total_tokens, "refused": refused}))
"""
    out = await run_python(code, sdk_environment(running, mock))
    assert out == {"plain": 50, "streamed": 35,
                   "refused": {"type": "RateLimitError", "status": 429, "cause": "on_budget_exhausted"}}
    assert await tokens_used(running, "sdk") == 85


async def test_a_halted_session_refuses_ungoverned_traffic_too(env):
    running, mock = env
    registry = running.chain.registry
    registry.allow = [AllowEntry.parse("GET 127.0.0.1/health")]
    try:
        # allowed (no adapter matches, the allow-list names it) while the session runs: forwarded
        before, _, _ = await send(running, mock, "/health", None, "ungoverned", method="GET")
        assert before == 200
        status, _, _ = await send(running, mock, CHAT, chat(**UNFITTABLE), "ungoverned")
        assert status == 429 and (await running.runtime.session_view("ungoverned"))["state"] == "halted"
        served = len(mock.requests)
        for path in ("/health", "/elsewhere"):  # allowed, and unknown
            status, _, body = await send(running, mock, path, None, "ungoverned", method="GET")
            assert status == 403, path
            gov = orjson.loads(body)["error"]["governor"]
            assert gov["cause"] == "on_budget_exhausted" and gov["refusal"] == "session_halted", path
        assert len(mock.requests) == served
    finally:
        registry.allow = []


async def test_run_keeps_the_governor_key_where_auditors_find_it(env):
    from governor.evidence import load_did_document, load_public_key, verify_record

    running, mock = env
    keys = running.settings.data_dir / "keys"
    assert (keys / "governor-key.pem").stat().st_mode & 0o077 == 0
    did = load_did_document(keys / "did.json")
    assert did["id"] == running.runtime.governor_id
    await send(running, mock, CHAT, chat(), "audited")
    record = await running.runtime.end_session("audited")
    assert verify_record(record, public_key=load_public_key(keys / "governor-pub.pem")).ok
    assert verify_record(record, did_document=did).ok
