"""Test harness for the enforcement point: a scripted runtime, the proxy on free ports,
the mock upstream over TLS, raw and SDK clients.

`ScriptedRuntime` implements RuntimeAPI with a tiny, fully predictable policy: a
per-session token cap (reservation at admission, cut when a stream's running
usage crosses it, exact accounting of final usage), halts that stick to the
session, scripted rules for other decisions, real pauses. It exists to make the
proxy's mechanics reproducible (cut at a chosen point, pause, fail closed); the
end-to-end tests use the real `governor.runtime.core.Runtime` when it is present.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import ssl
import sys
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

from governor.policy.steps import (
    ON_BUDGET_EXHAUSTED,
    PERMIT,
    Action,
    ApprovalRequest,
    Decision,
    ModelCall,
    Step,
    UsageReport,
)
from governor.runtime.api import Admission

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

Rule = tuple[Callable[[str, Step], bool], Callable[[str, Step], Decision]]

# Settings for tests about something other than who opens sessions: any ADL-Session value
# opens a session (the agent-named mode, trusting the agent), with a cap no test reaches, and
# no halt locks the agent (tests/test_sessions.py tests locks).
# Tests of sessions opened by a principal (tests/test_sessions.py) use the default mode.
AGENT_NAMED: dict[str, Any] = {"sessions": "agent-named", "agent_sessions_per_day": 1_000_000, "lock_on": (),
                               "agent_identity": "headers"}  # the old behaviour: the agent names itself


def budget_decision(observed: int, limit: int) -> Decision:
    return Decision(
        action=Action.HALT, cause=ON_BUDGET_EXHAUSTED, fail_closed=True,
        details={"dimension": "tokens", "scope": "per_session", "observed": observed, "limit": limit},
        event={"cause": ON_BUDGET_EXHAUSTED, "action": "halt"},
    )


@dataclass
class SessionBook:
    used: int = 0  # committed tokens (final usage)
    reserved: dict[int, int] = field(default_factory=dict)  # ticket -> reserved tokens
    halted: Decision | None = None


class ScriptedRuntime:
    def __init__(self, *, token_cap: int | None = None, rules: list[Rule] | None = None) -> None:
        self.token_cap = token_cap
        self.rules: list[Rule] = list(rules or [])
        self.books: dict[str, SessionBook] = {}
        self.steps: list[tuple[str, Step]] = []
        self.usage_reports: list[tuple[str, Any, UsageReport]] = []
        self.finished: list[tuple[str, Any, str | None]] = []
        self.open_tickets: set[int] = set()
        self.pending: dict[str, asyncio.Future] = {}
        self.approval_steps: dict[str, tuple[str, Step]] = {}
        self._tickets = itertools.count(1)
        self.fail_usage = False  # make usage() raise (fail-closed tests)
        self.allowed_tools: frozenset[str] | None = None  # what permitted model calls may offer

    # --- helpers for tests ---
    def book(self, session: str) -> SessionBook:
        return self.books.setdefault(session, SessionBook())

    def final_usage(self, session: str) -> list[UsageReport]:
        return [r for s, _, r in self.usage_reports if s == session and r.final]

    def steps_of(self, session: str, kind: type) -> list[Any]:
        return [step for s, step in self.steps if s == session and isinstance(step, kind)]

    def resolve(self, approval_id: str, approve: bool) -> None:
        self.pending[approval_id].set_result(approve)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            await asyncio.sleep(0.01)

    def _ticket(self, session: str, amount: int) -> int:
        ticket = next(self._tickets)
        self.open_tickets.add(ticket)
        self.book(session).reserved[ticket] = amount
        return ticket

    # --- RuntimeAPI ---
    async def admit(self, session: str, step: Step) -> Admission:
        self.steps.append((session, step))
        book = self.book(session)
        if book.halted is not None:
            return Admission(book.halted, session)
        for predicate, make in self.rules:
            if predicate(session, step):
                decision = make(session, step)
                if decision.action is Action.PAUSE and decision.approval is not None:
                    loop = asyncio.get_running_loop()
                    self.pending[decision.approval.id] = loop.create_future()
                    self.approval_steps[decision.approval.id] = (session, step)
                if decision.halts:
                    book.halted = decision
                ticket = None if decision.blocks else self._ticket(session, 0)
                return Admission(decision, session, ticket)
        amount = 0
        if isinstance(step, ModelCall):
            amount = step.expected_input_tokens + step.expected_output_tokens
            if self.token_cap is not None:
                projected = book.used + sum(book.reserved.values()) + amount
                if projected > self.token_cap:
                    book.halted = budget_decision(projected, self.token_cap)
                    return Admission(book.halted, session)
        decision = Decision(allowed_tools=self.allowed_tools) if isinstance(step, ModelCall) else PERMIT
        return Admission(decision, session, self._ticket(session, amount))

    async def await_approval(self, session: str, approval_id: str) -> Admission:
        approved = await self.pending[approval_id]
        if approved:
            return Admission(PERMIT, session, self._ticket(session, 0))
        return Admission(Decision(action=Action.DENY, cause="on_governor_oversight_trigger",
                                  details={"reason": "rejected by reviewer"}), session)

    async def usage(self, session: str, ticket: Any, report: UsageReport) -> Decision:
        if self.fail_usage:
            raise RuntimeError("store unavailable")
        self.usage_reports.append((session, ticket, report))
        book = self.book(session)
        amount = report.input_tokens + report.output_tokens
        if report.final:
            book.reserved.pop(ticket, None)
            book.used += amount
            if self.token_cap is not None and book.used > self.token_cap and book.halted is None:
                book.halted = budget_decision(book.used, self.token_cap)
            return PERMIT
        if self.token_cap is not None:
            others = sum(v for t, v in book.reserved.items() if t != ticket)
            projected = book.used + others + amount
            if projected > self.token_cap:
                book.halted = budget_decision(projected, self.token_cap)
                return book.halted
        return PERMIT

    async def finish(self, session: str, ticket: Any, *, error: str | None = None) -> None:
        assert ticket in self.open_tickets, f"ticket {ticket} finished twice or never issued"
        self.open_tickets.discard(ticket)
        self.book(session).reserved.pop(ticket, None)
        self.finished.append((session, ticket, error))

    def has_session(self, session: str) -> bool:
        return session in self.books

    async def sessions(self, after: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        ids = [s for s in sorted(self.books) if after is None or s > after]
        return [{"session": s, "used": self.books[s].used} for s in ids[:limit]]

    async def session_view(self, session: str) -> dict[str, Any] | None:
        book = self.books.get(session)
        return None if book is None else {"session": session, "used": book.used}

    def approvals(self) -> list[dict[str, Any]]:
        return [{"id": k} for k, f in self.pending.items() if not f.done()]

    async def resolve_approval(self, approval_id: str, approve: bool, reviewer: str) -> dict[str, Any]:
        self.resolve(approval_id, approve)
        return {"id": approval_id, "approved": approve}

    async def end_session(self, session: str) -> dict[str, Any]:
        return {"session": session}

    def record(self, session: str, nonce: str | None = None) -> dict[str, Any]:
        return {"session": session, "nonce": nonce}


def pause_rule(predicate: Callable[[str, Step], bool], approval_id: str) -> Rule:
    def make(session: str, step: Step) -> Decision:
        return Decision(action=Action.PAUSE, cause="on_governor_oversight_trigger",
                        approval=ApprovalRequest(id=approval_id, reason="requires_confirmation",
                                                 step_digest="", expires_at=time.time() + 60,
                                                 trigger="requires_confirmation"))
    return predicate, make


# --- raw HTTP/1.1 over TLS through the proxy -----------------------------------------------


class RawClient:
    """A blocking HTTP/1.1 client speaking exactly what we write, through the proxy
    (CONNECT + TLS with the governor's CA) or straight to a reverse-mode proxy."""

    def __init__(self, proxy: tuple[str, int], ca_file: Path, target: tuple[str, int] | None) -> None:
        sock = socket.create_connection(proxy, timeout=10)
        if target is not None:
            host, port = target
            sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(4096)
            assert b" 200 " in head.split(b"\r\n", 1)[0], head
            context = ssl.create_default_context(cafile=str(ca_file))
            sock = context.wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, method: str, path: str, body: bytes, headers: dict[str, str] | None = None, *,
             chunked: bool = False, content_type: str | None = "application/json") -> None:
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
        lines = [f"{method} {path} HTTP/1.1", "Host: upstream", framing]
        if content_type is not None:
            lines.append(f"Content-Type: {content_type}")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if chunked:  # in two chunks, then the last
            half = len(body) // 2
            body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:]) if part)
            body += b"0\r\n\r\n"
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed by the proxy")
        self.buf += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_response(self) -> tuple[int, dict[str, str], bytes]:
        """One complete response, framed strictly (a stray byte fails the next read)."""
        status_line = self._line()
        parts = status_line.split(b" ", 2)
        assert parts[0] == b"HTTP/1.1", f"not an HTTP/1.1 status line: {status_line!r}"
        status = int(parts[1])
        headers: dict[str, str] = {}
        while line := self._line():
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", ""):
            body = b""
            while True:
                size = int(self._line().split(b";")[0], 16)
                # (reads kept out of the asserts: under python -O an assert is not run at all)
                if size == 0:
                    trailer = self._line()
                    assert trailer == b"", "trailers are not expected"
                    break
                body += self._take(size)
                terminator = self._take(2)
                assert terminator == b"\r\n", "chunk not terminated by CRLF"
        else:
            body = self._take(int(headers.get("content-length", "0")))
        return status, headers, body


# --- SDK clients in a subprocess -------------------------------------------------------------


async def run_python(code: str, env: dict[str, str], timeout: float = 60.0) -> dict[str, Any]:
    """Run code in a fresh interpreter with exactly `env` (plus PATH/HOME); it must print one
    JSON object on its last stdout line, which is returned."""
    full_env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
                "PYTHONPATH": str(REPO), **env}
    proc = await asyncio.create_subprocess_exec(
        PYTHON, "-c", code, env=full_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError("SDK subprocess timed out")
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"SDK subprocess failed ({proc.returncode}):\n{out.decode()}\n{err.decode()}")
    return json.loads(lines[-1])


@asynccontextmanager
async def scripted_governor(tmp: Path, **settings: Any) -> AsyncIterator[tuple[Any, Any, ScriptedRuntime]]:
    """The real proxy (serve()) on a scripted runtime, in front of a loopback TLS mock LLM.

    Yields (running, mock, runtime); `settings` override the Settings used (e.g. upstream_timeout).
    """
    from governor.proxy.server import Settings, serve
    from tests.upstreams import MockLLM, make_tls

    tls = make_tls(tmp / "tls")
    mock = MockLLM(tls)
    await mock.start()
    runtime = ScriptedRuntime()
    options = dict(listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data", upstream_ca=tls.ca_file,
                   tick_interval=0, session="default", **AGENT_NAMED)
    running = await serve(Settings(**{**options, **settings}), runtime)
    try:
        yield running, mock, runtime
    finally:
        await running.stop()
        await mock.stop()


def sdk_environment(running: Any, mock: Any) -> dict[str, str]:
    """What the official openai and anthropic SDKs in a subprocess need to reach `mock`
    through the proxy `running` (only through their environment)."""
    return {"HTTPS_PROXY": running.proxy_url, "SSL_CERT_FILE": str(running.ca_file),
            "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{mock.base_url}/v1",
            "ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": mock.base_url}


@asynccontextmanager
async def real_governor(tmp: Path, **settings: Any) -> AsyncIterator[tuple[Any, Any]]:
    """The real proxy on the real runtime (the bundled example passport unless `settings`
    name one), agent-named, in front of a loopback TLS mock LLM: (running, mock), both
    stopped on exit; `settings` override the Settings used (e.g. control, tick_interval)."""
    from governor.proxy.server import Settings, serve
    from tests.upstreams import MockLLM, make_tls

    tls = make_tls(tmp / "tls")
    mock = MockLLM(tls)
    await mock.start()
    options = dict(listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data", upstream_ca=tls.ca_file,
                   tick_interval=0, **AGENT_NAMED)
    try:
        running = await serve(Settings(**{**options, **settings}))
    except BaseException:
        await mock.stop()
        raise
    try:
        yield running, mock
    finally:
        await running.stop()
        await mock.stop()


def real_sdk_env(name: str, **settings: Any) -> Any:
    """A module's `env` fixture: one `real_governor` (in a temp folder `name`) shared by the
    module's tests, as (running, mock, the SDKs' environment)."""
    import pytest_asyncio

    @pytest_asyncio.fixture(loop_scope="module", scope="module")
    async def env(tmp_path_factory: Any) -> AsyncIterator[tuple[Any, Any, dict[str, str]]]:
        async with real_governor(tmp_path_factory.mktemp(name), **settings) as (running, mock):
            yield running, mock, sdk_environment(running, mock)

    return env


def scripted_env(name: str, **settings: Any) -> Any:
    """A module's `env` fixture: one `scripted_governor` (in a temp folder `name`) shared by
    the module's tests, as (running, mock, runtime); pair it with `fresh_scripted`."""
    import pytest_asyncio

    @pytest_asyncio.fixture(loop_scope="module", scope="module")
    async def env(tmp_path_factory: Any) -> AsyncIterator[tuple[Any, Any, ScriptedRuntime]]:
        async with scripted_governor(tmp_path_factory.mktemp(name), **settings) as parts:
            yield parts

    return env


def scripted_sdk_env(name: str, **settings: Any) -> Any:
    """scripted_env, with the SDKs' environment: (running, mock, runtime, sdk_env)."""
    import pytest_asyncio

    @pytest_asyncio.fixture(loop_scope="module", scope="module")
    async def env(tmp_path_factory: Any) -> AsyncIterator[tuple[Any, Any, ScriptedRuntime, dict[str, str]]]:
        async with scripted_governor(tmp_path_factory.mktemp(name), **settings) as (running, mock, runtime):
            yield running, mock, runtime, sdk_environment(running, mock)

    return env


@contextmanager
def fresh_scripted(running: Any, mock: Any, runtime: ScriptedRuntime) -> Iterator[None]:
    """One test on a module-wide `scripted_governor`: it starts with the mock and the scripted
    runtime reset, and whatever it changed of the addon's policy and routes is put back; no
    admitted step may be left without its ticket finished."""
    policy, routes, allow = running.chain.policy, list(running.chain.registry.routes), list(running.chain.registry.allow)
    mock.reset()
    runtime.token_cap = None
    runtime.allowed_tools = None
    runtime.fail_usage = False
    for kept in (runtime.rules, runtime.books, runtime.steps, runtime.usage_reports):
        kept.clear()
    yield
    running.chain.policy = policy
    running.chain.registry.routes = routes
    running.chain.registry.allow = allow
    assert not runtime.open_tickets, "every admitted step's ticket is finished"


@asynccontextmanager
async def agent_named_world(tmp: Path, **settings: Any) -> AsyncIterator[tuple[Any, Any, Any]]:
    """The real proxy and runtime in agent-named mode, the mock upstream and an agent's
    httpx client through the proxy: (running, mock, agent), all stopped on exit."""
    import httpx

    from governor.proxy.server import Settings, serve
    from tests.upstreams import MockLLM

    mock = MockLLM()
    await mock.start()
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data",
                                   **{"tick_interval": 0, **settings}))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    try:
        yield running, mock, agent
    finally:
        await agent.aclose()
        await running.stop()
        await mock.stop()
