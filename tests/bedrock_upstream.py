"""A loopback mock of Amazon Bedrock Runtime (aiohttp, over TLS) for the boto3 tests.

It speaks Bedrock's wire format as boto3 parses it: Converse and InvokeModel JSON answers
with their usage fields and the `x-amzn-bedrock-*-token-count` headers, and the streamed
operations as `application/vnd.amazon.eventstream` frames (written with botocore's framing
rules: prelude, string headers, payload, CRC32s; each event's payload carries the random
`p` padding field Bedrock adds). Errors are `{"message"}` with `x-amzn-ErrorType`.

Every request's SigV4 signature is checked with botocore's own signer and the test
credentials (`signature_ok` on each recorded request): a request the governor changed in
any signed part (its body above all) fails the check, and the mock then answers 403
InvalidSignatureException as Bedrock does.

Routes are parsed from the raw path (the model id arrives percent-encoded, `%3A`, ARNs with
`%2F`); what each answer is comes from a queued `Answer`.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import re
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import orjson
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from governor.adapters import eventstream
from tests.upstreams import TLSMaterial

ACCESS_KEY = "AKIDEXAMPLEGOVERNOR0"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
REGION = "us-east-1"
_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                   r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$")
METRICS = "amazon-bedrock-invocationMetrics"
OVERSIZE_TAIL = 65536
_ROUTE = re.compile(r"^/model/(.+)/(converse|converse-stream|invoke|invoke-with-response-stream)$")


@dataclass
class Answer:
    text: str = "Hello from the mock."
    input_tokens: int = 20
    output_tokens: int = 10
    tool: tuple[str, dict[str, Any]] | None = None  # a tool call the model asks for
    chunks: int = 3  # text pieces of a stream
    usage: bool = True  # report usage (body fields, headers, metrics)
    chunk_delay: float = 0.0
    corrupt: str | None = None  # "crc", "truncate", "oversize", "garbage": a broken event stream
    status: int = 200


@dataclass
class Seen:
    path: str
    model_id: str
    operation: str
    headers: dict[str, str]
    body: Any
    raw: bytes
    signature_ok: bool


@dataclass
class StreamLog:
    frames: int = 0
    completed: bool = False
    disconnected: bool = False


def verify_sigv4(method: str, host: str, raw_path: str, headers: Any, body: bytes) -> bool:
    """The request's Authorization recomputed with botocore's signer over what arrived."""
    match = _AUTH.match(headers.get("Authorization", ""))
    if match is None or match[1] != ACCESS_KEY or match[4] != "bedrock":
        return False
    signed = {name: ", ".join(headers.getall(name)) for name in match[5].split(";") if name in headers}
    if len(signed) != len(match[5].split(";")):
        return False
    request = AWSRequest(method=method, url=f"https://{host}{raw_path}", headers=signed, data=body)
    request.context["timestamp"] = headers.get("X-Amz-Date", "")
    signer = SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "bedrock", match[3])
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    return hmac.compare_digest(expected, match[6])


def _padded(value: dict[str, Any]) -> bytes:
    return orjson.dumps({**value, "p": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"[: 4 + len(value) % 20]})


def _pieces(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text) or 1))
    size = -(-len(text) // n)
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def family(model_id: str) -> str:
    name = model_id.rsplit("/", 1)[-1]
    for candidate in (name, name.partition(".")[2]):
        for prefix, fam in (("amazon.titan-text", "titan"), ("anthropic.", "anthropic"), ("meta.", "llama")):
            if candidate.startswith(prefix):
                return fam
    return "unknown"


class MockBedrock:
    def __init__(self, tls: TLSMaterial) -> None:
        self.tls = tls
        self.queue: list[Answer] = []
        self.requests: list[Seen] = []
        self.streams: list[StreamLog] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    def script(self, *answers: Answer) -> None:
        self.queue.extend(answers)

    def reset(self) -> None:
        self.queue.clear()
        self.requests.clear()
        self.streams.clear()

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls.server_context())
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.endpoint

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @staticmethod
    def _error(status: int, code: str, message: str) -> web.Response:
        return web.Response(status=status, body=orjson.dumps({"message": message}),
                            headers={"Content-Type": "application/json", "x-amzn-ErrorType": f"{code}:http://internal"})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        raw_path = request.raw_path.split("?", 1)[0]
        match = _ROUTE.match(raw_path)
        ok = verify_sigv4(request.method, request.headers.get("Host", ""), raw_path, request.headers, raw)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        model_id, operation = (unquote(match[1]), match[2]) if match else ("", "")
        self.requests.append(Seen(raw_path, model_id, operation, dict(request.headers), body, raw, ok))
        if not ok:
            return self._error(403, "InvalidSignatureException",
                               "The request signature we calculated does not match the signature you provided.")
        if match is None or request.method != "POST":
            return self._error(404, "UnknownOperationException", "unknown operation")
        answer = self.queue.pop(0) if self.queue else Answer()
        if answer.status != 200:
            return self._error(answer.status, "ThrottlingException" if answer.status == 429 else "ValidationException",
                               "mock upstream error")
        if operation == "converse":
            return self._converse(answer)
        if operation == "invoke":
            return self._invoke(answer, family(model_id))
        frames = (self._converse_frames(answer) if operation == "converse-stream"
                  else self._invoke_frames(answer, family(model_id)))
        return await self._stream(request, answer, frames, operation)

    # --- plain ------------------------------------------------------------------------------

    @staticmethod
    def _usage_headers(answer: Answer) -> dict[str, str]:
        if not answer.usage:
            return {}
        return {"X-Amzn-Bedrock-Input-Token-Count": str(answer.input_tokens),
                "X-Amzn-Bedrock-Output-Token-Count": str(answer.output_tokens),
                "X-Amzn-Bedrock-Invocation-Latency": "321"}

    def _converse(self, answer: Answer) -> web.Response:
        content: list[dict[str, Any]] = [{"text": answer.text}]
        if answer.tool:
            content.append({"toolUse": {"toolUseId": "tooluse_mock1", "name": answer.tool[0], "input": answer.tool[1]}})
        data: dict[str, Any] = {"output": {"message": {"role": "assistant", "content": content}},
                                "stopReason": "tool_use" if answer.tool else "end_turn", "metrics": {"latencyMs": 321}}
        if answer.usage:
            data["usage"] = {"inputTokens": answer.input_tokens, "outputTokens": answer.output_tokens,
                             "totalTokens": answer.input_tokens + answer.output_tokens}
        return web.Response(body=orjson.dumps(data), headers={"Content-Type": "application/json",
                                                              "x-amzn-RequestId": "req-mock"})

    def _invoke(self, answer: Answer, fam: str) -> web.Response:
        if fam == "anthropic":
            content: list[dict[str, Any]] = [{"type": "text", "text": answer.text}]
            if answer.tool:
                content.append({"type": "tool_use", "id": "toolu_mock1", "name": answer.tool[0], "input": answer.tool[1]})
            data: dict[str, Any] = {"id": "msg_bdrk_mock", "type": "message", "role": "assistant",
                                    "model": "claude-3-5-haiku-20241022", "content": content,
                                    "stop_reason": "tool_use" if answer.tool else "end_turn", "stop_sequence": None}
            if answer.usage:
                data["usage"] = {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens}
        elif fam == "llama":
            data = {"generation": answer.text, "stop_reason": "stop"}
            if answer.usage:
                data.update(prompt_token_count=answer.input_tokens, generation_token_count=answer.output_tokens)
        else:
            result: dict[str, Any] = {"outputText": answer.text, "completionReason": "FINISH"}
            data = {"results": [result]}
            if answer.usage:
                result["tokenCount"] = answer.output_tokens
                data["inputTextTokenCount"] = answer.input_tokens
        return web.Response(body=orjson.dumps(data), headers={"Content-Type": "application/json",
                                                              "x-amzn-RequestId": "req-mock",
                                                              **self._usage_headers(answer)})

    # --- event streams --------------------------------------------------------------------------

    def _converse_frames(self, answer: Answer) -> list[bytes]:
        frames = [eventstream.event("messageStart", _padded({"role": "assistant"}))]
        for piece in _pieces(answer.text, answer.chunks):
            frames.append(eventstream.event("contentBlockDelta", _padded({"contentBlockIndex": 0,
                                                                          "delta": {"text": piece}})))
        frames.append(eventstream.event("contentBlockStop", _padded({"contentBlockIndex": 0})))
        if answer.tool:
            frames.append(eventstream.event("contentBlockStart", _padded({
                "contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tooluse_mock1", "name": answer.tool[0]}}})))
            args = orjson.dumps(answer.tool[1]).decode()
            for piece in _pieces(args, 2):
                frames.append(eventstream.event("contentBlockDelta", _padded({
                    "contentBlockIndex": 1, "delta": {"toolUse": {"input": piece}}})))
            frames.append(eventstream.event("contentBlockStop", _padded({"contentBlockIndex": 1})))
        frames.append(eventstream.event("messageStop", _padded({"stopReason": "tool_use" if answer.tool else "end_turn"})))
        metadata: dict[str, Any] = {"metrics": {"latencyMs": 321}}
        if answer.usage:
            metadata["usage"] = {"inputTokens": answer.input_tokens, "outputTokens": answer.output_tokens,
                                 "totalTokens": answer.input_tokens + answer.output_tokens}
        frames.append(eventstream.event("metadata", _padded(metadata)))
        return frames

    def _invoke_frames(self, answer: Answer, fam: str) -> list[bytes]:
        metrics = {"inputTokenCount": answer.input_tokens, "outputTokenCount": answer.output_tokens,
                   "invocationLatency": 321, "firstByteLatency": 50}
        pieces = _pieces(answer.text, answer.chunks)
        chunks: list[dict[str, Any]] = []
        if fam == "anthropic":
            start_usage = {"input_tokens": answer.input_tokens, "output_tokens": 1} if answer.usage else {}
            chunks.append({"type": "message_start", "message": {
                "id": "msg_bdrk_mock", "type": "message", "role": "assistant", "model": "claude-3-5-haiku-20241022",
                "content": [], "stop_reason": None, "stop_sequence": None, **({"usage": start_usage} if start_usage else {})}})
            chunks.append({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            chunks += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
                       for p in pieces]
            chunks.append({"type": "content_block_stop", "index": 0})
            if answer.tool:
                chunks.append({"type": "content_block_start", "index": 1, "content_block": {
                    "type": "tool_use", "id": "toolu_mock1", "name": answer.tool[0], "input": {}}})
                chunks.append({"type": "content_block_delta", "index": 1, "delta": {
                    "type": "input_json_delta", "partial_json": orjson.dumps(answer.tool[1]).decode()}})
                chunks.append({"type": "content_block_stop", "index": 1})
            delta: dict[str, Any] = {"type": "message_delta", "delta": {
                "stop_reason": "tool_use" if answer.tool else "end_turn", "stop_sequence": None}}
            if answer.usage:
                delta["usage"] = {"output_tokens": answer.output_tokens}
            chunks.append(delta)
            last: dict[str, Any] = {"type": "message_stop"}
        elif fam == "llama":
            for i, p in enumerate(pieces):
                chunks.append({"generation": p, "prompt_token_count": answer.input_tokens if i == 0 and answer.usage else None,
                               "generation_token_count": i + 1 if answer.usage else None, "stop_reason": None})
            last = {"generation": "", "prompt_token_count": None,
                    "generation_token_count": answer.output_tokens if answer.usage else None, "stop_reason": "stop"}
        else:
            for i, p in enumerate(pieces):
                chunk: dict[str, Any] = {"outputText": p, "index": 0, "completionReason": None}
                if answer.usage:
                    chunk["totalOutputTextTokenCount"] = i + 1
                    if i == 0:
                        chunk["inputTextTokenCount"] = answer.input_tokens
                chunks.append(chunk)
            last = {"outputText": "", "index": 0, "completionReason": "FINISH"}
            if answer.usage:
                last["totalOutputTextTokenCount"] = answer.output_tokens
        if answer.usage:
            last[METRICS] = metrics
        chunks.append(last)
        return [eventstream.event("chunk", _padded({"bytes": base64.b64encode(orjson.dumps(c)).decode()}))
                for c in chunks]

    async def _stream(self, request: web.Request, answer: Answer, frames: list[bytes],
                      operation: str) -> web.StreamResponse:
        log = StreamLog()
        self.streams.append(log)
        headers = {"Content-Type": eventstream.CONTENT_TYPE, "x-amzn-RequestId": "req-mock"}
        if operation == "invoke-with-response-stream":
            headers["X-Amzn-Bedrock-Content-Type"] = "application/json"
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        if answer.corrupt == "crc":
            second = bytearray(frames[1])
            second[-6] ^= 0xFF  # a payload byte: the message CRC no longer matches
            frames = [frames[0], bytes(second)] + frames[2:]
        elif answer.corrupt == "truncate":
            frames = frames[:-1] + [frames[-1][: len(frames[-1]) // 2]]
        elif answer.corrupt == "oversize":
            huge = 64 * 1024 * 1024
            prelude = huge.to_bytes(4, "big") + (0).to_bytes(4, "big")
            prelude += zlib.crc32(prelude).to_bytes(4, "big")
            frames = frames[:2] + [prelude + b"\0" * OVERSIZE_TAIL] * 8
        elif answer.corrupt == "garbage":
            frames = frames[:1] + [b"data: not an event stream\n\n" * 4]
        try:
            for frame in frames:
                # split each frame across writes: the governor must reassemble frames cut anywhere
                cut = max(1, len(frame) // 3)
                for part in (frame[:cut], frame[cut:]):
                    await response.write(part)
                log.frames += 1
                if answer.chunk_delay:
                    await asyncio.sleep(answer.chunk_delay)
            await response.write_eof()
            log.completed = True
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            log.disconnected = True
            raise
        return response


async def start_bedrock(tls: TLSMaterial) -> MockBedrock:
    mock = MockBedrock(tls)
    await mock.start()
    return mock


__all__ = ["MockBedrock", "Answer", "Seen", "StreamLog", "start_bedrock", "ACCESS_KEY", "SECRET_KEY", "REGION",
           "verify_sigv4"]
