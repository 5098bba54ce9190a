"""A loopback mock of the OpenAI Realtime WebSocket (aiohttp, over TLS), speaking the GA
event protocol as the API reference and the openai SDK's types describe it:

    connect         -> session.created
    session.update  -> session.updated (the session as the client set it)
    conversation.item.create -> conversation.item.added, conversation.item.done
    response.create -> response.created, response.output_item.added, response.content_part.added,
                       response.output_text.delta * n, response.output_text.done,
                       response.content_part.done, response.output_item.done,
                       [a function call: response.output_item.added, response.function_call_arguments.delta,
                        response.function_call_arguments.done, response.output_item.done],
                       response.done (response.usage with input/output token details)
    input_audio_buffer.commit -> input_audio_buffer.committed, [its transcription:
                       conversation.item.input_audio_transcription.completed with usage], then a
                       response the server starts on its own (as server VAD does), without any
                       response.create

What each response looks like is a `Turn` (queued with `script`, else `default`). Every
client event that arrived is kept (`events`), and each response's log says how many deltas
went out and whether the socket went away before its response.done (`cut`): the proof that
a cut stopped generation.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from tests.upstreams import TLSMaterial


@dataclass
class Turn:
    text: str = "Hello from the realtime mock."
    deltas: int = 3
    delay: float = 0.0  # between deltas
    input_tokens: int = 40
    output_tokens: int = 12
    audio_in: int = 0  # of input_tokens, audio
    audio_out: int = 0  # of output_tokens, audio
    cached: int = 0
    usage: bool = True  # response.done carries usage
    tool: tuple[str, dict[str, Any]] | None = None  # a function call the model makes
    raw_after_created: bytes | None = None  # a raw message sent right after response.created (hostile tests)
    binary_after_created: bool = False
    transcription: tuple[str, int, int] | None = None  # on a commit: (transcript, input, output tokens) of the ASR


@dataclass
class ResponseLog:
    id: str
    sent_deltas: int = 0
    done: bool = False
    cut: bool = False  # the socket went away before response.done
    finished: asyncio.Event = field(default_factory=asyncio.Event)


class RealtimeMock:
    def __init__(self, tls: TLSMaterial) -> None:
        self.tls = tls
        self.default = Turn()
        self._queue: list[Turn] = []
        self.events: list[dict[str, Any]] = []  # client events as received
        self.raw: list[tuple[str, bytes]] = []  # (kind, data) of every client message
        self.responses: list[ResponseLog] = []
        self.upgrades: list[dict[str, str]] = []  # the headers of each upgrade
        self.closes: list[int | None] = []  # the close code each socket ended with
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._ids = itertools.count(1)

    def script(self, *turns: Turn) -> None:
        self._queue.extend(turns)

    def reset(self) -> None:
        self._queue.clear()
        self.events.clear()
        self.raw.clear()
        self.responses.clear()
        self.upgrades.clear()
        self.closes.clear()
        self.default = Turn()

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/realtime", self._socket)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls.server_context())
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _other(self, request: web.Request) -> web.Response:
        self.raw.append(("http", f"{request.method} {request.path_qs}".encode() + b" " + await request.read()))
        return web.json_response({"object": "realtime.session", "client_secret": {"value": "ek_mock"}})

    def _id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):04d}"

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        self.upgrades.append(dict(request.headers))
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        model = request.query.get("model", "")
        session: dict[str, Any] = {"type": "realtime", "object": "realtime.session", "id": self._id("sess"),
                                   "model": model, "output_modalities": ["audio"], "instructions": "",
                                   "tools": [], "tool_choice": "auto", "max_output_tokens": "inf"}
        send = _Sender(ws, self)
        await send({"type": "session.created", "session": session})
        tasks: set[asyncio.Task] = set()
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self.raw.append(("text", msg.data.encode()))
                    event = orjson.loads(msg.data)
                    self.events.append(event)
                    kind = event.get("type")
                    if kind == "session.update":
                        session.update(event.get("session") or {})
                        await send({"type": "session.updated", "session": session})
                    elif kind == "conversation.item.create":
                        item = {**event.get("item", {}), "id": self._id("item"), "status": "completed"}
                        await send({"type": "conversation.item.added", "previous_item_id": None, "item": item})
                        await send({"type": "conversation.item.done", "previous_item_id": None, "item": item})
                    elif kind == "response.create":
                        turn = self._queue.pop(0) if self._queue else self.default
                        task = asyncio.ensure_future(self._respond(send, turn, model))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    elif kind == "input_audio_buffer.commit":
                        item_id = self._id("item")
                        await send({"type": "input_audio_buffer.committed", "previous_item_id": None,
                                    "item_id": item_id})
                        turn = self._queue.pop(0) if self._queue else self.default
                        if turn.transcription is not None:
                            text, used_in, used_out = turn.transcription
                            await send({"type": "conversation.item.input_audio_transcription.completed",
                                        "item_id": item_id, "content_index": 0, "transcript": text,
                                        "usage": {"type": "tokens", "input_tokens": used_in,
                                                  "output_tokens": used_out, "total_tokens": used_in + used_out,
                                                  "input_token_details": {"audio_tokens": used_in,
                                                                          "text_tokens": 0}}})
                        task = asyncio.ensure_future(self._respond(send, turn, model))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                elif msg.type == WSMsgType.BINARY:
                    self.raw.append(("binary", msg.data))
        finally:
            for task in list(tasks):
                task.cancel()
            self.closes.append(ws.close_code)
            for log in self.responses:
                if not log.done:
                    log.cut = True
                log.finished.set()
        return ws

    async def _respond(self, send: "_Sender", turn: Turn, model: str) -> None:
        response_id = self._id("resp")
        log = ResponseLog(response_id)
        self.responses.append(log)
        base = {"object": "realtime.response", "id": response_id, "conversation_id": "conv_mock",
                "output_modalities": ["text"], "max_output_tokens": "inf", "audio": None, "metadata": None}
        try:
            await send({"type": "response.created", "response": {**base, "status": "in_progress", "output": [],
                                                                  "usage": None, "status_details": None}})
            if turn.raw_after_created is not None:
                await send.raw(turn.raw_after_created)
            if turn.binary_after_created:
                await send.ws.send_bytes(b"\x00\x01binary")
            item_id = self._id("item")
            message = {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                       "status": "in_progress", "content": []}
            await send({"type": "response.output_item.added", "response_id": response_id, "output_index": 0,
                        "item": message})
            await send({"type": "response.content_part.added", "response_id": response_id, "item_id": item_id,
                        "output_index": 0, "content_index": 0, "part": {"type": "text", "text": ""}})
            pieces = _split(turn.text, turn.deltas)
            for piece in pieces:
                if turn.delay:
                    await asyncio.sleep(turn.delay)
                await send({"type": "response.output_text.delta", "response_id": response_id, "item_id": item_id,
                            "output_index": 0, "content_index": 0, "delta": piece})
                log.sent_deltas += 1
            await send({"type": "response.output_text.done", "response_id": response_id, "item_id": item_id,
                        "output_index": 0, "content_index": 0, "text": turn.text})
            part = {"type": "text", "text": turn.text}
            await send({"type": "response.content_part.done", "response_id": response_id, "item_id": item_id,
                        "output_index": 0, "content_index": 0, "part": part})
            done_message = {**message, "status": "completed", "content": [part]}
            await send({"type": "response.output_item.done", "response_id": response_id, "output_index": 0,
                        "item": done_message})
            output = [done_message]
            if turn.tool is not None:
                name, arguments = turn.tool
                call_item_id, call_id = self._id("item"), self._id("call")
                args = orjson.dumps(arguments).decode()
                call = {"id": call_item_id, "object": "realtime.item", "type": "function_call", "status": "in_progress",
                        "name": name, "call_id": call_id, "arguments": ""}
                await send({"type": "response.output_item.added", "response_id": response_id, "output_index": 1,
                            "item": call})
                await send({"type": "response.function_call_arguments.delta", "response_id": response_id,
                            "item_id": call_item_id, "output_index": 1, "call_id": call_id, "delta": args})
                await send({"type": "response.function_call_arguments.done", "response_id": response_id,
                            "item_id": call_item_id, "output_index": 1, "call_id": call_id, "name": name,
                            "arguments": args})
                call = {**call, "status": "completed", "arguments": args}
                await send({"type": "response.output_item.done", "response_id": response_id, "output_index": 1,
                            "item": call})
                output.append(call)
            usage = None
            if turn.usage:
                usage = {"total_tokens": turn.input_tokens + turn.output_tokens, "input_tokens": turn.input_tokens,
                         "output_tokens": turn.output_tokens,
                         "input_token_details": {"text_tokens": turn.input_tokens - turn.audio_in,
                                                 "audio_tokens": turn.audio_in, "image_tokens": 0,
                                                 "cached_tokens": turn.cached,
                                                 "cached_tokens_details": {"text_tokens": turn.cached,
                                                                           "audio_tokens": 0, "image_tokens": 0}},
                         "output_token_details": {"text_tokens": turn.output_tokens - turn.audio_out,
                                                  "audio_tokens": turn.audio_out}}
            await send({"type": "response.done", "response": {**base, "status": "completed", "status_details": None,
                                                               "output": output, "usage": usage}})
            log.done = True
        except (ConnectionError, RuntimeError):  # the socket went away mid-response
            pass
        finally:
            log.finished.set()


class _Sender:
    def __init__(self, ws: web.WebSocketResponse, mock: RealtimeMock) -> None:
        self.ws = ws
        self.mock = mock

    async def __call__(self, event: dict[str, Any]) -> None:
        if self.ws.closed:
            raise ConnectionError("socket closed")
        await self.ws.send_str(orjson.dumps({"event_id": self.mock._id("event"), **event}).decode())

    async def raw(self, data: bytes) -> None:
        await self.ws.send_str(data.decode())


def _split(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text) or 1))
    size = -(-len(text) // n)
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]
