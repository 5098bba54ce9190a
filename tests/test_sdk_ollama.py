"""The official `ollama` SDK (`ollama.Client(host=...)`) through the real proxy on the real
runtime, against a loopback upstream that answers as Ollama does (tests/compat_upstreams.py):
/api/chat and /api/generate plain and streamed (NDJSON), /api/embed, /api/embeddings.

Charged from the final object's `prompt_eval_count` / `eval_count`; refused at the cap with
the SDK's `ResponseError` carrying the governor's reason; `options.num_predict` fitted;
undeclared tools withheld; the record verifies. Hostile: counts missing or of the wrong
type, a line that is not JSON (or JSON only to Python's lenient parser), a line past the
size bound, `stream` as a string, a body that is not an object.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
import pytest_asyncio

from governor.adapters.counting import count_text
from governor.adapters.sse import MAX_EVENT_BYTES
from tests.compat_harness import client_environment, compat_governor, events, http_client, used, verified_record
from tests.compat_upstreams import Answer
from tests.proxy_harness import run_python

pytestmark = pytest.mark.asyncio(loop_scope="module")

PRELUDE = """
import json, ollama, os
client = ollama.Client(host=os.environ["OLLAMA_TARGET"], timeout=30)
out = {}
def record(name, fn):
    try:
        out[name] = fn()
    except ollama.ResponseError as e:
        out[name] = {"raised": "ResponseError", "status": e.status_code, "error": e.error}
    except Exception as e:
        out[name] = {"raised": type(e).__name__, "error": str(e)}
def session(name):
    return ollama.Client(host=os.environ["OLLAMA_TARGET"], timeout=30, headers={"ADL-Session": name})
"""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sdk-ollama")
    async with compat_governor(tmp) as (running, upstream):
        environment = {**client_environment(running), "OLLAMA_TARGET": upstream.base_url}
        yield running, upstream, environment, tmp


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


async def test_chat_and_generate_plain_and_streamed_are_charged_their_counts(env):
    running, upstream, environment, tmp = env
    upstream.script(Answer(text="plain chat", input_tokens=21, output_tokens=5),
                    Answer(text="a streamed chat answer", chunks=4, input_tokens=30, output_tokens=9),
                    Answer(text="generated", input_tokens=12, output_tokens=3),
                    Answer(text="streamed generation", chunks=3, input_tokens=14, output_tokens=6))
    code = PRELUDE + """
c = session("counted")
msgs = [{"role": "user", "content": "hi"}]
record("chat", lambda: c.chat(model="llama3.2", messages=msgs, stream=False).message.content)
def streamed_chat():
    parts = list(c.chat(model="llama3.2", messages=msgs, stream=True))
    return {"text": "".join(p.message.content for p in parts), "done": parts[-1].done,
            "eval_count": parts[-1].eval_count}
record("chat_stream", streamed_chat)
record("generate", lambda: c.generate(model="llama3.2", prompt="hi").response)
def streamed_generate():
    parts = list(c.generate(model="llama3.2", prompt="hi", stream=True))
    return "".join(p.response for p in parts)
record("generate_stream", streamed_generate)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    assert out == {"chat": "plain chat", "chat_stream": {"text": "a streamed chat answer", "done": True,
                                                          "eval_count": 9},
                   "generate": "generated", "generate_stream": "streamed generation"}, out
    await asyncio.sleep(0.1)  # a stream's final usage is settled after its last byte
    assert await used(running, "counted") == 26 + 39 + 15 + 20
    # what went upstream: the stream flag as sent (Ollama streams unless told not to), no ADL-* header
    assert [r.body.get("stream") for r in upstream.requests] == [False, True, False, True]
    assert not any(h.lower().startswith("adl-") for r in upstream.requests for h in r.headers)
    record = await verified_record(running, "counted", tmp)
    # nothing refused or exhausted (free local models cost less than the passport's baseline: an anomaly)
    assert [cause for cause, _ in events(record) if cause != "on_anomaly"] == []


async def test_embed_and_legacy_embeddings(env):
    running, upstream, environment, tmp = env
    upstream.script(Answer(input_tokens=8), Answer())
    code = PRELUDE + """
c = session("embedded")
record("embed", lambda: len(c.embed(model="all-minilm", input=["a", "b"]).embeddings))
record("embeddings", lambda: len(c.embeddings(model="all-minilm", prompt="some words to embed").embedding))
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    assert out == {"embed": 2, "embeddings": 3}, out
    # /api/embed: prompt_eval_count; the legacy answer has no count: the request's estimate
    # (its body at 4 bytes per token), never nothing
    legacy = len(orjson.dumps(upstream.requests[1].body))
    assert await used(running, "embedded") == 8 + -(-legacy // 4)


async def test_output_limit_is_fitted_into_options_num_predict(env):
    running, upstream, environment, tmp = env
    code = PRELUDE + """
c = session("fitted")
msgs = [{"role": "user", "content": "hi"}]
record("none", lambda: c.chat(model="llama3.2", messages=msgs).message.content)
record("unlimited", lambda: c.chat(model="llama3.2", messages=msgs, options={"num_predict": -1}).message.content)
record("huge", lambda: c.generate(model="llama3.2", prompt="hi", options={"num_predict": 100000, "temperature": 0}).response)
record("small", lambda: c.generate(model="llama3.2", prompt="hi", options={"num_predict": 64}).response)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    assert all(isinstance(v, str) for v in out.values()), out
    options = [r.body.get("options") for r in upstream.requests]
    # under the example passport's 20000-token cap: no limit (or -1) gets the reservation's
    # (4096 by default), one past what is left is lowered, one within it is kept
    assert options[0] == {"num_predict": 4096}
    assert options[1] == {"num_predict": 4096}
    assert options[2]["num_predict"] < 20000 and options[2]["temperature"] == 0
    assert options[3] == {"num_predict": 64}


async def test_undeclared_tools_are_withheld_and_an_undeclared_call_refused(env):
    running, upstream, environment, tmp = env
    upstream.script(Answer(tool_calls=(("search_papers", {"query": "agents"}),)),
                    Answer(tool_calls=(("search_papers", {"query": "governors"}),), chunks=4),
                    Answer(tool_calls=(("run_shell", {"cmd": "id"}),)))
    code = PRELUDE + """
c = session("tools")
tools = [{"type": "function", "function": {"name": "search_papers", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object"}}}]
msgs = [{"role": "user", "content": "find papers"}]
def call():
    r = c.chat(model="llama3.2", messages=msgs, tools=tools, stream=False)
    return [t.function.name for t in r.message.tool_calls]
record("declared", call)
def streamed_declared():
    return [t.function.arguments for p in c.chat(model="llama3.2", messages=msgs, tools=tools, stream=True)
            for t in (p.message.tool_calls or [])]
record("declared_stream", streamed_declared)
def streamed():
    return [t.function.name for p in c.chat(model="llama3.2", messages=msgs, tools=tools, stream=True)
            for t in (p.message.tool_calls or [])]
record("undeclared", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    assert out["declared"] == ["search_papers"], out
    # a declared call in a stream: the output after it was held until it was admitted, then delivered
    assert out["declared_stream"] == [{"query": "governors"}], out
    # the model never saw run_shell; when it asks for it anyway the stream is cut with an error line
    assert [t["function"]["name"] for t in upstream.requests[0].body["tools"]] == ["search_papers"]
    refused = out["undeclared"]
    assert refused["raised"] == "ResponseError" and "on_governor_tool_denied" in refused["error"], refused
    assert "'run_shell'" in refused["error"], refused
    record = await verified_record(running, "tools", tmp)
    assert any(e["detail"].get("tool") == "run_shell" for e in record["events"])


@pytest.mark.parametrize("reported", [30_000, 1], ids=["honest", "lying"])
async def test_the_cap_refuses_with_a_readable_error_and_a_stream_is_cut_at_it(env, reported):
    running, upstream, environment, tmp = env
    # the running text outgrows the cap before the counts arrive (whatever they will say): cut mid-stream
    upstream.script(Answer(text="w" * 120_000, chunks=60, chunk_delay=0.01, input_tokens=10, output_tokens=reported))
    session = f"capped-{reported}"
    code = PRELUDE + f"""
c = session({session!r})
msgs = [{{"role": "user", "content": "hi"}}]
def streamed():
    seen = []
    for p in c.chat(model="llama3.2", messages=msgs, options={{"num_predict": 2000}}, stream=True):
        seen.append(p.message.content)
    return "ran to the end"
record("cut", streamed)
record("after", lambda: c.chat(model="llama3.2", messages=msgs, stream=False).message.content)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    cut, after = out["cut"], out["after"]
    assert cut["raised"] == "ResponseError" and "governor" in cut["error"], cut
    assert after["raised"] == "ResponseError" and after["status"] == 429 and "halted" in after["error"], after
    await asyncio.wait_for(upstream.streams[0].done.wait(), 5)
    assert upstream.streams[0].disconnected and len(upstream.requests) == 1
    record = await verified_record(running, session, tmp)
    assert ("on_budget_exhausted", "halt") in events(record)


async def test_an_unpriced_local_model_under_a_cost_cap_is_refused_saying_how_to_price_it(env):
    running, upstream, environment, tmp = env
    code = PRELUDE + """
c = session("unpriced")
record("call", lambda: c.chat(model="qwen3:8b", messages=[{"role": "user", "content": "hi"}]).message.content)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    refused = out["call"]
    assert refused["raised"] == "ResponseError" and refused["status"] == 429, refused
    assert "'qwen3:8b' has no price" in refused["error"] and "pricing file" in refused["error"]
    assert upstream.requests == []


# --- hostile -------------------------------------------------------------------------------


async def post(running, upstream, path: str, content: bytes, session: str):
    async with http_client(running) as http:
        return await http.post(upstream.base_url + path, content=content,
                               headers={"content-type": "application/json", "ADL-Session": session})


async def test_counts_missing_or_not_integers_are_replaced_by_the_count(env):
    running, upstream, environment, tmp = env
    text = "counted by the governor " * 40  # 160 words: the count (adapters.counting) is 160
    upstream.script(Answer(text=text, counts=False), Answer(text=text, counts="string"),
                    Answer(text=text, counts="negative", chunks=5))
    body = orjson.dumps({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    estimate_in = -(-len(body) // 4)
    for session in ("missing", "strings"):
        answer = await post(running, upstream, "/api/chat", body, session)
        assert answer.status_code == 200 and answer.json()["message"]["content"] == text
        assert await used(running, session) == estimate_in + count_text(text)
    streamed = orjson.dumps({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]})
    answer = await post(running, upstream, "/api/chat", streamed, "negative")
    assert answer.status_code == 200 and answer.text.endswith('"done":true}\n') or '"done":true' in answer.text
    await asyncio.sleep(0.1)
    assert await used(running, "negative") == -(-len(streamed) // 4) + count_text(text)
    for session in ("missing", "strings", "negative"):
        [deviation] = usage_deviations(running, session)
        assert deviation["kind"] == "usage_missing" and deviation["counted_output_tokens"] == count_text(text)


def usage_deviations(running, session: str) -> list[dict]:
    """The usage_* deviations the session's record holds (policy.anomaly.usage_deviation)."""
    return [d for e in running.runtime.record(session)["events"]
            for d in (e.get("detail") or {}).get("deviations", ()) if d.get("kind", "").startswith("usage_")]


@pytest.mark.parametrize("stream", [False, True])
async def test_honest_counts_are_charged_exactly_and_low_ones_the_count(env, stream):
    running, upstream, environment, tmp = env
    text = "The quick brown fox jumps over the lazy dog. " * 20  # 180 words, 900 bytes
    honest = 200  # at least the words (a tokenizer's count), below bytes / 4 (225)
    tool = ("search_papers", {"query": "weather in Paris"})
    upstream.script(Answer(text=text, input_tokens=6, output_tokens=honest, chunks=12, tool_calls=(tool,)),
                    Answer(text=text, input_tokens=6, output_tokens=3, chunks=12, tool_calls=(tool,)))
    body = orjson.dumps({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    session = f"ollama-honest-{stream}"
    assert (await post(running, upstream, "/api/chat", body, session)).status_code == 200
    await asyncio.sleep(0.1)
    assert await used(running, session) == 6 + honest
    assert usage_deviations(running, session) == []
    assert (await post(running, upstream, "/api/chat", body, session + "-liar")).status_code == 200
    await asyncio.sleep(0.1)
    # the text's words, the tool's name and its arguments as compact JSON (3 words)
    assert await used(running, session + "-liar") == 6 + count_text(text) + 1 + 3
    [deviation] = usage_deviations(running, session + "-liar")
    assert deviation["kind"] == "usage_below_count" and deviation["reported_output_tokens"] == 3


@pytest.mark.parametrize("mode", ["garbage_line", "lenient_tool"])
async def test_a_line_that_is_not_json_cuts_the_stream_and_is_recorded(env, mode):
    running, upstream, environment, tmp = env
    upstream.script(Answer(chunks=4, **{mode: True if mode == "garbage_line" else "run_shell"}))
    session = f"unreadable-{mode}"
    code = PRELUDE + f"""
c = session({session!r})
def streamed():
    return [p.message.content for p in c.chat(model="llama3.2", messages=[{{"role": "user", "content": "hi"}}],
                                              stream=True)]
record("stream", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    assert out["stream"]["raised"] == "ResponseError", out
    assert "NDJSON line that is not JSON" in out["stream"]["error"], out
    await asyncio.sleep(0.2)  # the cut is recorded by a task beside the relay
    record = await verified_record(running, session, tmp)
    [refusal] = [e for e in record["events"] if e["cause"] == "on_governor_request_refused"]
    assert refusal["detail"]["reason"] == "unreadable_answer"


async def test_a_plain_answer_only_a_lenient_parser_reads_is_refused_and_charged_its_reservation(env):
    running, upstream, environment, tmp = env
    upstream.script(Answer(lenient_tool="run_shell"))
    code = PRELUDE + """
record("plain", lambda: session("lenient-plain").chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}],
                                                      options={"num_predict": 100}).message.tool_calls)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    assert out["plain"]["raised"] == "ResponseError" and out["plain"]["status"] == 502, out
    assert "not a JSON object the governor can read" in out["plain"]["error"]
    assert await used(running, "lenient-plain") >= 100  # what it reserved: what it used cannot be read


async def test_a_line_past_the_size_bound_cuts_the_stream(env):
    running, upstream, environment, tmp = env
    upstream.script(Answer(endless_bytes=MAX_EVENT_BYTES + 1024))
    body = orjson.dumps({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]})
    answer = await post(running, upstream, "/api/chat", body, "endless")
    last = answer.content.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    assert b"x" * 1024 not in answer.content[-2048:]
    assert "holds at most" in orjson.loads(last)["error"]
    await asyncio.sleep(0.2)
    record = await verified_record(running, "endless", tmp)
    assert [e["detail"]["reason"] for e in record["events"] if e["cause"] == "on_governor_request_refused"] == [
        "event_too_large"]


@pytest.mark.parametrize("body, says", [
    (b'{"model":"llama3.2","messages":[],"stream":"true"}', "'stream' must be a boolean"),
    (b'["llama3.2"]', "must be a JSON object"),
    (b'{"model":"llama3.2","prompt":"hi","options":{"num_predict":"100"}}', "'options.num_predict' must be an integer"),
    (b'{"model":"llama3.2","prompt":"hi","options":[1]}', "'options' must be an object"),
    (b'{"messages":[]}', "'model' is required"),
])
async def test_malformed_requests_are_refused_in_ollamas_format_and_recorded(env, body, says):
    running, upstream, environment, tmp = env
    path = "/api/chat" if b"messages" in body or body.startswith(b"[") else "/api/generate"
    answer = await post(running, upstream, path, body, "malformed")
    assert answer.status_code == 400 and says in answer.json()["error"], answer.text
    assert upstream.requests == []


async def test_a_malformed_request_is_in_the_record(env):
    running, upstream, environment, tmp = env
    answer = await post(running, upstream, "/api/chat", b'{"model":"llama3.2","stream":"yes"}', "malformed-rec")
    assert answer.status_code == 400
    record = await verified_record(running, "malformed-rec", tmp)
    assert [e["detail"]["reason"] for e in record["events"] if e["cause"] == "on_governor_request_refused"][0] == "bad_request"
