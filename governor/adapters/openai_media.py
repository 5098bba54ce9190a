"""OpenAI's media endpoints: images (generations, edits, variations) and audio (speech,
transcriptions, translations), plain and streamed.

Matched on the normalized path like the OpenAI adapter (POST .../images/generations,
.../images/edits, .../images/variations, .../audio/speech, .../audio/transcriptions,
.../audio/translations). Generations and speech are JSON; edits, variations,
transcriptions and translations are multipart/form-data (governor.adapters.forms: read
within bounds, a form a server could read otherwise is refused 400); an edit sent as JSON
(image URLs or file ids) is read as JSON.

Each call is one ModelCall: counted as an iteration, reserved and charged as
governor.adapters.media_charges says (tokens for token-billed models, priced units for the
rest), settled from the answer: its `usage` when it has one, what it delivered (images
returned) otherwise, or, when the answer says nothing the governor can measure (audio
bytes, a transcript as text), what was reserved. An answer that is not a 200 is not charged.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import orjson

from governor.adapters import media_charges as charges
from governor.adapters import sse
from governor.adapters.base import SuffixAdapter, Exchange, Observation, Reply, StreamEvent, StreamWatcher
from governor.adapters.model_calls import estimate_tokens
from governor.adapters.reading import as_dict, as_list, positive_int
from governor.adapters.refusals import describe
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.counting import OutputCounter, count_text, measured
from governor.adapters.endpoints import GOVERNED, Endpoint, Probe
from governor.adapters.forms import Form, FormError, read_form
from governor.adapters.openai import ERROR_TYPES
from governor.policy.steps import Decision, ModelCall, Step, UsageReport

GENERATIONS, EDITS, VARIATIONS = "image_generations", "image_edits", "image_variations"
SPEECH, TRANSCRIPTIONS, TRANSLATIONS = "speech", "transcriptions", "translations"
_KINDS = (
    ("/images/generations", GENERATIONS), ("/images/edits", EDITS), ("/images/variations", VARIATIONS),
    ("/audio/speech", SPEECH), ("/audio/transcriptions", TRANSCRIPTIONS), ("/audio/translations", TRANSLATIONS),
)
_SUFFIXES = tuple(suffix for suffix, _ in _KINDS)
IMAGES = (GENERATIONS, EDITS, VARIATIONS)
TRANSCRIBING = (TRANSCRIPTIONS, TRANSLATIONS)
DEFAULT_IMAGE_MODEL = "dall-e-2"  # what the API uses when an image request names no model
_STREAM_FINAL = ("image_generation.completed", "image_edit.completed", "transcript.text.done", "speech.audio.done")
_PARTIALS = ("image_generation.partial_image", "image_edit.partial_image")


def _kind(route: str) -> str | None:
    if not route.endswith(_SUFFIXES):
        return None
    return next(kind for suffix, kind in _KINDS if route.endswith(suffix))


def _count(body: Mapping[str, Any], name: str) -> int:
    """A count (`n`, `partial_images`) from a JSON body (an int) or a form (digits); 0 when
    absent; a 400 for anything else, which would be reserved as something else."""
    value = body.get(name)
    if value is None:
        return 0
    if isinstance(value, str) and value.isdigit() and len(value) <= 6:
        return int(value)
    if type(value) is int and 0 <= value <= 999_999:
        return value
    shown = repr(value)
    raise BadRequest(f"'{name}' must be a non-negative integer, got {shown[:40]}")


def _text(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a string")
    return value


def _speed(body: Mapping[str, Any]) -> float | None:
    value = body.get("speed")
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise BadRequest("'speed' must be a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadRequest("'speed' must be a positive number")
    return float(value)


def _stream(body: Mapping[str, Any]) -> bool:
    value = body.get("stream")
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


class OpenAIMediaAdapter(SuffixAdapter):
    name = "openai_media"
    provider = "openai"
    suffixes = _SUFFIXES

    def _body(self, request: RequestView, kind: str) -> tuple[dict[str, Any], Form | None]:
        """The request's parameters: a JSON object, or a multipart form's text fields (and its
        files' sizes) for the endpoints that take uploads."""
        if kind in (GENERATIONS, SPEECH) or request.content_type == "application/json":
            body = request.json_object()
            return body, None
        try:
            form = read_form(request.headers.get("content-type"), request.content)
        except FormError as exc:
            raise BadRequest(str(exc)) from None
        return dict(form.fields), form

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        kind = _kind(request.match_route)
        if kind is None:
            raise BadRequest(f"not an OpenAI media call: {request.method} {request.route}")
        body, form = self._body(request, kind)
        model = body.get("model")
        if model is None:  # Azure names the deployment in the path; OpenAI's image default is dall-e-2
            parts = request.normal_route.split("/")
            lowered = [part.lower() for part in parts]
            if "deployments" in lowered[:-1]:
                model = parts[lowered.index("deployments") + 1]
            elif kind in IMAGES:
                model = DEFAULT_IMAGE_MODEL
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' is required and must be a string")
        state: dict[str, Any] = {"kind": kind, "units": ()}
        if kind in IMAGES:
            self._images(kind, model, body, form, request, state)
        elif kind == SPEECH:
            self._speech(model, body, request, state)
        else:
            self._transcription(model, body, form, request, state)
        return Exchange(adapter=self, method=request.method, host=request.host, path=request.path, body=body,
                        session=session, persona=persona, stream=state.get("stream", False), model=model,
                        state=state)

    def _images(self, kind: str, model: str, body: dict[str, Any], form: Form | None, request: RequestView,
                state: dict[str, Any]) -> None:
        prompt = _text(body, "prompt")
        if kind != VARIATIONS and prompt is None:
            raise BadRequest("'prompt' is required")
        if form is not None and not form.files_named("image", "image[]"):
            raise BadRequest("an image file is required ('image')")
        n = _count(body, "n") or 1
        size, quality = _text(body, "size"), _text(body, "quality")
        state.update(n=n, size=size, quality=quality)
        if charges.token_billed_image(model):
            partials = _count(body, "partial_images")
            images = len(form.files_named("image", "image[]", "mask")) if form is not None else \
                len(as_list(body.get("images"))) + (1 if body.get("mask") else 0)
            prompt_bytes = len(prompt.encode()) if prompt else 0
            state["expected_input"] = (estimate_tokens(prompt_bytes, self.config.bytes_per_token)
                                       + images * charges.INPUT_IMAGE_TOKENS)
            state["expected_output"] = n * (charges.image_output_tokens(size, quality)
                                            + partials * charges.PARTIAL_IMAGE_TOKENS)
            state["stream"] = _stream(body)
        else:  # priced per image (DALL-E), never streamed
            state["unit"] = charges.image_unit(model, size, quality)
            state["units"] = ((state["unit"], n),)
            state["expected_input"] = state["expected_output"] = 0

    def _speech(self, model: str, body: dict[str, Any], request: RequestView, state: dict[str, Any]) -> None:
        text = _text(body, "input")
        if text is None:
            raise BadRequest("'input' is required")
        state["sse"] = body.get("stream_format") == "sse"
        if charges.token_billed_speech(model):
            state["expected_input"] = estimate_tokens(len(request.content), self.config.bytes_per_token)
            state["expected_output"] = charges.speech_output_tokens(len(text), _speed(body))
        else:
            state["units"] = (("character", len(text)),)
            state["expected_input"] = state["expected_output"] = 0

    def _transcription(self, model: str, body: dict[str, Any], form: Form | None, request: RequestView,
                       state: dict[str, Any]) -> None:
        files = form.files_named("file") if form is not None else []
        if len(files) != 1:
            raise BadRequest("exactly one audio file is required ('file')")
        floor = self.config.extra.get("audio_bytes_per_second", charges.AUDIO_BYTES_PER_SECOND)
        seconds = charges.audio_seconds(files[0].size, floor)
        state["seconds"] = seconds
        if charges.token_billed_transcription(model):
            prompt = _text(body, "prompt") or ""
            state["expected_input"] = (seconds * charges.AUDIO_TOKENS_PER_SECOND
                                       + estimate_tokens(len(prompt.encode()), self.config.bytes_per_token))
            state["expected_output"] = self.config.default_output_tokens
            state["stream"] = _stream(body)
        else:
            state["units"] = (("audio_second", seconds),)
            state["expected_input"] = state["expected_output"] = 0

    async def steps(self, exchange: Exchange) -> list[Step]:
        state = exchange.state
        return [ModelCall(model=exchange.model, expected_input_tokens=state["expected_input"],
                          expected_output_tokens=state["expected_output"], persona=exchange.persona,
                          provider=self.provider, units=state["units"])]

    # --- answers -------------------------------------------------------------------------

    def reserved(self, exchange: Exchange, *, units: tuple[tuple[str, float], ...] | None = None,
                 input_tokens: int | None = None, output_tokens: int | None = None) -> UsageReport:
        """The call's usage as reserved (what an answer that says nothing measurable is
        charged), with any figure the answer did give in its place."""
        state = exchange.state
        return UsageReport(model=exchange.model,
                           input_tokens=state["expected_input"] if input_tokens is None else input_tokens,
                           output_tokens=state["expected_output"] if output_tokens is None else output_tokens,
                           persona=exchange.persona, units=state["units"] if units is None else units)

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        if status != 200:
            return Observation()  # the provider bills no failed call
        if "text/event-stream" in (headers.get("content-type") or ""):  # read whole (speech SSE, ...)
            watcher = MediaStreamWatcher(self, exchange)
            events = watcher.feed(body) + watcher.close()
            return Observation(usage=next((e for e in reversed(events) if isinstance(e, UsageReport)), None))
        kind = exchange.state["kind"]
        if kind == SPEECH:  # audio bytes: characters are known, tokens are not reported
            return Observation(usage=self.reserved(exchange))
        data = _object(body)
        if kind in IMAGES:
            return Observation(usage=self._images_delivered(exchange, data))
        return Observation(usage=self._transcribed(exchange, data))

    def _images_delivered(self, exchange: Exchange, data: dict[str, Any] | None) -> UsageReport:
        """Images are charged for what was delivered: per image returned, or for a
        token-billed model its usage, never less than the least its images can cost."""
        state = exchange.state
        images = len(as_list((data or {}).get("data")))
        if "unit" in state:
            return self.reserved(exchange, units=((state["unit"], images),))
        return self._image_tokens(exchange, as_dict((data or {}).get("usage")) or None, images,
                                  (data or {}).get("quality"))

    def _image_tokens(self, exchange: Exchange, usage: dict[str, Any] | None, images: int, quality: Any,
                      partials: int = 0) -> UsageReport:
        state = exchange.state
        quality = quality if isinstance(quality, str) else state.get("quality")
        least = (images * charges.image_output_tokens(state.get("size"), quality, floor=True)
                 + partials * charges.PARTIAL_IMAGE_TOKENS)
        if usage is None:  # no usage: the reservation's input, and the least what was delivered costs
            return self.reserved(exchange, output_tokens=least)
        return self.reserved(exchange, input_tokens=positive_int(usage.get("input_tokens")),
                             output_tokens=max(positive_int(usage.get("output_tokens")), least))

    def transcript_tokens(self, exchange: Exchange, usage: dict[str, Any], counted: int) -> UsageReport:
        """A token-billed transcript: its usage, the output at least the governor's count of the
        transcript it relayed (adapters.counting), both figures recorded."""
        reported = self.reserved(exchange, input_tokens=positive_int(usage.get("input_tokens")),
                                 output_tokens=positive_int(usage.get("output_tokens")))
        return measured(reported, counted, model=exchange.model, expected_input=exchange.state["expected_input"],
                        persona=exchange.persona)

    def _transcribed(self, exchange: Exchange, data: dict[str, Any] | None) -> UsageReport:
        """A transcript's usage: tokens or seconds as the answer reports them; a verbose
        answer's `duration`; else (a transcript as text, no usage) what was reserved."""
        usage = as_dict((data or {}).get("usage"))
        if usage.get("type") == "tokens" and "unit" not in exchange.state and not exchange.state["units"]:
            text = (data or {}).get("text")
            return self.transcript_tokens(exchange, usage, count_text(text) if type(text) is str else 0)
        seconds = usage.get("seconds") if usage.get("type") == "duration" else (data or {}).get("duration")
        if exchange.state["units"] and _seconds(seconds):
            return self.reserved(exchange, units=(("audio_second", math.ceil(seconds)),))
        return self.reserved(exchange)

    def stream_watcher(self, exchange: Exchange, status: int, headers: Mapping[str, str]) -> StreamWatcher | None:
        if status != 200 or "text/event-stream" not in (headers.get("content-type") or ""):
            return None
        return MediaStreamWatcher(self, exchange)

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        return openai_error(status, message, governor)

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        # no text can stand in for an image or audio: the refusal, as an error
        return self.error_response(403, describe(governor), governor, exchange)


def openai_error(status: int, message: str, governor: Mapping[str, Any] | None) -> Reply:
    """An error in OpenAI's format (as the OpenAI adapter renders it), the governor object inside."""
    error: dict[str, Any] = {"message": message, "type": ERROR_TYPES.get(status, "governor_error"), "param": None,
                             "code": (governor or {}).get("cause")}
    if governor is not None:
        error["governor"] = dict(governor)
    return Reply.json(status, {"error": error})


def _object(body: bytes) -> dict[str, Any] | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


class MediaStreamWatcher(sse.SSEStreamWatcher):
    """Streamed images (`image_generation.*`, `image_edit.*`), transcripts (`transcript.text.*`)
    and speech (`speech.audio.*`): the final event's usage settles the call, the images
    and partial images counted are its floor; a stream that ends without one is charged
    what was reserved."""

    def __init__(self, adapter: OpenAIMediaAdapter, exchange: Exchange) -> None:
        self.adapter = adapter
        self.exchange = exchange
        self.decoder = sse.SSEDecoder()
        self.images = 0
        self.partials = 0
        self.quality: Any = None
        self.usage_fields: dict[str, Any] | None = None
        self.transcript = OutputCounter()  # a transcript's text deltas (adapters.counting)

    @property
    def usage(self) -> UsageReport | None:
        return None  # nothing is reported before the end: a media call stays within its reservation

    def _event(self, event: Any, out: list[StreamEvent]) -> None:
        data = event.json()
        if not isinstance(data, dict):
            return
        kind = data.get("type") or event.event
        if kind == "transcript.text.delta":
            self.transcript.add_value(data.get("delta"))
        elif kind in _PARTIALS:
            self.partials += 1
        elif kind in _STREAM_FINAL:
            if kind.endswith(".completed"):
                self.images += 1
                self.quality = data.get("quality", self.quality)
            usage = data.get("usage")
            if isinstance(usage, dict):
                self.usage_fields = usage

    def _closed(self, out: list[StreamEvent]) -> None:
        exchange = self.exchange
        if exchange.state["kind"] in IMAGES and "unit" not in exchange.state:
            out.append(self.adapter._image_tokens(exchange, self.usage_fields, self.images, self.quality,
                                                  self.partials))
            return
        usage = self.usage_fields
        if usage is not None and not exchange.state["units"] and exchange.state["kind"] in TRANSCRIBING:
            out.append(self.adapter.transcript_tokens(exchange, usage, self.transcript.tokens))
        elif usage is not None and not exchange.state["units"]:
            out.append(self.adapter.reserved(exchange, input_tokens=positive_int(usage.get("input_tokens")),
                                             output_tokens=positive_int(usage.get("output_tokens"))))
        else:
            out.append(self.adapter.reserved(exchange))

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        error = {"message": message, "type": "governor_stream_cut", "param": None, "code": governor.get("cause"),
                 "governor": dict(governor)}
        return sse.encode({"type": "error", "error": error}, "error")


ADAPTERS = (OpenAIMediaAdapter,)

__all__ = ["OpenAIMediaAdapter", "MediaStreamWatcher", "openai_error", "ADAPTERS", "ENDPOINTS"]


_PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
_WAV = b"RIFF" + b"\0" * 4 + b"WAVEfmt " + b"\0" * 2048


def _form(fields: dict[str, str], files: dict[str, tuple[str, bytes, str]]) -> tuple[bytes, str]:
    """A multipart body as the openai SDK (httpx) sends one, for the table's probes."""
    boundary = "governor-probe-boundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
             for name, value in fields.items()]
    for name, (filename, content, kind) in files.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                     f"Content-Type: {kind}\r\n\r\n".encode() + content + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _probe(path: str, fields: dict[str, str], files: dict[str, tuple[str, bytes, str]]) -> Probe:
    body, content_type = _form(fields, files)
    return Probe("POST", path, body, content_type)


ENDPOINTS = (
    Endpoint("OpenAI", "image generations", "POST", "/v1/images/generations", GOVERNED, "openai_media",
             Probe("POST", "/v1/images/generations", b'{"prompt":"a red circle"}'),
             "no model: dall-e-2; DALL-E per image (size, quality), gpt-image-* in tokens (usage)"),
    Endpoint("OpenAI", "image generations", "POST", "/v1/images/generations", GOVERNED, "openai_media",
             Probe("POST", "/v1/images/generations",
                   b'{"model":"gpt-image-1","prompt":"a red circle","stream":true,"partial_images":1,"quality":"low"}'),
             "SSE: image_generation.completed usage; each partial image 100 tokens", stream=True),
    Endpoint("OpenAI", "image edits", "POST", "/v1/images/edits", GOVERNED, "openai_media",
             _probe("/v1/images/edits", {"prompt": "add a hat"}, {"image": ("in.png", _PNG, "image/png")}),
             "multipart; as generations, input images reserved as tokens for gpt-image-*"),
    Endpoint("OpenAI", "image edits", "POST", "/v1/images/edits", GOVERNED, "openai_media",
             _probe("/v1/images/edits",
                    {"model": "gpt-image-1", "prompt": "add a hat", "stream": "true", "quality": "low"},
                    {"image": ("in.png", _PNG, "image/png")}),
             "SSE: image_edit.completed usage", stream=True),
    Endpoint("OpenAI", "image variations", "POST", "/v1/images/variations", GOVERNED, "openai_media",
             _probe("/v1/images/variations", {"n": "1"}, {"image": ("in.png", _PNG, "image/png")}),
             "multipart; dall-e-2 per image"),
    Endpoint("OpenAI", "speech", "POST", "/v1/audio/speech", GOVERNED, "openai_media",
             Probe("POST", "/v1/audio/speech", b'{"model":"tts-1","input":"hello","voice":"alloy"}'),
             "tts-1: per character of input; gpt-4o-mini-tts: tokens (reserved from the input)"),
    Endpoint("OpenAI", "speech", "POST", "/v1/audio/speech", GOVERNED, "openai_media",
             Probe("POST", "/v1/audio/speech",
                   b'{"model":"gpt-4o-mini-tts","input":"hello","voice":"alloy","stream_format":"sse"}'),
             "SSE: speech.audio.done usage", stream=True),
    Endpoint("OpenAI", "transcriptions", "POST", "/v1/audio/transcriptions", GOVERNED, "openai_media",
             _probe("/v1/audio/transcriptions", {"model": "whisper-1"}, {"file": ("a.wav", _WAV, "audio/wav")}),
             "multipart; whisper-1 per second (reserved from the file size), gpt-4o-transcribe tokens (usage)"),
    Endpoint("OpenAI", "transcriptions", "POST", "/v1/audio/transcriptions", GOVERNED, "openai_media",
             _probe("/v1/audio/transcriptions", {"model": "gpt-4o-transcribe", "stream": "true"},
                    {"file": ("a.wav", _WAV, "audio/wav")}),
             "SSE: transcript.text.done usage", stream=True),
    Endpoint("OpenAI", "translations", "POST", "/v1/audio/translations", GOVERNED, "openai_media",
             _probe("/v1/audio/translations", {"model": "whisper-1"}, {"file": ("a.wav", _WAV, "audio/wav")}),
             "multipart; whisper-1 per second of audio"),
)
