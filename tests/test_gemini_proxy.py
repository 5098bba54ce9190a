"""Gemini through the real proxy on the real runtime, as a hostile agent or upstream would
drive it (raw HTTP/1.1 over TLS, the loopback Gemini mock): bodies that are not JSON, a
path without a model, the colon percent-encoded, a candidateCount no cap holds, answers
without usage or with usage that lies, malformed stream chunks, the JSON-array stream
(read whole, refused whole at the cap), another method on a model path, a halted session.
Each is governed or refused in Google's error format, never forwarded unread, and a
refusal is in the session's record."""

from __future__ import annotations

import asyncio

import orjson
import pytest
import pytest_asyncio

from governor.adapters.counting import count_text
from governor.adapters.fitting import FITTED_HEADER
from tests.gemini_upstream import GeminiBehaviour as B
from tests.gemini_upstream import GeminiMock
from tests.proxy_harness import RawClient, real_governor

pytestmark = pytest.mark.asyncio(loop_scope="module")

GEN = "/v1beta/models/gemini-2.5-flash:generateContent"
SSE = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
ARRAY = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
HI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    async with real_governor(tmp_path_factory.mktemp("gemini-proxy")) as (running, llm):
        mock = GeminiMock(llm.tls)
        await mock.start()
        try:
            yield running, mock
        finally:
            await mock.stop()


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


async def send(running, mock, path: str, body, session: str, method: str = "POST"):
    client = await asyncio.to_thread(RawClient, running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
    try:
        payload = body if isinstance(body, bytes) else orjson.dumps(body)
        await asyncio.to_thread(client.send, method, path, payload, {"ADL-Session": session})
        return await asyncio.to_thread(client.read_response)
    finally:
        client.close()


async def tokens_used(running, session: str, dimension: str = "tokens") -> float:
    view = await running.runtime.session_view(session)
    return next(b["used"] for b in view["budgets"]
                if b["dimension"] == dimension and b["scope"] == "per_session" and b["persona"] is None)


async def refusals_recorded(running, session: str) -> list[dict]:
    record = await running.runtime.end_session(session)
    return [e["detail"] for e in record["events"] if e["cause"] == "on_governor_request_refused"]


def google_error(body: bytes) -> dict:
    error = orjson.loads(body)["error"]
    assert set(error) >= {"code", "message", "status"}
    return error


@pytest.mark.parametrize("path, body, status, reason, says", [
    (GEN, b"this is not json", 400, "bad_request", "not valid JSON"),
    (GEN, b"{\"contents\": [", 400, "bad_request", "not valid JSON"),
    (GEN, {"contents": "a string"}, 400, "bad_request", "'contents' is required"),
    ("/v1beta/models/:generateContent", HI, 400, "bad_request", "names no model"),
    ("/v1beta/models/%3AstreamGenerateContent?alt=sse", HI, 400, "bad_request", "names no model"),
    (GEN, {**HI, "generationConfig": {"maxOutputTokens": "9999999"}}, 400, "bad_request", "positive integer"),
    (GEN, {**HI, "tools": [{"functionDeclarations": [{"parameters": {}}]}]}, 400, "bad_request", "'name'"),
])
async def test_a_request_the_governor_cannot_read_is_refused_in_googles_format_and_recorded(
        env, path, body, status, reason, says):
    running, mock = env
    session = f"bad-{abs(hash((path, str(body)))) % 10**8}"
    got, _, answer = await send(running, mock, path, body, session)
    error = google_error(answer)
    assert got == status and error["status"] == "INVALID_ARGUMENT" and says in error["message"], answer
    assert mock.requests == []
    [detail] = await refusals_recorded(running, session)
    assert detail["reason"] == reason and detail["status"] == status


async def test_another_method_with_a_body_is_refused_405_in_googles_format(env):
    running, mock = env
    got, _, answer = await send(running, mock, GEN, HI, "put", method="PUT")
    assert got == 405 and "governs model calls sent with POST" in google_error(answer)["message"]
    assert mock.requests == []


async def test_the_colon_percent_encoded_is_governed_and_charged(env):
    running, mock = env
    mock.script(B(text="encoded", input_tokens=70, output_tokens=5))
    got, _, answer = await send(running, mock, "/v1beta/models/gemini-2.5-flash%3AgenerateContent", HI, "encoded")
    assert got == 200 and orjson.loads(answer)["candidates"][0]["content"]["parts"][0]["text"] == "encoded"
    assert mock.requests[0].path == "/v1beta/models/gemini-2.5-flash%3AgenerateContent"  # as the agent sent it
    assert await tokens_used(running, "encoded") == 75
    # priced as gemini-2.5-flash (policies/pricing.yaml: 0.30 in, 2.50 out per million tokens)
    assert await tokens_used(running, "encoded", "cost_usd") == pytest.approx((70 * 0.30 + 5 * 2.50) / 1e6)


async def test_an_unpriced_gemini_model_is_refused_under_the_cost_cap_saying_how_to_price_it(env):
    running, mock = env
    got, _, answer = await send(running, mock, "/v1beta/models/gemini-0-unknown:generateContent", HI, "unpriced")
    error = google_error(answer)
    assert got == 429 and error["governor"]["reason"] == "unpriced_model", answer
    assert "has no price" in error["message"] and "--pricing" in error["message"]
    assert mock.requests == []


async def test_a_huge_candidate_count_is_refused_before_anything_reaches_the_upstream(env):
    running, mock = env
    body = {**HI, "generationConfig": {"candidateCount": 1_000_000}}
    got, _, answer = await send(running, mock, GEN, body, "many")
    error = google_error(answer)
    assert got == 429 and error["status"] == "RESOURCE_EXHAUSTED" and error["governor"]["cause"] == "on_budget_exhausted"
    assert mock.requests == []


async def test_an_answer_without_usage_is_charged_what_the_governor_saw(env):
    running, mock = env
    mock.script(B(text="w" * 8000, usage=None))
    got, headers, _ = await send(running, mock, GEN, HI, "silent")
    assert got == 200 and headers[FITTED_HEADER.lower()] == "4096"  # no limit named: its reservation's inserted
    assert mock.requests[0].body["generationConfig"] == {"maxOutputTokens": 4096}
    # 8,000 bytes delivered, not 0: the governor's count of them (adapters.counting) and the estimated input
    assert await tokens_used(running, "silent") == -(-len(orjson.dumps(HI)) // 4) + count_text("w" * 8000)
    deviations = [d for e in running.runtime.record("silent")["events"]
                  for d in (e.get("detail") or {}).get("deviations", ()) if d.get("kind", "").startswith("usage_")]
    assert [d["kind"] for d in deviations] == ["usage_missing"]


async def test_a_non_json_200_is_charged_its_reservation(env):
    running, mock = env
    mock.script(B(raw_answer=b"<html>surprise</html>"))
    got, _, answer = await send(running, mock, GEN, {**HI, "generationConfig": {"maxOutputTokens": 300}}, "html")
    assert got == 200 and answer == b"<html>surprise</html>"
    assert await tokens_used(running, "html") >= 300


async def test_a_stream_whose_usage_goes_down_and_whose_chunks_are_malformed_is_charged_the_most_it_said(env):
    running, mock = env
    mock.script(B(text="streamed", chunks=4, input_tokens=50, output_tokens=400, progressive_usage=True,
                  garbage_sse=True))
    got, _, answer = await send(running, mock, SSE, {**HI, "generationConfig": {"maxOutputTokens": 500}}, "garbage")
    assert got == 200 and b"garbage" in answer and answer.count(b"data: {\"candidates\"") == 5
    assert await tokens_used(running, "garbage") == 450
    # the last chunk says 3 tokens after earlier chunks said 300: the largest is charged
    mock.script(B(text="abc", chunks=3, usage={"promptTokenCount": 9, "candidatesTokenCount": 300},
                  last_usage={"promptTokenCount": 1, "candidatesTokenCount": 3, "totalTokenCount": 4}))
    got, _, answer = await send(running, mock, SSE, HI, "lying")
    assert got == 200 and b'"candidatesTokenCount":3,' in answer and b'"candidatesTokenCount":300' in answer
    assert await tokens_used(running, "lying") == 309


async def test_the_json_array_stream_is_read_whole_charged_and_its_calls_admitted(env):
    running, mock = env
    mock.script(B(text="array answer", chunks=3, input_tokens=20, output_tokens=6,
                  tool_calls=(("search_papers", {"query": "q"}),)))
    got, headers, answer = await send(running, mock, ARRAY, HI, "array")
    items = orjson.loads(answer)
    assert got == 200 and isinstance(items, list) and len(items) == 4
    assert "".join(p.get("text", "") for i in items for p in i["candidates"][0]["content"]["parts"]) == "array answer"
    assert await tokens_used(running, "array") == 26
    view = await running.runtime.session_view("array")
    assert view["tool_calls"] == 1


async def test_a_json_array_stream_past_the_cap_is_replaced_by_the_error(env):
    running, mock = env
    mock.script(B(text="t" * 400, chunks=4, input_tokens=10, output_tokens=30_000))
    got, _, answer = await send(running, mock, ARRAY, {**HI, "generationConfig": {"maxOutputTokens": 1000}}, "over")
    error = google_error(answer)
    assert got == 429 and error["governor"]["cause"] == "on_budget_exhausted", answer
    assert b"tttt" not in answer  # what the upstream generated past the cap is not delivered


async def test_an_upstream_error_passes_as_google_sent_it_and_is_not_charged(env):
    running, mock = env
    mock.script(B(status=503))
    got, _, answer = await send(running, mock, GEN, HI, "upstream-error")
    assert got == 503 and google_error(answer)["status"] == "INTERNAL"
    assert await tokens_used(running, "upstream-error") == 0


async def test_a_halted_session_refuses_gemini_and_vertex_alike(env):
    running, mock = env
    await send(running, mock, GEN, {**HI, "generationConfig": {"candidateCount": 1_000_000}}, "halted")
    for path in (GEN, SSE, "/v1/projects/p/locations/l/publishers/google/models/gemini-2.5-flash:generateContent",
                 "/v1beta/models/gemini-2.5-flash:countTokens"):
        got, _, answer = await send(running, mock, path, HI, "halted")
        assert got == 429 and google_error(answer)["governor"]["cause"] == "on_budget_exhausted", (path, answer)
    assert mock.requests == []


@pytest.mark.parametrize("row", __import__("governor.adapters.gemini", fromlist=["ENDPOINTS"]).ENDPOINTS,
                         ids=lambda row: f"{row.provider}-{row.family}{'-stream' if row.stream else ''}")
async def test_every_endpoint_row_is_a_governed_step_on_default_options(env, row):
    running, mock = env
    session = f"row-{abs(hash((row.probe.path, row.family))) % 10**8}"
    got, _, _ = await send(running, mock, row.probe.path, row.probe.body, session, method=row.probe.method)
    assert got == 200 and len(mock.requests) == 1
    view = await running.runtime.session_view(session)
    assert view["iterations"] == 1  # counted
    used = await tokens_used(running, session)
    assert used == 0 if row.verdict == "free" else used > 0  # charged, unless free
    from governor.evidence import load_public_key, verify_record
    record = await running.runtime.end_session(session)
    key = load_public_key(running.settings.data_dir / "keys" / "governor-pub.pem")
    assert verify_record(record, public_key=key).ok
