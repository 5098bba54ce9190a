"""A loopback LLM upstream over HTTP/2 (hypercorn, TLS with ALPN h2 and http/1.1).

The aiohttp mock (tests/upstreams.py) speaks HTTP/1.1 only; a governor cut must reach the
client whatever the upstream's HTTP version, so this one serves the same three streamed
APIs over HTTP/2 when the proxy offers it: OpenAI chat completions and Responses, and
Anthropic messages, each as `H2Stream` says (text deltas of "abcd", one token each; usage
in every chunk or only in the last one; a delay between events).

Every request is recorded with the HTTP version it came in (`requests`) and every stream
leaves an `H2Log`: events sent, whether it completed, and whether the client reset it
before the end (`disconnected`: the proof that a cut stopped generation), so a test can
also show that a cut stream's siblings on the same connection went on.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field
from typing import Any

import orjson
from hypercorn.asyncio import serve
from hypercorn.config import Config

from tests.upstreams import TLSMaterial

PIECE = "abcd"  # one token of text per delta


@dataclass
class H2Stream:
    """How one streamed answer goes."""

    deltas: int = 3
    input_tokens: int = 11
    output_tokens: int | None = None  # the usage it reports: None, one per delta
    usage_per_chunk: bool = False  # cumulative usage in every text chunk, not only at the end
    delay: float = 0.0  # seconds between events
    piece: str = PIECE  # the text of each delta (4 bytes per token)
    hang: float = 0.0  # seconds to wait (for the client to go away) before the response headers
    content_length: bool = False  # frame the stream with a content-length (as some servers do)
    tail: bytes = b""  # raw bytes sent after the last event (e.g. a line that never ends)


@dataclass
class H2Log:
    path: str
    http_version: str
    events_planned: int
    events_sent: int = 0
    completed: bool = False
    disconnected: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)


def _tokens(s: H2Stream) -> int:
    return s.deltas * max(1, len(s.piece) // 4) if s.output_tokens is None else s.output_tokens


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n"


def chat_events(body: dict[str, Any], s: H2Stream) -> list[bytes]:
    model = body.get("model", "mock-model")
    out_total = _tokens(s)
    include = bool((body.get("stream_options") or {}).get("include_usage"))

    def usage(out: int) -> dict[str, int]:
        return {"prompt_tokens": s.input_tokens, "completion_tokens": out, "total_tokens": s.input_tokens + out}

    base = {"id": "chatcmpl-h2", "object": "chat.completion.chunk", "created": 1700000000, "model": model}
    events = [_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]})]
    for n in range(1, s.deltas + 1):
        chunk: dict[str, Any] = {**base, "choices": [{"index": 0, "delta": {"content": s.piece}, "finish_reason": None}]}
        if s.usage_per_chunk and include:
            chunk["usage"] = usage(out_total * n // s.deltas)
        events.append(_sse(chunk))
    events.append(_sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    if include:
        events.append(_sse({**base, "choices": [], "usage": usage(out_total)}))
    events.append(b"data: [DONE]\n\n")
    return events


def responses_events(body: dict[str, Any], s: H2Stream) -> list[bytes]:
    model = body.get("model", "mock-model")
    out_total = _tokens(s)
    item = {"id": "msg_h2", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": s.piece * s.deltas, "annotations": []}]}

    def response(status: str, output: list, usage: Any) -> dict[str, Any]:
        return {"id": "resp_h2", "object": "response", "created_at": 1700000000, "model": model, "status": status,
                "output": output, "usage": usage, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
                "temperature": 1.0, "top_p": 1.0}

    seq = iter(range(1_000_000))
    events = [_sse({"type": "response.created", "sequence_number": next(seq),
                    "response": response("in_progress", [], None)}, "response.created"),
              _sse({"type": "response.output_item.added", "sequence_number": next(seq), "output_index": 0,
                    "item": {**item, "status": "in_progress", "content": []}}, "response.output_item.added")]
    for _ in range(s.deltas):
        events.append(_sse({"type": "response.output_text.delta", "sequence_number": next(seq), "item_id": "msg_h2",
                            "output_index": 0, "content_index": 0, "delta": s.piece, "logprobs": []},
                           "response.output_text.delta"))
    events.append(_sse({"type": "response.output_item.done", "sequence_number": next(seq), "output_index": 0,
                        "item": item}, "response.output_item.done"))
    usage = {"input_tokens": s.input_tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": out_total, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": s.input_tokens + out_total}
    events.append(_sse({"type": "response.completed", "sequence_number": next(seq),
                        "response": response("completed", [item], usage)}, "response.completed"))
    return events


def messages_events(body: dict[str, Any], s: H2Stream) -> list[bytes]:
    model = body.get("model", "mock-model")
    out_total = _tokens(s)
    message = {"id": "msg_h2", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": s.input_tokens, "output_tokens": 1}}
    events = [_sse({"type": "message_start", "message": message}, "message_start"),
              _sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                   "content_block_start")]
    for n in range(1, s.deltas + 1):
        events.append(_sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": s.piece}},
                           "content_block_delta"))
        if s.usage_per_chunk:
            events.append(_sse({"type": "message_delta", "delta": {"stop_reason": None, "stop_sequence": None},
                                "usage": {"output_tokens": out_total * n // s.deltas}}, "message_delta"))
    events.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    events.append(_sse({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                        "usage": {"output_tokens": out_total}}, "message_delta"))
    events.append(_sse({"type": "message_stop"}, "message_stop"))
    return events


class H2Upstream:
    """hypercorn on 127.0.0.1 (a free port), TLS offering h2 and http/1.1, streaming as scripted."""

    def __init__(self, tls: TLSMaterial) -> None:
        self.tls = tls
        self.default = H2Stream()
        self._queue: list[H2Stream] = []
        self.requests: list[tuple[str, str, Any, tuple]] = []  # (http version, path, body, client address)
        self.streams: list[H2Log] = []
        self.port = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._sock: socket.socket | None = None

    def script(self, *streams: H2Stream) -> None:
        self._queue.extend(streams)

    def reset(self) -> None:
        self._queue.clear()
        self.requests.clear()
        self.streams.clear()
        self.default = H2Stream()

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.set_inheritable(True)
        self._sock = sock
        self.port = sock.getsockname()[1]
        config = Config()
        config.bind = [f"fd://{sock.fileno()}"]
        config.certfile, config.keyfile = str(self.tls.cert_file), str(self.tls.key_file)
        config.alpn_protocols = ["h2", "http/1.1"]
        config.accesslog = None
        config.errorlog = None
        config.graceful_timeout = 0.5
        self._task = asyncio.get_running_loop().create_task(serve(self._app, config, shutdown_trigger=self._stop.wait))
        # the socket listens already: connections wait in its backlog until hypercorn accepts them
        await asyncio.sleep(0)
        return self.base_url

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 5)
        if self._sock is not None:  # hypercorn closed the descriptor; forget the object without closing it again
            self._sock.detach()

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        body = orjson.loads(raw) if raw else {}
        path = scope["path"]
        self.requests.append((scope["http_version"], path, body, tuple(scope.get("client") or ())))
        s = self._queue.pop(0) if self._queue else self.default
        if path.endswith("/chat/completions"):
            events = chat_events(body, s)
        elif path.endswith("/responses"):
            events = responses_events(body, s)
        elif path.endswith("/v1/messages"):
            events = messages_events(body, s)
        else:
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"not found"})
            return
        if s.tail:
            events.append(s.tail)
        log = H2Log(path, scope["http_version"], len(events))
        self.streams.append(log)
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            if s.hang:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(gone.wait(), s.hang)
                if gone.is_set():
                    log.disconnected = True
                    return
            headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
            if s.content_length:
                headers.append((b"content-length", str(sum(map(len, events))).encode()))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for event in events:
                if gone.is_set():
                    break
                await send({"type": "http.response.body", "body": event, "more_body": True})
                log.events_sent += 1
                if s.delay:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(gone.wait(), s.delay)
            if gone.is_set():
                log.disconnected = True
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                log.completed = True
        except (Exception, asyncio.CancelledError):  # hypercorn refuses a send to a reset stream
            log.disconnected = True
            raise
        finally:
            watcher.cancel()
            log.done.set()
