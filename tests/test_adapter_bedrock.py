"""The Bedrock adapter's parts on their own: the event-stream framing checked against
botocore's own parser (and hostile frames), model ids and families, request bodies,
answers with honest, lying and missing usage, and Bedrock's error shapes as botocore reads
them. The whole path through the proxy with boto3 is tests/test_sdk_bedrock.py."""

from __future__ import annotations

import base64
import random
import struct
import zlib

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from botocore.eventstream import EventStreamBuffer
from botocore.model import ServiceModel
from botocore.loaders import Loader
from botocore.parsers import RestJSONParser

from governor.adapters import AdapterRegistry, eventstream
from governor.adapters.base import AdapterConfig
from governor.adapters.request_view import BadRequest, RequestView
from governor.policy.steps import UsageReport
from governor.adapters.bedrock import BedrockAdapter, family_of, model_id_of
from governor.adapters.counting import count_text
from governor.adapters.shapes import normalize_path
from governor.policy.steps import Decision, ToolCall

HAIKU = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0"


def view(path: str, body: object, method: str = "POST") -> RequestView:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return RequestView(method, "bedrock-runtime.us-east-1.amazonaws.com", path, {"content-type": "application/json"},
                       content)


def opened(path: str, body: object, **extra):
    adapter = BedrockAdapter(AdapterConfig(extra=extra))
    return adapter, adapter.open(view(path, body), session="s", persona=None)


# --- the framing ---------------------------------------------------------------------------


def frames_sample() -> list[bytes]:
    return [eventstream.event("messageStart", b'{"role":"assistant"}'),
            eventstream.event("contentBlockDelta", orjson.dumps({"contentBlockIndex": 0, "delta": {"text": "h\u00e9llo"}})),
            eventstream.encode({":event-type": "metadata", ":message-type": "event"}, b""),
            eventstream.exception("throttlingException", b'{"message":"slow down"}')]


def test_frames_written_are_read_by_botocore_and_by_the_decoder_split_anywhere():
    frames = frames_sample()
    stream = b"".join(frames)
    buffer = EventStreamBuffer()
    buffer.add_data(stream)
    theirs = [(m.headers, m.payload) for m in buffer]
    assert [h[":message-type"] for h, _ in theirs] == ["event", "event", "event", "exception"]
    for cut in range(len(stream) + 1):  # two chunks, split at every byte
        decoder = eventstream.FrameDecoder()
        ours = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert [(dict(f.headers), f.payload) for f in ours] == theirs
        assert decoder.close() == 0
    decoder = eventstream.FrameDecoder()
    one_by_one = [f for i in range(len(stream)) for f in decoder.feed(stream[i:i + 1])]
    assert [(dict(f.headers), f.payload) for f in one_by_one] == theirs


def test_every_header_type_is_read():
    head = b""
    for name, kind, value in (("t", 0, b""), ("f", 1, b""), ("b", 2, b"\x05"), ("s", 3, b"\x00\x07"),
                              ("i", 4, b"\xff\xff\xff\xfe"), ("l", 5, b"\x00" * 7 + b"\x09"),
                              ("by", 6, b"\x00\x02ab"), ("ts", 8, b"\x00" * 7 + b"\x01"), ("u", 9, b"\x01" * 16)):
        head += bytes([len(name)]) + name.encode() + bytes([kind]) + value
    total = 16 + len(head)
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    frame = prelude + head
    frame += struct.pack(">I", zlib.crc32(frame))
    (decoded,) = eventstream.FrameDecoder().feed(frame)
    assert decoded.headers == {"t": True, "f": False, "b": 5, "s": 7, "i": -2, "l": 9, "by": b"ab", "ts": 1,
                               "u": int.from_bytes(b"\x01" * 16, "big")}
    buffer = EventStreamBuffer()
    buffer.add_data(frame)
    assert len(list(buffer)) == 1  # botocore reads the same frame


def _reframed(head: bytes, payload: bytes = b"", *, total: int | None = None, prelude_crc: int | None = None,
              message_crc: int | None = None) -> bytes:
    total = 16 + len(head) + len(payload) if total is None else total
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude) if prelude_crc is None else prelude_crc)
    body = prelude + head + payload
    return body + struct.pack(">I", zlib.crc32(body) if message_crc is None else message_crc)


@pytest.mark.parametrize("frame, says", [
    (_reframed(b"", b"{}", prelude_crc=1), "prelude CRC"),
    (_reframed(b"", b"{}", message_crc=1), "message CRC"),
    (_reframed(b"", total=eventstream.MAX_FRAME + 1), "exceeds the governor's limit"),
    (_reframed(b"", total=0xFFFFFFFF), "exceeds the governor's limit"),
    (_reframed(b"\x01a\x07\x00"), "out of bounds"),  # a string header whose length is cut off
    (_reframed(b"\x01a\x07\x00\x09abc"), "out of bounds"),  # a string value longer than the headers
    (_reframed(b"\x01a\x0a"), "unknown type"),
    (_reframed(b"\x00"), "name out of bounds"),
    (_reframed(b"\x01\xff\x07\x00\x00"), "not UTF-8"),
    (_reframed(b"\x01a\x07\x00\x01\xff"), "not UTF-8"),
    (_reframed(b"\x01a\x00\x01a\x01"), "repeated"),
    (struct.pack(">II", 10, 0) + struct.pack(">I", zlib.crc32(struct.pack(">II", 10, 0))) + b"\0" * 8,
     "shorter than its headers"),
    (b"data: {\"not\": \"an event stream\"}\n\n", "prelude CRC"),  # SSE where frames belong
])
def test_hostile_frames_fail_closed(frame, says):
    decoder = eventstream.FrameDecoder()
    with pytest.raises(eventstream.MalformedStream, match=says):
        for i in range(0, len(frame), 7):
            decoder.feed(frame[i:i + 7])


def test_a_frame_claiming_a_huge_length_is_refused_before_its_bytes_are_held():
    decoder = eventstream.FrameDecoder()
    head = struct.pack(">II", 1 << 31, 0)
    with pytest.raises(eventstream.MalformedStream):
        decoder.feed(head + struct.pack(">I", zlib.crc32(head)))
    assert decoder.pending <= 12


def test_an_end_inside_a_frame_is_reported_not_raised():
    frame = frames_sample()[1]
    decoder = eventstream.FrameDecoder()
    assert decoder.feed(frame[:-5]) == []
    assert decoder.close() == len(frame) - 5


def test_a_large_frame_fed_in_small_chunks_is_read_once():
    payload = orjson.dumps({"contentBlockIndex": 0, "delta": {"text": "x" * (4 * 1024 * 1024)}})
    frame = eventstream.event("contentBlockDelta", payload)
    decoder = eventstream.FrameDecoder()
    got = [f for i in range(0, len(frame), 4096) for f in decoder.feed(frame[i:i + 4096])]
    assert len(got) == 1 and got[0].payload == payload


def test_the_relay_framer_gives_whole_frames_only_however_the_bytes_are_cut():
    stream = b"".join(frames_sample() * 5)
    rng = random.Random(29)
    for _ in range(200):
        framer = eventstream.FrameFramer()
        out, i = [], 0
        while i < len(stream):
            step = rng.randint(1, 90)
            piece = framer.feed(stream[i:i + step])
            i += step
            if piece:
                out.append(piece)
                buffer = EventStreamBuffer()
                buffer.add_data(b"".join(out))
                list(buffer)  # whole frames so far: botocore reads them all
                assert not buffer._data  # nothing left half-read
        assert b"".join(out) + framer.take() == stream


# --- paths, model ids, families ------------------------------------------------------------------


@pytest.mark.parametrize("path, model_id, operation", [
    (f"{HAIKU}/converse", "anthropic.claude-3-5-haiku-20241022-v1:0", "/converse"),
    (f"{HAIKU}/Converse-Stream", "anthropic.claude-3-5-haiku-20241022-v1:0", "/converse-stream"),
    ("/model/arn%3Aaws%3Abedrock%3Aus-west-2%3A1%3Ainference-profile%2Fus.meta.llama3-1-8b-instruct-v1%3A0/invoke",
     "arn:aws:bedrock:us-west-2:1:inference-profile/us.meta.llama3-1-8b-instruct-v1:0", "/invoke"),
    ("/model/amazon.titan-text-lite-v1/./invoke-with-response-stream", "amazon.titan-text-lite-v1",
     "/invoke-with-response-stream"),
    ("/model/x%253Ay/invoke", "x%3Ay", "/invoke"),  # decoded once, as Bedrock decodes it
])
def test_model_ids_are_read_as_bedrock_routes_them(path, model_id, operation):
    assert model_id_of(normalize_path(path)) == (model_id, operation)
    assert AdapterRegistry.default().select(view(path, {})).name == "bedrock"


@pytest.mark.parametrize("model_id, family", [
    ("anthropic.claude-3-5-haiku-20241022-v1:0", "anthropic"), ("us.anthropic.claude-sonnet-4-20250514-v1:0", "anthropic"),
    ("global.anthropic.claude-haiku-4-5-20251001-v1:0", "anthropic"), ("meta.llama3-1-8b-instruct-v1:0", "llama"),
    ("eu.meta.llama3-2-3b-instruct-v1:0", "llama"), ("amazon.titan-text-express-v1", "titan"),
    ("arn:aws:bedrock:us-east-1::foundation-model/amazon.titan-text-lite-v1", "titan"),
    ("amazon.titan-embed-text-v2:0", None), ("amazon.nova-pro-v1:0", None), ("mistral.mistral-large-2402-v1:0", None),
    ("arn:aws:bedrock:us-east-1:1:provisioned-model/abc123", None), ("", None),
])
def test_families_by_model_id(model_id, family):
    assert family_of(model_id) == family


def test_selection_is_by_path_and_refuses_the_operations_it_does_not_govern():
    registry = AdapterRegistry.default()
    assert registry.select(view("/v1/chat/completions", {"model": "m", "messages": []})).name == "openai"
    for path in (f"{HAIKU}/count-tokens", f"{HAIKU}/invoke-with-bidirectional-stream", "/async-invoke",
                 "/guardrail/g1/version/1/apply"):
        adapter = registry.select(view(path, {}))
        assert adapter.name == "bedrock"
        with pytest.raises(BadRequest, match="does not govern") as refused:
            adapter.open(view(path, {}), session="s", persona=None)
        assert refused.value.status == 403
    refusal = registry.select(view(f"{HAIKU}/converse", {}, method="PUT"))
    assert refusal.status == 405  # a model endpoint reached by another method: refused, not forwarded


# --- request bodies --------------------------------------------------------------------------------


def test_bodies_of_each_family_are_read():
    converse = {"messages": [], "inferenceConfig": {"maxTokens": 300},
                "toolConfig": {"tools": [{"toolSpec": {"name": "a"}}, {"cachePoint": {"type": "default"}},
                                         {"systemTool": {"name": "b"}}]}}
    _, exchange = opened(f"{HAIKU}/converse-stream", converse)
    assert exchange.stream and exchange.state["expected_output"] == 300 and exchange.state["tools"] == ("a", "b")
    assert exchange.model == "anthropic.claude-3-5-haiku-20241022-v1:0"
    _, exchange = opened(f"{HAIKU}/invoke", {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 77,
                                             "messages": [], "tools": [{"name": "t", "input_schema": {}}]})
    assert (exchange.state["family"], exchange.state["expected_output"], exchange.state["tools"]) == ("anthropic", 77, ("t",))
    _, exchange = opened("/model/meta.llama3-8b-instruct-v1:0/invoke", {"prompt": "x", "max_gen_len": 55})
    assert exchange.state["expected_output"] == 55 and not exchange.stream
    _, exchange = opened("/model/amazon.titan-text-express-v1/invoke", {"inputText": "x"})
    assert exchange.state["expected_output"] == 4096  # no limit named: the guess, reserved
    assert exchange.state["declared_output"] == 0


@pytest.mark.parametrize("path, body, says", [
    (f"{HAIKU}/converse", {"messages": "hi"}, "'messages' must be an array"),
    (f"{HAIKU}/converse", {"messages": [], "inferenceConfig": []}, "'inferenceConfig' must be an object"),
    (f"{HAIKU}/converse", {"messages": [], "inferenceConfig": {"maxTokens": "100"}}, "'maxTokens' must be a positive"),
    (f"{HAIKU}/converse", {"messages": [], "inferenceConfig": {"maxTokens": True}}, "'maxTokens' must be a positive"),
    (f"{HAIKU}/converse", {"messages": [], "inferenceConfig": {"maxTokens": -1}}, "'maxTokens' must be a positive"),
    (f"{HAIKU}/converse", {"messages": [], "toolConfig": {"tools": [{"toolSpec": {}}]}}, "cannot name"),
    (f"{HAIKU}/converse", {"messages": [], "toolConfig": {"tools": [{"toolSpec": {"name": "a"}, "x": 1}]}}, "cannot name"),
    (f"{HAIKU}/converse", {"messages": [], "toolConfig": {"tools": {"name": "a"}}}, "must be an array"),
    (f"{HAIKU}/converse", [1, 2], "must be a JSON object"),
    (f"{HAIKU}/converse", b"\x00\x01garbage", "not valid JSON"),
    (f"{HAIKU}/invoke", {"anthropic_version": "bedrock-2023-05-31", "messages": [], "max_tokens": 1.5}, "positive"),
    (f"{HAIKU}/invoke", {"prompt": "not anthropic"}, "'messages' must be an array"),
    ("/model/meta.llama3-8b-instruct-v1:0/invoke", {"messages": []}, "'prompt' must be a string"),
    ("/model/amazon.titan-text-express-v1/invoke", {"inputText": "x", "textGenerationConfig": 5}, "must be an object"),
    ("/model/mistral.mistral-7b-instruct-v0:2/invoke", {"prompt": "x", "max_tokens": 9}, "Use Converse"),
    ("/model/amazon.titan-embed-text-v2:0/invoke-with-response-stream", {"inputText": "x"}, "Use Converse"),
    ("/model//converse", {"messages": []}, "names no model id"),
])
def test_hostile_bodies_are_refused_with_a_reason(path, body, says):
    with pytest.raises(BadRequest, match=says):
        opened(path, body)


def test_an_offered_tool_the_session_may_not_use_refuses_the_call():
    allowed = lambda session, persona: frozenset({"ok"})  # noqa: E731
    body = {"messages": [], "toolConfig": {"tools": [{"toolSpec": {"name": "ok"}}, {"toolSpec": {"name": "rm"}}]}}
    with pytest.raises(BadRequest, match="'rm'") as refused:
        opened(f"{HAIKU}/converse", body, allowed_tools=allowed)
    assert refused.value.status == 403
    adapter, exchange = opened(f"{HAIKU}/converse", {"messages": [], "toolConfig": {"tools": [
        {"toolSpec": {"name": "ok"}}]}}, allowed_tools=allowed)
    assert adapter.rewrite_request(exchange, Decision(allowed_tools=frozenset({"ok"}))) is None  # never rewritten
    with pytest.raises(RuntimeError):  # a decision that would withhold one: fail closed, never rewrite
        adapter.rewrite_request(exchange, Decision(allowed_tools=frozenset()))
    assert adapter.output_limit_fields(exchange) == ()  # no output fitting (a rewrite) for signed bodies


# --- answers ------------------------------------------------------------------------------------------


def test_plain_answers_are_charged_the_larger_of_the_figures_and_never_below_what_they_delivered():
    adapter, exchange = opened(f"{HAIKU}/converse", {"messages": [], "inferenceConfig": {"maxTokens": 900}})
    honest = {"output": {"message": {"content": [{"text": "hi there"}, {"toolUse": {"name": "t", "input": {"a": 1}}}]}},
              "usage": {"inputTokens": 12, "outputTokens": 9, "cacheReadInputTokens": 4, "cacheWriteInputTokens": 2}}
    seen = adapter.observe_response(exchange, 200, {}, orjson.dumps(honest))
    assert (seen.usage.input_tokens, seen.usage.output_tokens, seen.usage.cached_input_tokens) == (18, 9, 4)
    assert [s.tool for s in seen.steps if isinstance(s, ToolCall)] == ["t"]
    lying = {"output": {"message": {"content": [{"text": "x" * 4000}]}}, "usage": {"inputTokens": 1, "outputTokens": 1}}
    # the governor's count of the text (adapters.counting: one word of 4000 bytes, 32), not the 1 it says
    usage = adapter.observe_response(exchange, 200, {}, orjson.dumps(lying)).usage
    assert (usage.output_tokens, usage.reported_output_tokens, usage.counted_output_tokens) == (32, 1, 32)
    silent = {"output": {"message": {"content": [{"text": "y" * 400}]}}}
    usage = adapter.observe_response(exchange, 200, {}, orjson.dumps(silent)).usage
    assert usage.output_tokens == count_text("y" * 400) == 4 and usage.reported_output_tokens is None
    assert usage.input_tokens == exchange.state["expected_input"] > 0
    headers = {"x-amzn-bedrock-input-token-count": "50", "x-amzn-bedrock-output-token-count": "30"}
    assert adapter.observe_response(exchange, 200, headers, orjson.dumps(honest)).usage.output_tokens == 30
    hostile = {"usage": {"inputTokens": "12", "outputTokens": [1], "cacheReadInputTokens": True},
               "output": {"message": {"content": {"text": 5}}}}
    usage = adapter.observe_response(exchange, 200, {"x-amzn-bedrock-output-token-count": "9" * 40},
                                     orjson.dumps(hostile)).usage
    assert usage.output_tokens == 0 and usage.cached_input_tokens == 0  # nothing readable, nothing delivered
    assert adapter.observe_response(exchange, 200, {}, b"<html>not json").usage.output_tokens == 4
    assert adapter.observe_response(exchange, 503, {}, b"{}").usage is None  # nothing generated


def test_invoke_answers_of_each_family():
    adapter, exchange = opened("/model/meta.llama3-8b-instruct-v1:0/invoke", {"prompt": "x"})
    usage = adapter.observe_response(exchange, 200, {}, orjson.dumps(
        {"generation": "abcd", "prompt_token_count": 7, "generation_token_count": 3})).usage
    assert (usage.input_tokens, usage.output_tokens) == (7, 3)
    adapter, exchange = opened("/model/amazon.titan-text-express-v1/invoke", {"inputText": "x"})
    usage = adapter.observe_response(exchange, 200, {}, orjson.dumps(
        {"inputTextTokenCount": 5, "results": [{"tokenCount": 2, "outputText": "ab"}, {"tokenCount": 4}]})).usage
    assert (usage.input_tokens, usage.output_tokens) == (5, 6)
    adapter, exchange = opened(f"{HAIKU}/invoke", {"messages": [], "max_tokens": 10})
    seen = adapter.observe_response(exchange, 200, {}, orjson.dumps(
        {"content": [{"type": "tool_use", "name": "t", "input": {}}],
         "usage": {"input_tokens": 3, "output_tokens": 8, "cache_read_input_tokens": 10}}))
    assert (seen.usage.input_tokens, seen.usage.output_tokens, seen.usage.cached_input_tokens) == (13, 8, 10)
    assert [s.tool for s in seen.steps] == ["t"]


def _chunk(data: dict) -> bytes:
    return eventstream.event("chunk", orjson.dumps({"bytes": base64.b64encode(orjson.dumps(data)).decode(), "p": "ab"}))


def _watch(adapter, exchange, frames: list[bytes]) -> list:
    watcher = adapter.stream_watcher(exchange, 200, {"content-type": eventstream.CONTENT_TYPE})
    stream = b"".join(frames)
    events = []
    for i in range(0, len(stream), 11):
        events += watcher.feed(stream[i:i + 11])
    return events + watcher.close()


def test_converse_stream_usage_and_tool_calls_and_a_lying_metadata_event():
    adapter, exchange = opened(f"{HAIKU}/converse-stream", {"messages": [], "inferenceConfig": {"maxTokens": 100}})
    frames = [eventstream.event("messageStart", b'{"role":"assistant"}'),
              eventstream.event("contentBlockDelta", orjson.dumps({"contentBlockIndex": 0, "delta": {"text": "z" * 800}})),
              eventstream.event("contentBlockStart", orjson.dumps({"contentBlockIndex": 1, "start": {"toolUse": {"name": "t"}}})),
              eventstream.event("contentBlockDelta", orjson.dumps({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{\"q\":"}}})),
              eventstream.event("contentBlockDelta", orjson.dumps({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "1}"}}})),
              eventstream.event("contentBlockStop", b'{"contentBlockIndex":1}'),
              eventstream.exception("throttlingException", b'{"message":"upstream says no"}'),  # relayed, not read
              eventstream.event("metadata", orjson.dumps({"usage": {"inputTokens": 9, "outputTokens": 2}}))]
    events = _watch(adapter, exchange, frames)
    assert [(e.tool, dict(e.arguments)) for e in events if isinstance(e, ToolCall)] == [("t", {"q": 1})]
    final = events[-1]
    assert isinstance(final, UsageReport) and final.final
    # the lie (2) is not believed: the governor's count of the text, the tool's name and its arguments
    counted = count_text("z" * 800 + "t" + '{"q":1}')
    assert final.input_tokens == 9 and final.output_tokens == final.counted_output_tokens == counted
    assert final.reported_output_tokens == 2
    running = [e for e in events if isinstance(e, UsageReport) and not e.final]
    assert running and running[0].output_tokens > 100  # past the reservation: reported before the end


@pytest.mark.parametrize("path, body, chunks, expected", [
    (f"{HAIKU}/invoke-with-response-stream", {"messages": [], "max_tokens": 50}, [
        {"type": "message_start", "message": {"usage": {"input_tokens": 21, "output_tokens": 1}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello"}},
        {"type": "message_delta", "usage": {"output_tokens": 6}},
        {"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 21, "outputTokenCount": 6}}],
     (21, 6)),
    ("/model/meta.llama3-8b-instruct-v1:0/invoke-with-response-stream", {"prompt": "x", "max_gen_len": 50}, [
        {"generation": "ab", "prompt_token_count": 11, "generation_token_count": 1},
        {"generation": "cd", "prompt_token_count": None, "generation_token_count": 2},
        {"generation": "", "generation_token_count": 3, "stop_reason": "stop",
         "amazon-bedrock-invocationMetrics": {"inputTokenCount": 11, "outputTokenCount": 3}}], (11, 3)),
    ("/model/amazon.titan-text-express-v1/invoke-with-response-stream", {"inputText": "x"}, [
        {"outputText": "abc", "inputTextTokenCount": 4, "totalOutputTextTokenCount": 1},
        {"outputText": "", "totalOutputTextTokenCount": 5, "completionReason": "FINISH"}], (4, 5)),
    ("/model/amazon.titan-text-express-v1/invoke-with-response-stream", {"inputText": "x"}, [
        {"outputText": "q" * 4000}], None),  # no usage at all: the estimate and the reserved input
])
def test_invoke_streams_of_each_family(path, body, chunks, expected):
    adapter, exchange = opened(path, body)
    final = _watch(adapter, exchange, [_chunk(c) for c in chunks])[-1]
    if expected is None:
        assert (final.input_tokens, final.output_tokens) == (exchange.state["expected_input"], 1000)
    else:
        assert (final.input_tokens, final.output_tokens) == expected


def test_hostile_chunks_are_skipped_not_crashed_on():
    adapter, exchange = opened("/model/meta.llama3-8b-instruct-v1:0/invoke-with-response-stream", {"prompt": "x"})
    frames = [eventstream.event("chunk", b'{"bytes": "!!! not base64"}'),
              eventstream.event("chunk", b'{"bytes": 12}'),
              eventstream.event("chunk", b"not json"),
              eventstream.event("chunk", orjson.dumps({"bytes": base64.b64encode(b"[1,2]").decode()})),
              _chunk({"generation": ["x"], "prompt_token_count": "7", "generation_token_count": -5,
                      "amazon-bedrock-invocationMetrics": [1]}),
              eventstream.event("other", b"{}")]
    final = _watch(adapter, exchange, frames)[-1]
    # nothing readable was reported; what was relayed (a list where text belongs: 5 bytes) is counted
    assert final.output_tokens == 2 and final.input_tokens == exchange.state["expected_input"]


def test_a_stream_the_governor_did_not_ask_for_is_not_watched():
    adapter, exchange = opened(f"{HAIKU}/converse-stream", {"messages": []})
    assert adapter.stream_watcher(exchange, 200, {"content-type": "application/json"}) is None
    assert adapter.stream_watcher(exchange, 400, {"content-type": eventstream.CONTENT_TYPE}) is None
    usage = adapter.observe_response(exchange, 200, {"content-type": "application/json"}, b'{"a":"' + b"x" * 398 + b'"}')
    assert usage.usage.output_tokens == 102  # what it delivered instead (406 bytes), counted


# --- what boto3 makes of the governor's bytes -----------------------------------------------------


@pytest.fixture(scope="module")
def bedrock_model():
    loader = Loader()
    return ServiceModel(loader.load_service_model("bedrock-runtime", "service-2"), "bedrock-runtime")


@pytest.mark.parametrize("status, code, sent", [(429, "ServiceQuotaExceededException", 400),
                                                (403, "AccessDeniedException", 403), (400, "ValidationException", 400),
                                                (503, "ServiceUnavailableException", 503),
                                                (413, "ValidationException", 400)])
def test_errors_are_bedrock_errors_botocore_reads(bedrock_model, status, code, sent):
    adapter, exchange = opened(f"{HAIKU}/converse", {"messages": [], "inferenceConfig": {"maxTokens": 64}})
    gov = {"cause": "on_budget_exhausted" if status == 429 else None, "action": "halt", "limit": 10}
    reply = adapter.error_response(status, "governor: the reason", gov, exchange)
    assert reply.status == sent
    headers = {name.lower(): value for name, value in reply.headers.items()}  # as urllib3's headers answer
    parsed = RestJSONParser().parse({"status_code": reply.status, "headers": headers, "body": reply.body},
                                    bedrock_model.operation_model("Converse").output_shape)
    assert parsed["Error"]["Code"] == code
    assert parsed["Error"]["Message"].startswith("governor: the reason")
    if status == 429:  # a declared limit that did not fit: the message says why it was not lowered
        assert "signed" in parsed["Error"]["Message"] and "lower it" in parsed["Error"]["Message"]


def test_a_call_naming_no_limit_is_told_to_name_one():
    adapter, exchange = opened(f"{HAIKU}/converse", {"messages": []})
    reply = adapter.error_response(429, "governor: over", {"cause": "on_budget_exhausted", "limit": 10}, exchange)
    message = orjson.loads(reply.body)["message"]
    assert "names no output limit, so 4096 tokens were reserved" in message and "name one" in message
    after_halt = adapter.error_response(429, "governor: halted", {"cause": "on_budget_exhausted"}, exchange)
    assert orjson.loads(after_halt.body)["message"] == "governor: halted"


@pytest.mark.parametrize("cause, code", [("on_budget_exhausted", "throttlingException"),
                                         ("on_iteration_limit", "throttlingException"),
                                         (None, "modelStreamErrorException")])
def test_the_terminal_frame_is_an_exception_boto3_raises(bedrock_model, cause, code):
    from botocore.eventstream import EventStream, EventStreamError
    from botocore.parsers import EventStreamJSONParser

    adapter, exchange = opened(f"{HAIKU}/converse-stream", {"messages": []})
    watcher = adapter.stream_watcher(exchange, 200, {"content-type": eventstream.CONTENT_TYPE})
    body = eventstream.event("messageStart", b'{"role":"assistant"}') + watcher.terminal("governor: cut", {"cause": cause})

    class Raw:
        def stream(self):
            yield body

    output = bedrock_model.operation_model("ConverseStream").output_shape.members["stream"]
    stream = EventStream(Raw(), output, EventStreamJSONParser(), "ConverseStream")
    seen = []
    with pytest.raises(EventStreamError) as raised:
        for event in stream:
            seen.append(event)
    assert seen == [{"messageStart": {"role": "assistant"}}]
    assert raised.value.response["Error"] == {"Code": code, "Message": "governor: cut"}


def test_fallbacks_are_answers_boto3_parses(bedrock_model):
    decision = Decision(fallback_message="the declared fallback")
    for path, body in ((f"{HAIKU}/converse", {"messages": []}), (f"{HAIKU}/converse-stream", {"messages": []}),
                       (f"{HAIKU}/invoke", {"messages": []}),
                       ("/model/meta.llama3-8b-instruct-v1:0/invoke-with-response-stream", {"prompt": "x"}),
                       (f"{HAIKU}/invoke-with-response-stream", {"messages": []})):
        adapter, exchange = opened(path, body)
        reply = adapter.fallback_response(exchange, decision, {"cause": "on_iteration_limit"})
        assert reply.status == 200
        if exchange.stream:
            buffer = EventStreamBuffer()
            buffer.add_data(reply.body)
            messages = list(buffer)
            assert messages and all(m.headers[":message-type"] == "event" for m in messages)
            text = b"".join(m.payload for m in messages)
            if b'"bytes"' in text:
                text = b"".join(base64.b64decode(orjson.loads(m.payload)["bytes"]) for m in messages)
            assert b"the declared fallback" in text
        else:
            assert b"the declared fallback" in reply.body


STREAM_PATHS = (f"{HAIKU}/converse-stream", f"{HAIKU}/invoke-with-response-stream",
                "/model/meta.llama3-8b-instruct-v1:0/invoke-with-response-stream",
                "/model/amazon.titan-text-express-v1/invoke-with-response-stream")
JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=20),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                       max_leaves=12)
EVENT_TYPES = st.sampled_from(["chunk", "metadata", "contentBlockDelta", "contentBlockStart", "contentBlockStop",
                               "messageStop", "x"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(EVENT_TYPES, JSONISH, st.booleans()), max_size=8), st.lists(st.integers(0, 4000), max_size=8),
       st.integers(-1, 3000), st.sampled_from(STREAM_PATHS))
def test_any_event_stream_in_any_chunking_is_read_or_refused_as_malformed(events, cuts, flip, path):
    """Arbitrary event payloads (and, for the chunk events, arbitrary decoded bytes), cut
    anywhere, a byte flipped somewhere: the watcher reports steps and usage, or raises
    MalformedStream (the relay cuts the stream), nothing else."""
    frames = []
    for kind, value, wrap in events:
        payload = orjson.dumps({"bytes": base64.b64encode(orjson.dumps(value)).decode()} if wrap else value)
        frames.append(eventstream.event(kind, payload))
    stream = bytearray(b"".join(frames))
    if 0 <= flip < len(stream):
        stream[flip] ^= 0x40
    adapter, exchange = opened(path, {"messages": [], "prompt": "x", "inputText": "x"})
    watcher = adapter.stream_watcher(exchange, 200, {"content-type": eventstream.CONTENT_TYPE})
    points = sorted({c for c in cuts if c < len(stream)} | {0, len(stream)})
    out = []
    try:
        for start, end in zip(points, points[1:]):
            out += watcher.feed(bytes(stream[start:end]))
    except eventstream.MalformedStream:
        assert 0 <= flip < len(stream)  # only the flipped byte can make it malformed
        return
    out += watcher.close()
    assert isinstance(out[-1], UsageReport) and out[-1].final
    assert all(isinstance(e, (UsageReport, ToolCall)) for e in out)
