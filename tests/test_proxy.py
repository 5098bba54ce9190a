"""Enforcement as clients see it, over raw HTTP/1.1 + TLS through the real proxy.

Headers, refusals and fallbacks in each provider's format, pauses that hold the
request, the anti-swap header, unknown traffic, and bad input of every kind
(malformed JSON, garbage and truncated SSE, huge bodies, a failing runtime).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses

import orjson
import pytest
import pytest_asyncio

from governor.adapters import Route
from governor.passport import example_passport_path, load_passport, passport_digest
from governor.policy.steps import (
    ON_ITERATION_LIMIT,
    ON_SESSION_INTEGRITY,
    Action,
    Decision,
    ModelCall,
    PassportPresented,
    ToolCall,
)
from tests.proxy_harness import AGENT_NAMED, RawClient, fresh_scripted, pause_rule, scripted_env
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


env = scripted_env("proxy")


@pytest.fixture(autouse=True)
def fresh(env):
    with fresh_scripted(*env):
        yield


async def exchange(running, mock, path: str, body: bytes, headers: dict | None = None, *, count: int = 1):
    """Send `count` requests on one kept-alive connection; return the responses."""
    client = await asyncio.to_thread(RawClient, running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
    try:
        out = []
        for _ in range(count):
            await asyncio.to_thread(client.send, "POST", path, body, headers)
            out.append(await asyncio.to_thread(client.read_response))
        return out if count > 1 else out[0]
    finally:
        client.close()


def chat(stream: bool = False, **extra) -> bytes:
    return orjson.dumps({"model": "gpt-test", "stream": stream, "max_tokens": 40,
                         "messages": [{"role": "user", "content": "hi"}], **extra})


def message(stream: bool = False, **extra) -> bytes:
    return orjson.dumps({"model": "claude-test", "stream": stream, "max_tokens": 40,
                         "messages": [{"role": "user", "content": "hi"}], **extra})


def sse_events(body: bytes) -> list[dict]:
    return [orjson.loads(line.removeprefix(b"data: ")) for block in body.split(b"\n\n") for line in block.split(b"\n")
            if line.startswith(b"data: ") and line != b"data: [DONE]"]


# --- headers ---------------------------------------------------------------------------


async def test_adl_headers_name_session_and_persona_and_never_go_upstream(env):
    running, mock, runtime = env
    status, _, _ = await exchange(running, mock, CHAT, chat(), {
        "ADL-Session": "s-1", "ADL-Persona": "searcher", "ADL-Delegation-Depth": "1", "X-Other": "kept"})
    assert status == 200
    [call] = runtime.steps_of("s-1", ModelCall)
    assert call.persona == "searcher" and call.provider == "openai" and call.expected_output_tokens == 40
    headers = {k.lower() for k in mock.requests[0].headers}
    assert "x-other" in headers and not any(h.startswith("adl-") for h in headers)


async def test_passport_header_is_checked_against_the_pin(env):
    running, mock, runtime = env
    pin = "the-pinned-digest"
    runtime.rules.append((
        lambda s, step: isinstance(step, PassportPresented) and step.digest != pin,
        lambda s, step: Decision(action=Action.HALT, cause=ON_SESSION_INTEGRITY, fail_closed=True,
                                 details={"reason": "passport changed mid-session"}),
    ))
    document = load_passport(example_passport_path())
    encoded = base64.urlsafe_b64encode(orjson.dumps(document)).rstrip(b"=").decode()
    status, headers, body = await exchange(running, mock, CHAT, chat(), {"ADL-Session": "swap",
                                                                        "ADL-Passport": encoded})
    assert status == 403
    governor = orjson.loads(body)["error"]["governor"]
    assert governor["cause"] == ON_SESSION_INTEGRITY and governor["action"] == "halt"
    [presented] = runtime.steps_of("swap", PassportPresented)
    assert presented.digest == passport_digest(document)  # canonical bytes, whatever the encoding
    assert mock.requests == []
    # the digest form, equal to the pin, passes
    status, _, _ = await exchange(running, mock, CHAT, chat(), {"ADL-Session": "same", "ADL-Passport": f"sha256={pin}"})
    assert status == 200
    assert runtime.steps_of("same", PassportPresented)[0].digest == pin


# --- refusals and fallbacks ------------------------------------------------------------


async def test_anthropic_refusal_is_in_anthropic_format(env):
    running, mock, runtime = env
    runtime.rules.append((lambda s, step: isinstance(step, ModelCall),
                          lambda s, step: Decision(action=Action.DENY, cause="on_sub_agent_denied",
                                                   details={"persona": "ghost"})))
    status, headers, body = await exchange(running, mock, MESSAGES, message(), {"ADL-Session": "deny"})
    assert status == 403 and headers["x-should-retry"] == "false" and headers["adl-governor-action"] == "deny"
    data = orjson.loads(body)
    assert data["type"] == "error" and data["error"]["type"] == "permission_error"
    assert data["governor"] == {"cause": "on_sub_agent_denied", "action": "deny", "enforced": True, "fail_closed": False,
                                "session": "deny", "persona": "ghost"}


def _fallback(s, step):
    return Decision(action=Action.FALLBACK, cause=ON_ITERATION_LIMIT, fallback_value="Stopped here.",
                    fallback_message="Iteration limit reached")


async def test_fallback_answers_in_the_protocols_normal_shape(env):
    running, mock, runtime = env
    runtime.rules.append((lambda s, step: isinstance(step, ModelCall), _fallback))
    status, headers, body = await exchange(running, mock, CHAT, chat(), {"ADL-Session": "fb"})
    data = orjson.loads(body)
    assert status == 200 and headers["adl-governor-action"] == "fallback"
    assert data["object"] == "chat.completion" and data["choices"][0]["message"]["content"] == "Stopped here."
    assert data["governor"]["cause"] == ON_ITERATION_LIMIT
    # streamed: a complete SSE stream carrying the same text
    status, headers, body = await exchange(running, mock, CHAT, chat(stream=True), {"ADL-Session": "fb"})
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert body.endswith(b"data: [DONE]\n\n")
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in sse_events(body)) == "Stopped here."
    # Anthropic, plain and streamed
    status, _, body = await exchange(running, mock, MESSAGES, message(), {"ADL-Session": "fb"})
    assert orjson.loads(body)["content"] == [{"type": "text", "text": "Stopped here."}]
    status, _, body = await exchange(running, mock, MESSAGES, message(stream=True), {"ADL-Session": "fb"})
    events = sse_events(body)
    assert [e["type"] for e in events][0] == "message_start" and events[-1]["type"] == "message_stop"
    assert mock.requests == []


async def test_pause_holds_the_request_until_the_reviewer_answers(env):
    running, mock, runtime = env
    runtime.rules.append(pause_rule(lambda s, step: isinstance(step, ModelCall) and s == "held", "ap-1"))
    task = asyncio.ensure_future(exchange(running, mock, CHAT, chat(), {"ADL-Session": "held"}))
    await runtime.wait_for(lambda: "ap-1" in runtime.pending)
    await asyncio.sleep(0.2)
    assert not task.done() and mock.requests == []  # held, not failed, not forwarded
    runtime.resolve("ap-1", True)
    status, _, body = await task
    assert status == 200 and len(mock.requests) == 1
    # rejected: refused, the session goes on
    runtime.rules[0] = pause_rule(lambda s, step: isinstance(step, ModelCall) and s == "held2", "ap-2")
    task = asyncio.ensure_future(exchange(running, mock, CHAT, chat(), {"ADL-Session": "held2"}))
    await runtime.wait_for(lambda: "ap-2" in runtime.pending)
    runtime.resolve("ap-2", False)
    status, _, body = await task
    assert status == 403 and orjson.loads(body)["error"]["governor"]["action"] == "deny"
    assert len(mock.requests) == 1


async def test_a_tool_call_the_model_asks_for_can_be_refused(env):
    running, mock, runtime = env
    runtime.rules.append((lambda s, step: isinstance(step, ToolCall) and step.tool == "delete_file",
                          lambda s, step: Decision(action=Action.HALT, cause=ON_ITERATION_LIMIT,
                                                   details={"tool": step.tool})))
    mock.script(Behaviour(tool_calls=(("delete_file", {"path": "/etc/passwd"}),)))
    status, _, body = await exchange(running, mock, CHAT, chat(), {"ADL-Session": "tools"})
    assert status == 429
    assert orjson.loads(body)["error"]["governor"]["tool"] == "delete_file"
    [call] = runtime.steps_of("tools", ToolCall)
    assert call.target_path == "/etc/passwd" and dict(call.arguments) == {"path": "/etc/passwd"}


# --- unknown traffic -------------------------------------------------------------------


async def test_unknown_traffic_is_refused_by_default_or_forwarded_when_the_operator_opts_out(env):
    running, mock, runtime = env
    status, _, body = await exchange(running, mock, "/v1/widgets", b'{"name": "x"}', {"ADL-Session": "u"})
    error = orjson.loads(body)["error"]
    assert status == 403 and "unknown traffic" in error["governor"]["reason"]
    assert "--allow" in error["message"] and "--unknown-traffic forward" in error["message"]  # what allows it
    assert error["governor"]["refusal"] == "unknown_traffic" and mock.requests == []
    running.chain.policy = dataclasses.replace(running.chain.policy, unknown_traffic="forward")
    status, _, body = await exchange(running, mock, "/v1/widgets", b'{"name": "x"}', {"ADL-Session": "u"})
    assert status == 200 and orjson.loads(body)["path"] == "/v1/widgets"
    assert runtime.steps == []
    assert running.chain.unknown_seen["127.0.0.1"] >= 1
    assert len(mock.requests) == 1


async def test_an_ignore_route_lets_through_only_what_no_adapter_governs(env):
    running, mock, runtime = env
    running.chain.registry.routes = [Route("127.0.0.1", "/v1/chat/**", "ignore"), Route("127.0.0.1", "/x/**", "ignore")]
    # a chat path stays governed: an ignore route is an allow-list entry, not an exemption
    status, _, _ = await exchange(running, mock, CHAT, b"not even json", {"ADL-Session": "ign"})
    assert status == 400 and mock.requests == []
    status, _, _ = await exchange(running, mock, "/x/anything", b"not even json", {"ADL-Session": "ign"})
    assert status == 200  # passed through untouched: the mock parsed nothing and answered
    assert not any(s == "ign" for s, _ in runtime.steps) and len(mock.requests) == 1


# --- bad input -------------------------------------------------------------------------


async def test_malformed_json_gets_a_400_in_the_providers_format_and_is_not_forwarded(env):
    running, mock, runtime = env
    status, headers, body = await exchange(running, mock, CHAT, b'{"model": "gpt-test", "messages": [', {})
    error = orjson.loads(body)["error"]
    assert status == 400 and error["type"] == "invalid_request_error" and "not valid JSON" in error["message"]
    status, _, body = await exchange(running, mock, MESSAGES, b'{"model": "claude-test"}', {})
    data = orjson.loads(body)
    assert status == 400 and data["error"]["type"] == "invalid_request_error" and "messages" in data["error"]["message"]
    status, _, body = await exchange(running, mock, CHAT, b'[1, 2, 3]', {})
    assert status == 400
    assert mock.requests == [] and runtime.steps == []


async def test_a_compressed_body_is_governed_as_its_decoded_json(env):
    import gzip

    running, mock, runtime = env
    body = chat(model="gpt-gzipped")
    status, _, _ = await exchange(running, mock, CHAT, gzip.compress(body),
                                  {"Content-Encoding": "gzip", "ADL-Session": "gz"})
    assert status == 200
    assert [step.model for _, step in runtime.steps if isinstance(step, ModelCall)] == ["gpt-gzipped"]
    assert len(mock.requests) == 1
    status, _, body = await exchange(running, mock, CHAT, b"not gzip at all", {"Content-Encoding": "gzip"})
    assert status == 400 and "cannot be decoded" in orjson.loads(body)["error"]["message"]
    assert len(mock.requests) == 1  # the undecodable request never went upstream


async def test_a_compressed_answer_is_accounted_from_its_decoded_usage(env):
    import gzip

    running, mock, runtime = env
    mock.script(Behaviour(gzip=True, input_tokens=31, output_tokens=17))
    status, headers, body = await exchange(running, mock, CHAT, chat(), {"ADL-Session": "gz-answer"})
    assert status == 200 and headers.get("content-encoding") == "gzip"
    assert orjson.loads(gzip.decompress(body))["usage"]["completion_tokens"] == 17  # passed on as sent
    [report] = runtime.final_usage("gz-answer")
    assert (report.input_tokens, report.output_tokens) == (31, 17)


async def test_a_rewritten_request_body_is_framed_as_the_agent_framed_it(env):
    """The governor asks for stream usage (rewriting the body): with a Content-Length the
    length is the new one, with Transfer-Encoding: chunked it stays chunked."""
    running, mock, runtime = env
    for chunked in (False, True):
        mock.reset()
        client = await asyncio.to_thread(RawClient, running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
        try:
            await asyncio.to_thread(client.send, "POST", CHAT, chat(stream=True), {"ADL-Session": f"framing-{chunked}"},
                                    chunked=chunked)
            status, _, body = await asyncio.to_thread(client.read_response)
        finally:
            client.close()
        assert status == 200 and b"[DONE]" in body
        [seen] = mock.requests
        assert seen.body["stream_options"] == {"include_usage": True}  # parsed whole upstream
        lowered = {k.lower(): v for k, v in seen.headers.items()}
        assert ("transfer-encoding" in lowered) is chunked
        assert chunked or int(lowered["content-length"]) == len(orjson.dumps(seen.body))
        assert lowered.get("accept-encoding") == "identity"


async def test_huge_bodies_get_the_policys_answer_or_a_413(env):
    running, mock, runtime = env
    runtime.token_cap = 100_000
    huge = chat(messages=[{"role": "user", "content": "a" * 3_000_000}])
    status, _, body = await exchange(running, mock, CHAT, huge, {"ADL-Session": "huge"})
    assert status == 429  # ~750k estimated input tokens: the budget says no
    assert orjson.loads(body)["error"]["governor"]["cause"] == "on_budget_exhausted"
    running.chain.policy = dataclasses.replace(running.chain.policy, max_body_bytes=1_000_000)
    status, _, body = await exchange(running, mock, MESSAGES, message(messages=[{"role": "user", "content": "b" * 2_000_000}]),
                                     {"ADL-Session": "huge2"})
    assert status == 413 and orjson.loads(body)["error"]["type"] == "request_too_large"
    assert mock.requests == []


async def test_garbage_sse_from_upstream_passes_and_usage_is_still_counted(env):
    running, mock, runtime = env
    # output_tokens 6: the text ("Hello from the mock upstream.") is 6 tokens in cl100k; a lower
    # figure is an under-report the governor's own count (5 words) would raise
    mock.script(Behaviour(garbage_sse=True, chunks=6, input_tokens=9, output_tokens=6))
    status, _, body = await exchange(running, mock, CHAT, chat(stream=True), {"ADL-Session": "garbage"})
    assert status == 200 and b"not json at all" in body and body.endswith(b"data: [DONE]\n\n")
    await runtime.wait_for(lambda: runtime.final_usage("garbage"))
    [final] = runtime.final_usage("garbage")
    assert (final.input_tokens, final.output_tokens) == (9, 6)


async def test_truncated_upstream_stream_is_accounted_and_the_proxy_lives_on(env):
    running, mock, runtime = env
    mock.script(Behaviour(text="t" * 200, chunks=10, truncate_after=4))
    with pytest.raises(ConnectionError):
        await exchange(running, mock, CHAT, chat(stream=True), {"ADL-Session": "trunc"})
    await runtime.wait_for(lambda: runtime.final_usage("trunc"))
    [final] = runtime.final_usage("trunc")
    assert final.output_tokens > 0  # what came through is charged (estimated: no usage was reported)
    assert any(err for s, _, err in runtime.finished if s == "trunc")
    status, _, _ = await exchange(running, mock, CHAT, chat(), {"ADL-Session": "trunc"})
    assert status == 200


async def test_runtime_failures_fail_closed(env):
    running, mock, runtime = env
    runtime.fail_usage = True
    status, _, body = await exchange(running, mock, CHAT, chat(), {"ADL-Session": "broken"})
    assert status == 503
    assert orjson.loads(body)["error"]["governor"]["cause"] == "on_governor_error"
    mock.script(Behaviour(text="s" * 300, chunks=10, chunk_delay=0.02))
    status, _, body = await exchange(running, mock, CHAT, chat(stream=True), {"ADL-Session": "broken"})
    error = next(e["error"] for e in sse_events(body) if "error" in e)
    assert error["governor"]["cause"] == "on_governor_error" and error["governor"]["fail_closed"] is True


async def test_a_runtime_that_raises_at_admission_fails_closed(env):
    running, mock, runtime = env

    def explode(session, step):
        raise RuntimeError("policy crashed")

    runtime.rules.append((lambda s, step: isinstance(step, ModelCall), explode))
    status, headers, body = await exchange(running, mock, MESSAGES, message(), {"ADL-Session": "crash"})
    assert status == 503 and headers["x-should-retry"] == "false"
    governor = orjson.loads(body)["error"]["governor"]
    assert governor == {"cause": "on_governor_error", "action": "deny", "fail_closed": True,
                        "reason": "internal error while governing the request", "session": "crash"}
    assert mock.requests == []


# --- what a finished exchange leaves behind ----------------------------------------------
# mitmproxy's flows are reference cycles, freed by the cyclic collector only: the governor's
# per-exchange state (flight, exchange, tickets, decisions; a stream's relay and watcher) is
# taken off the flow when the exchange ends, so reference counting frees it at once (fewer
# objects for every young collection to walk). Driven through the real addon and runtime with
# mitmproxy's test flows, the collector off.


@pytest_asyncio.fixture
async def addon_on_test_flows(tmp_path):
    """(hook, runtime, forward): `governor run`'s addon chain and runtime on the bundled
    passport, session "s", the collector off; hook(name, flow) runs a hook over the chain as
    mitmproxy does; forward(body) makes a test flow for a chat completion, runs the request
    hook, checks it was forwarded, and returns the flow and a weak reference to its flight."""
    import gc
    import inspect
    import weakref

    from mitmproxy import http
    from mitmproxy.test import tflow

    from governor.proxy.flow_state import STATE_KEY
    from governor.proxy.runtime_setup import build_runtime
    from governor.proxy.server import Settings, build_chain

    settings = Settings(data_dir=tmp_path / "data", control=None, session="s", **AGENT_NAMED)
    runtime = build_runtime(settings)
    chain, peers = build_chain(settings, runtime)

    async def hook(name: str, flow) -> None:  # every addon's, in the chain's order, as mitmproxy calls them
        for call in chain.hooks(name):
            result = call(flow)
            if inspect.isawaitable(result):
                await result

    hook.chain = chain  # for the tests that reach one addon
    async def forward(body: dict):
        flow = tflow.tflow()
        flow.request = http.Request.make("POST", "https://api.openai.com/v1/chat/completions", orjson.dumps(body),
                                         {"content-type": "application/json"})
        flow.response = None
        await hook("request", flow)
        assert flow.response is None, "the model call was forwarded"
        return flow, weakref.ref(flow.metadata[STATE_KEY].flight)

    gc.disable()
    try:
        yield hook, runtime, forward
    finally:
        gc.enable()
        if peers is not None:
            await peers.close()
        await runtime.close()


async def _session_tokens(runtime) -> tuple[dict, float]:
    view = await runtime.session_view("s")
    return view, next(b["used"] for b in view["budgets"] if b["dimension"] == "tokens" and b["scope"] == "per_session")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_finished_exchange_leaves_nothing_of_the_governors_on_its_flow(addon_on_test_flows, stream):
    import weakref

    from mitmproxy import http

    from governor.proxy.flow_state import STATE_KEY
    from governor.proxy.relay import StreamRelay

    hook, runtime, forward = addon_on_test_flows
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    if stream:
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini"}
        events = [{**chunk, "choices": [{"index": 0, "delta": {"content": "hel"}, "finish_reason": None}]},
                  {**chunk, "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
                  {**chunk, "choices": [], "usage": usage}]
        writes = [b"data: " + orjson.dumps(event) + b"\n\n" for event in events] + [b"data: [DONE]\n\n"]
        answer, content_type = b"", "text/event-stream"
    else:
        answer = orjson.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": "hello"}}],
                               "usage": usage})
        writes, content_type = [], "application/json"
    flow, flight = await forward({"model": "gpt-4o-mini", "max_tokens": 50, "stream": stream,
                                  "messages": [{"role": "user", "content": "hi"}]})
    flow.response = http.Response.make(200, answer, {"content-type": content_type})
    await hook("responseheaders", flow)
    relay = flow.response.stream
    assert isinstance(relay, StreamRelay) == stream
    if stream:
        relayed = [out for data in writes for out in relay(data)] + relay(b"")
        assert b"".join(relayed) == b"".join(writes)  # delivered as it came
        relay = weakref.ref(relay)
    await hook("response", flow)
    assert flow.response.status_code == 200
    assert STATE_KEY not in flow.metadata
    if stream:
        assert flow.response.stream is True  # still a streamed response, without our relay
        assert relay() is None
    else:
        assert orjson.loads(flow.response.content)["usage"]["total_tokens"] == 11
    assert flight() is None  # freed without a collection (and with it what only it held)
    view, tokens = await _session_tokens(runtime)
    assert (view["state"], view["iterations"], view["in_flight"]) == ("active", 1, 0)
    assert tokens == 11  # settled at what the upstream reported


async def test_an_exchange_that_fails_upstream_is_released_and_leaves_nothing_on_its_flow(addon_on_test_flows):
    """The error hook (the upstream never answered): the reservation is released, the call's
    in-flight slot freed, and the flight taken off the flow and freed without a collection."""
    from mitmproxy import flow as mitmflow

    from governor.proxy.flow_state import STATE_KEY

    hook, runtime, forward = addon_on_test_flows
    flow, flight = await forward({"model": "gpt-4o-mini", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]})
    view, tokens = await _session_tokens(runtime)
    assert tokens > 0 and view["in_flight"] == 1  # held while the call is out
    flow.error = mitmflow.Error("connection reset by upstream")
    await hook("error", flow)
    assert STATE_KEY not in flow.metadata
    assert flight() is None
    view, tokens = await _session_tokens(runtime)
    assert (view["iterations"], view["in_flight"], tokens) == (1, 0, 0)  # released: it was never consumption


@pytest.mark.parametrize("url,body,status", [
    ("https://api.openai.com/v1/chat/completions", b'{"model": "gpt-4o-mini", "messages": [', 400),  # refused
    ("https://unknown.example/v1/things", b'{"a": 1}', 403),  # no adapter's: refused (default deny)
], ids=["refused", "unclaimed"])
async def test_a_flow_the_governor_does_not_forward_as_governed_keeps_nothing_of_ours(addon_on_test_flows, url,
                                                                                      body, status):
    """A refused request or one no adapter claims carries no FlowState past the request hooks
    (it held the request as the agent sent it, body parsed, until the cyclic collector ran)."""
    from mitmproxy import http
    from mitmproxy.test import tflow

    from governor.proxy.flow_state import STATE_KEY

    hook, _, _ = addon_on_test_flows
    flow = tflow.tflow()
    flow.request = http.Request.make("POST", url, body, {"content-type": "application/json"})
    flow.response = None
    await hook("request", flow)
    assert (flow.response.status_code if flow.response is not None else None) == status
    assert STATE_KEY not in flow.metadata


async def test_a_cancelled_response_hook_still_ends_the_exchange(addon_on_test_flows):
    """mitmproxy calls no addon after one whose hook was cancelled (a stop while an answer is
    read): the answers' addon ends the exchange itself, so its reservation is released."""
    import asyncio

    from mitmproxy import http

    from governor.proxy.answers import Answers
    from governor.proxy.flow_state import STATE_KEY

    hook, runtime, forward = addon_on_test_flows
    answers = next(addon for addon in hook.chain.members if isinstance(addon, Answers))
    reading = asyncio.Event()

    async def never_done(flow, flight):
        reading.set()
        await asyncio.Event().wait()

    answers._plain_response = never_done
    flow, flight = await forward({"model": "gpt-4o-mini", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]})
    flow.response = http.Response.make(200, b"{}", {"content-type": "application/json"})
    await hook("responseheaders", flow)
    task = asyncio.ensure_future(hook("response", flow))
    await reading.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert STATE_KEY not in flow.metadata and flight().finished  # (the cancelled task's frames still hold it)
    view, tokens = await _session_tokens(runtime)
    assert (view["in_flight"], tokens) == (0, 0)  # released, not left reserved


async def test_an_exchange_that_cannot_be_tracked_is_refused_and_released(addon_on_test_flows, monkeypatch):
    """The in-flight addon cannot watch the exchange (its ticker, the watchdog): it does not go
    upstream unwatched; it is refused (503, fail closed) and its reservation released."""
    from mitmproxy import http
    from mitmproxy.test import tflow

    from governor.proxy.in_flight import InFlight

    hook, runtime, _ = addon_on_test_flows

    def broken(self, flow, flight):
        raise RuntimeError("cannot track")

    monkeypatch.setattr(InFlight, "_track", broken)
    flow = tflow.tflow()
    flow.request = http.Request.make("POST", "https://api.openai.com/v1/chat/completions",
                                     orjson.dumps({"model": "gpt-4o-mini", "max_tokens": 50,
                                                   "messages": [{"role": "user", "content": "hi"}]}),
                                     {"content-type": "application/json"})
    flow.response = None
    await hook("request", flow)
    assert flow.response is not None and flow.response.status_code == 503
    view, tokens = await _session_tokens(runtime)
    assert (view["in_flight"], tokens) == (0, 0)
