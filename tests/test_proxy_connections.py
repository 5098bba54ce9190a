"""Slow and many clients against a real `governor run` child process (issue 20, finding 4):
1,100 half-open connections under nofile=1024 do not starve an honest governed request
or /healthz; dribbling connections (a byte a second: never idle) are closed by the
header and body deadlines; an idle keep-alive connection is closed; the options parse."""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
import orjson
import pytest

from governor.proxy.connections import ConnectionLimits, default_cap
from tests.governor_process import GovernorProcess
from tests.proxy_harness import RawClient
from tests.upstreams import MockLLM, make_tls

# these tests name their sessions (ADL-Session): agent-named, as tests about something else do
AGENT_NAMED_ARGS = ["--sessions", "agent-named", "--lock-on", "none"]
CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
HALF_LINE = b"POST /v1/chat/completions HTT"  # a partial request line, then nothing


@pytest.fixture
async def upstream(tmp_path):
    tls = make_tls(tmp_path / "tls")
    mock = MockLLM(tls)
    await mock.start()
    yield tls, mock
    await mock.stop()


@pytest.fixture
async def governors():
    started: list[GovernorProcess] = []

    async def start(*args, **kwargs) -> GovernorProcess:
        governor = GovernorProcess(*args, **kwargs)
        started.append(governor)
        return await governor.start()

    yield start
    for governor in started:
        await governor.stop()


class Held:
    """Client sockets the test opens and holds, noting when the governor closes each."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.closed_at: dict[int, float] = {}
        self._watchers: list[asyncio.Task] = []

    async def open(self, address: tuple[str, int], count: int, first: bytes) -> None:
        gate = asyncio.Semaphore(100)

        async def one(i: int) -> None:
            async with gate:
                try:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), 10)
                except (OSError, asyncio.TimeoutError):
                    self.closed_at[i] = time.monotonic()  # refused outright counts as closed
                    return
                writer.write(first)
                self.writers.append(writer)
                self._watchers.append(asyncio.create_task(self._watch(i, reader)))

        await asyncio.gather(*(one(i) for i in range(count)))

    async def _watch(self, i: int, reader: asyncio.StreamReader) -> None:
        try:
            while await reader.read(4096):
                pass
        except OSError:
            pass
        self.closed_at[i] = time.monotonic()

    def dribble(self, byte: bytes = b"X") -> None:
        for writer in self.writers:
            if not writer.is_closing():
                try:
                    writer.write(byte)
                except (OSError, RuntimeError):
                    pass

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)


async def _honest(governor: GovernorProcess, mock: MockLLM, session: str = "honest") -> int:
    def call() -> int:
        client = RawClient(governor.proxy, governor.ca_file, ("127.0.0.1", mock.port))
        try:
            client.send("POST", "/v1/chat/completions", orjson.dumps(CHAT), {"ADL-Session": session})
            return client.read_response()[0]
        finally:
            client.close()

    return await asyncio.wait_for(asyncio.to_thread(call), 5.0)


async def _healthz(governor: GovernorProcess) -> int:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        async with http.get(f"{governor.control_url}/healthz") as resp:
            return resp.status


async def test_1100_half_open_connections_do_not_starve_honest_clients(tmp_path, upstream, governors):
    tls, mock = upstream
    governor = await governors(tmp_path / "gov", [*AGENT_NAMED_ARGS, "--upstream-ca", str(tls.ca_file)], nofile=1024)
    assert await _honest(governor, mock) == 200
    held = Held()
    try:
        await held.open(governor.proxy, 1100, HALF_LINE)
        await asyncio.sleep(0.5)
        # both answer within 5 s (before: both timed out, accept() failing with EMFILE)
        assert await _healthz(governor) == 200
        assert await _honest(governor, mock) == 200
        assert governor.open_files() < 1024
        # the cap held: the longest-waiting half-open connections were closed to make room
        cap = default_cap(1024)
        deadline = time.monotonic() + 5.0  # a poll, not a fixed 1 s: the closes have mostly landed already
        while len(held.closed_at) < 1100 - cap - 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(held.closed_at) >= 1100 - cap - 5, (len(held.closed_at), cap)
        for _ in range(3):  # and go on answering while the rest stay open
            assert await _honest(governor, mock) == 200
            assert await _healthz(governor) == 200
    finally:
        await held.close()


async def test_dribbling_connections_are_closed_within_the_deadlines(tmp_path, upstream, governors):
    tls, mock = upstream
    header, body, idle = 2.0, 2.0, 2.0
    governor = await governors(tmp_path / "gov", [*AGENT_NAMED_ARGS,
        "--upstream-ca", str(tls.ca_file), "--client-header-timeout", str(header),
        "--client-body-timeout", str(body), "--client-idle-timeout", str(idle)], nofile=4096)
    headers_dribblers, body_dribblers = Held(), Held()
    post = (b"POST http://127.0.0.1:%d/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{" % mock.port)
    try:
        started = time.monotonic()
        await headers_dribblers.open(governor.proxy, 900, b"P")
        await body_dribblers.open(governor.proxy, 50, post)
        opened = time.monotonic()
        deadline = opened + max(header, body) + 6.0  # the deadline, two sweeps, a loaded machine's slack
        while time.monotonic() < deadline and (len(headers_dribblers.closed_at) < 900
                                               or len(body_dribblers.closed_at) < 50):
            headers_dribblers.dribble(b"O")  # a byte a second: never idle, never a whole request line
            body_dribblers.dribble(b" ")
            await asyncio.sleep(1.0)
        assert len(headers_dribblers.closed_at) == 900, len(headers_dribblers.closed_at)
        assert len(body_dribblers.closed_at) == 50, len(body_dribblers.closed_at)
        # none closed before its deadline (they were not refused: the cap is far)
        assert min(headers_dribblers.closed_at.values()) >= started + header - 0.1
        print(f"900 header dribblers closed {max(headers_dribblers.closed_at.values()) - opened:.1f} s after the "
              f"last opened (deadline {header} s)")
        assert await _honest(governor, mock) == 200
    finally:
        await headers_dribblers.close()
        await body_dribblers.close()


async def test_an_idle_keep_alive_connection_is_closed(tmp_path, upstream, governors):
    tls, mock = upstream
    governor = await governors(tmp_path / "gov", [*AGENT_NAMED_ARGS, "--upstream-ca", str(tls.ca_file), "--client-idle-timeout", "1.5"])

    def served_then_idle() -> float:
        client = RawClient(governor.proxy, governor.ca_file, ("127.0.0.1", mock.port))
        try:
            client.send("POST", "/v1/chat/completions", orjson.dumps(CHAT), {"ADL-Session": "idle"})
            assert client.read_response()[0] == 200
            client.send("POST", "/v1/chat/completions", orjson.dumps(CHAT), {"ADL-Session": "idle"})
            assert client.read_response()[0] == 200  # keep-alive: a second request on it is served
            answered = time.monotonic()
            client.sock.settimeout(10)
            assert client.sock.recv(1) == b""  # then, idle, the governor closes it
            return time.monotonic() - answered
        finally:
            client.close()

    waited = await asyncio.wait_for(asyncio.to_thread(served_then_idle), 15)
    assert 1.0 <= waited <= 6.0, waited


def test_connection_options_parse(tmp_path):
    from governor.cli import UsageError
    from governor.cli.run import resolve

    def args(**given):
        namespace = argparse.Namespace(**{name: None for name in (
            "passport", "config", "listen", "control", "control_host", "mode", "data_dir", "tier", "session_idle",
            "unknown_traffic", "session", "upstream_ca", "upstream_timeout", "client_header_timeout",
            "client_body_timeout", "client_idle_timeout", "max_client_connections", "pricing", "store",
            "reviewer_tokens", "id", "log_level")})
        for key, value in given.items():
            setattr(namespace, key, value)
        return namespace

    defaults = resolve(args(), {})
    assert (defaults.client_header_timeout, defaults.client_idle_timeout, defaults.max_client_connections) == (
        ConnectionLimits().header_timeout, ConnectionLimits().idle_timeout, 0)
    settings = resolve(args(client_header_timeout="5", max_client_connections="200"), {})
    assert settings.client_header_timeout == 5.0 and settings.max_client_connections == 200
    config = tmp_path / "governor.yaml"
    config.write_text("client_idle_timeout: 7\nmax_client_connections: 50\ncontrol_host: [a.example, b.example]\n")
    settings = resolve(args(config=str(config)), {})
    assert settings.client_idle_timeout == 7.0 and settings.max_client_connections == 50
    assert settings.control_hosts == ("a.example", "b.example")
    for bad in (dict(client_header_timeout="0"), dict(max_client_connections="-3"),
                dict(max_client_connections="lots")):
        with pytest.raises(UsageError):
            resolve(args(**bad), {})


def test_default_cap_leaves_headroom():
    assert default_cap(1024) == (1024 - 128) // 2
    assert default_cap(65536) == (65536 - 8192) // 2
    assert default_cap(64) == 16


# --- the guard's bookkeeping, with a fake clock (no sockets) ------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Client:
    def __init__(self, name: str) -> None:
        self.id, self.peername, self.error = name, (name, 1), None


class _Flow:
    count = 0

    def __init__(self, client: _Client) -> None:
        _Flow.count += 1
        self.id, self.client_conn = f"flow-{_Flow.count}", client
        self.request = type("Request", (), {"timestamp_end": None})()


def _body_done(flow: _Flow) -> None:  # what mitmproxy sets when a request's body is complete
    flow.request.timestamp_end = 1.0


def _guard(**limits):
    from governor.proxy.connections import ConnectionGuard

    clock = _Clock()
    return ConnectionGuard(ConnectionLimits(**{"max_connections": 100, **limits}), clock=clock), clock


def test_guard_deadlines():
    guard, clock = _guard(header_timeout=30, body_timeout=120, idle_timeout=60)
    silent, tunnel, slow_body, served, early, held = (
        _Client(n) for n in ("silent", "tunnel", "body", "served", "early", "held"))
    for client in (silent, tunnel, slow_body, served, early, held):
        guard.client_connected(client)
    clock.now += 20
    guard.http_connect(_Flow(tunnel))  # the tunnel's TLS and first request are due 30 s from now
    body_flow, served_flow, early_flow = _Flow(slow_body), _Flow(served), _Flow(early)
    guard.requestheaders(body_flow)
    guard.requestheaders(served_flow)
    _body_done(served_flow)
    guard.response(served_flow)  # now idle
    guard.requestheaders(early_flow)
    held_flow = _Flow(held)  # its body is in; its answer waits (an approval, a long upstream)
    guard.requestheaders(held_flow)
    _body_done(held_flow)
    guard.response(early_flow)  # refused at its headers: no body deadline left behind
    assert list(guard._bodies) == [body_flow.id, held_flow.id]
    clock.now += 15  # 35 s after connecting
    guard.sweep()
    assert guard.closed["header_timeout"] == 1 and guard.open_connections == 5  # only `silent`
    clock.now += 20
    guard.sweep()
    assert guard.closed["header_timeout"] == 2  # the tunnel, 30 s after its CONNECT
    clock.now += 30  # 65 s after `served` went idle
    guard.sweep()
    assert guard.closed["idle_timeout"] == 2  # served and early
    clock.now += 60  # 125 s after the body's headers
    guard.sweep()
    assert guard.closed["body_timeout"] == 1 and guard.open_connections == 1  # `held` waits on
    clock.now += 1000
    guard.sweep()
    assert guard.open_connections == 1 and sum(guard.closed.values()) == 5


def test_guard_cap_evicts_the_longest_waiting_idle_connection_never_a_busy_one():
    guard, clock = _guard(max_connections=3)
    a, b, c, d, e = (_Client(n) for n in "abcde")
    guard.client_connected(a)
    clock.now += 1
    guard.client_connected(b)
    clock.now += 1
    guard.client_connected(c)
    guard.requestheaders(_Flow(a))  # a is busy: not evictable, though the oldest
    guard.client_connected(d)  # over the cap: b, the longest-waiting idle one, goes
    assert guard.closed["evicted"] == 1 and guard.open_connections == 3 and d.error is None
    guard.requestheaders(_Flow(c))
    guard.requestheaders(_Flow(d))
    guard.client_connected(e)  # every connection busy: the newcomer is refused
    assert e.error and guard.closed["refused"] == 1 and guard.open_connections == 3
    guard.client_disconnected(b)  # mitmproxy's own notice of the evicted one: nothing left to do
    assert guard.open_connections == 3
