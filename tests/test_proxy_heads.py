"""HTTP/1 heads are bounded (issue 20, hostile agent and upstream), through the real proxy
and runtime: mitmproxy held every byte of a head until its blank line, so an endless header
line (from the agent, or from an upstream) grew the governor's memory until a deadline, and
gigabytes fit in one on loopback. Past governor.proxy.heads.MAX_HEAD_BYTES (1 MiB) the
client gets 431 and is disconnected; an upstream is disconnected and the agent gets a 502.
"""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from governor.proxy.heads import MAX_HEAD_BYTES
from governor.proxy.server import Settings, serve
from tests.proxy_harness import AGENT_NAMED
from tests.upstreams import MockLLM

FLOOD = 32 * MAX_HEAD_BYTES  # what the hostile side is ready to send
PIECE = b"a" * (64 * 1024)
CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def world(tmp_path):
    mock = MockLLM()
    await mock.start()
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp_path / "data",
                                   tick_interval=0))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    yield running, mock, agent
    await agent.aclose()
    await running.stop()
    await mock.stop()


def proxy_address(running) -> tuple[str, int]:
    host, port = running.proxy_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def test_a_client_sending_an_endless_header_gets_431_and_is_disconnected(world):
    running, mock, agent = world
    reader, writer = await asyncio.open_connection(*proxy_address(running))
    writer.write(f"POST {mock.base_url}/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Flood: ".encode())
    sent, reset = 0, False
    try:
        while sent < FLOOD:
            writer.write(PIECE)
            await asyncio.wait_for(writer.drain(), 10)
            sent += len(PIECE)
    except (ConnectionError, OSError):
        reset = True  # disconnected mid-flood: what the bound does
    try:
        answer = await asyncio.wait_for(reader.read(), 10)  # the proxy's 431, then its close
    except (ConnectionError, OSError):
        answer, reset = b"", True  # the 431 lost to the reset (the flood still unread at the close)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 431") or reset, answer[:200]
    assert sent < FLOOD  # cut off at the bound, not after the whole flood
    assert mock.requests == []  # nothing reached the upstream
    ok = await agent.post(f"{mock.base_url}/v1/chat/completions", json=CHAT, headers={"ADL-Session": "honest"})
    assert ok.status_code == 200  # the proxy serves others as before


async def test_an_upstream_sending_an_endless_header_is_disconnected_and_the_agent_gets_502(world):
    running, mock, agent = world
    upstream_sent = 0
    upstream_gone = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def endless_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal upstream_sent
        writers.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Flood: ")
        try:
            while upstream_sent < FLOOD:
                writer.write(PIECE)
                await writer.drain()
                upstream_sent += len(PIECE)
        except (ConnectionError, OSError):
            upstream_gone.set()

    server = await asyncio.start_server(endless_head, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        # before: read until the upstream timeout (300 s), the whole flood held in memory
        answer = await asyncio.wait_for(
            agent.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=orjson.dumps(CHAT),
                       headers={"ADL-Session": "flooded", "content-type": "application/json"}), 15)
        assert answer.status_code == 502, answer.text[:200]
        await asyncio.wait_for(upstream_gone.wait(), 10)  # disconnected by the governor
        assert upstream_sent < FLOOD  # at the bound (and what socket buffers held), not after the flood
    finally:
        for writer in writers:
            writer.transport.abort()
        server.close()
    # the exchange released what it held: the next call of the session is served
    ok = await agent.post(f"{mock.base_url}/v1/chat/completions", json=CHAT, headers={"ADL-Session": "flooded"})
    assert ok.status_code == 200
