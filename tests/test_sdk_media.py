"""OpenAI's images, audio and moderation and Anthropic's token counting through the real proxy
on the real runtime (the bundled example passport: cost_usd 0.5 and tokens 20,000 per
session, max_iterations 12, on_budget_exhausted halt), driven by the official `openai` and
`anthropic` SDKs in a subprocess, against a mock that answers as the API reference documents
(tests/media_upstream.py). Each family is charged what its answer says it used (or what it
delivered, or what it reserved when it says nothing measurable), refused at the cap with a
readable error before the upstream sees it, and the session's signed record verifies.
"""

from __future__ import annotations

import math
import ssl

import httpx
import pytest
import pytest_asyncio

from governor.runtime.prices import price_book
from governor.adapters import media_charges
from governor.evidence import load_public_key, verify_record
from governor.policy.pricing import default_pricing_path, load_pricing
from tests import media_upstream as upstream
from tests.proxy_harness import AGENT_NAMED, run_python
from tests.restartable_governor import write_passport
from tests.upstreams import make_tls

pytestmark = pytest.mark.asyncio(loop_scope="module")

PRICES = price_book()

PRELUDE = """
import json, openai, anthropic
client = openai.OpenAI(max_retries=0)
claude = anthropic.Anthropic(max_retries=0)
out = {}
def record(name, fn):
    try:
        out[name] = fn()
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        out[name] = {"raised": type(e).__name__, "status": e.status_code, "message": str(e), "body": e.body}
def session(name):
    return {"ADL-Session": name}
"""


def no_cost_review(document: dict) -> None:
    """The example passport without its review of sessions past $0.10 and its cost baseline
    (each would hold or flag the calls here); its caps are kept."""
    oversight = document["human_oversight"]
    oversight["triggers"] = [t for t in oversight["triggers"] if not (isinstance(t, dict) and "cost_usd_over" in t["when"])]
    document["anomaly_baseline"].pop("cost_per_session_usd")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    from governor.proxy.server import Settings, serve

    tmp = tmp_path_factory.mktemp("media")
    tls = make_tls(tmp / "tls")
    mock = upstream.MediaMock(tls)
    await mock.start()
    running = await serve(Settings(listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data",
                                   passport=write_passport(tmp / "passport.json", mutate=no_cost_review),
                                   upstream_ca=tls.ca_file, tick_interval=0, **AGENT_NAMED))
    sdk_env = {"HTTPS_PROXY": running.proxy_url, "SSL_CERT_FILE": str(running.ca_file),
               "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{mock.base_url}/v1",
               "ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": mock.base_url}
    try:
        yield running, mock, sdk_env
    finally:
        await running.stop()
        await mock.stop()


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


async def used(running, session: str, dimension: str) -> float:
    view = await running.runtime.session_view(session)
    return next(b["used"] for b in view["budgets"]
                if b["dimension"] == dimension and b["scope"] == "per_session" and b["persona"] is None)


async def verified_record(running, session: str) -> dict:
    record = await running.runtime.end_session(session)
    key = load_public_key(running.settings.data_dir / "keys" / "governor-pub.pem")
    assert verify_record(record, public_key=key).ok
    return record


def unit_cost(model: str, unit: str, count: float) -> float:
    return PRICES.cost(model, 0, 0, 0, ((unit, count),))


async def test_images_are_charged_per_image_or_by_usage_and_refused_at_the_cost_cap(env):
    running, mock, sdk_env = env
    code = PRELUDE + """
png = ("in.png", b"\\x89PNG\\r\\n\\x1a\\n" + b"\\0" * 64, "image/png")
def default_model():
    r = client.images.generate(prompt="a red circle", extra_headers=session("img"))
    return [d.url for d in r.data]
def dalle3():
    r = client.images.generate(model="dall-e-3", prompt="a red circle", size="1792x1024", quality="hd",
                               extra_headers=session("img"))
    return len(r.data)
def variation():
    r = client.images.create_variation(image=png, n=2, extra_headers=session("img"))
    return len(r.data)
def edit():
    r = client.images.edit(model="gpt-image-1", image=png, prompt="add a hat", quality="high", size="1024x1024",
                           extra_headers=session("img"))
    return {"images": len(r.data), "output_tokens": r.usage.output_tokens}
def too_dear():
    return len(client.images.generate(model="dall-e-3", prompt="more", size="1792x1024", quality="hd", n=2,
                                      extra_headers=session("img")).data)
for name in ("default_model", "dalle3", "variation", "edit", "too_dear"):
    record(name, globals()[name])
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["default_model"] == ["https://images.example/0.png"]
    assert out["dalle3"] == 1 and out["variation"] == 2
    assert out["edit"] == {"images": 1, "output_tokens": upstream.IMAGE_OUTPUT_TOKENS}
    # the governor forwarded the request as sent: no model was added to it
    first = mock.requests[0]
    assert first.path == "/v1/images/generations" and "model" not in first.body
    assert mock.requests[3].body["files"] == {"image": 72}  # the edit's upload reached it whole
    expected = (unit_cost("dall-e-2", "image/1024x1024/standard", 1) + unit_cost("dall-e-3", "image/1792x1024/hd", 1)
                + unit_cost("dall-e-2", "image/1024x1024/standard", 2)
                + PRICES.cost("gpt-image-1", upstream.IMAGE_INPUT_TOKENS, upstream.IMAGE_OUTPUT_TOKENS))
    assert await used(running, "img", "cost_usd") == pytest.approx(expected)
    assert await used(running, "img", "tokens") == upstream.IMAGE_INPUT_TOKENS + upstream.IMAGE_OUTPUT_TOKENS
    refused = out["too_dear"]
    assert refused["raised"] == "RateLimitError" and refused["status"] == 429, refused
    governor = refused["body"]["governor"]
    assert governor["cause"] == "on_budget_exhausted" and governor["dimension"] == "cost_usd"
    assert "limit 0.5" in refused["message"]
    assert len(mock.requests) == 4  # the refused call never reached the upstream
    record = await verified_record(running, "img")
    assert any(e["cause"] == "on_budget_exhausted" for e in record["events"])


async def test_a_streamed_image_generation_is_charged_its_final_usage(env):
    running, mock, sdk_env = env
    code = PRELUDE + """
def streamed():
    events = list(client.images.generate(model="gpt-image-1", prompt="a red circle", stream=True, partial_images=2,
                                         quality="high", size="1024x1024", extra_headers=session("img-stream")))
    return [e.type for e in events]
def streamed_edit():
    png = ("in.png", b"\\x89PNG\\r\\n\\x1a\\n" + b"\\0" * 64, "image/png")
    events = list(client.images.edit(model="gpt-image-1", image=png, prompt="add a hat", stream=True,
                                     quality="high", size="1024x1024", extra_headers=session("img-stream")))
    return [e.type for e in events]
record("streamed", streamed)
record("streamed_edit", streamed_edit)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["streamed"] == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert out["streamed_edit"] == ["image_edit.completed"]
    assert mock.requests[1].body["fields"]["stream"] == "true"  # the edit went as a multipart form
    output = upstream.IMAGE_OUTPUT_TOKENS + 2 * media_charges.PARTIAL_IMAGE_TOKENS
    assert await used(running, "img-stream", "tokens") == 2 * upstream.IMAGE_INPUT_TOKENS + output + \
        upstream.IMAGE_OUTPUT_TOKENS
    assert await used(running, "img-stream", "cost_usd") == pytest.approx(
        PRICES.cost("gpt-image-1", upstream.IMAGE_INPUT_TOKENS, output)
        + PRICES.cost("gpt-image-1", upstream.IMAGE_INPUT_TOKENS, upstream.IMAGE_OUTPUT_TOKENS))
    await verified_record(running, "img-stream")


async def test_audio_is_charged_per_character_second_or_token_and_refused_at_the_cost_cap(env):
    running, mock, sdk_env = env
    code = PRELUDE + """
wav = ("a.wav", b"RIFF" + b"\\0" * 9996, "audio/wav")  # 10,000 bytes
big = ("big.mp3", b"\\xff\\xfb" * 1_500_000, "audio/mpeg")  # 3,000,000 bytes
def speech():
    r = client.audio.speech.create(model="tts-1", voice="alloy", input="hello world", extra_headers=session("audio"))
    return len(r.content)
def speech_sse():
    r = client.audio.speech.create(model="gpt-4o-mini-tts", voice="alloy", input="hello world",
                                   stream_format="sse", extra_headers=session("audio"))
    return r.content.count(b"data: ")
def whisper():
    r = client.audio.transcriptions.create(model="whisper-1", file=wav, extra_headers=session("audio"))
    return {"text": r.text, "seconds": r.usage.seconds}
def translation():
    return client.audio.translations.create(model="whisper-1", file=wav, extra_headers=session("audio")).text
def transcribe():
    r = client.audio.transcriptions.create(model="gpt-4o-transcribe", file=wav, extra_headers=session("audio"))
    return r.usage.total_tokens
def transcribe_streamed():
    events = list(client.audio.transcriptions.create(model="gpt-4o-transcribe", file=wav, stream=True,
                                                     extra_headers=session("audio")))
    return [e.type for e in events]
def too_long():
    return client.audio.transcriptions.create(model="whisper-1", file=big, extra_headers=session("audio")).text
for name in ("speech", "speech_sse", "whisper", "translation", "transcribe", "transcribe_streamed", "too_long"):
    record(name, globals()[name])
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["speech"] == len(upstream.MP3) and out["speech_sse"] == 2
    assert out["whisper"] == {"text": "hello there", "seconds": upstream.WHISPER_SECONDS}
    assert out["translation"] == "hello there" and out["transcribe"] == sum(upstream.TRANSCRIBE_USAGE)
    assert out["transcribe_streamed"] == ["transcript.text.delta", "transcript.text.done"]
    reserved_seconds = math.ceil(10_000 / media_charges.AUDIO_BYTES_PER_SECOND)  # the translation said nothing
    expected = (unit_cost("tts-1", "character", len("hello world"))
                + PRICES.cost("gpt-4o-mini-tts", *upstream.SPEECH_USAGE)
                + unit_cost("whisper-1", "audio_second", math.ceil(upstream.WHISPER_SECONDS))
                + unit_cost("whisper-1", "audio_second", reserved_seconds)
                + 2 * PRICES.cost("gpt-4o-transcribe", *upstream.TRANSCRIBE_USAGE))
    assert await used(running, "audio", "cost_usd") == pytest.approx(expected)
    assert await used(running, "audio", "tokens") == sum(upstream.SPEECH_USAGE) + 2 * sum(upstream.TRANSCRIBE_USAGE)
    refused = out["too_long"]  # 3 MB of audio: 6,000 seconds reserved, $0.60 > $0.50
    assert refused["raised"] == "RateLimitError" and refused["body"]["governor"]["dimension"] == "cost_usd", refused
    assert len(mock.requests) == 6
    await verified_record(running, "audio")


async def test_free_calls_count_as_iterations_and_are_refused_past_the_limit(env):
    running, mock, sdk_env = env
    code = PRELUDE + """
msgs = [{"role": "user", "content": "hi"}]
def moderation():
    return client.moderations.create(input="hello", extra_headers=session("free")).results[0].flagged
def input_tokens():
    return client.responses.input_tokens.count(model="gpt-4o-mini", input="hi", extra_headers=session("free")).input_tokens
def count():
    return claude.messages.count_tokens(model="claude-3-5-haiku-latest", messages=msgs,
                                        extra_headers=session("free")).input_tokens
def count_with_max_tokens():
    return claude.messages.count_tokens(model="claude-3-5-haiku-latest", messages=msgs, extra_body={"max_tokens": 9000},
                                        extra_headers=session("free")).input_tokens
for i in range(3):
    record(f"moderation{i}", moderation)
    record(f"input_tokens{i}", input_tokens)
    record(f"count{i}", count)
    record(f"count_max{i}", count_with_max_tokens)
record("past_the_limit", moderation)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    for i in range(3):
        assert (out[f"moderation{i}"], out[f"input_tokens{i}"], out[f"count{i}"], out[f"count_max{i}"]) == (
            False, 7, 12, 12)
    refused = out["past_the_limit"]  # the 13th: max_iterations 12, on_iteration_limit's declared fallback
    assert refused["status"] == 403 and refused["body"]["governor"]["cause"] == "on_iteration_limit", refused
    assert "on_iteration_limit" in refused["message"] and "projected 13 > limit 12" in refused["message"]
    assert len(mock.requests) == 12
    assert mock.requests[3].body["max_tokens"] == 9000  # forwarded as sent
    assert await used(running, "free", "cost_usd") == 0 and await used(running, "free", "tokens") == 0
    await verified_record(running, "free")


async def test_an_unpriced_modality_is_refused_with_how_to_price_it_and_a_halt_stops_free_calls(env):
    running, mock, sdk_env = env
    code = PRELUDE + """
msgs = [{"role": "user", "content": "hi"}]
record("unpriced", lambda: client.images.generate(model="dall-e-3", prompt="x", size="4096x4096",
                                                  extra_headers=session("halted")).created)
record("moderation", lambda: client.moderations.create(input="x", extra_headers=session("halted")).id)
record("count", lambda: claude.messages.count_tokens(model="claude-3-5-haiku-latest", messages=msgs,
                                                      extra_headers=session("halted")).input_tokens)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    unpriced = out["unpriced"]
    assert unpriced["status"] == 429 and unpriced["body"]["governor"]["reason"] == "unpriced_unit", unpriced
    assert "has no price for 'image/4096x4096/standard'" in unpriced["message"]
    assert "units: {image/4096x4096/standard: USD per unit}" in unpriced["message"]
    assert "--pricing FILE" in unpriced["message"]
    moderation, count = out["moderation"], out["count"]
    assert moderation["raised"] == "RateLimitError", moderation
    assert moderation["body"]["governor"]["halt_cause"] == "on_budget_exhausted"
    # refused in Anthropic's own error format, which the anthropic SDK reads
    assert count["raised"] == "RateLimitError" and count["body"]["type"] == "error", count
    assert count["body"]["error"]["type"] == "rate_limit_error"
    assert mock.requests == []
    await verified_record(running, "halted")


# --- hostile bodies --------------------------------------------------------------------------


def form(boundary: str, *parts: bytes) -> bytes:
    return b"".join(f"--{boundary}\r\n".encode() + part + b"\r\n" for part in parts) + f"--{boundary}--\r\n".encode()


def field(name: str, value: bytes, extra: str = "") -> bytes:
    return f'Content-Disposition: form-data; name="{name}"\r\n{extra}\r\n'.encode() + value


def upload(name: str, size: int) -> bytes:
    return (f'Content-Disposition: form-data; name="{name}"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'
            .encode() + b"\0" * size)


B = "hostile-boundary"
MP = f"multipart/form-data; boundary={B}"
HOSTILE = [
    ("no boundary", "multipart/form-data", form(B, field("model", b"whisper-1"), upload("file", 10))),
    ("boundary too long", "multipart/form-data; boundary=" + "x" * 71, b""),
    ("truncated", MP, form(B, field("model", b"whisper-1"), upload("file", 10))[:-8]),
    ("not multipart at all", MP, b"model=whisper-1"),
    ("model twice", MP, form(B, field("model", b"gpt-4o-transcribe"), field("model", b"whisper-1"),
                            upload("file", 10))),
    ("base64 part", MP, form(B, field("model", b"d2hpc3Blci0x", "Content-Transfer-Encoding: base64\r\n"),
                            upload("file", 10))),
    ("not UTF-8", MP, form(B, field("model", b"\xff\xfe"), upload("file", 10))),
    ("huge field", MP, form(B, field("model", b"whisper-1"), field("prompt", b"x" * (1024 * 1024 + 1)),
                           upload("file", 10))),
    ("too many parts", MP, form(B, field("model", b"whisper-1"), upload("file", 10),
                               *[field(f"f{i}", b"") for i in range(300)])),
    ("no file", MP, form(B, field("model", b"whisper-1"))),
    ("no name", MP, form(B, b"Content-Disposition: form-data\r\n\r\nx", upload("file", 10))),
    ("wrong count", MP, form(B, field("model", b"whisper-1"), field("n", b"-1"), upload("file", 10))),
]


@pytest.mark.parametrize("why,content_type,body", HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_a_form_the_governor_cannot_read_as_a_server_would_is_refused_and_recorded(env, why, content_type, body):
    running, mock, _ = env
    session = f"hostile-{why.replace(' ', '-')}"
    path = "/v1/images/variations" if why == "wrong count" else "/v1/audio/transcriptions"
    context = ssl.create_default_context(cafile=str(running.ca_file))
    async with httpx.AsyncClient(proxy=running.proxy_url, verify=context, trust_env=False, timeout=30) as agent:
        answer = await agent.post(f"{mock.base_url}{path}", content=body,
                                  headers={"content-type": content_type, "ADL-Session": session})
    assert answer.status_code == 400, (why, answer.status_code, answer.text)
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"], error
    assert mock.requests == []
    record = await verified_record(running, session)
    refusals = [e for e in record["events"] if e["cause"] == "on_governor_request_refused"]
    assert [e["detail"]["reason"] for e in refusals] == ["bad_request"], record["events"]


async def test_a_huge_upload_is_governed_by_its_size_not_buffered_into_a_crash(env):
    running, mock, _ = env
    body = form(B, field("model", b"whisper-1"), upload("file", 20 * 1024 * 1024))  # 20 MiB: 41,944 seconds
    context = ssl.create_default_context(cafile=str(running.ca_file))
    async with httpx.AsyncClient(proxy=running.proxy_url, verify=context, trust_env=False, timeout=60) as agent:
        answer = await agent.post(f"{mock.base_url}/v1/audio/transcriptions", content=body,
                                  headers={"content-type": MP, "ADL-Session": "huge"})
    assert answer.status_code == 429 and answer.json()["error"]["governor"]["dimension"] == "cost_usd"
    assert mock.requests == []


async def test_lying_usage_is_charged_at_least_what_was_delivered(env):
    running, mock, sdk_env = env
    mock.lie = True  # gpt-image-1 says 1 output token for a high-quality 1024x1024 image
    code = PRELUDE + """
record("image", lambda: client.images.generate(model="gpt-image-1", prompt="x", quality="high", size="1024x1024",
                                               n=1, extra_headers=session("lying")).usage.output_tokens)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["image"] == 1
    floor = media_charges.IMAGE_TOKENS["1024x1024"]["high"]
    assert await used(running, "lying", "tokens") == upstream.IMAGE_INPUT_TOKENS + floor
    await verified_record(running, "lying")
