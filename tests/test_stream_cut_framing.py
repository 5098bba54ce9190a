"""A cut stream ends promptly for the client, however the upstream framed its body and
whatever it had sent already.

The relay forwards whole events and, once a stream is cut, the adapter's terminal event in
place of the rest: the body the client gets is not the upstream's. An upstream that framed
its stream with a Content-Length (rather than chunking it) had that length go out to the
client unchanged, so a cut body ended short of it and the client waited for bytes that never
came (a read timeout instead of the governor's error). Each synchronous cut cause, in each
framing the relay knows (SSE, NDJSON, Bedrock's binary event stream), is driven here from a
raw loopback upstream that sends the whole answer in one write and keeps its connection
open (the burst), Content-Length framed or chunked; and from one still writing, which must
be disconnected. Over HTTP/2 (client and upstream, tests/h2_upstream.py) the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from dataclasses import dataclass, field

import httpx2
import orjson
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.adapters import eventstream, sse
from governor.passport import sign_passport
from governor.proxy.server import Settings, serve
from tests.h2_upstream import H2Stream, H2Upstream
from tests.proxy_harness import AGENT_NAMED
from tests.upstreams import TLSMaterial, make_tls

pytestmark = pytest.mark.asyncio(loop_scope="module")

CAP = 3000  # the session's token budget
LIMIT = 2000  # sse.MAX_EVENT_BYTES in these tests: what the governor holds of one event
PROMPT = 5.0  # seconds: a cut answer ends well within this (the client's timeout is 20)
PASSPORT = {
    "adl_spec": "0.4.0", "name": "cut-framing", "description": "cut streams", "version": "1.0.0",
    "id": "https://example.com/agents/cut-framing", "data_classification": {"sensitivity": "internal"},
    "lifecycle": {"status": "active"},
    "permissions": {"resource_limits": {"budget": {"tokens": {"per_session": CAP}}}},
}
HAIKU = "anthropic.claude-3-5-haiku-20241022-v1:0"
CONVERSE, EVENTSTREAM = f"/model/{HAIKU}/converse-stream", "application/vnd.amazon.eventstream"
MORE = 2000  # what a live upstream sends after its answer's events, 20 ms apart


@dataclass
class RawAnswer:
    """One answer of the raw upstream: `lead` then `rest`, framed by Content-Length, by
    chunks (one per event) or by the close; sent in one write (the burst) or, `live`, the
    lead then the rest event by event with a delay, then `more` forever."""

    lead: list[bytes]
    rest: list[bytes]
    content_type: str
    framing: str = "length"  # "length" | "chunked"
    live: bool = False
    more: bytes = b""


@dataclass
class RawLog:
    sent_all: bool = False
    disconnected: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)


class RawUpstream:
    """HTTP/1.1 over TLS on loopback, byte for byte as scripted (asyncio streams: aiohttp
    picks its own framing)."""

    def __init__(self, tls: TLSMaterial) -> None:
        self.tls = tls
        self.answers: list[RawAnswer] = []
        self.logs: list[RawLog] = []
        self.server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"https://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls.server_context())

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        log = RawLog()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            answer = self.answers.pop(0)
            self.logs.append(log)
            parts = answer.lead + answer.rest
            if answer.framing == "length":  # a live answer's length counts what it would go on sending
                more = len(answer.more) * MORE if answer.live else 0
                fields = b"content-length: %d\r\n" % (sum(map(len, parts)) + more)
                framed = parts
            else:
                fields = b"transfer-encoding: chunked\r\n"
                framed = [b"%x\r\n%s\r\n" % (len(p), p) for p in parts] + [b"0\r\n\r\n"]
            head_out = b"HTTP/1.1 200 OK\r\ncontent-type: " + answer.content_type.encode() + b"\r\n" + fields + b"\r\n"
            if not answer.live:
                writer.write(head_out + b"".join(framed))  # the whole answer, before any cut can land
                await writer.drain()
                log.sent_all = True
                await asyncio.wait_for(reader.read(), 30)  # kept open until the proxy lets go
                log.disconnected = True
                return
            lead = len(answer.lead)
            writer.write(head_out + b"".join(framed[:lead]))
            await writer.drain()
            body = framed[lead:-1] if answer.framing == "chunked" else framed[lead:]
            more = b"%x\r\n%s\r\n" % (len(answer.more), answer.more) if answer.framing == "chunked" else answer.more
            for piece in body + [more] * MORE:  # far past any cut
                await asyncio.sleep(0.02)
                if reader.at_eof():
                    break
                writer.write(piece)
                await writer.drain()
            log.disconnected = reader.at_eof()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            log.disconnected = True
        except asyncio.TimeoutError:
            pass
        finally:
            log.done.set()
            writer.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cut-framing")
    tls = make_tls(tmp / "tls")
    raw, h2 = RawUpstream(tls), H2Upstream(tls)
    await raw.start()
    await h2.start()
    passport = tmp / "passport.json"
    passport.write_text(json.dumps(sign_passport(PASSPORT, Ed25519PrivateKey.generate())))
    running = await serve(Settings(**AGENT_NAMED, passport=passport, listen=("127.0.0.1", 0), control=None,
                                   data_dir=tmp / "data", upstream_ca=tls.ca_file, tick_interval=0))
    yield running, raw, h2
    await running.stop()
    await raw.stop()
    await h2.stop()


@pytest.fixture(autouse=True)
def small_events(monkeypatch, env):
    monkeypatch.setattr(sse, "MAX_EVENT_BYTES", LIMIT)
    env[1].answers.clear()
    env[1].logs.clear()
    env[2].reset()


# --- the answers ----------------------------------------------------------------------------


def _sse(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"


def anthropic(cause: str) -> tuple[list[bytes], list[bytes]]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1}}
    lead = [_sse("message_start", {"type": "message_start", "message": message}),
            _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}})]
    deltas = [_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": "abcd"}}) for _ in range(4)]
    end = [_sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
           _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                  "usage": {"output_tokens": 4000 if cause == "budget" else 4}}),
           _sse("message_stop", {"type": "message_stop"})]
    if cause == "too_large":  # one line that never ends, the last bytes the upstream sends
        return lead, deltas + [b": " + b"x" * (LIMIT + 1000)]
    if cause == "no_boundary":  # whole comment lines, but no blank line ending an event
        return lead, deltas + [b": k\n" * (LIMIT // 4 + 250)]
    return lead, deltas + end  # "budget": the usage at the end crosses the session's cap


def ollama(cause: str) -> tuple[list[bytes], list[bytes]]:
    line = orjson.dumps({"model": "llama3.2", "created_at": "2026-01-01T00:00:00Z",
                         "message": {"role": "assistant", "content": "abcd"}, "done": False}) + b"\n"
    tail = b"this is not json\n" if cause == "unreadable" else b'{"message":"' + b"y" * (LIMIT + 1000)
    return [line], [line] * 3 + [tail]


def bedrock(cause: str) -> tuple[list[bytes], list[bytes]]:
    lead = [eventstream.event("messageStart", b'{"role":"assistant"}')]
    delta = eventstream.event("contentBlockDelta", orjson.dumps({"contentBlockIndex": 0, "delta": {"text": "abcd"}}))
    if cause == "malformed":  # the last frame's message CRC flipped
        bad = bytearray(delta)
        bad[-1] ^= 0xFF
        tail = bytes(bad)
    else:  # "too_large": a prelude claiming more than the governor holds of one frame
        tail = (64 * 1024 * 1024).to_bytes(4, "big") + b"\x00" * 8
    if cause == "flood":  # such frames, 64 KiB of each sent: more than the socket buffers hold
        return lead, [delta] * 3 + [tail + b"\x00" * 65536] * 8
    return lead, [delta] * 3 + [tail]


# path, body, content type, the answer, what the terminal carries, the refusal recorded
CASES = {
    ("sse", "too_large"): ("/v1/messages", anthropic, "text/event-stream", b"event: error", "event_too_large"),
    ("sse", "no_boundary"): ("/v1/messages", anthropic, "text/event-stream", b"event: error", "event_too_large"),
    ("sse", "budget"): ("/v1/messages", anthropic, "text/event-stream", b"event: error", "on_budget_exhausted"),
    ("ndjson", "unreadable"): ("/api/chat", ollama, "application/x-ndjson", b'{"error":', "unreadable_answer"),
    ("ndjson", "too_large"): ("/api/chat", ollama, "application/x-ndjson", b'{"error":', "event_too_large"),
    ("eventstream", "malformed"): (CONVERSE, bedrock, EVENTSTREAM, b"modelStreamErrorException", "event_too_large"),
    ("eventstream", "too_large"): (CONVERSE, bedrock, EVENTSTREAM, b"modelStreamErrorException", "event_too_large"),
    ("eventstream", "flood"): (CONVERSE, bedrock, EVENTSTREAM, b"modelStreamErrorException", "event_too_large"),
}
REQUESTS = {
    "/v1/messages": {"model": "claude-haiku-4-5", "max_tokens": 50, "stream": True,
                     "messages": [{"role": "user", "content": "go"}]},
    "/api/chat": {"model": "llama3.2", "messages": [{"role": "user", "content": "go"}], "stream": True,
                  "options": {"num_predict": 50}},
    CONVERSE: {"messages": [{"role": "user", "content": [{"text": "go"}]}], "inferenceConfig": {"maxTokens": 50}},
}


def refusals(running, session: str) -> list[str]:
    return [e["detail"].get("reason") if e["cause"] == "on_governor_request_refused" else e["cause"]
            for e in running.runtime.record(session)["events"]]


async def stream(running, url: str, body: dict, session: str, http2: bool = False) -> tuple[int, bytes, float, str]:
    async with httpx2.AsyncClient(http2=http2, proxy=running.proxy_url, trust_env=False, timeout=20,
                                  verify=ssl.create_default_context(cafile=str(running.ca_file))) as client:
        started = time.monotonic()
        async with client.stream("POST", url, json=body, headers={"ADL-Session": session,
                                                                  "anthropic-version": "2023-06-01"}) as response:
            data = b"".join([chunk async for chunk in response.aiter_raw()])
        return response.status_code, data, time.monotonic() - started, response.http_version


async def recorded(running, session: str, reason: str) -> list[str]:
    for _ in range(100):  # the relay's cut is recorded by a task of its own
        if reason in (found := refusals(running, session)):
            return found
        await asyncio.sleep(0.05)
    return refusals(running, session)


# --- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("case", list(CASES), ids=["-".join(c) for c in CASES])
async def test_a_burst_cut_ends_promptly_with_the_terminal(env, case, framing, caplog):
    """The upstream sent its whole answer (its end too) before the cut landed, and keeps its
    connection open: the client gets the terminal and a clean end at once, the refusal is
    recorded, and nothing after the cut reached the client. The answer came with its headers,
    while the flow waited for its hook: the end, read already, ends the response (no upstream
    body is left to stop, nothing to warn about). A flood (more than the sockets hold) is cut
    while mitmproxy's reader of the upstream waits to hand over what it read next: the close
    still ends the body, and the upstream is let go."""
    running, raw, _ = env
    path, answer, content_type, terminal, reason = CASES[case]
    lead, rest = answer(case[1])
    raw.answers.append(RawAnswer(lead, rest, content_type, framing))
    session = f"burst-{'-'.join(case)}-{framing}"
    status, data, took, _ = await stream(running, raw.base_url + path, REQUESTS[path], session)
    assert status == 200 and took < PROMPT, (took, data[-300:])
    assert terminal in data, data[-300:]
    assert rest[-1] not in data  # the bad tail (the crossing usage) was not forwarded
    assert reason in await recorded(running, session, reason)
    assert "cannot end" not in caplog.text
    if case[1] == "flood":  # more than the sockets hold: the upstream was still sending, and is let go
        await asyncio.wait_for(raw.logs[0].done.wait(), 10)
        assert raw.logs[0].disconnected
    else:
        assert raw.logs[0].sent_all


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("case", [("sse", "too_large"), ("ndjson", "unreadable"), ("eventstream", "malformed")],
                         ids=["sse", "ndjson", "eventstream"])
async def test_a_live_upstream_is_disconnected_by_the_cut(env, case, framing):
    """An upstream still writing when the cut lands is let go (generation stops), and the
    client gets the terminal promptly, whatever the framing."""
    running, raw, _ = env
    path, answer, content_type, terminal, reason = CASES[case]
    lead, rest = answer(case[1])
    raw.answers.append(RawAnswer(lead, rest, content_type, framing, live=True, more=rest[0]))
    session = f"live-{case[0]}-{framing}"
    status, data, took, _ = await stream(running, raw.base_url + path, REQUESTS[path], session)
    assert status == 200 and took < PROMPT and terminal in data, (took, data[-300:])
    await asyncio.wait_for(raw.logs[0].done.wait(), 10)
    assert raw.logs[0].disconnected
    assert reason in await recorded(running, session, reason)


@pytest.mark.parametrize("http2", [True, False], ids=["http2", "http1.1"])
@pytest.mark.parametrize("cause", ["too_large", "budget"])
async def test_a_cut_of_a_length_framed_burst_over_http2(env, http2, cause):
    """An HTTP/2 upstream's stream with a content-length, sent whole before the cut (its end
    included): the client (HTTP/2, or HTTP/1.1 to which mitmproxy speaks HTTP/1.1 upstream)
    gets the terminal and a clean end at once."""
    running, _, h2 = env
    tail = b": " + b"x" * (LIMIT + 1000) if cause == "too_large" else b""
    h2.script(H2Stream(deltas=20, output_tokens=4000 if cause == "budget" else None, content_length=True, tail=tail))
    session = f"h2-{cause}-{http2}"
    status, data, took, version = await stream(running, h2.base_url + "/v1/messages",
                                               REQUESTS["/v1/messages"], session, http2)
    assert status == 200 and took < PROMPT and b"event: error" in data, (took, data[-300:])
    assert version == ("HTTP/2" if http2 else "HTTP/1.1") and h2.requests[0][0] == ("2" if http2 else "1.1")
    assert h2.streams[0].events_sent == h2.streams[0].events_planned  # it had sent everything
    reason = "event_too_large" if cause == "too_large" else "on_budget_exhausted"
    assert reason in await recorded(running, session, reason)


async def test_an_uncut_length_framed_stream_is_delivered_whole_and_chunked(env):
    """The framing the client gets for a relayed stream the upstream framed by length: the
    same bytes, chunked (the upstream's Content-Length could not frame a cut one)."""
    running, raw, _ = env
    lead, rest = anthropic("none")
    raw.answers.append(RawAnswer(lead, rest, "text/event-stream", "length"))
    async with httpx2.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=20,
                                  verify=ssl.create_default_context(cafile=str(running.ca_file))) as client:
        response = await client.post(raw.base_url + "/v1/messages", json=REQUESTS["/v1/messages"],
                                     headers={"ADL-Session": "whole", "anthropic-version": "2023-06-01"})
    assert response.status_code == 200 and response.content == b"".join(lead + rest)
    assert "content-length" not in response.headers and response.headers["transfer-encoding"] == "chunked"
    assert refusals(running, "whole") == []
