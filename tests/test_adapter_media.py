"""The media and free-call adapters on their own: selection by path, what each request is
reserved as, what each answer is charged, and bodies that are refused (wrong types, hostile
forms)."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from governor.adapters import AdapterRegistry, Refusal, media_charges
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.forms import FormError, read_form
from governor.adapters.free_calls import AnthropicCountAdapter, OpenAIFreeAdapter
from governor.adapters.openai_media import OpenAIMediaAdapter

MEDIA = OpenAIMediaAdapter()
REGISTRY = AdapterRegistry.default()


def view(path: str, body: bytes, content_type: str = "application/json", method: str = "POST") -> RequestView:
    return RequestView(method, "api.openai.com", path, {"content-type": content_type}, body)


def json_view(path: str, body: dict) -> RequestView:
    return view(path, orjson.dumps(body))


def multipart(fields: dict, files: dict) -> RequestView:
    request = httpx.Request("POST", "https://api.openai.com/", data=fields, files=files)
    return request.read(), request.headers["content-type"]


def opened(request: RequestView):
    exchange = MEDIA.open(request, session="s", persona=None)
    return exchange, asyncio.run(MEDIA.steps(exchange))[0]


@pytest.mark.parametrize("path,adapter", [
    ("/v1/images/generations", "openai_media"), ("/v1/images/edits", "openai_media"),
    ("/v1/images/variations", "openai_media"), ("/v1/audio/speech", "openai_media"),
    ("/v1/audio/transcriptions", "openai_media"), ("/v1/audio/translations", "openai_media"),
    ("/openai/v1//audio/../audio/speech/", "openai_media"),  # normalized like every model path
    ("/v1/moderations", "openai_free"), ("/v1/responses/input_tokens", "openai_free"),
    ("/v1/messages/count_tokens", "anthropic_count"),
    ("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"),
])
def test_each_family_is_selected_by_its_path(path, adapter):
    assert REGISTRY.select(view(path, b"{}")).name == adapter


def test_another_method_with_a_body_is_refused_and_a_bodiless_read_is_not_a_call():
    refused = REGISTRY.select(view("/v1/images/generations", b"{}", method="PUT"))
    assert isinstance(refused, Refusal) and refused.status == 405
    assert REGISTRY.select(view("/v1/moderations", b"", method="GET")) is None


def test_an_image_generation_without_a_model_is_dall_e_2_per_image():
    exchange, call = opened(json_view("/v1/images/generations", {"prompt": "x", "n": 3, "size": "512x512"}))
    assert (call.model, call.units, call.expected_input_tokens, call.expected_output_tokens) == (
        "dall-e-2", (("image/512x512/standard", 3),), 0, 0)
    _, call = opened(json_view("/v1/images/generations", {"prompt": "x", "model": "dall-e-3", "quality": "auto"}))
    assert call.units == (("image/1024x1024/hd", 1),)  # `auto` reserved as the dearer quality


def test_a_gpt_image_call_reserves_tokens_by_size_quality_and_partial_images():
    _, call = opened(json_view("/v1/images/generations", {"prompt": "x", "model": "gpt-image-1", "n": 2,
                                                          "size": "1536x1024", "quality": "medium",
                                                          "stream": True, "partial_images": 3}))
    assert call.units == () and call.expected_output_tokens == 2 * (1568 + 3 * 100)
    _, auto = opened(json_view("/v1/images/generations", {"prompt": "x", "model": "gpt-image-1"}))
    assert auto.expected_output_tokens == media_charges.LARGEST_IMAGE_TOKENS
    # the size left to the provider (auto) is reserved as the dearest size of the quality asked
    _, low = opened(json_view("/v1/images/generations", {"prompt": "x", "model": "gpt-image-1", "quality": "low"}))
    assert low.expected_output_tokens == 408
    assert media_charges.image_output_tokens(None, "medium", floor=True) == 1056


@pytest.mark.parametrize("body", [
    {"prompt": "x", "n": 1.5}, {"prompt": "x", "n": "2"}, {"prompt": "x", "n": -1}, {"prompt": "x", "n": True},
    {"prompt": "x", "size": 5}, {"prompt": "x", "model": 5}, {"model": "dall-e-3"}, {"prompt": ["x"]},
])
def test_an_image_request_of_the_wrong_types_is_refused(body):
    if body.get("n") == "2":  # a JSON string count: read as the form's digits (reserved as 2)
        assert opened(json_view("/v1/images/generations", body))[1].units[0][1] == 2
        return
    with pytest.raises(BadRequest):
        MEDIA.open(json_view("/v1/images/generations", body), session="s", persona=None)


def test_speech_is_reserved_per_character_or_in_tokens():
    _, call = opened(json_view("/v1/audio/speech", {"model": "tts-1-hd", "input": "héllo", "voice": "alloy"}))
    assert call.units == (("character", 5),)
    _, call = opened(json_view("/v1/audio/speech", {"model": "gpt-4o-mini-tts", "input": "x" * 100, "speed": 0.5,
                                                    "voice": "alloy"}))
    assert call.units == () and call.expected_output_tokens == 400  # 2 a character, twice as long at half speed
    for bad in ({"model": "tts-1"}, {"model": "tts-1", "input": 3}, {"input": "x"},
                {"model": "gpt-4o-mini-tts", "input": "x", "speed": "fast"}):
        with pytest.raises(BadRequest):
            MEDIA.open(json_view("/v1/audio/speech", bad), session="s", persona=None)


def test_a_transcription_is_reserved_from_its_file_size():
    body, content_type = multipart({"model": "whisper-1"}, {"file": ("a.mp3", b"\0" * 10_001, "audio/mpeg")})
    _, call = opened(view("/v1/audio/transcriptions", body, content_type))
    assert call.units == (("audio_second", 21),)  # 10,001 bytes at 500 a second, rounded up
    body, content_type = multipart({"model": "gpt-4o-transcribe"}, {"file": ("a.mp3", b"\0" * 1000, "audio/mpeg")})
    _, call = opened(view("/v1/audio/transcriptions", body, content_type))
    assert call.units == () and call.expected_input_tokens == 2 * media_charges.AUDIO_TOKENS_PER_SECOND
    body, content_type = multipart({"model": "whisper-1"}, {"other": ("a.mp3", b"\0", "audio/mpeg")})
    with pytest.raises(BadRequest, match="exactly one audio file"):
        MEDIA.open(view("/v1/audio/transcriptions", body, content_type), session="s", persona=None)
    body, content_type = multipart({"model": "whisper-1"}, {})  # no file: httpx sends a url-encoded form
    with pytest.raises(BadRequest, match="multipart/form-data"):
        MEDIA.open(view("/v1/audio/transcriptions", body, content_type), session="s", persona=None)


def test_answers_are_charged_what_they_report_or_deliver_and_failures_nothing():
    exchange, _ = opened(json_view("/v1/images/generations", {"prompt": "x", "model": "dall-e-3", "n": 2}))
    answer = orjson.dumps({"created": 1, "data": [{"url": "u"}]})
    assert MEDIA.observe_response(exchange, 200, {}, answer).usage.units == (("image/1024x1024/standard", 1),)
    assert MEDIA.observe_response(exchange, 400, {}, b'{"error": {}}').usage is None
    assert MEDIA.observe_response(exchange, 200, {}, b"not json").usage.units == (("image/1024x1024/standard", 0),)
    body, content_type = multipart({"model": "whisper-1", "response_format": "text"},
                                   {"file": ("a.mp3", b"\0" * 5000, "audio/mpeg")})
    exchange, _ = opened(view("/v1/audio/transcriptions", body, content_type))
    assert MEDIA.observe_response(exchange, 200, {}, b"hello").usage.units == (("audio_second", 10),)  # reserved
    verbose = orjson.dumps({"text": "hi", "duration": 2.5})
    assert MEDIA.observe_response(exchange, 200, {}, verbose).usage.units == (("audio_second", 3),)
    lying = orjson.dumps({"text": "hi", "usage": {"type": "duration", "seconds": "NaN"}})
    assert MEDIA.observe_response(exchange, 200, {}, lying).usage.units == (("audio_second", 10),)


def test_free_calls_are_zero_token_model_calls_in_their_providers_error_format():
    for adapter, path, body in ((OpenAIFreeAdapter(), "/v1/moderations", {"input": "x"}),
                                (AnthropicCountAdapter(), "/v1/messages/count_tokens",
                                 {"model": "claude-x", "max_tokens": 99, "messages": []})):
        exchange = adapter.open(json_view(path, body), session="s", persona=None)
        (call,) = asyncio.run(adapter.steps(exchange))
        assert (call.expected_input_tokens, call.expected_output_tokens, call.units) == (0, 0, ())
    assert OpenAIFreeAdapter().open(json_view("/v1/moderations", {"input": "x"}), session="s",
                                    persona=None).model == "omni-moderation-latest"
    anthropic = orjson.loads(AnthropicCountAdapter().error_response(429, "no", {"cause": "c"}).body)
    assert anthropic["type"] == "error" and anthropic["error"]["type"] == "rate_limit_error"
    openai = orjson.loads(OpenAIFreeAdapter().error_response(429, "no", {"cause": "c"}).body)
    assert openai["error"]["type"] == "governor_limit_reached" and openai["error"]["governor"] == {"cause": "c"}
    with pytest.raises(BadRequest):
        AnthropicCountAdapter().open(json_view("/v1/messages/count_tokens", {"messages": []}), session="s",
                                     persona=None)


def test_forms_refuse_what_a_server_could_read_otherwise():
    ok = b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n--b--\r\n'
    assert read_form("multipart/form-data; boundary=b", ok).fields == {"model": "whisper-1"}
    repeated = b'--b\r\nContent-Disposition: form-data; name="a"\r\nContent-Disposition: form-data; name="b"\r\n\r\nx\r\n--b--\r\n'
    big_header = b'--b\r\nContent-Disposition: form-data; name="a"\r\nX-Pad: ' + b"p" * 20_000 + b"\r\n\r\nx\r\n--b--\r\n"
    for content_type, body in (("multipart/form-data; boundary=b", repeated),
                               ("multipart/form-data; boundary=b", big_header),
                               ("application/json", ok), (None, ok)):
        with pytest.raises(FormError):
            read_form(content_type, body)


def test_the_audio_floor_comes_from_the_config_file(tmp_path):
    import argparse

    from governor.cli.run import OPTIONS, UsageError, resolve

    config = tmp_path / "governor.yaml"
    args = argparse.Namespace(**{**{name: None for name in OPTIONS}, "config": str(config)})
    config.write_text("audio_bytes_per_second: 8000\n")
    settings = resolve(args, {})
    body, content_type = multipart({"model": "whisper-1"}, {"file": ("a.mp3", b"\0" * 80_000, "audio/mpeg")})
    exchange = OpenAIMediaAdapter(settings.adapters).open(view("/v1/audio/transcriptions", body, content_type),
                                                          session="s", persona=None)
    assert exchange.state["units"] == (("audio_second", 10),)
    for bad in ("0", "-5", "true", "lots"):
        config.write_text(f"audio_bytes_per_second: {bad}\n")
        with pytest.raises(UsageError, match="audio_bytes_per_second must be a positive number"):
            resolve(args, {})


def test_an_azure_deployment_names_the_model_when_the_body_does_not():
    request = json_view("/openai/deployments/my-dalle/images/generations?api-version=2025-04-01", {"prompt": "x"})
    assert OpenAIMediaAdapter().open(request, session="s", persona=None).model == "my-dalle"


@pytest.mark.parametrize("said, charged", [(40, 40), (1, 36)])  # honest: exactly; lying low: the count (36 words)
def test_a_token_billed_transcript_is_charged_at_least_its_count_plain_and_streamed(said, charged):
    from governor.adapters.sse import encode
    from governor.policy.steps import UsageReport

    text = "The quick brown fox jumps over the lazy dog. " * 4  # 36 words, 180 bytes (bytes / 4: 45)
    usage = {"type": "tokens", "input_tokens": 12, "output_tokens": said, "total_tokens": 12 + said}
    body, content_type = multipart({"model": "gpt-4o-transcribe"}, {"file": ("a.mp3", b"\0" * 1000, "audio/mpeg")})
    exchange, _ = opened(view("/v1/audio/transcriptions", body, content_type))
    plain = MEDIA.observe_response(exchange, 200, {}, orjson.dumps({"text": text, "usage": usage})).usage
    assert (plain.input_tokens, plain.output_tokens) == (12, charged)
    assert (plain.reported_output_tokens, plain.counted_output_tokens) == (said, 36)
    watcher = MEDIA.stream_watcher(exchange, 200, {"content-type": "text/event-stream"})
    events = watcher.feed(b"".join(encode({"type": "transcript.text.delta", "delta": text[i:i + 11]})
                                   for i in range(0, len(text), 11)))
    events += watcher.feed(encode({"type": "transcript.text.done", "text": text, "usage": usage}))
    events += watcher.close()
    [final] = [e for e in events if isinstance(e, UsageReport)]
    assert (final.input_tokens, final.output_tokens) == (12, charged)
    assert (final.reported_output_tokens, final.counted_output_tokens) == (said, 36)
