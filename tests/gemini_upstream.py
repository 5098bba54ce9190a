"""A loopback mock of the Gemini APIs (the Generative Language API and Vertex AI), aiohttp,
over TLS with the MockLLM's material (tests/upstreams.py), so the governor under test trusts
it too.

It answers any `POST …/{model}:{method}` (the colon plain or percent-encoded, as Google's
front end decodes it) in the wire format google-genai sends and parses (its `_api_client`
and `models` modules): `generateContent` (a GenerateContentResponse: `candidates` with
`content.parts` of `text` or `functionCall`, `finishReason`, `usageMetadata`,
`modelVersion`, `responseId`), `streamGenerateContent?alt=sse` (each chunk a whole
GenerateContentResponse as `data: {...}\\r\\n\\r\\n`, the usage so far in every chunk, the last
with `finishReason` and the final figures), `streamGenerateContent` without `alt=sse` (a JSON
array written element by element: `[{…}\\n,\\r\\n{…}]`), `countTokens` (`totalTokens`),
`embedContent` (`embedding.values`) and `batchEmbedContents` (`embeddings[]`), both with
`usageMetadata.promptTokenCount`. Errors as Google sends them:
`{"error": {"code", "message", "status"}}`.

What an answer holds is a `GeminiBehaviour` (tests.upstreams.Behaviour plus Gemini's own
figures and hostile shapes), queued with `mock.script(...)`; requests are recorded in
`mock.requests`, streams in `mock.streams` (tests.upstreams.StreamLog).
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from tests.upstreams import Behaviour, Recorded, StreamLog, TLSMaterial

_DEFAULT = object()


@dataclass
class GeminiBehaviour(Behaviour):
    thoughts_tokens: int = 0
    tool_use_prompt_tokens: int = 0
    usage: Any = _DEFAULT  # the usageMetadata sent instead of the true one (None: none at all)
    last_usage: Any = _DEFAULT  # streams: the last chunk's usageMetadata instead of the true one
    raw_answer: bytes | None = None  # plain answers and streams: these bytes instead, status 200
    candidates: int = 1  # candidates in each answer (the request's candidateCount when it names one)


def _split(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text) or 1))
    size = -(-len(text) // n)
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _config(body: Any) -> dict[str, Any]:
    config = body.get("generationConfig") or body.get("generation_config") if isinstance(body, dict) else None
    return config if isinstance(config, dict) else {}


class GeminiMock:
    """The mock server; `base_url` is what google-genai's HttpOptions(base_url=...) takes."""

    def __init__(self, tls: TLSMaterial | None = None) -> None:
        self.tls = tls
        self.default = GeminiBehaviour()
        self._queue: list[Behaviour] = []
        self.requests: list[Recorded] = []
        self.streams: list[StreamLog] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    def script(self, *behaviours: Behaviour) -> None:
        self._queue.extend(behaviours)

    def reset(self) -> None:
        self._queue.clear()
        self.requests.clear()
        self.streams.clear()
        self.default = GeminiBehaviour()

    def _next(self) -> GeminiBehaviour:
        b = self._queue.pop(0) if self._queue else self.default
        return b if isinstance(b, GeminiBehaviour) else GeminiBehaviour(**vars(b))

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0,
                           ssl_context=self.tls.server_context() if self.tls else None)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- plumbing ---------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw
        self.requests.append(Recorded(request.method, request.path_qs, dict(request.headers), body))
        route, _, query = request.raw_path.partition("?")
        segment = urllib.parse.unquote(route).rsplit("/", 1)[-1]
        model, _, method = segment.rpartition(":")
        model, method = model or "unknown", method.lower()
        if request.method != "POST" or not method:
            return self._error(404, "NOT_FOUND", f"no such method: {request.method} {request.path}")
        if not isinstance(body, dict):
            return self._error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        b = self._next()
        if b.hang:
            await asyncio.sleep(b.hang)
        if b.status != 200:
            return self._error(b.status, "INTERNAL" if b.status >= 500 else "INVALID_ARGUMENT", "mock upstream error")
        if method == "counttokens":
            return web.json_response({"totalTokens": b.input_tokens,
                                      "promptTokensDetails": [{"modality": "TEXT", "tokenCount": b.input_tokens}]})
        if method in ("embedcontent", "batchembedcontents"):
            usage = {"promptTokenCount": b.input_tokens, "totalTokenCount": b.input_tokens}
            if method == "embedcontent":
                return web.json_response({"embedding": {"values": [0.25, -0.5, 0.125]}, "usageMetadata": usage})
            count = len(body.get("requests") or [])
            return web.json_response({"embeddings": [{"values": [0.25, -0.5, 0.125]}] * count,
                                      "usageMetadata": usage})
        if method not in ("generatecontent", "streamgeneratecontent"):
            return self._error(404, "NOT_FOUND", f"no such method: {method}")
        limit = _config(body).get("maxOutputTokens")
        if b.honour_max_tokens and isinstance(limit, int) and limit < b.chunks:
            pieces = _split(b.text, b.chunks)[:limit]
            b = GeminiBehaviour(**{**vars(b), "text": "".join(pieces), "chunks": limit, "output_tokens": limit})
        candidates = _config(body).get("candidateCount") or b.candidates
        if method == "generatecontent":
            if b.raw_answer is not None:
                return web.Response(body=b.raw_answer, content_type="application/json")
            return web.json_response(self._answer(b, model, b.text, b.tool_calls, b.output_tokens, True, candidates))
        chunks = self._chunks(b, model, candidates)
        if "alt=sse" in query.lower():
            return await self._sse(request, b, chunks)
        return await self._json_array(request, b, chunks)

    @staticmethod
    def _error(status: int, code: str, message: str) -> web.Response:
        return web.json_response({"error": {"code": status, "message": message, "status": code}}, status=status)

    @staticmethod
    def _usage(b: GeminiBehaviour, output: int, final: bool) -> dict[str, Any] | None:
        if b.usage is not _DEFAULT:
            return b.usage
        usage: dict[str, Any] = {"promptTokenCount": b.input_tokens}
        if output:
            usage["candidatesTokenCount"] = output
        if b.cached_tokens:
            usage["cachedContentTokenCount"] = b.cached_tokens
        thoughts = b.thoughts_tokens if final else 0
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        if b.tool_use_prompt_tokens:
            usage["toolUsePromptTokenCount"] = b.tool_use_prompt_tokens
        usage["totalTokenCount"] = b.input_tokens + output + thoughts + b.tool_use_prompt_tokens
        usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": b.input_tokens}]
        return usage

    def _answer(self, b: GeminiBehaviour, model: str, text: str, calls: Any, output: int, final: bool,
                candidates: int = 1) -> dict[str, Any]:
        parts: list[dict[str, Any]] = [{"text": text}] if text or not calls else []
        parts += [{"functionCall": {"name": name, "args": args}} for name, args in calls]
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if final:
            candidate["finishReason"] = "STOP"
        answer: dict[str, Any] = {"candidates": [{**candidate, "index": i} for i in range(max(1, candidates))]}
        usage = self._usage(b, output, final)
        if usage is not None:
            answer["usageMetadata"] = usage
        answer["modelVersion"] = model
        answer["responseId"] = "mock-response"
        return answer

    def _chunks(self, b: GeminiBehaviour, model: str, candidates: int) -> list[dict[str, Any]]:
        pieces = _split(b.text, b.chunks)
        chunks = []
        for n, piece in enumerate(pieces, 1):
            so_far = b.output_tokens * n // len(pieces) if b.progressive_usage else 0
            chunks.append(self._answer(b, model, piece, (), so_far, False, candidates))
        last = self._answer(b, model, "", b.tool_calls, b.output_tokens, True, candidates)
        if b.last_usage is not _DEFAULT:
            last["usageMetadata"] = b.last_usage
        chunks.append(last)
        return chunks

    async def _write_all(self, request: web.Request, b: GeminiBehaviour, resp: web.StreamResponse,
                         events: list[bytes]) -> web.StreamResponse:
        log = StreamLog(request.path, len(events))
        self.streams.append(log)
        await resp.prepare(request)
        try:
            for i, event in enumerate(events):
                if b.truncate_after is not None and i == b.truncate_after:
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if b.garbage_sse and i == max(1, len(events) // 2):
                    await resp.write(b"data: {not json at all\r\n\r\n\xff\xfe garbage \r\n\r\n")
                await resp.write(event)
                log.events_sent += 1
                if b.chunk_delay:
                    await asyncio.sleep(b.chunk_delay)
            await resp.write_eof()
            log.completed = True
        except (ConnectionError, asyncio.CancelledError) as exc:
            log.disconnected = True
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            log.done.set()
        return resp

    async def _sse(self, request: web.Request, b: GeminiBehaviour, chunks: list[dict[str, Any]]) -> web.StreamResponse:
        events = [b.raw_answer] if b.raw_answer is not None else \
            [b"data: " + orjson.dumps(chunk) + b"\r\n\r\n" for chunk in chunks]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        return await self._write_all(request, b, resp, events)

    async def _json_array(self, request: web.Request, b: GeminiBehaviour,
                          chunks: list[dict[str, Any]]) -> web.StreamResponse:
        if b.raw_answer is not None:
            events = [b.raw_answer]
        else:
            events = [(b"[" if i == 0 else b"\n,\r\n") + orjson.dumps(chunk, option=orjson.OPT_INDENT_2)
                      for i, chunk in enumerate(chunks)]
            events[-1] += b"]"
        resp = web.StreamResponse(headers={"Content-Type": "application/json; charset=UTF-8"})
        return await self._write_all(request, b, resp, events)
