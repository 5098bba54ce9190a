"""The proxy's mechanics on the wire: raw HTTP/1.1 over TLS through the real proxy.

A scripted runtime makes cuts reproducible; the mock upstream speaks HTTPS with
its own CA, which the governor trusts. These tests pin what `transit` does inside
mitmproxy: a cut stream ends with a protocol-correct terminal event and correct
chunked framing, the upstream sees the disconnect before it finished, and the
client's kept-alive connection answers the next request cleanly.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from tests.proxy_harness import RawClient, scripted_env
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = "/v1/chat/completions"


env = scripted_env("transit", upstream_timeout=1.5)


@pytest.fixture(autouse=True)
def fresh(env):
    running, mock, runtime = env
    mock.reset()
    runtime.token_cap = None
    runtime.rules.clear()
    runtime.books.clear()
    yield


def chat_body(stream: bool, **extra) -> bytes:
    return orjson.dumps({"model": "gpt-test", "stream": stream, "max_tokens": 50,
                         "messages": [{"role": "user", "content": "hi"}], **extra})


def client(running, mock) -> RawClient:
    return RawClient(running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))


async def test_cut_stream_then_clean_response_on_same_connection(env):
    running, mock, runtime = env
    # 20 slow text deltas; the budget cap is crossed by the running estimate mid-way.
    mock.script(Behaviour(text="x" * 400, chunks=20, chunk_delay=0.05))
    runtime.token_cap = 120  # reservation: prompt estimate + max_tokens 50 fits; 400 chars (~100 tokens) does not
    c = await asyncio.to_thread(client, running, mock)
    try:
        await asyncio.to_thread(c.send, "POST", CHAT, chat_body(True), {"ADL-Session": "cut-1"})
        status, headers, body = await asyncio.to_thread(c.read_response)
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        events = [line for line in body.split(b"\n\n") if line]
        # whole events only, ending with the terminal: finish chunk, error, [DONE]
        assert events[-1] == b"data: [DONE]"
        error = orjson.loads(events[-2].removeprefix(b"data: "))["error"]
        assert error["governor"]["cause"] == "on_budget_exhausted"
        assert error["governor"]["session"] == "cut-1"
        finish = orjson.loads(events[-3].removeprefix(b"data: "))
        assert finish["choices"][0]["finish_reason"] == "length"
        for event in events[:-1]:
            orjson.loads(event.removeprefix(b"data: "))  # every event is complete JSON
        # the upstream saw the client go away before it finished generating
        log = mock.streams[0]
        await asyncio.wait_for(log.done.wait(), 5)
        assert log.disconnected and not log.completed and log.events_sent < log.events_planned
        # same connection, next request: a clean, correctly framed response
        runtime.token_cap = None
        runtime.books.clear()
        await asyncio.to_thread(c.send, "POST", CHAT, chat_body(False), {"ADL-Session": "cut-2"})
        status, headers, body = await asyncio.to_thread(c.read_response)
        assert status == 200
        assert orjson.loads(body)["choices"][0]["message"]["content"] == "Hello from the mock upstream."
    finally:
        c.close()
    # the cut stream's ticket and the next one were both finished, the first with the cut
    assert not runtime.open_tickets
    assert any(err and "on_budget_exhausted" in err for _, _, err in runtime.finished)


async def test_stream_passes_through_untouched_and_counts_usage(env):
    running, mock, runtime = env
    mock.default = Behaviour(text="abcdef" * 5, chunks=6, input_tokens=21, output_tokens=13, cached_tokens=4)
    c = await asyncio.to_thread(client, running, mock)
    try:
        await asyncio.to_thread(c.send, "POST", CHAT, chat_body(True), {"ADL-Session": "pass"})
        status, headers, body = await asyncio.to_thread(c.read_response)
    finally:
        c.close()
    assert status == 200
    # the governor asked for usage the client did not ask for: the extra final chunk
    sent = mock.requests[0].body
    assert sent["stream_options"] == {"include_usage": True}
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in body.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 21
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "abcdef" * 5
    await runtime.wait_for(lambda: runtime.final_usage("pass"))
    [final] = runtime.final_usage("pass")
    assert (final.input_tokens, final.output_tokens, final.cached_input_tokens) == (21, 13, 4)
    assert not runtime.open_tickets


async def test_hung_upstream_gets_a_clear_504_and_the_connection_survives(env):
    running, mock, runtime = env
    mock.script(Behaviour(hang=10))
    c = await asyncio.to_thread(client, running, mock)
    try:
        await asyncio.to_thread(c.send, "POST", CHAT, chat_body(False), {"ADL-Session": "hang"})
        status, headers, body = await asyncio.to_thread(c.read_response)
        assert status == 504
        error = orjson.loads(body)["error"]
        assert error["type"] == "upstream_timeout" and "1.5s" in error["message"]
        assert headers["x-should-retry"] == "false"
        await asyncio.to_thread(c.send, "POST", CHAT, chat_body(False), {"ADL-Session": "hang"})
        status, headers, body = await asyncio.to_thread(c.read_response)
        assert status == 200
    finally:
        c.close()
    assert not runtime.open_tickets


async def test_stalled_stream_is_cut_with_a_terminal_event(env):
    running, mock, runtime = env
    mock.script(Behaviour(chunks=6, stall_after=3, stall_for=2.5))
    c = await asyncio.to_thread(client, running, mock)
    try:
        await asyncio.to_thread(c.send, "POST", CHAT, chat_body(True), {"ADL-Session": "stall"})
        status, headers, body = await asyncio.to_thread(c.read_response)
    finally:
        c.close()
    assert status == 200
    events = [e for e in body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert "went silent" in orjson.loads(events[-2].removeprefix(b"data: "))["error"]["message"]
    await asyncio.wait_for(mock.streams[0].done.wait(), 5)
    assert mock.streams[0].disconnected


async def test_wall_clock_limit_cuts_a_stream_between_chunks(env):
    import dataclasses

    from governor.policy.steps import Action, Decision, Tick

    running, mock, runtime = env
    policy = running.chain.policy
    running.chain.policy = dataclasses.replace(policy, tick_interval=0.2)
    clock_ran_out = Decision(action=Action.HALT, cause="on_budget_exhausted",
                             details={"dimension": "wall_clock_sec", "scope": "per_session", "observed": 901,
                                      "limit": 900})
    state = {"ticks": 0}

    def tick(session, step):
        state["ticks"] += 1
        return clock_ran_out if state["ticks"] >= 3 else Decision()

    runtime.rules.append((lambda s, step: isinstance(step, Tick), tick))
    mock.script(Behaviour(chunks=40, chunk_delay=0.05))
    try:
        c = await asyncio.to_thread(client, running, mock)
        try:
            await asyncio.to_thread(c.send, "POST", CHAT, chat_body(True), {"ADL-Session": "clock"})
            status, _, body = await asyncio.to_thread(c.read_response)
        finally:
            c.close()
    finally:
        running.chain.policy = policy
    events = [e for e in body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    governor = orjson.loads(events[-2].removeprefix(b"data: "))["error"]["governor"]
    assert governor["dimension"] == "wall_clock_sec" and governor["limit"] == 900
    await asyncio.wait_for(mock.streams[0].done.wait(), 5)
    assert mock.streams[0].disconnected and not mock.streams[0].completed


async def test_a_streamed_tool_call_is_held_until_admitted(env):
    from tests.proxy_harness import pause_rule

    running, mock, runtime = env
    runtime.rules.append(pause_rule(lambda s, step: type(step).__name__ == "ToolCall", "stream-ap"))
    # paced as a model streams: a body that arrives whole while mitmproxy still runs the
    # responseheaders hook is read past its end before the relay sees it, and a tool call
    # in it can then only be cut, not held (docs/reference/wire-protocols.md, known limits)
    mock.script(Behaviour(chunks=3, chunk_delay=0.1, tool_calls=(("delete_file", {"path": "/x"}),)))
    c = await asyncio.to_thread(client, running, mock)
    try:
        await asyncio.to_thread(c.send, "POST", CHAT, chat_body(True), {"ADL-Session": "held"})
        reading = asyncio.ensure_future(asyncio.to_thread(c.read_response))
        await runtime.wait_for(lambda: "stream-ap" in runtime.pending)
        await asyncio.wait_for(mock.streams[0].done.wait(), 5)
        await asyncio.sleep(0.3)
        assert mock.streams[0].completed  # the upstream is done...
        assert not reading.done()  # ...but the client has not seen the end: the tool call awaits review
        runtime.resolve("stream-ap", True)
        status, _, body = await reading
        assert status == 200 and body.endswith(b"data: [DONE]\n\n") and b"delete_file" in body
        # rejected: the held stream ends with the refusal instead
        runtime.rules[0] = pause_rule(lambda s, step: type(step).__name__ == "ToolCall", "stream-ap2")
        mock.script(Behaviour(chunks=3, chunk_delay=0.1, tool_calls=(("delete_file", {"path": "/y"}),)))
        await asyncio.to_thread(c.send, "POST", CHAT, chat_body(True), {"ADL-Session": "held"})
        reading = asyncio.ensure_future(asyncio.to_thread(c.read_response))
        await runtime.wait_for(lambda: "stream-ap2" in runtime.pending)
        runtime.resolve("stream-ap2", False)
        status, _, body = await reading
        events = [e for e in body.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        assert orjson.loads(events[-2].removeprefix(b"data: "))["error"]["governor"]["action"] == "deny"
        assert b'"finish_reason":"tool_calls"' not in body  # the clean end never reached the client
        # and the connection is still good
        await asyncio.to_thread(c.send, "POST", CHAT, chat_body(False), {"ADL-Session": "held-next"})
        status, _, _ = await asyncio.to_thread(c.read_response)
        assert status == 200
    finally:
        c.close()
