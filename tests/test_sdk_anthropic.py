"""The official `anthropic` SDK through the real proxy (regular mode, real TLS), configured
only through its environment (HTTPS_PROXY, SSL_CERT_FILE, ANTHROPIC_BASE_URL)."""

from __future__ import annotations

import pytest

from governor.policy.steps import ModelCall, ToolCall
from tests.proxy_harness import fresh_scripted, run_python, scripted_sdk_env
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOOLS = [
    {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"name": "delete_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
]

PRELUDE = """
import json, anthropic
client = anthropic.Anthropic()
out = {}
def record(name, fn):
    try:
        out[name] = fn()
    except anthropic.APIStatusError as e:
        out[name] = {"raised": type(e).__name__, "status": e.status_code, "body": e.body}
"""


env = scripted_sdk_env("sdk-anthropic")


@pytest.fixture(autouse=True)
def fresh(env):
    with fresh_scripted(*env[:3]):
        yield


async def test_messages_plain_and_streamed_with_tools(env):
    running, mock, runtime, sdk_env = env
    runtime.allowed_tools = frozenset({"get_weather"})
    mock.script(
        Behaviour(text="checking", tool_calls=(("get_weather", {"city": "Oslo"}),), input_tokens=30,
                  output_tokens=12, cached_tokens=10),
        Behaviour(text="streamed reply", chunks=4, input_tokens=25, output_tokens=11, progressive_usage=True,
                  tool_calls=(("get_weather", {"city": "Turku"}),)),
    )
    code = PRELUDE + f"""
tools = {TOOLS!r}
def plain():
    m = client.messages.create(model="claude-test", max_tokens=64, tools=tools,
        messages=[{{"role": "user", "content": "weather?"}}], extra_headers={{"ADL-Session": "msg"}})
    use = [b for b in m.content if b.type == "tool_use"][0]
    return {{"tool": use.name, "input": use.input, "in": m.usage.input_tokens, "out": m.usage.output_tokens}}
def streamed():
    with client.messages.stream(model="claude-test", max_tokens=64, tools=tools,
            messages=[{{"role": "user", "content": "weather?"}}], extra_headers={{"ADL-Session": "msg"}}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    return {{"text": text, "out": final.usage.output_tokens, "stop": final.stop_reason}}
record("plain", plain)
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["plain"] == {"tool": "get_weather", "input": {"city": "Oslo"}, "in": 20, "out": 12}
    assert out["streamed"] == {"text": "streamed reply", "out": 11, "stop": "tool_use"}
    for request in mock.requests:
        assert [t["name"] for t in request.body["tools"]] == ["get_weather"]
    await runtime.wait_for(lambda: len(runtime.final_usage("msg")) == 2)
    # input counts cache reads (20 uncached + 10 cached); message_delta usage is cumulative:
    # several deltas in the stream, the last one (11) is the output, not their sum
    assert [(u.input_tokens, u.output_tokens, u.cached_input_tokens) for u in runtime.final_usage("msg")] == [
        (30, 12, 10), (25, 11, 0)]
    assert [c.expected_output_tokens for c in runtime.steps_of("msg", ModelCall)] == [64, 64]
    await runtime.wait_for(lambda: len(runtime.steps_of("msg", ToolCall)) == 2)
    assert [(t.tool, dict(t.arguments)) for t in runtime.steps_of("msg", ToolCall)] == [
        ("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Turku"})]


async def test_budget_exhausted_is_a_429_with_the_governor_object(env):
    running, mock, runtime, sdk_env = env
    runtime.token_cap = 50
    code = PRELUDE + """
def call():
    client.messages.create(model="claude-test", max_tokens=64,
        messages=[{"role": "user", "content": "hi"}], extra_headers={"ADL-Session": "broke"})
record("first", call)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    first = out["first"]
    assert first["raised"] == "RateLimitError" and first["status"] == 429
    assert first["body"]["type"] == "error" and first["body"]["error"]["type"] == "rate_limit_error"
    assert first["body"]["governor"]["cause"] == "on_budget_exhausted"
    assert first["body"]["governor"]["limit"] == 50
    assert mock.requests == []
    assert len(runtime.steps_of("broke", ModelCall)) == 1  # x-should-retry: false, no SDK retry


async def test_stream_cut_raises_apistatuserror_with_the_reason(env):
    running, mock, runtime, sdk_env = env
    runtime.token_cap = 150
    mock.script(Behaviour(text="z" * 1200, chunks=40, chunk_delay=0.02))
    code = PRELUDE + """
def streamed():
    seen = []
    try:
        for event in client.messages.create(model="claude-test", max_tokens=100, stream=True,
                messages=[{"role": "user", "content": "go"}], extra_headers={"ADL-Session": "cut"}):
            seen.append(event.type)
    except anthropic.APIStatusError as e:
        return {"raised": type(e).__name__, "status": e.status_code, "body": e.body, "seen": seen}
    return {"completed": True, "seen": seen}
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    streamed = out["streamed"]
    # the SDK turns `event: error` into an APIStatusError (status of the 200 stream response)
    assert streamed["raised"] == "APIStatusError" and streamed["status"] == 200
    assert streamed["body"]["type"] == "error"
    assert streamed["body"]["error"]["type"] == "rate_limit_error"
    assert streamed["body"]["governor"]["cause"] == "on_budget_exhausted"
    assert streamed["seen"][0] == "message_start" and "content_block_delta" in streamed["seen"]
    assert "message_stop" not in streamed["seen"]
    log = mock.streams[0]
    assert log.disconnected and not log.completed
    [final] = runtime.final_usage("cut")
    assert final.output_tokens > 0  # what was generated before the cut is charged (estimated)
