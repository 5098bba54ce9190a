"""Loopback mock LLM upstreams for tests and benchmarks (aiohttp, optionally over TLS).

One server speaks three APIs on their usual paths, plain and streamed:

    POST .../chat/completions   OpenAI Chat Completions
    POST .../responses          OpenAI Responses
    POST .../completions        OpenAI legacy Completions
    POST .../embeddings         OpenAI Embeddings
    POST .../v1/messages        Anthropic Messages

and, like servers that fold case, slashes and percent-escapes before routing, on any
spelling of those paths (`/V1/Chat/Completions/`, `/v1/chat%2Fcompletions`): the worst
case for the governor, which must govern every spelling the upstream would serve.

What each answer looks like is a `Behaviour`: the text, the usage it reports,
the tool calls the model "asks for", delays, and failure modes (hang before
headers, stall mid-stream, garbage or truncated SSE, an HTTP error). Tests queue
behaviours with `mock.script(...)` (consumed one per request, then `default`).
Every request is recorded (`mock.requests`) and every streamed answer leaves a
`StreamLog` saying how many events were sent and whether the client went away
before the end (`disconnected`) — the proof that a cut aborted generation.

`make_tls(dir)` makes a throwaway CA and a localhost/127.0.0.1 certificate so the
mock can serve HTTPS that the governor (ssl_verify_upstream_trusted_ca) trusts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ipaddress
import posixpath
import re
import ssl
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

# --- TLS material ----------------------------------------------------------------------


@dataclass(frozen=True)
class TLSMaterial:
    ca_file: Path  # PEM of the CA that signed the server certificate
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


def make_tls(directory: Path, name: str = "upstream") -> TLSMaterial:
    """A CA and a server certificate for localhost and 127.0.0.1, written under directory."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = directory / f"{name}-ca.pem"
    cert_file = directory / f"{name}-cert.pem"
    key_file = directory / f"{name}-key.pem"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return TLSMaterial(ca_file, cert_file, key_file)


# --- behaviours ------------------------------------------------------------------------


@dataclass
class Behaviour:
    """How the mock answers one request."""

    text: str = "Hello from the mock upstream."
    chunks: int = 3  # text deltas in a stream
    input_tokens: int = 11
    output_tokens: int = 7
    cached_tokens: int = 0
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    chunk_delay: float = 0.0  # seconds between stream events
    hang: float | None = None  # sleep this long before sending headers
    stall_after: int | None = None  # stream: stop sending (but keep open) after this many events
    stall_for: float = 30.0
    garbage_sse: bool = False  # stream: send undecodable SSE data in the middle
    truncate_after: int | None = None  # stream: drop the connection abruptly after this many events
    progressive_usage: bool = False  # stream: report cumulative usage after every text delta
    status: int = 200  # != 200: answer with an error in the API's format
    stream_usage_always: bool = False  # OpenAI chat: send the usage chunk even when not asked
    gzip: bool = False  # OpenAI chat, plain: the answer gzip-compressed (Content-Encoding: gzip)
    encoded_answer: tuple[str, bytes] | None = None  # OpenAI chat: these bytes under this Content-Encoding
    boundless: tuple[bytes, int] | None = None  # stream: after the first event, this line this many times, no blank line
    # OpenAI chat stream: after the finish event (which completes the tool calls the governor
    # then admits), this event this many times: an upstream flooding while a call is held
    after_finish: tuple[bytes, int] | None = None
    # stream: stop after max_tokens text deltas when the request names one (an honest provider;
    # one delta is one token), counting the usage it reports accordingly. False: the request's
    # max_tokens is ignored, every chunk is sent and its usage reported (a hostile upstream).
    honour_max_tokens: bool = False


@dataclass
class StreamLog:
    path: str
    events_planned: int
    events_sent: int = 0
    completed: bool = False
    disconnected: bool = False  # the client went away before the stream completed
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw bytes when not JSON


def _split(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text) or 1))
    size = -(-len(text) // n)
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _honoured(b: Behaviour, body: Any) -> Behaviour:
    """`b` cut to the request's max_tokens (one text delta per token) when it honours it."""
    limit = None
    if isinstance(body, dict):  # whichever output-limit field the API has (chat, Responses, Anthropic)
        limit = next((body[k] for k in ("max_completion_tokens", "max_tokens", "max_output_tokens")
                      if body.get(k) is not None), None)
    if not b.honour_max_tokens or not isinstance(limit, int) or limit >= b.chunks:
        return b
    pieces = _split(b.text, b.chunks)
    return dataclasses.replace(b, text="".join(pieces[:limit]), chunks=limit, output_tokens=limit)


class MockLLM:
    """An aiohttp server speaking the OpenAI and Anthropic APIs from scripted behaviours."""

    def __init__(self, tls: TLSMaterial | None = None) -> None:
        self.tls = tls
        self.default = Behaviour()
        self._queue: list[Behaviour] = []
        self.requests: list[Recorded] = []
        self.streams: list[StreamLog] = []
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._transports: set[asyncio.Transport] = set()

    # --- control ---
    def script(self, *behaviours: Behaviour) -> None:
        self._queue.extend(behaviours)

    def reset(self) -> None:
        self._queue.clear()
        self.requests.clear()
        self.streams.clear()
        self.default = Behaviour()

    def _next(self) -> Behaviour:
        return self._queue.pop(0) if self._queue else self.default

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{prefix:.*}chat/completions", self._chat)
        app.router.add_post("/{prefix:.*}responses", self._responses)
        app.router.add_post("/{prefix:.*}v1/completions", self._completions)
        app.router.add_post("/{prefix:.*}v1/embeddings", self._embeddings)
        app.router.add_post("/{prefix:.*}v1/messages", self._messages)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, host, port, ssl_context=self.tls.server_context() if self.tls else None
        )
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- plumbing ---
    async def _record(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw
        self.requests.append(Recorded(request.method, request.path_qs, dict(request.headers), body))
        return body

    async def _other(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST":  # a model path spelled otherwise: served as a lenient server would
            route = re.sub("/+", "/", urllib.parse.unquote(request.raw_path.split("?", 1)[0])).rstrip("/").lower()
            route = posixpath.normpath(route) if "/." in route else route
            for suffix, handler in (("/chat/completions", self._chat), ("/responses", self._responses),
                                    ("/completions", self._completions), ("/embeddings", self._embeddings),
                                    ("/v1/messages", self._messages)):
                if route.endswith(suffix):
                    return await handler(request)
        await self._record(request)
        return web.json_response({"ok": True, "path": request.path})

    async def _stream(self, request: web.Request, b: Behaviour, events: list[bytes]) -> web.StreamResponse:
        log = StreamLog(request.path, len(events))
        self.streams.append(log)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
        await resp.prepare(request)
        try:
            for i, event in enumerate(events):
                if b.truncate_after is not None and i == b.truncate_after:
                    transport = request.transport
                    if transport is not None:
                        transport.abort()
                    return resp
                if b.stall_after is not None and i == b.stall_after:
                    await asyncio.sleep(b.stall_for)
                if b.garbage_sse and i == max(1, len(events) // 2):
                    await resp.write(b"data: {not json at all\n\n\xff\xfe garbage \n\n")
                await resp.write(event)
                log.events_sent += 1
                if b.chunk_delay:
                    await asyncio.sleep(b.chunk_delay)
            await resp.write_eof()
            log.completed = True
        except ConnectionError:
            log.disconnected = True  # the client (the governor, after a cut) went away
        except asyncio.CancelledError:
            log.disconnected = True
            raise
        finally:
            log.done.set()
        return resp

    @staticmethod
    def _sse(data: Any, event: str | None = None) -> bytes:
        head = f"event: {event}\n".encode() if event else b""
        return head + b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n"

    # --- OpenAI chat completions ---
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        b = self._next()
        if b.hang:
            await asyncio.sleep(b.hang)
        if b.status != 200:
            return web.json_response(
                {"error": {"message": "mock upstream error", "type": "server_error", "code": None}},
                status=b.status,
            )
        if b.encoded_answer is not None:  # as given, whatever was asked (a stream, identity)
            coding, raw = b.encoded_answer
            streamed = isinstance(body, dict) and body.get("stream")
            return web.Response(body=raw, headers={"Content-Encoding": coding,
                                                   "Content-Type": "text/event-stream" if streamed else "application/json"})
        model = body.get("model", "mock-model") if isinstance(body, dict) else "mock-model"
        b = _honoured(b, body)
        usage = {
            "prompt_tokens": b.input_tokens,
            "completion_tokens": b.output_tokens,
            "total_tokens": b.input_tokens + b.output_tokens,
            "prompt_tokens_details": {"cached_tokens": b.cached_tokens},
        }
        base = {"id": "chatcmpl-mock", "created": 1700000000, "model": model}
        if not (isinstance(body, dict) and body.get("stream")):
            message: dict[str, Any] = {"role": "assistant", "content": b.text if not b.tool_calls else None}
            if b.tool_calls:
                message["tool_calls"] = [
                    {"id": f"call_{i}", "type": "function",
                     "function": {"name": name, "arguments": orjson.dumps(args).decode()}}
                    for i, (name, args) in enumerate(b.tool_calls)
                ]
            answer = {
                **base, "object": "chat.completion",
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if b.tool_calls else "stop", "logprobs": None}],
                "usage": usage,
            }
            if b.gzip:
                import gzip

                return web.Response(body=gzip.compress(orjson.dumps(answer)),
                                    headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
            return web.json_response(answer)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) or b.stream_usage_always
        chunk = {**base, "object": "chat.completion.chunk"}
        events = [self._sse({**chunk, "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})]
        if b.boundless is not None:
            line, times = b.boundless
            events += [line] * times
        pieces = _split(b.text, b.chunks)
        for n, piece in enumerate(pieces, 1):
            event: dict[str, Any] = {**chunk, "choices": [
                {"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            if b.progressive_usage and include_usage:
                out = b.output_tokens * n // len(pieces)
                event["usage"] = {**usage, "completion_tokens": out, "total_tokens": b.input_tokens + out}
            events.append(self._sse(event))
        for i, (name, args) in enumerate(b.tool_calls):
            arguments = orjson.dumps(args).decode()
            half = len(arguments) // 2
            events.append(self._sse({**chunk, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "id": f"call_{i}", "type": "function",
                 "function": {"name": name, "arguments": arguments[:half]}}]}, "finish_reason": None}]}))
            events.append(self._sse({**chunk, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": arguments[half:]}}]}, "finish_reason": None}]}))
        events.append(self._sse({**chunk, "choices": [
            {"index": 0, "delta": {}, "finish_reason": "tool_calls" if b.tool_calls else "stop"}]}))
        if b.after_finish is not None:
            flood, times = b.after_finish
            events += [flood] * times
        if include_usage:
            events.append(self._sse({**chunk, "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        return await self._stream(request, b, events)

    # --- OpenAI legacy completions and embeddings ---
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        b = self._next()
        model = body.get("model", "mock-model") if isinstance(body, dict) else "mock-model"
        usage = {"prompt_tokens": b.input_tokens, "completion_tokens": b.output_tokens,
                 "total_tokens": b.input_tokens + b.output_tokens}
        base = {"id": "cmpl-mock", "object": "text_completion", "created": 1700000000, "model": model}
        if not (isinstance(body, dict) and body.get("stream")):
            return web.json_response({**base, "choices": [{"index": 0, "text": b.text, "logprobs": None,
                                                           "finish_reason": "stop"}], "usage": usage})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = [self._sse({**base, "choices": [{"index": 0, "text": piece, "logprobs": None,
                                                  "finish_reason": None}]}) for piece in _split(b.text, b.chunks)]
        events.append(self._sse({**base, "choices": [{"index": 0, "text": "", "logprobs": None,
                                                      "finish_reason": "stop"}]}))
        if include_usage:
            events.append(self._sse({**base, "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        return await self._stream(request, b, events)

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        b = self._next()
        model = body.get("model", "mock-model") if isinstance(body, dict) else "mock-model"
        return web.json_response({"object": "list", "model": model,
                                  "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 0.125]}],
                                  "usage": {"prompt_tokens": b.input_tokens, "total_tokens": b.input_tokens}})

    # --- OpenAI responses ---
    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        b = self._next()
        if b.hang:
            await asyncio.sleep(b.hang)
        if b.status != 200:
            return web.json_response(
                {"error": {"message": "mock upstream error", "type": "server_error", "code": None}},
                status=b.status,
            )
        model = body.get("model", "mock-model") if isinstance(body, dict) else "mock-model"
        b = _honoured(b, body)
        usage = {
            "input_tokens": b.input_tokens,
            "input_tokens_details": {"cached_tokens": b.cached_tokens},
            "output_tokens": b.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": b.input_tokens + b.output_tokens,
        }
        text_item = {"id": "msg_mock", "type": "message", "role": "assistant", "status": "completed",
                     "content": [{"type": "output_text", "text": b.text, "annotations": []}]}
        calls = [{"id": f"fc_{i}", "type": "function_call", "call_id": f"call_{i}", "name": name,
                  "arguments": orjson.dumps(args).decode(), "status": "completed"}
                 for i, (name, args) in enumerate(b.tool_calls)]
        output = [text_item, *calls]

        def response(status: str, out: list, use: Any) -> dict[str, Any]:
            return {"id": "resp_mock", "object": "response", "created_at": 1700000000, "model": model,
                    "status": status, "output": out, "usage": use, "parallel_tool_calls": True,
                    "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None,
                    "instructions": None, "metadata": {}, "temperature": 1.0, "top_p": 1.0}

        if not (isinstance(body, dict) and body.get("stream")):
            return web.json_response(response("completed", output, usage))
        seq = iter(range(10_000))
        events = [self._sse({"type": "response.created", "sequence_number": next(seq),
                             "response": response("in_progress", [], None)}, "response.created")]
        events.append(self._sse({"type": "response.output_item.added", "sequence_number": next(seq),
                                 "output_index": 0, "item": {**text_item, "status": "in_progress", "content": []}},
                                "response.output_item.added"))
        for piece in _split(b.text, b.chunks):
            events.append(self._sse({"type": "response.output_text.delta", "sequence_number": next(seq),
                                     "item_id": "msg_mock", "output_index": 0, "content_index": 0,
                                     "delta": piece, "logprobs": []}, "response.output_text.delta"))
        events.append(self._sse({"type": "response.output_item.done", "sequence_number": next(seq),
                                 "output_index": 0, "item": text_item}, "response.output_item.done"))
        for i, call in enumerate(calls, 1):
            events.append(self._sse({"type": "response.output_item.added", "sequence_number": next(seq),
                                     "output_index": i, "item": {**call, "arguments": "", "status": "in_progress"}},
                                    "response.output_item.added"))
            events.append(self._sse({"type": "response.function_call_arguments.delta",
                                     "sequence_number": next(seq), "item_id": call["id"], "output_index": i,
                                     "delta": call["arguments"]}, "response.function_call_arguments.delta"))
            events.append(self._sse({"type": "response.output_item.done", "sequence_number": next(seq),
                                     "output_index": i, "item": call}, "response.output_item.done"))
        events.append(self._sse({"type": "response.completed", "sequence_number": next(seq),
                                 "response": response("completed", output, usage)}, "response.completed"))
        return await self._stream(request, b, events)

    # --- Anthropic messages ---
    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        b = self._next()
        if b.hang:
            await asyncio.sleep(b.hang)
        if b.status != 200:
            return web.json_response(
                {"type": "error", "error": {"type": "api_error", "message": "mock upstream error"}},
                status=b.status,
            )
        model = body.get("model", "mock-model") if isinstance(body, dict) else "mock-model"
        b = _honoured(b, body)
        usage = {"input_tokens": b.input_tokens - b.cached_tokens, "output_tokens": b.output_tokens,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": b.cached_tokens}
        blocks: list[dict[str, Any]] = [{"type": "text", "text": b.text}]
        blocks += [{"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args}
                   for i, (name, args) in enumerate(b.tool_calls)]
        stop = "tool_use" if b.tool_calls else "end_turn"
        message = {"id": "msg_mock", "type": "message", "role": "assistant", "model": model,
                   "content": blocks, "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not (isinstance(body, dict) and body.get("stream")):
            return web.json_response(message)
        events = [self._sse({"type": "message_start", "message": {
            **message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}},
            "message_start")]
        events.append(self._sse({"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}, "content_block_start"))
        events.append(self._sse({"type": "ping"}, "ping"))
        pieces = _split(b.text, b.chunks)
        for n, piece in enumerate(pieces, 1):
            events.append(self._sse({"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": piece}}, "content_block_delta"))
            if b.progressive_usage:
                events.append(self._sse({"type": "message_delta", "delta": {"stop_reason": None,
                                         "stop_sequence": None},
                                         "usage": {"output_tokens": b.output_tokens * n // len(pieces)}},
                                        "message_delta"))
        events.append(self._sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        for i, (name, args) in enumerate(b.tool_calls, 1):
            events.append(self._sse({"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {}}}, "content_block_start"))
            arguments = orjson.dumps(args).decode()
            events.append(self._sse({"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": arguments}}, "content_block_delta"))
            events.append(self._sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
        events.append(self._sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                 "usage": {"output_tokens": b.output_tokens}}, "message_delta"))
        events.append(self._sse({"type": "message_stop"}, "message_stop"))
        return await self._stream(request, b, events)


async def start_mock(tls: TLSMaterial | None = None, port: int = 0) -> MockLLM:
    mock = MockLLM(tls)
    await mock.start(port=port)
    return mock
