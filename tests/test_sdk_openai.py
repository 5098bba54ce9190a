"""The official `openai` SDK through the real proxy (regular mode, real TLS), configured
only through its environment: HTTPS_PROXY and SSL_CERT_FILE (the governor's CA).

The SDK runs in a subprocess so the environment applies exactly as it would for an
agent; the upstream is the loopback mock over HTTPS with its own CA, which the
governor trusts (ssl_verify_upstream_trusted_ca).
"""

from __future__ import annotations

import pytest

from governor.policy.steps import ModelCall, ToolCall
from tests.proxy_harness import fresh_scripted, run_python, scripted_sdk_env
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "delete_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}}}}},
]

PRELUDE = """
import json, openai
client = openai.OpenAI()
out = {}
def record(name, fn):
    try:
        out[name] = fn()
    except openai.APIStatusError as e:
        out[name] = {"raised": type(e).__name__, "status": e.status_code, "body": e.body}
    except openai.APIError as e:
        out[name] = {"raised": type(e).__name__, "message": e.message, "body": e.body}
"""


env = scripted_sdk_env("sdk-openai")


@pytest.fixture(autouse=True)
def fresh(env):
    with fresh_scripted(*env[:3]):
        yield


async def test_chat_plain_and_streamed_with_tools(env):
    running, mock, runtime, sdk_env = env
    runtime.allowed_tools = frozenset({"get_weather"})
    mock.script(
        Behaviour(tool_calls=(("get_weather", {"city": "Oslo"}),), input_tokens=31, output_tokens=17, cached_tokens=8),
        Behaviour(text="streamed answer", chunks=4, input_tokens=23, output_tokens=9,
                  tool_calls=(("get_weather", {"city": "Bergen"}),)),
    )
    code = PRELUDE + f"""
tools = {TOOLS!r}
def plain():
    r = client.chat.completions.create(model="gpt-test", max_tokens=64, tools=tools,
        messages=[{{"role": "user", "content": "weather?"}}], extra_headers={{"ADL-Session": "chat"}})
    call = r.choices[0].message.tool_calls[0]
    return {{"tool": call.function.name, "args": call.function.arguments, "usage": r.usage.total_tokens}}
def streamed():
    chunks = list(client.chat.completions.create(model="gpt-test", max_tokens=64, tools=tools, stream=True,
        messages=[{{"role": "user", "content": "weather?"}}], extra_headers={{"ADL-Session": "chat"}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    last = chunks[-1]
    return {{"text": text, "last_choices": len(last.choices), "last_usage": last.usage.total_tokens if last.usage else None}}
record("plain", plain)
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["plain"] == {"tool": "get_weather", "args": '{"city":"Oslo"}', "usage": 48}
    # the client did not ask for stream usage: it sees the extra final chunk (no choices, usage)
    assert out["streamed"] == {"text": "streamed answer", "last_choices": 0, "last_usage": 32}
    # only the allowed tool went upstream; the ADL-Session header did not
    for request in mock.requests:
        assert [t["function"]["name"] for t in request.body["tools"]] == ["get_weather"]
        assert not any(h.lower().startswith("adl-") for h in request.headers)
    assert mock.requests[1].body["stream_options"] == {"include_usage": True}
    # usage counted exactly as the upstream reported it
    await runtime.wait_for(lambda: len(runtime.final_usage("chat")) == 2)
    assert [(u.input_tokens, u.output_tokens, u.cached_input_tokens) for u in runtime.final_usage("chat")] == [
        (31, 17, 8), (23, 9, 0)]
    calls = runtime.steps_of("chat", ModelCall)
    assert [c.tools_offered for c in calls] == [("get_weather", "delete_file")] * 2
    await runtime.wait_for(lambda: len(runtime.steps_of("chat", ToolCall)) == 2)
    assert [(t.tool, dict(t.arguments)) for t in runtime.steps_of("chat", ToolCall)] == [
        ("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Bergen"})]


async def test_responses_plain_and_streamed(env):
    running, mock, runtime, sdk_env = env
    mock.script(
        Behaviour(text="resp", input_tokens=40, output_tokens=5, cached_tokens=10,
                  tool_calls=(("get_weather", {"city": "Rome"}),)),
        Behaviour(text="streamed resp", chunks=3, input_tokens=12, output_tokens=6),
    )
    code = PRELUDE + """
def plain():
    r = client.responses.create(model="gpt-test", input="hi", max_output_tokens=32,
        extra_headers={"ADL-Session": "resp"})
    calls = [i.name for i in r.output if i.type == "function_call"]
    return {"text": r.output_text, "calls": calls, "usage": r.usage.total_tokens}
def streamed():
    events = list(client.responses.create(model="gpt-test", input="hi", stream=True,
        extra_headers={"ADL-Session": "resp"}))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    return {"text": text, "last": events[-1].type}
record("plain", plain)
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["plain"] == {"text": "resp", "calls": ["get_weather"], "usage": 45}
    assert out["streamed"] == {"text": "streamed resp", "last": "response.completed"}
    await runtime.wait_for(lambda: len(runtime.final_usage("resp")) == 2)
    assert [(u.input_tokens, u.output_tokens, u.cached_input_tokens) for u in runtime.final_usage("resp")] == [
        (40, 5, 10), (12, 6, 0)]
    assert [c.expected_output_tokens for c in runtime.steps_of("resp", ModelCall)] == [32, 4096]
    assert [t.tool for t in runtime.steps_of("resp", ToolCall)] == ["get_weather"]


async def test_budget_exhausted_is_a_429_the_sdk_raises_and_does_not_retry(env):
    running, mock, runtime, sdk_env = env
    runtime.token_cap = 60  # a 64-token max_tokens call cannot be reserved
    code = PRELUDE + """
def call():
    client.chat.completions.create(model="gpt-test", max_tokens=64,
        messages=[{"role": "user", "content": "hi"}], extra_headers={"ADL-Session": "broke"})
record("first", call)
record("after_halt", call)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    first = out["first"]
    assert first["raised"] == "RateLimitError" and first["status"] == 429
    governor = first["body"]["governor"]
    assert governor["cause"] == "on_budget_exhausted"
    assert governor["action"] == "halt" and governor["session"] == "broke"
    assert governor["dimension"] == "tokens" and governor["scope"] == "per_session" and governor["limit"] == 60
    # the halted session refuses the next call with the same machine-readable reason
    assert out["after_halt"]["body"]["governor"] == governor
    assert mock.requests == []  # nothing reached the upstream
    assert len(runtime.steps_of("broke", ModelCall)) == 2  # one per call: the SDK did not retry


async def test_stream_cut_mid_way_raises_the_sdk_error_with_the_reason(env):
    running, mock, runtime, sdk_env = env
    runtime.token_cap = 200
    mock.script(Behaviour(text="y" * 1200, chunks=40, chunk_delay=0.02))
    code = PRELUDE + """
def streamed():
    seen = []
    try:
        for chunk in client.chat.completions.create(model="gpt-test", max_tokens=100, stream=True,
                messages=[{"role": "user", "content": "go"}], extra_headers={"ADL-Session": "cut"}):
            if chunk.choices:
                seen.append(chunk.choices[0].finish_reason or (chunk.choices[0].delta.content or ""))
    except openai.APIError as e:
        return {"raised": type(e).__name__, "body": e.body, "seen": len(seen), "last": seen[-1]}
    return {"completed": True, "seen": len(seen)}
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    streamed = out["streamed"]
    assert streamed["raised"] == "APIError"  # openai's documented stream error: data line carrying "error"
    assert streamed["body"]["governor"]["cause"] == "on_budget_exhausted"
    assert streamed["last"] == "length"  # the final chunk's finish_reason came before the error
    assert 1 < streamed["seen"] < 40
    log = mock.streams[0]
    assert log.disconnected and not log.completed
