"""A loopback upstream that answers as Azure OpenAI, Ollama and TGI do (aiohttp, over TLS).

Written from each provider's published API reference and from what its official client
sends and parses (`openai.AzureOpenAI`, the `ollama` SDK, TGI's router):

    Azure OpenAI  POST /openai/deployments/{deployment}/chat/completions?api-version=...
                  POST /openai/deployments/{deployment}/completions, .../embeddings
                  POST /openai/v1/chat/completions, /openai/v1/responses (model = deployment)
                  an `api-key` header; answers with `prompt_filter_results` and per-choice
                  `content_filter_results`; a stream's first chunk has empty `choices`, id and model
    Ollama        POST /api/chat, /api/generate (NDJSON unless "stream": false), /api/embed,
                  /api/embeddings; counts in the `"done": true` object
    TGI           POST /generate (x-prompt-tokens / x-generated-tokens headers, `details` when
                  asked), /generate_stream (`data:` events, `details` in the last when asked)

What an answer says is an `Answer` (queued with `script`, one per request, then the default);
its hostile modes: counts missing or of the wrong type, a line that is not JSON, an endless
line, a lenient-JSON tool call. Every request is kept (`requests`); every stream leaves a log
of whether the client went away before its end.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.upstreams import TLSMaterial

REAL_MODEL = "gpt-4o-mini-2024-07-18"  # what Azure answers carry as `model`
FILTERS = {"hate": {"filtered": False, "severity": "safe"}, "self_harm": {"filtered": False, "severity": "safe"},
           "sexual": {"filtered": False, "severity": "safe"}, "violence": {"filtered": False, "severity": "safe"}}


@dataclass
class Answer:
    text: str = "Hello from the compat mock."
    chunks: int = 3
    input_tokens: int = 11
    output_tokens: int = 7
    counts: Any = True  # False: no counts; "string": counts as strings; "negative": -1
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    chunk_delay: float = 0.0
    garbage_line: bool = False  # a stream line / event that is not JSON, after the first
    lenient_tool: str | None = None  # a stream line with this tool call and a NaN argument
    endless_bytes: int = 0  # a stream: this many bytes without a newline, after the first line
    status: int = 200


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class StreamLog:
    done: asyncio.Event = field(default_factory=asyncio.Event)
    completed: bool = False
    disconnected: bool = False


def _pieces(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text) or 1))
    size = -(-len(text) // n)
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _count(answer: Answer, value: int) -> Any:
    return {True: value, "string": str(value), "negative": -1}.get(answer.counts, value)


class CompatUpstream:
    def __init__(self, tls: TLSMaterial) -> None:
        self.tls = tls
        self.requests: list[Seen] = []
        self.streams: list[StreamLog] = []
        self.queue: list[Answer] = []
        self.default = Answer()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def script(self, *answers: Answer) -> None:
        self.queue.extend(answers)

    def reset(self) -> None:
        self.requests.clear()
        self.streams.clear()
        self.queue.clear()

    def _next(self) -> Answer:
        return self.queue.pop(0) if self.queue else self.default

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(r"/openai/deployments/{deployment}/{endpoint:.+}", self.azure_deployment)
        app.router.add_post("/openai/v1/chat/completions", self.azure_v1_chat)
        app.router.add_post("/openai/v1/responses", self.azure_v1_responses)
        app.router.add_post("/api/chat", self.ollama)
        app.router.add_post("/api/generate", self.ollama)
        app.router.add_post("/api/embed", self.ollama_embed)
        app.router.add_post("/api/embeddings", self.ollama_embeddings)
        app.router.add_post("/generate", self.tgi_generate)
        app.router.add_post("/generate_stream", self.tgi_stream)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls.server_context())
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _seen(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw
        self.requests.append(Seen(request.method, request.path, dict(request.query), dict(request.headers), body))
        return body

    # --- Azure OpenAI ----------------------------------------------------------------------

    @staticmethod
    def _azure_refusal(request: web.Request, deployment_path: bool) -> web.Response | None:
        if not request.headers.get("api-key"):
            return web.json_response({"error": {"code": "401", "message": "Access denied due to invalid "
                                                 "subscription key or wrong API endpoint."}}, status=401)
        if deployment_path and "api-version" not in request.query:
            return web.json_response({"error": {"code": "404", "message": "Resource not found"}}, status=404)
        return None

    async def azure_deployment(self, request: web.Request) -> web.StreamResponse:
        body = await self._seen(request)
        if (refused := self._azure_refusal(request, True)) is not None:
            return refused
        endpoint = request.match_info["endpoint"]
        if endpoint == "chat/completions":
            return await self._azure_chat(request, body)
        answer = self._next()
        usage = {"prompt_tokens": answer.input_tokens, "total_tokens": answer.input_tokens}
        if endpoint == "embeddings":
            return web.json_response({"object": "list", "model": "text-embedding-3-small", "usage": usage,
                                      "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}]})
        usage = {**usage, "completion_tokens": answer.output_tokens,
                 "total_tokens": answer.input_tokens + answer.output_tokens}
        return web.json_response({
            "id": "cmpl-azure", "object": "text_completion", "created": int(time.time()),
            "model": "gpt-35-turbo-instruct", "prompt_filter_results": [
                {"prompt_index": 0, "content_filter_results": FILTERS}],
            "choices": [{"text": answer.text, "index": 0, "finish_reason": "stop", "logprobs": None,
                         "content_filter_results": FILTERS}], "usage": usage})

    async def azure_v1_chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._seen(request)
        if (refused := self._azure_refusal(request, False)) is not None:
            return refused
        return await self._azure_chat(request, body)

    async def _azure_chat(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        answer = self._next()
        created = int(time.time())
        calls = [{"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": orjson.dumps(args).decode()}}
                 for i, (name, args) in enumerate(answer.tool_calls)]
        usage = {"prompt_tokens": answer.input_tokens, "completion_tokens": answer.output_tokens,
                 "total_tokens": answer.input_tokens + answer.output_tokens,
                 "prompt_tokens_details": {"audio_tokens": 0, "cached_tokens": 0},
                 "completion_tokens_details": {"accepted_prediction_tokens": 0, "audio_tokens": 0,
                                               "reasoning_tokens": 0, "rejected_prediction_tokens": 0}}
        if not body.get("stream"):
            message = {"content": answer.text, "refusal": None, "role": "assistant"}
            if calls:
                message["tool_calls"] = calls
            return web.json_response({
                "choices": [{"content_filter_results": FILTERS, "finish_reason": "tool_calls" if calls else "stop",
                             "index": 0, "logprobs": None, "message": message}],
                "created": created, "id": "chatcmpl-azure1", "model": REAL_MODEL, "object": "chat.completion",
                "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": FILTERS}],
                "system_fingerprint": "fp_azure", "usage": usage})
        response = await self._start(request, "text/event-stream; charset=utf-8")
        log = self.streams[-1]
        base = {"created": created, "id": "chatcmpl-azure1", "model": REAL_MODEL, "object": "chat.completion.chunk",
                "system_fingerprint": "fp_azure"}
        events = [{"choices": [], "created": 0, "id": "", "model": "", "object": "",
                   "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": FILTERS}]},
                  {**base, "choices": [{"content_filter_results": {}, "delta": {"content": "", "refusal": None,
                                                                                  "role": "assistant"},
                                        "finish_reason": None, "index": 0, "logprobs": None}]}]
        for piece in _pieces(answer.text, answer.chunks):
            events.append({**base, "choices": [{"content_filter_results": FILTERS, "delta": {"content": piece},
                                                "finish_reason": None, "index": 0, "logprobs": None}]})
        for i, call in enumerate(calls):
            events.append({**base, "choices": [{"content_filter_results": {}, "delta": {"tool_calls": [
                {**call, "index": i}]}, "finish_reason": None, "index": 0, "logprobs": None}]})
        events.append({**base, "choices": [{"content_filter_results": {}, "delta": {},
                                            "finish_reason": "tool_calls" if calls else "stop", "index": 0,
                                            "logprobs": None}]})
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            events.append({**base, "choices": [], "usage": usage})
        frames = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
        return await self._send(response, log, frames, answer.chunk_delay)

    async def azure_v1_responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._seen(request)
        if (refused := self._azure_refusal(request, False)) is not None:
            return refused
        answer = self._next()
        return web.json_response({
            "id": "resp_azure1", "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": REAL_MODEL, "output": [{"type": "message", "id": "msg_azure1", "status": "completed",
                                             "role": "assistant", "content": [
                                                 {"type": "output_text", "text": answer.text, "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None,
            "incomplete_details": None, "content_filters": None,
            "usage": {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens,
                      "total_tokens": answer.input_tokens + answer.output_tokens,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}})

    # --- Ollama ----------------------------------------------------------------------------

    async def ollama(self, request: web.Request) -> web.StreamResponse:
        body = await self._seen(request)
        answer = self._next()
        if answer.status != 200:
            return web.json_response({"error": f"model \"{body.get('model')}\" not found, try pulling it first"},
                                     status=answer.status)
        chat = request.path.endswith("/api/chat")
        model = body.get("model")
        stamp = "2026-11-27T22:00:00.123456789Z"

        def said(text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if calls:
                    message["tool_calls"] = calls
                return {"message": message}
            return {"response": text}

        calls = [{"function": {"name": name, "arguments": args}} for name, args in answer.tool_calls]
        done: dict[str, Any] = {"done": True, "done_reason": "stop", "total_duration": 4883583458,
                                "load_duration": 1334875, "prompt_eval_duration": 342546000,
                                "eval_duration": 4535599000}
        if answer.counts:
            done["prompt_eval_count"] = _count(answer, answer.input_tokens)
            done["eval_count"] = _count(answer, answer.output_tokens)
        if not chat:
            done["context"] = [1, 2, 3]
        if body.get("stream", True) is False:
            if answer.lenient_tool:  # JSON only to Python's json: a tool call with a NaN argument
                return web.Response(content_type="application/json", body=b'{"model":"x","message":{"role":'
                                    b'"assistant","content":"","tool_calls":[{"function":{"name":"'
                                    + answer.lenient_tool.encode() + b'","arguments":{"n":NaN}}}]},"done":true}')
            whole = {"model": model, "created_at": stamp, **said(answer.text, calls), **done}
            return web.json_response(whole)
        response = await self._start(request, "application/x-ndjson")
        log = self.streams[-1]
        lines = [orjson.dumps({"model": model, "created_at": stamp, **said(piece), "done": False}) + b"\n"
                 for piece in _pieces(answer.text, answer.chunks)]
        if calls:
            lines.append(orjson.dumps({"model": model, "created_at": stamp, **said("", calls), "done": False}) + b"\n")
        if answer.garbage_line:
            lines.insert(1, b'{"model": "' + str(model).encode() + b'", "message": {oops\n')
        if answer.lenient_tool:
            lines.insert(1, b'{"model":"x","created_at":"' + stamp.encode() + b'","message":{"role":"assistant",'
                            b'"content":"","tool_calls":[{"function":{"name":"' + answer.lenient_tool.encode()
                            + b'","arguments":{"n":NaN}}}]},"done":false}\n')
        if answer.endless_bytes:
            lines.insert(1, b"x" * answer.endless_bytes)
        lines.append(orjson.dumps({"model": model, "created_at": stamp, **said(""), **done}) + b"\n")
        return await self._send(response, log, lines, answer.chunk_delay)

    async def ollama_embed(self, request: web.Request) -> web.Response:
        body = await self._seen(request)
        answer = self._next()
        inputs = body.get("input") if isinstance(body.get("input"), list) else [body.get("input")]
        reply: dict[str, Any] = {"model": body.get("model"), "embeddings": [[0.1, 0.2, 0.3] for _ in inputs],
                                 "total_duration": 14143917, "load_duration": 1019500}
        if answer.counts:
            reply["prompt_eval_count"] = _count(answer, answer.input_tokens)
        return web.json_response(reply)

    async def ollama_embeddings(self, request: web.Request) -> web.Response:
        await self._seen(request)
        self._next()
        return web.json_response({"embedding": [0.5670403838157654, 0.009260174818336964, 0.23178744316101074]})

    # --- TGI -------------------------------------------------------------------------------

    async def tgi_generate(self, request: web.Request) -> web.Response:
        body = await self._seen(request)
        answer = self._next()
        parameters = body.get("parameters") or {}
        reply: dict[str, Any] = {"generated_text": answer.text}
        if parameters.get("details"):
            reply["details"] = {"finish_reason": "length", "generated_tokens": _count(answer, answer.output_tokens),
                                "seed": None, "prefill": [], "tokens": []}
        headers = {"x-compute-type": "gpu+optimized", "x-compute-time": "0.12", "x-compute-characters": "5"}
        if answer.counts:
            headers |= {"x-prompt-tokens": str(_count(answer, answer.input_tokens)),
                        "x-generated-tokens": str(_count(answer, answer.output_tokens))}
        return web.json_response(reply, headers=headers)

    async def tgi_stream(self, request: web.Request) -> web.StreamResponse:
        body = await self._seen(request)
        answer = self._next()
        parameters = body.get("parameters") or {}
        response = await self._start(request, "text/event-stream")
        log = self.streams[-1]
        pieces = _pieces(answer.text, answer.chunks)
        frames = []
        for index, piece in enumerate(pieces, 1):
            last = index == len(pieces)
            event = {"index": index, "token": {"id": index, "text": piece, "logprob": -0.25, "special": False},
                     "generated_text": answer.text if last else None, "details": None}
            if last and parameters.get("details") and answer.counts:
                event["details"] = {"finish_reason": "length", "generated_tokens": _count(answer, answer.output_tokens),
                                    "seed": None, "input_length": _count(answer, answer.input_tokens)}
            frames.append(b"data:" + orjson.dumps(event) + b"\n\n")
        if answer.garbage_line:
            frames.insert(1, b"data:{not json\n\n")
        return await self._send(response, log, frames, answer.chunk_delay)

    # --- streaming -------------------------------------------------------------------------

    async def _start(self, request: web.Request, content_type: str) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": content_type})
        await response.prepare(request)
        self.streams.append(StreamLog())
        return response

    async def _send(self, response: web.StreamResponse, log: StreamLog, frames: list[bytes],
                    delay: float) -> web.StreamResponse:
        try:
            for frame in frames:
                await response.write(frame)
                if delay:
                    await asyncio.sleep(delay)
            await response.write_eof()
            log.completed = True
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError too: the client went away
            log.disconnected = True
        except asyncio.CancelledError:
            log.disconnected = True
            raise
        finally:
            log.done.set()
        return response


__all__ = ["Answer", "CompatUpstream", "REAL_MODEL"]
