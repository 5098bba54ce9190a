"""A burst of agent connections that arrives while the governor's event loop is busy (the
fresh-clone run's flaky 256-stream case, tests/test_stream_budget_replicas.py): the kernel
queues every one for the governor to accept (the proxy listens with a wide backlog,
governor/proxy/backlog.py) and each is served through the real proxy. With mitmproxy's own
backlog of 100 the handshakes past the accept queue were dropped, and some reset (a SYN cookie
the kernel no longer honoured): the agent saw ECONNRESET from a governor that never saw it.
The control plane's listener likewise (aiohttp's own backlog is 128): one governor, with its
control plane, serves the module."""

from __future__ import annotations

import asyncio
import select
import socket
import time
from urllib.parse import urlsplit

import orjson
import pytest
import pytest_asyncio

from governor.control.app import CONTROL_MAX_CONNECTIONS
from governor.proxy.server import Settings, serve
from tests.proxy_harness import AGENT_NAMED
from tests.stream_budget_harness import write_passport
from tests.upstreams import MockLLM

pytestmark = pytest.mark.asyncio(loop_scope="module")

BURST = 200  # twice mitmproxy's backlog of 100, past aiohttp's 128


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def governor(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("backlog")
    mock = MockLLM()
    await mock.start()
    running = await serve(Settings(**AGENT_NAMED, passport=write_passport(tmp / "passport.json"),
                                   listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp / "data",
                                   tick_interval=0))
    yield running, mock
    await running.stop()
    await mock.stop()


def connect_all(address: tuple[str, int], count: int, wait: float) -> tuple[list[socket.socket], int]:
    """Start `count` connections at once and wait up to `wait` seconds for their handshakes,
    synchronously: the caller's event loop (the governor's) accepts nothing meanwhile, so only
    the listen backlog holds them. Returns the sockets and how many completed."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(address)
        sockets.append(sock)
    pending = set(sockets)
    deadline = time.monotonic() + wait
    while pending and time.monotonic() < deadline:
        _, writable, _ = select.select([], list(pending), [], 0.05)
        pending.difference_update(writable)
    return sockets, sum(1 for s in sockets if s not in pending and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))


async def exchange(sock: socket.socket, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), 60)  # Connection: close: the governor ends it
    finally:
        writer.close()


async def test_a_burst_of_connections_while_the_loop_is_busy_is_queued_and_served(governor):
    running, mock = governor
    proxy = urlsplit(running.proxy_url)
    sockets, connected = connect_all((proxy.hostname, proxy.port), BURST, wait=1.5)
    # a dropped handshake is retried by the client after a second: 1.5 s would let one retry in,
    # which the still-full queue drops again; with the wide backlog none was dropped
    assert connected == BURST, f"{connected} of {BURST} handshakes completed while the loop was busy"
    body = orjson.dumps({"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]})
    url = f"{mock.base_url}/v1/chat/completions"
    request = (f"POST {url} HTTP/1.1\r\nHost: {urlsplit(url).netloc}\r\nContent-Type: application/json\r\n"
               f"ADL-Session: burst\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    answers = await asyncio.gather(*[exchange(s, request) for s in sockets], return_exceptions=True)
    broken = [a for a in answers if isinstance(a, BaseException)]
    assert not broken, broken[:3]
    statuses = [a.split(b"\r\n", 1)[0] for a in answers if isinstance(a, bytes)]
    assert statuses == [b"HTTP/1.1 200 OK"] * BURST, sorted(set(statuses))


async def test_a_burst_of_connections_to_the_control_plane_while_the_loop_is_busy_is_queued(governor):
    """Every handshake completes while the loop accepts nothing (the kernel queues them; with
    aiohttp's backlog of 128, 129 did); once it runs, the control plane accepts them all and
    its own cap (64 connections: the oldest idle one closed past it) bounds what it serves at
    once; a request after the burst is answered."""
    running, _ = governor
    control = urlsplit(running.control_url)
    sockets, connected = connect_all((control.hostname, control.port), BURST, wait=1.5)
    assert connected == BURST, f"{connected} of {BURST} handshakes completed while the loop was busy"
    request = f"GET /healthz HTTP/1.1\r\nHost: {control.netloc}\r\nConnection: close\r\n\r\n".encode()
    answers = await asyncio.gather(*[exchange(s, request) for s in sockets], return_exceptions=True)
    served = [a for a in answers if isinstance(a, bytes) and a.startswith(b"HTTP/1.1 200 OK")]
    # at least as many as its cap serves at once; one closed by the cap (busy past it) reads nothing or a reset
    assert len(served) >= CONTROL_MAX_CONNECTIONS, sorted({repr(a)[:60] for a in answers})
    others = [a for a in answers if not (isinstance(a, bytes) and a.startswith(b"HTTP/1.1 200 OK"))]
    assert all(a == b"" or isinstance(a, ConnectionResetError) for a in others), others[:3]
    reader, writer = await asyncio.wait_for(asyncio.open_connection(control.hostname, control.port), 10)
    writer.write(request)
    assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 200 OK")
    writer.close()


async def test_the_widened_backlog_is_idempotent_and_leaves_the_listener_open():
    from mitmproxy.proxy import mode_servers

    from governor.proxy import backlog

    backlog.install()
    installed = mode_servers.AsyncioServerInstance.listen
    backlog.install()  # a second serve() in one process: not wrapped twice
    assert mode_servers.AsyncioServerInstance.listen is installed
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    try:
        assert backlog.widen(server) == 1
        _, port = server.sockets[0].getsockname()[:2]
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # accepted and closed by the handler: still listening
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
