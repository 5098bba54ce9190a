"""A loopback mock of OpenAI's image, audio and moderation endpoints and Anthropic's token
counting, answering as the API reference documents them (the shapes the official SDKs parse:
openai's ImagesResponse, ImageGenStreamEvent, Transcription, Translation, ModerationCreateResponse;
anthropic's MessageTokensCount), over TLS, for tests/test_sdk_media.py.

`lie` makes answers report usage that is not what they delivered (hostile tests); every
request is recorded (path, content type, the parsed JSON or form fields and file sizes).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.upstreams import TLSMaterial

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
MP3 = b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\xff\xfb\x90\x00" * 256  # an ID3 header and MPEG frame headers

# what the mock reports as used (the tests' expected charges are computed from these)
IMAGE_INPUT_TOKENS = 50
IMAGE_OUTPUT_TOKENS = 4160  # one 1024x1024 high-quality gpt-image-1 image
WHISPER_SECONDS = 3.2
TRANSCRIBE_USAGE = (120, 30)  # gpt-4o-transcribe input, output tokens
SPEECH_USAGE = (8, 400)  # gpt-4o-mini-tts input, output tokens (SSE only)


@dataclass
class Seen:
    path: str
    content_type: str
    body: Any  # the JSON object, or {"fields": {...}, "files": {name: size}}


@dataclass
class MediaMock:
    tls: TLSMaterial
    requests: list[Seen] = field(default_factory=list)
    lie: bool = False  # usage that says almost nothing was used
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for path, handler in (("/v1/images/generations", self._generate), ("/v1/images/edits", self._edit),
                              ("/v1/images/variations", self._variation), ("/v1/audio/speech", self._speech),
                              ("/v1/audio/transcriptions", self._transcribe),
                              ("/v1/audio/translations", self._translate), ("/v1/moderations", self._moderate),
                              ("/v1/responses/input_tokens", self._input_tokens),
                              ("/v1/messages/count_tokens", self._count_tokens)):
            app.router.add_post(path, handler)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls.server_context())
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def reset(self) -> None:
        self.requests.clear()
        self.lie = False

    async def _read(self, request: web.Request) -> dict[str, Any]:
        content_type = request.headers.get("Content-Type", "")
        if content_type.startswith("multipart/"):
            form = await request.post()
            fields: dict[str, Any] = {}
            files: dict[str, int] = {}
            for name, value in form.items():
                if isinstance(value, str):
                    fields[name] = value
                else:
                    files[name] = len(value.file.read())
            body: Any = {"fields": fields, "files": files}
        else:
            body = orjson.loads(await request.read())
        self.requests.append(Seen(request.path, content_type, body))
        return body

    @staticmethod
    def _params(body: dict[str, Any]) -> dict[str, Any]:
        return body.get("fields", body)

    # --- images ---------------------------------------------------------------------------

    def _image_usage(self, images: int, partials: int = 0) -> dict[str, Any]:
        output = 1 if self.lie else IMAGE_OUTPUT_TOKENS * images + 100 * partials  # 100 per partial image
        return {"input_tokens": IMAGE_INPUT_TOKENS, "output_tokens": output,
                "total_tokens": IMAGE_INPUT_TOKENS + output,
                "input_tokens_details": {"image_tokens": 40, "text_tokens": 10}}

    async def _images(self, request: web.Request, body: dict[str, Any], event_prefix: str) -> web.StreamResponse:
        params = self._params(body)
        model = params.get("model") or "dall-e-2"
        n = int(params.get("n") or 1)
        created = int(time.time())
        if not model.startswith("gpt-image"):  # DALL-E: URLs, no usage
            return web.json_response({"created": created, "data": [
                {"url": f"https://images.example/{i}.png", "revised_prompt": None} for i in range(n)]})
        stream = params.get("stream") in (True, "true")
        if not stream:
            return web.json_response({"created": created, "data": [{"b64_json": PNG} for _ in range(n)],
                                      "background": "opaque", "output_format": "png", "quality": "high",
                                      "size": "1024x1024", "usage": self._image_usage(n)})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        partials = int(params.get("partial_images") or 0)
        for index in range(partials):
            event = {"type": f"{event_prefix}.partial_image", "b64_json": PNG, "created_at": created,
                     "partial_image_index": index, "background": "opaque", "output_format": "png",
                     "quality": "high", "size": "1024x1024"}
            await response.write(f"event: {event['type']}\ndata: ".encode() + orjson.dumps(event) + b"\n\n")
        done = {"type": f"{event_prefix}.completed", "b64_json": PNG, "created_at": created,
                "background": "opaque", "output_format": "png", "quality": "high", "size": "1024x1024",
                "usage": self._image_usage(1, partials)}
        await response.write(f"event: {done['type']}\ndata: ".encode() + orjson.dumps(done) + b"\n\n")
        await response.write_eof()
        return response

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        return await self._images(request, await self._read(request), "image_generation")

    async def _edit(self, request: web.Request) -> web.StreamResponse:
        return await self._images(request, await self._read(request), "image_edit")

    async def _variation(self, request: web.Request) -> web.StreamResponse:
        return await self._images(request, await self._read(request), "image_variation")

    # --- audio ----------------------------------------------------------------------------

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        body = await self._read(request)
        if body.get("stream_format") != "sse":
            return web.Response(body=MP3, content_type="audio/mpeg")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta = {"type": "speech.audio.delta", "audio": base64.b64encode(MP3).decode()}
        inputs, outputs = SPEECH_USAGE
        done = {"type": "speech.audio.done", "usage": {"input_tokens": inputs, "output_tokens": outputs,
                                                        "total_tokens": inputs + outputs}}
        for event in (delta, done):
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await response.write_eof()
        return response

    async def _transcribe(self, request: web.Request) -> web.StreamResponse:
        body = await self._read(request)
        params = self._params(body)
        if params.get("response_format") == "text":
            return web.Response(text="hello there\n", content_type="text/plain")
        if params.get("model", "").startswith("gpt-"):
            inputs, outputs = (1, 1) if self.lie else TRANSCRIBE_USAGE
            usage = {"type": "tokens", "input_tokens": inputs, "output_tokens": outputs,
                     "total_tokens": inputs + outputs, "input_token_details": {"text_tokens": 0, "audio_tokens": inputs}}
            if params.get("stream") == "true":
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                for event in ({"type": "transcript.text.delta", "delta": "hello there"},
                              {"type": "transcript.text.done", "text": "hello there", "usage": usage}):
                    await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
                await response.write_eof()
                return response
            return web.json_response({"text": "hello there", "usage": usage})
        return web.json_response({"text": "hello there",
                                  "usage": {"type": "duration", "seconds": 0.1 if self.lie else WHISPER_SECONDS}})

    async def _translate(self, request: web.Request) -> web.Response:
        await self._read(request)
        return web.json_response({"text": "hello there"})  # a translation reports no usage

    # --- free -----------------------------------------------------------------------------

    async def _moderate(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        return web.json_response({"id": "modr-1", "model": body.get("model") or "omni-moderation-latest",
                                  "results": [{"flagged": False, "categories": {}, "category_scores": {},
                                               "category_applied_input_types": {}}]})

    async def _input_tokens(self, request: web.Request) -> web.Response:
        await self._read(request)
        return web.json_response({"object": "response.input_tokens", "input_tokens": 7})

    async def _count_tokens(self, request: web.Request) -> web.Response:
        await self._read(request)
        return web.json_response({"input_tokens": 12})
