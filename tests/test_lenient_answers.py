"""OpenAI and Anthropic answers that only a lenient JSON parser reads (issue #29): a body or
stream event with NaN, Infinity or a lone surrogate is JSON to Python's json, which the
official SDKs parse with (httpx's Response.json, json.loads of each SSE event), but not to
orjson, so the governor could not read the tool calls it carries. Such an answer is refused
as Ollama's and TGI's are (adapters.base.UnreadableAnswer): a plain answer is a 502 charged
its reservation; a stream is cut and the refusal recorded (`unreadable_answer`). What no
parser reads (garbage, `[DONE]`) is unchanged. Real proxy, real runtime, a raw loopback
upstream that sends the scripted bytes as they are.
"""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest
import pytest_asyncio

from tests.proxy_harness import real_governor
from tests.test_measured_usage import RawUpstream, send, tokens_used

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"

# a tool call the governor would have to admit, in an envelope orjson refuses
CHAT_ANSWER = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,'
               b'"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",'
               b'"function":{"name":"run_shell","arguments":"{\\"cmd\\":\\"id\\"}"}}]},"logprobs":null,'
               b'"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":NaN,"total_tokens":5}}')
MESSAGE_ANSWER = (b'{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":'
                  b'"tool_use","id":"toolu_1","name":"run_shell","input":{"cmd":"id","retries":Infinity}}],'
                  b'"stop_reason":"tool_use","usage":{"input_tokens":5,"output_tokens":9}}')
CHAT_CHUNK = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini",'
              b'"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":'
              b'{"name":"run_shell","arguments":"{}"}}]},"finish_reason":null,"logprobs":NaN}]}\n\n')
MESSAGE_EVENT = (b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":'
                 b'{"type":"tool_use","id":"toolu_1","name":"run_shell","input":{"n":NaN}}}\n\n')


def chat_body(stream: bool = False) -> dict:
    body = {"model": "gpt-4o-mini", "max_tokens": 100, "messages": [{"role": "user", "content": "hello"}]}
    return {**body, "stream": True} if stream else body


def messages_body(stream: bool = False) -> dict:
    body = {"model": "claude-haiku-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "hello"}]}
    return {**body, "stream": True} if stream else body


def refusals(running, session: str) -> list[str]:
    return [e["detail"].get("reason") for e in running.runtime.record(session)["events"]
            if e["cause"] == "on_governor_request_refused"]


def chat_chunk(text: str) -> bytes:
    return b"data: " + orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                                     "model": "gpt-4o-mini", "choices": [{"index": 0, "delta": {"content": text},
                                                                          "finish_reason": None}]}) + b"\n\n"


def message_events() -> list[bytes]:
    def event(name: str, data: dict) -> bytes:
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"
    return [event("message_start", {"message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                "model": "claude-haiku-4-5", "content": [],
                                                "usage": {"input_tokens": 5, "output_tokens": 1}}}),
            event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "hello"}}),
            event("content_block_stop", {"index": 0})]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    async with real_governor(tmp_path_factory.mktemp("lenient")) as (running, mock):
        upstream = RawUpstream(mock.tls)
        await upstream.start()
        try:
            yield running, upstream
        finally:
            await upstream.stop()


def test_the_hostile_answers_are_json_to_the_sdks_parser_and_not_to_orjson():
    for raw in (CHAT_ANSWER, MESSAGE_ANSWER, CHAT_CHUNK[6:], MESSAGE_EVENT.split(b"data: ")[1]):
        assert isinstance(json.loads(raw), dict)  # what httpx's Response.json and the SDKs' SSE decoders call
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(raw)


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("path, body, answer", [
    (CHAT, chat_body(), CHAT_ANSWER),
    (MESSAGES, messages_body(), MESSAGE_ANSWER),
    # a lone surrogate escape (Python's json reads it; orjson does not), in a Responses answer
    (RESPONSES, {"model": "gpt-4o-mini", "input": "hi", "max_output_tokens": 100},
     b'{"id":"resp_1","object":"response","status":"completed","model":"gpt-4o-mini","output":[{"type":'
     b'"function_call","id":"fc_1","call_id":"call_1","name":"run_shell","arguments":"{}","status":"completed"},'
     b'{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"\\ud800"}]}]}'),
])
async def test_a_plain_answer_only_a_lenient_parser_reads_is_refused_and_charged_its_reservation(env, path, body,
                                                                                                 answer):
    running, upstream = env
    session = f"lenient-plain-{path.rsplit('/', 1)[-1]}"
    upstream.scripts.append(("application/json", [answer]))
    status, _, reply = await send(running, upstream, path, body, session)
    assert status == 502, reply
    assert b"lenient parser" in reply and b"run_shell" not in reply
    assert await tokens_used(running, session) >= 100  # the reservation: what it used cannot be read


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("path, body, events", [
    (CHAT, chat_body(stream=True), [chat_chunk("hello"), CHAT_CHUNK, chat_chunk(" more"), b"data: [DONE]\n\n"]),
    (MESSAGES, messages_body(stream=True), [*message_events(), MESSAGE_EVENT]),
    (RESPONSES, {"model": "gpt-4o-mini", "input": "hi", "max_output_tokens": 100, "stream": True}, [
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":1,'
        b'"item_id":"m","output_index":0,"content_index":0,"delta":"hello"}\n\n',
        b'event: response.output_item.done\ndata: {"type":"response.output_item.done","sequence_number":2,'
        b'"output_index":1,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"run_shell",'
        b'"arguments":"{}","status":"completed"},"obfuscation":Infinity}\n\n']),
])
async def test_a_stream_event_only_a_lenient_parser_reads_cuts_the_stream_and_is_recorded(env, path, body, events):
    running, upstream = env
    session = f"lenient-stream-{path.rsplit('/', 1)[-1]}"
    upstream.scripts.append(("text/event-stream", events))
    status, _, reply = await send(running, upstream, path, body, session)
    assert status == 200
    assert b"hello" in reply and b"run_shell" not in reply and b"lenient parser" in reply, reply
    await asyncio.sleep(0.2)
    assert "unreadable_answer" in refusals(running, session)


@pytest.mark.asyncio(loop_scope="module")
async def test_what_no_parser_reads_is_unchanged(env):
    running, upstream = env
    upstream.scripts.append(("application/json", [b"<html>not json</html>"]))
    status, _, reply = await send(running, upstream, CHAT, chat_body(), "garbage-plain")
    assert status == 200 and reply == b"<html>not json</html>"
    upstream.scripts.append(("text/event-stream", [chat_chunk("hello"), b"data: {not json\n\n", chat_chunk(" there"),
                                                   b"data: [DONE]\n\n"]))
    status, _, reply = await send(running, upstream, CHAT, chat_body(stream=True), "garbage-stream")
    assert status == 200 and b" there" in reply and b"[DONE]" in reply
    assert "unreadable_answer" not in refusals(running, "garbage-stream")
