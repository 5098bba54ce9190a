"""Text Generation Inference's /generate and /generate_stream through the real proxy on the
real runtime, as raw HTTP (what `huggingface_hub`'s InferenceClient sends), against a
loopback upstream that answers as TGI's router does (tests/compat_upstreams.py).

Charged from the `x-prompt-tokens` / `x-generated-tokens` headers (plain) and the last
event's `details` (streamed: the governor asks for them); `parameters.max_new_tokens`
fitted; refused at the cap in TGI's error format; the record verifies. Hostile: counts
missing, an event that is not JSON, `stream` as a string, a body that is not an object."""

from __future__ import annotations

import asyncio

import orjson
import pytest
import pytest_asyncio

from governor.adapters.counting import count_text
from tests.compat_harness import compat_governor, events, http_client, used, verified_record
from tests.compat_upstreams import Answer

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tgi")
    async with compat_governor(tmp) as (running, upstream):
        yield running, upstream, tmp


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


async def post(env, path: str, body, session: str):
    running, upstream, _ = env
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    async with http_client(running) as http:
        return await http.post(upstream.base_url + path, content=content,
                               headers={"content-type": "application/json", "ADL-Session": session})


def data_events(text: str) -> list[dict]:
    return [orjson.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


async def test_generate_plain_and_streamed_are_charged_their_counts(env):
    running, upstream, tmp = env
    upstream.script(Answer(text="plain text", input_tokens=13, output_tokens=4),
                    Answer(text="streamed text", chunks=3, input_tokens=17, output_tokens=6))
    plain = await post(env, "/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 20}}, "tgi-counted")
    assert plain.status_code == 200 and plain.json() == {"generated_text": "plain text"}
    streamed = await post(env, "/generate_stream", {"inputs": "hi", "parameters": {"max_new_tokens": 20}},
                          "tgi-counted")
    assert streamed.status_code == 200
    sent = data_events(streamed.text)
    assert "".join(e["token"]["text"] for e in sent) == "streamed text"
    # the governor asked for details: the last event carries the counts
    assert upstream.requests[1].body["parameters"] == {"max_new_tokens": 20, "details": True}
    assert sent[-1]["details"]["generated_tokens"] == 6 and sent[-1]["details"]["input_length"] == 17
    assert upstream.requests[0].body["parameters"] == {"max_new_tokens": 20}  # a plain one's are in headers
    await asyncio.sleep(0.1)
    assert await used(running, "tgi-counted") == 17 + 23
    record = await verified_record(running, "tgi-counted", tmp)
    assert [cause for cause, _ in events(record) if cause != "on_anomaly"] == []


async def test_max_new_tokens_is_fitted_and_best_of_reserves_every_candidate(env):
    running, upstream, tmp = env
    await post(env, "/generate", {"inputs": "hi"}, "tgi-fitted")
    await post(env, "/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 50_000, "temperature": 0.5}},
               "tgi-fitted")
    refused = await post(env, "/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 4000, "best_of": 5}},
                         "tgi-best-of")
    parameters = [r.body["parameters"] for r in upstream.requests]
    assert parameters[0] == {"max_new_tokens": 4096}  # a call naming none gets its reservation's limit
    assert parameters[1]["max_new_tokens"] < 20_000 and parameters[1]["temperature"] == 0.5
    # 5 x 4000 cannot be reserved within 20000 tokens: fitted to 5 answers of what is left
    assert refused.status_code == 200 and parameters[2]["max_new_tokens"] < 4000


async def test_the_cap_refuses_in_tgis_error_format(env):
    running, upstream, tmp = env
    refused = await post(env, "/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 1000, "best_of": 100}},
                         "tgi-capped")
    assert refused.status_code == 429
    error = refused.json()
    assert error["error_type"] == "governor" and error["error"].startswith("governor: halt (on_budget_exhausted)")
    assert error["governor"]["dimension"] == "tokens"
    streamed = await post(env, "/generate_stream", {"inputs": "hi"}, "tgi-capped")
    assert streamed.status_code == 429 and "halted" in streamed.json()["error"]
    assert upstream.requests == []
    record = await verified_record(running, "tgi-capped", tmp)
    assert ("on_budget_exhausted", "halt") in events(record)


async def test_a_stream_past_the_cap_is_cut_with_an_error_event(env):
    running, upstream, tmp = env
    upstream.script(Answer(text="w" * 120_000, chunks=60, chunk_delay=0.01, input_tokens=5, output_tokens=30_000))
    streamed = await post(env, "/generate_stream", {"inputs": "hi", "parameters": {"max_new_tokens": 2000}},
                          "tgi-cut")
    last = data_events(streamed.text)[-1]
    assert last["error_type"] == "governor" and last["governor"]["cause"] == "on_budget_exhausted", last
    await asyncio.wait_for(upstream.streams[0].done.wait(), 5)
    assert upstream.streams[0].disconnected


def usage_deviations(running, session: str) -> list[dict]:
    """The usage_* deviations the session's record holds (policy.anomaly.usage_deviation)."""
    return [d for e in running.runtime.record(session)["events"]
            for d in (e.get("detail") or {}).get("deviations", ()) if d.get("kind", "").startswith("usage_")]


async def test_counts_missing_are_the_governors_count(env):
    running, upstream, tmp = env
    text = "estimated " * 100  # 100 words: the count (adapters.counting) is 100 tokens
    upstream.script(Answer(text=text, counts=False), Answer(text=text, counts=False, chunks=10))
    body = orjson.dumps({"inputs": "hi", "parameters": {"max_new_tokens": 300}})
    assert (await post(env, "/generate", body, "tgi-missing")).status_code == 200
    assert await used(running, "tgi-missing") == -(-len(body) // 4) + count_text(text)
    assert (await post(env, "/generate_stream", body, "tgi-missing-stream")).status_code == 200
    await asyncio.sleep(0.1)
    assert await used(running, "tgi-missing-stream") == -(-len(body) // 4) + count_text(text)
    for session in ("tgi-missing", "tgi-missing-stream"):
        [deviation] = usage_deviations(running, session)
        assert deviation["kind"] == "usage_missing" and deviation["counted_output_tokens"] == count_text(text)


@pytest.mark.parametrize("path", ["/generate", "/generate_stream"])
async def test_honest_counts_are_charged_exactly_and_low_ones_the_count(env, path):
    running, upstream, tmp = env
    text = "The quick brown fox jumps over the lazy dog. " * 20  # 180 words, 900 bytes
    honest = 200  # at least the words (a tokenizer's count), below bytes / 4 (225)
    upstream.script(Answer(text=text, input_tokens=6, output_tokens=honest, chunks=12),
                    Answer(text=text, input_tokens=6, output_tokens=3, chunks=12))
    body = orjson.dumps({"inputs": "hi", "parameters": {"max_new_tokens": 400}})
    session = f"tgi-honest{path.replace('/', '-')}"
    assert (await post(env, path, body, session)).status_code == 200
    await asyncio.sleep(0.1)
    assert await used(running, session) == 6 + honest
    assert usage_deviations(running, session) == []
    assert (await post(env, path, body, session + "-liar")).status_code == 200
    await asyncio.sleep(0.1)
    assert await used(running, session + "-liar") == 6 + count_text(text)
    [deviation] = usage_deviations(running, session + "-liar")
    assert deviation["kind"] == "usage_below_count" and deviation["reported_output_tokens"] == 3


async def test_an_event_that_is_not_json_cuts_the_stream_and_is_recorded(env):
    running, upstream, tmp = env
    upstream.script(Answer(garbage_line=True, chunks=4))
    streamed = await post(env, "/generate_stream", {"inputs": "hi"}, "tgi-garbage")
    last = data_events(streamed.text)[-1]
    assert "not a JSON object" in last["error"], streamed.text
    await asyncio.sleep(0.2)
    record = await verified_record(running, "tgi-garbage", tmp)
    assert [e["detail"]["reason"] for e in record["events"] if e["cause"] == "on_governor_request_refused"] == [
        "unreadable_answer"]


@pytest.mark.parametrize("body, says", [
    (b'{"inputs":"hi","stream":"true"}', "'stream' must be a boolean"),
    (b'"hi"', "must be a JSON object"),
    (b'{"inputs":["hi"]}', "'inputs' is required and must be a string"),
    (b'{"inputs":"hi","parameters":{"max_new_tokens":"20"}}', "'max_new_tokens' must be a positive integer"),
    (b'{"inputs":"hi","parameters":"x"}', "'parameters' must be an object"),
])
async def test_malformed_requests_are_refused_in_tgis_format(env, body, says):
    running, upstream, tmp = env
    refused = await post(env, "/generate", body, "tgi-malformed")
    assert refused.status_code == 400 and says in refused.json()["error"], refused.text
    assert refused.json()["error_type"] == "governor"
    assert upstream.requests == []
