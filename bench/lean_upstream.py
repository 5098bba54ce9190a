"""A lean mock upstream (bench/scaling.py --upstream lean): the answers of common.py's
aiohttp `upstream` role (the same OpenAI-shaped chat completion, with the usage the
request allows), from a bare asyncio protocol: HTTP/1.1 with keep-alive, one request
parsed per response, the answer to a body it has seen before sent from a cache. Its CPU per
request is about half of aiohttp's, which leaves more of a small host to the governors.

    python bench/lean_upstream.py [--port P] [--completion-tokens N]

Prints {"pid", "port"} when it listens; stops on SIGTERM. `POST /v1/chat/completions` only
(and `GET /stats`: how many requests it answered); a streamed request gets its whole event
stream in one response with a Content-Length (no gaps: the scaling bench sends plain calls).
Anything it cannot read is answered 400 and the connection closed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CHAT_PATH, HOST, PYTHON, Role, mock_usage, plain_answer, stream_writes  # noqa: E402

MAX_HEAD = 64 * 1024
MAX_BODY = 8 * 1024 * 1024
CACHE_SIZE = 1024  # distinct bodies answered from the cache; a flood of distinct ones clears it


def response(status: str, body: bytes, content_type: str = "application/json", *, close: bool = False) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            + ("Connection: close\r\n" if close else "") + "\r\n")
    return head.encode() + body


def bad(reason: str) -> bytes:
    return response("400 Bad Request", json.dumps({"error": {"message": reason}}).encode(), close=True)


class Answers:
    """The whole HTTP response for a request body, made once per distinct body."""

    def __init__(self, completion_tokens: int) -> None:
        self.completion_tokens = completion_tokens
        self.cache: dict[bytes, bytes] = {}
        self.requests = 0

    def chat(self, body: bytes) -> bytes:
        self.requests += 1
        cached = self.cache.get(body)
        if cached is not None:
            return cached
        import orjson

        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            return bad("bad json")
        if not isinstance(request, dict):
            return bad("the body is not a JSON object")
        model = request.get("model", "gpt-4o-mini")
        try:
            use = mock_usage(request, self.completion_tokens)
            if request.get("stream"):
                options = request.get("stream_options") or {}
                chunks = int((request.get("mock") or {}).get("chunks", 20))
                events = b"".join(stream_writes(model, use, chunks, bool(options.get("include_usage"))))
                made = response("200 OK", events, "text/event-stream")
            else:
                made = response("200 OK", plain_answer(model, use))
        except (TypeError, ValueError, AttributeError) as exc:  # a body of the wrong shape
            return bad(f"unusable request: {type(exc).__name__}")
        if len(self.cache) >= CACHE_SIZE:
            self.cache.clear()
        self.cache[body] = made
        return made


class Responder(asyncio.Protocol):
    """One connection: requests read as they arrive (pipelined ones too), answered in order."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and not self.transport.is_closing():
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self.refuse("request head too large")
                return
            lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                return self.refuse("not an HTTP/1.x request line")
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    return self.refuse("a header line without a colon")
                headers[name.strip().lower()] = value.strip()
            if "transfer-encoding" in headers:
                return self.refuse("chunked request bodies are not read here")
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                return self.refuse("bad Content-Length")
            if not 0 <= length <= MAX_BODY:
                return self.refuse("bad Content-Length")
            total = end + 4 + length
            if len(self.buffer) < total:
                return
            body = bytes(self.buffer[end + 4:total])
            del self.buffer[:total]
            method, target = parts[0], parts[1]
            path = target.split("?", 1)[0]
            if method == "POST" and path == CHAT_PATH:
                answer = self.answers.chat(body)
            elif method == "GET" and path == "/stats":
                answer = response("200 OK", json.dumps({"requests": self.answers.requests}).encode())
            else:
                answer = response("404 Not Found", b'{"error": {"message": "not found"}}')
            self.transport.write(answer)
            if answer.startswith(b"HTTP/1.1 400") or headers.get("connection", "").lower() == "close":
                self.transport.close()

    def refuse(self, reason: str) -> None:
        assert self.transport is not None
        self.transport.write(bad(reason))
        self.transport.close()
        self.buffer.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(port: int, completion_tokens: int) -> None:
    answers = Answers(completion_tokens)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Responder(answers), HOST, port, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"pid": os.getpid(), "port": server.sockets[0].getsockname()[1]}), flush=True)
    await stop.wait()
    server.close()


class LeanUpstream(Role):
    """This file's server as a bench role (the place of Role("upstream"))."""

    def __init__(self, *args: str) -> None:
        super().__init__("lean-upstream", *args)

    def command(self, role: str, args: Any) -> list[str]:
        return [PYTHON, str(Path(__file__).resolve()), *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--completion-tokens", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.completion_tokens))


if __name__ == "__main__":
    main()
