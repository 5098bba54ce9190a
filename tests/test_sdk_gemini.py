"""The official `google-genai` SDK through the real proxy on the real runtime (regular mode,
real TLS; the bundled example passport: 20,000 tokens and 0.5 USD per session, tools
search_papers, fetch_paper, ...), configured through its environment (HTTPS_PROXY,
SSL_CERT_FILE) and `HttpOptions(base_url=...)`, against the loopback Gemini mock
(tests/gemini_upstream.py), for the Generative Language API and for Vertex AI.

Each call is a governed step: charged what usageMetadata says, refused at the cap with an
`errors.APIError` that carries the governor's reason, cut mid-stream with an error event
the SDK raises, its offered tools withheld, the model's function calls admitted as tool
calls; and the session's signed record verifies.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

from governor.adapters.refusals import describe
from tests.gemini_upstream import GeminiBehaviour as B
from tests.gemini_upstream import GeminiMock
from tests.proxy_harness import real_governor, run_python

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    async with real_governor(tmp_path_factory.mktemp("sdk-gemini")) as (running, llm):
        mock = GeminiMock(llm.tls)
        await mock.start()
        try:
            yield running, mock, {"HTTPS_PROXY": running.proxy_url, "SSL_CERT_FILE": str(running.ca_file)}
        finally:
            await mock.stop()


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


def prelude(mock: GeminiMock, session: str, *, vertex: bool = False) -> str:
    if vertex:
        client = (f"genai.Client(vertexai=True, project='demo', location='us-central1', "
                  f"credentials=Credentials(token='fake-token'), http_options=types.HttpOptions("
                  f"base_url={mock.base_url!r}, headers={{'ADL-Session': {session!r}}}))")
    else:
        client = (f"genai.Client(api_key='test-key', http_options=types.HttpOptions("
                  f"base_url={mock.base_url!r}, headers={{'ADL-Session': {session!r}}}))")
    return f"""
import json
from google import genai
from google.genai import errors, types
from google.oauth2.credentials import Credentials
client = {client}
out = {{}}
def record(name, fn):
    try:
        out[name] = fn()
    except errors.APIError as e:
        out[name] = {{"raised": type(e).__name__, "code": e.code, "status": e.status, "message": e.message,
                      "body": e.details}}
"""


async def tokens_used(running, session: str) -> float:
    view = await running.runtime.session_view(session)
    return next(b["used"] for b in view["budgets"]
                if b["dimension"] == "tokens" and b["scope"] == "per_session" and b["persona"] is None)


async def verified(running, session: str) -> dict:
    from governor.evidence import load_public_key, verify_record

    record = await running.runtime.end_session(session)
    report = verify_record(record, public_key=load_public_key(running.settings.data_dir / "keys" / "governor-pub.pem"))
    assert report.ok, report.summary()
    return record


TOOLS = """[types.Tool(function_declarations=[
    types.FunctionDeclaration(name="search_papers", parameters={"type": "object", "properties": {"query": {"type": "string"}}}),
    types.FunctionDeclaration(name="run_shell", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}}),
]), types.Tool(google_search=types.GoogleSearch())]"""


async def test_generate_plain_and_streamed_charged_tools_withheld_calls_admitted_record_verifies(env):
    running, mock, sdk_env = env
    mock.script(
        B(text="", tool_calls=(("search_papers", {"query": "agents"}),), input_tokens=31, output_tokens=17,
          cached_tokens=8, thoughts_tokens=5),
        B(text="streamed answer", chunks=4, input_tokens=23, output_tokens=9, progressive_usage=True,
          tool_use_prompt_tokens=3),
    )
    code = prelude(mock, "gem") + f"""
tools = {TOOLS}
def plain():
    r = client.models.generate_content(model="gemini-2.5-flash", contents="find papers",
        config=types.GenerateContentConfig(tools=tools, max_output_tokens=64))
    call = r.function_calls[0]
    return {{"tool": call.name, "args": call.args, "total": r.usage_metadata.total_token_count,
             "thoughts": r.usage_metadata.thoughts_token_count}}
def streamed():
    chunks = list(client.models.generate_content_stream(model="gemini-2.5-flash", contents="hello",
        config=types.GenerateContentConfig(max_output_tokens=64)))
    return {{"text": "".join(c.text or "" for c in chunks), "chunks": len(chunks),
             "total": chunks[-1].usage_metadata.total_token_count}}
record("plain", plain)
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["plain"] == {"tool": "search_papers", "args": {"query": "agents"}, "total": 53, "thoughts": 5}, out
    assert out["streamed"] == {"text": "streamed answer", "chunks": 5, "total": 35}, out
    plain, streamed = mock.requests
    # (the SDK's default API version: v1 in google-genai 3, v1beta before)
    assert plain.path.removeprefix("/v1beta").removeprefix("/v1") == "/models/gemini-2.5-flash:generateContent"
    assert streamed.path.endswith("/models/gemini-2.5-flash:streamGenerateContent?alt=sse")
    # the undeclared function and the provider-run search never reached the model; ADL-* headers neither
    assert [d["name"] for t in plain.body["tools"] for d in t["functionDeclarations"]] == ["search_papers"]
    assert [sorted(t) for t in plain.body["tools"]] == [["functionDeclarations"]]  # googleSearch went
    assert "tools" not in streamed.body
    assert not any(h.lower().startswith("adl-") for r in mock.requests for h in r.headers)
    # usage as usageMetadata says: thoughts are output, tool-use prompt input
    assert await tokens_used(running, "gem") == (31 + 17 + 5) + (23 + 3 + 9)
    view = await running.runtime.session_view("gem")
    assert view["tool_calls"] == 1 and view["iterations"] >= 2
    record = await verified(running, "gem")
    withheld = [e for e in record["events"] if e["cause"] == "on_governor_tools_withheld"]
    assert withheld and set(withheld[0]["detail"]["tools"]) == {"run_shell", "googleSearch"}


async def test_count_tokens_is_counted_and_free_embeddings_charge_input(env):
    running, mock, sdk_env = env
    mock.script(B(input_tokens=900), B(input_tokens=12))
    code = prelude(mock, "free") + """
record("count", lambda: client.models.count_tokens(model="gemini-2.5-flash", contents="hello").total_tokens)
record("embed", lambda: len(client.models.embed_content(model="gemini-embedding-001", contents=["a", "b"]).embeddings))
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out == {"count": 900, "embed": 2}, out
    assert [r.path.split("/", 2)[2] for r in mock.requests] == ["models/gemini-2.5-flash:countTokens",
                                                                "models/gemini-embedding-001:batchEmbedContents"]
    assert await tokens_used(running, "free") == 12  # the count cost nothing, the embeddings their input
    view = await running.runtime.session_view("free")
    assert view["iterations"] == 2  # both counted
    await verified(running, "free")


async def test_refused_at_the_cap_with_a_readable_api_error_and_nothing_reaches_the_upstream(env):
    running, mock, sdk_env = env
    code = prelude(mock, "broke") + """
def call():
    return client.models.generate_content(model="gemini-2.5-flash", contents="hi",
        config=types.GenerateContentConfig(max_output_tokens=30000, candidate_count=100)).text
record("first", call)
record("after_halt", lambda: client.models.generate_content(model="gemini-2.5-flash", contents="hi").text)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    first = out["first"]
    assert first["raised"] == "ClientError" and first["code"] == 429 and first["status"] == "RESOURCE_EXHAUSTED", first
    governor = first["body"]["error"]["governor"]
    assert governor["cause"] == "on_budget_exhausted" and governor["session"] == "broke"
    assert first["message"].endswith(describe(governor)) and "Budget exhausted; the session ends here." in first["message"]
    info = first["body"]["error"]["details"][0]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo" and info["reason"] == "ON_BUDGET_EXHAUSTED"
    assert out["after_halt"]["code"] == 429  # the halted session refuses the next call too
    assert mock.requests == []
    record = await verified(running, "broke")
    assert record["outcome"] == "halted"


async def test_a_stream_past_the_cap_is_cut_with_an_error_event_the_sdk_raises(env):
    running, mock, sdk_env = env
    # an upstream that ignores the limit and reports its usage growing past the 20,000-token cap
    mock.script(B(text="y" * 4000, chunks=40, chunk_delay=0.01, input_tokens=10, output_tokens=40_000,
                  progressive_usage=True))
    code = prelude(mock, "cut") + """
def streamed():
    seen = []
    try:
        for chunk in client.models.generate_content_stream(model="gemini-2.5-flash", contents="go",
                config=types.GenerateContentConfig(max_output_tokens=1000)):
            seen.append(chunk.text or "")
    except errors.APIError as e:
        return {"raised": type(e).__name__, "code": e.code, "status": e.status, "message": e.message,
                "governor": e.details["error"]["governor"], "seen": len(seen)}
    return {"completed": True, "seen": len(seen)}
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    streamed = out["streamed"]
    assert streamed.get("code") == 429 and streamed["status"] == "RESOURCE_EXHAUSTED", streamed
    assert streamed["governor"]["cause"] == "on_budget_exhausted"
    assert 1 <= streamed["seen"] < 40
    log = mock.streams[0]
    await log.done.wait()
    assert log.disconnected and not log.completed
    assert await tokens_used(running, "cut") > 20_000 - 4096  # charged what it ran up, not nothing
    await verified(running, "cut")


async def test_vertex_plain_and_streamed(env):
    running, mock, sdk_env = env
    mock.script(B(text="from vertex", input_tokens=40, output_tokens=6),
                B(text="vertex stream", chunks=3, input_tokens=14, output_tokens=4))
    code = prelude(mock, "vertex", vertex=True) + """
def plain():
    r = client.models.generate_content(model="gemini-2.5-flash", contents="hi")
    return {"text": r.text, "total": r.usage_metadata.total_token_count}
def streamed():
    return "".join(c.text or "" for c in client.models.generate_content_stream(model="gemini-2.5-flash", contents="hi"))
record("plain", plain)
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out == {"plain": {"text": "from vertex", "total": 46}, "streamed": "vertex stream"}, out
    prefix = "/v1beta1/projects/demo/locations/us-central1/publishers/google/models/gemini-2.5-flash"
    assert [r.path for r in mock.requests] == [f"{prefix}:generateContent", f"{prefix}:streamGenerateContent?alt=sse"]
    assert mock.requests[0].headers["Authorization"] == "Bearer fake-token"
    # no output limit was named and the call draws on a cap: it went with its reservation's
    assert mock.requests[0].body["generationConfig"]["maxOutputTokens"] == 4096
    assert await tokens_used(running, "vertex") == 46 + 18
    await verified(running, "vertex")


async def test_async_client_streams_too(env):
    running, mock, sdk_env = env
    mock.script(B(text="async stream", chunks=3, input_tokens=5, output_tokens=3))
    code = prelude(mock, "aio") + """
import asyncio
async def main():
    text = ""
    async for chunk in await client.aio.models.generate_content_stream(model="gemini-2.5-flash", contents="hi"):
        text += chunk.text or ""
    return text
out["streamed"] = asyncio.run(main())
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out == {"streamed": "async stream"}
    assert await tokens_used(running, "aio") == 8


async def test_a_call_the_model_makes_to_an_undeclared_tool_is_denied_plain_and_streamed(env):
    running, mock, sdk_env = env
    mock.script(B(text="", tool_calls=(("run_shell", {"cmd": "rm -rf /"}),)),
                B(text="thinking about it", chunks=3, tool_calls=(("run_shell", {"cmd": "rm -rf /"}),)))
    code = prelude(mock, "shell-plain") + """
record("plain", lambda: client.models.generate_content(model="gemini-2.5-flash", contents="go").function_calls[0].name)
client = genai.Client(api_key="test-key", http_options=types.HttpOptions(base_url=client._api_client._http_options.base_url,
                      headers={"ADL-Session": "shell-stream"}))
def streamed():
    calls = []
    for chunk in client.models.generate_content_stream(model="gemini-2.5-flash", contents="go"):
        calls += [c.name for c in chunk.function_calls or []]
    return calls
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    for name in ("plain", "streamed"):
        refused = out[name]
        assert refused.get("code") == 403 and refused["status"] == "PERMISSION_DENIED", (name, refused)
        governor = refused["body"]["error"]["governor"]
        assert governor["cause"] == "on_governor_tool_denied" and governor["tool"] == "run_shell"
    assert len(mock.requests) == 2  # both model calls went; the calls they asked for were refused
