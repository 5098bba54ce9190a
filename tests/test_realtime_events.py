"""The Realtime event reader on its own (governor/adapters/realtime_events.py): what each
event becomes, pairing of admissions with responses, tool calls once per call_id, usage."""

from __future__ import annotations

import orjson
import pytest

from governor.adapters.base import AdapterConfig
from governor.adapters.realtime import RealtimeAdapter, _kind
from governor.adapters.realtime_events import RealtimeConversation, Refused
from governor.policy.steps import ToolCall


def conversation(**config) -> RealtimeConversation:
    return RealtimeConversation(AdapterConfig(**config), "gpt-realtime", None)


def event(**fields) -> bytes:
    return orjson.dumps(fields)


def test_paths():
    assert _kind("/v1/realtime") == "socket" and _kind("/openai/realtime") == "socket"
    assert _kind("/v1/realtime/client_secrets") == "mint" and _kind("/v1/realtime/sessions") == "mint"
    assert _kind("/v1/realtime/translations/client_secrets") == "mint"
    assert _kind("/v1/realtime/calls") == "calls" and _kind("/v1/realtime/calls/rtc_1/hangup") == "calls"
    assert _kind("/v1/realtime/translations") == "other"
    assert _kind("/v1/realtime_x") is None and _kind("/v1/chat/completions") is None
    adapter = RealtimeAdapter()
    assert adapter.claims("/v1/realtime") and not adapter.claims("/v1/responses")


def test_the_expected_output_comes_from_the_response_then_the_session_then_the_default():
    c = conversation(default_output_tokens=4096)
    verdict = c.client(event(type="response.create", response={"max_output_tokens": 321}), True)
    assert verdict.step.expected_output_tokens == 321
    c.client(event(type="session.update", session={"max_output_tokens": 700}), True)
    assert c.client(event(type="response.create"), True).step.expected_output_tokens == 700
    c.client(event(type="session.update", session={"max_response_output_tokens": "inf"}), True)  # beta, "inf"
    assert c.client(event(type="response.create"), True).step.expected_output_tokens == 4096
    for bad in ("lots", 0, -1, 1.5, True):
        with pytest.raises(Refused):
            c.client(event(type="response.create", response={"max_output_tokens": bad}), True)


def test_admissions_pair_with_responses_and_a_server_error_releases_its_own():
    c = conversation()
    first = c.client(event(type="response.create", event_id="mine"), True)
    c.admitted(first, ticket=1)
    second = c.client(event(type="response.create"), True)
    c.admitted(second, ticket=2)
    assert second.data["event_id"].startswith("event_governor_")  # given one, so an error can name it
    refused = c.server(event(type="error", error={"type": "invalid_request_error", "event_id": "mine"}), True)
    assert refused.release is not None and refused.release.ticket == 1
    created = c.server(event(type="response.created", response={"id": "resp_1"}), True)
    assert created.admit is None and c.responses["resp_1"].ticket == 2
    # nothing pending: a response the server started itself is a step to admit
    vad = c.server(event(type="response.created", response={"id": "resp_2"}), True)
    assert vad.admit is not None


def test_a_tool_call_is_one_step_whichever_events_carry_it():
    c = conversation()
    c.track("resp_1", c.server_started("resp_1"), ticket=1)
    call = {"type": "function_call", "name": "search_papers", "call_id": "call_1", "arguments": '{"query": "x"}'}
    args = c.server(event(type="response.function_call_arguments.done", response_id="resp_1", call_id="call_1",
                          name="search_papers", arguments='{"query": "x"}'), True)
    item = c.server(event(type="response.output_item.done", response_id="resp_1", item=call), True)
    done = c.server(event(type="response.done", response={"id": "resp_1", "output": [call], "usage": {
        "input_tokens": 10, "output_tokens": 5, "input_token_details": {"cached_tokens": 4}}}), True)
    steps = args.tool_calls + item.tool_calls + done.tool_calls
    assert steps == [ToolCall(tool="search_papers", arguments={"query": "x"}, origin="model")]
    usage = done.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.final) == (10, 5, 4, True)


def test_running_usage_past_the_reservation_and_lying_usage():
    c = conversation(bytes_per_token=4.0)
    verdict = c.client(event(type="response.create", response={"max_output_tokens": 10}), True)
    c.admitted(verdict, ticket=1)
    c.server(event(type="response.created", response={"id": "r"}), True)
    quiet = c.server(event(type="response.output_text.delta", response_id="r", delta="word " * 8), True)
    assert quiet.usage is None  # 10 tokens: within what it reserved
    loud = c.server(event(type="response.output_text.delta", response_id="r", delta="word " * 8), True)
    assert loud.usage is not None and loud.usage.output_tokens == 20 and not loud.usage.final
    done = c.server(event(type="response.done", response={"id": "r", "usage": {"input_tokens": 3,
                                                                              "output_tokens": 1}}), True)
    # the governor's count of the text relayed (16 words), not the 1 the upstream claimed; both recorded
    assert (done.usage.input_tokens, done.usage.output_tokens) == (3, 16)
    assert (done.usage.reported_output_tokens, done.usage.counted_output_tokens) == (1, 16)


def test_honest_usage_is_charged_exactly():
    c = conversation(bytes_per_token=4.0)
    c.admitted(c.client(event(type="response.create", response={"max_output_tokens": 100}), True), ticket=1)
    c.server(event(type="response.created", response={"id": "r"}), True)
    text = "The quick brown fox jumps over the lazy dog. " * 4  # 36 words, 180 bytes
    for piece in (text[:77], text[77:]):
        c.server(event(type="response.output_audio_transcript.delta", response_id="r", delta=piece), True)
    # honest: at least the words, below bytes / 4 (45)
    done = c.server(event(type="response.done", response={"id": "r", "usage": {"input_tokens": 3,
                                                                              "output_tokens": 40}}), True)
    assert (done.usage.input_tokens, done.usage.output_tokens) == (3, 40)
    assert (done.usage.reported_output_tokens, done.usage.counted_output_tokens) == (40, 36)


@pytest.mark.parametrize("content, is_text", [(b"\x00", False), (b"{", True), (b"[]", True), (b'{"type": ""}', True),
                                              (b'{"type": "response.create_v2"}', True),
                                              (b'{"type": "session.update", "session": {"tools": [1]}}', True)])
def test_unreadable_client_events_are_refused(content, is_text):
    with pytest.raises(Refused):
        conversation().client(content, is_text)


def test_unknown_server_events_pass_and_unreadable_ones_are_refused():
    c = conversation()
    assert c.server(event(type="response.output_audio_transcript.segment"), True).kind.endswith("segment")
    for content, is_text in ((b"\x01", False), (b"nope", True), (b'{"type": 1}', True)):
        with pytest.raises(Refused):
            c.server(content, is_text)


def test_a_response_without_response_done_is_charged_what_it_reserved():
    c = conversation()
    verdict = c.client(event(type="response.create", response={"max_output_tokens": 50}), True)
    response = c.admitted(verdict, ticket=1)
    report = c.unfinished(response)
    assert report.final and report.output_tokens == 50 and report.input_tokens == verdict.step.expected_input_tokens
    assert c.outstanding() == [response] and c.outstanding() == []


def test_an_input_transcription_is_a_call_of_the_session_transcription_model():
    c = conversation(bytes_per_token=4.0)
    c.client(event(type="session.update", session={"audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}}),
             True)
    tokens = c.server(event(type="conversation.item.input_audio_transcription.completed", transcript="hello there",
                            usage={"type": "tokens", "input_tokens": 30, "output_tokens": 1}), True)
    assert tokens.admit.model == "gpt-4o-transcribe" and tokens.admit.expected_output_tokens == 0
    assert (tokens.usage.input_tokens, tokens.usage.output_tokens) == (30, 2)  # at least the transcript's count
    assert (tokens.usage.reported_output_tokens, tokens.usage.counted_output_tokens) == (1, 2)
    beta = conversation()
    beta.server(event(type="session.created", session={"input_audio_transcription": {"model": "whisper-1"}}), True)
    duration = beta.server(event(type="conversation.item.input_audio_transcription.completed", transcript="x" * 40,
                                 usage={"type": "duration", "seconds": 2.5}), True)
    # billed by duration: the transcript's count (one word of 40 bytes), no token figure to hold it against
    assert duration.admit.model == "whisper-1" and duration.usage.output_tokens == 1
    assert duration.usage.counted_output_tokens is None


def test_the_adapter_opens_the_upgrade_and_refuses_the_rest():
    from governor.adapters.request_view import BadRequest, RequestView

    adapter = RealtimeAdapter()
    upgrade = {"upgrade": "websocket", "connection": "Upgrade"}
    azure = adapter.open(RequestView("GET", "x.openai.azure.com", "/openai/realtime?api-version=2025-04-01-preview"
                                     "&deployment=gpt-realtime", upgrade, b""), session="s", persona=None)
    assert azure.model == "gpt-realtime" and azure.state["kind"] == "socket"
    for method, path, headers, body, status in (
            ("GET", "/v1/realtime?model=m", {}, b"", 400),  # no upgrade
            ("GET", "/v1/realtime?model=m", upgrade, b"{}", 400),  # a body
            ("POST", "/v1/realtime/client_secrets", {}, b"{}", 403),  # not allowed by default
            ("POST", "/v1/realtime/calls", {}, b"v=0", 403),
            ("DELETE", "/v1/realtime/whatever", {}, b"", 403)):
        with pytest.raises(BadRequest) as refused:
            adapter.open(RequestView(method, "api.openai.com", path, headers, body), session="s", persona=None)
        assert refused.value.status == status, path
    allowing = RealtimeAdapter(AdapterConfig(extra={"realtime_client_secrets": "allow"}))
    minted = allowing.open(RequestView("POST", "api.openai.com", "/v1/realtime/transcription_sessions", {},
                                       b'{"input_audio_transcription": {"model": "gpt-4o-transcribe"}}'),
                           session="s", persona=None)
    assert minted.model == "gpt-4o-transcribe" and minted.state["kind"] == "mint"
    with pytest.raises(BadRequest):
        allowing.open(RequestView("GET", "api.openai.com", "/v1/realtime/sessions", {}, b""), session="s", persona=None)
