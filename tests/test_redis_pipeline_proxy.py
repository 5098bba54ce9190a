"""The Redis store's pipelined path end to end (issue #30): the real proxy and runtime on
`redis://…?sessions=local`, a real redis-server. 64 calls at once, twice, against a small
per-day token cap deliver no more than the cap (settlements queued without awaiting, the
admissions behind them on the same connection); a settlement that Redis does not answer
after the response was delivered is recorded in the session's record, the next call is
refused 503 with Retry-After while Redis is down, and the session goes on once it answers,
its usage counted once; a shared session's settlement takes the same route."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.evidence.record import record_path
from governor.proxy.server import Settings, serve
from tests.proxy_harness import AGENT_NAMED
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer
from tests.stream_budget_harness import PASSPORT
from tests.upstreams import Behaviour, MockLLM

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

from governor.store.redis import RedisStore  # noqa: E402  (after the skip: needs the client only)

CAP = 1_000  # tokens a day; a call uses 25 (5 in, 20 out)
DAY_TOKENS = ("per_day", None, "tokens")


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    own = RedisServer()
    yield own
    own.stop()  # continued first if a test stopped it


def capped_passport(path: Path) -> Path:
    from governor.passport import sign_passport

    passport = json.loads(json.dumps(PASSPORT))
    passport["permissions"]["resource_limits"]["budget"]["tokens"] = {"per_day": CAP}
    path.write_text(json.dumps(sign_passport(passport, Ed25519PrivateKey.generate())))
    return path


async def governor(tmp: Path, url: str) -> tuple:
    mock = MockLLM()
    await mock.start()
    mock.default = Behaviour(input_tokens=5, output_tokens=20)
    running = await serve(Settings(**AGENT_NAMED, passport=capped_passport(tmp / "passport.json"),
                                   listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data", store=url,
                                   tick_interval=0))
    return running, mock, httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)


async def chat(agent: httpx.AsyncClient, mock: MockLLM, session: str) -> httpx.Response:
    return await agent.post(f"{mock.base_url}/v1/chat/completions", headers={"ADL-Session": session},
                            json={"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]})


async def answered_while_the_store_is_away(running, agent: httpx.AsyncClient, mock: MockLLM, session: str, *,
                                          away: Callable[[], Any], back: Callable[[], Any]) -> httpx.Response:
    """A call admitted, the store made `away` while it is at the upstream: the call is answered
    whole (5 + 20 tokens), its settlement fails after the response (drained: the queued
    script's timeout read), and the session's next call's answer, the store still away, is
    returned; the store is `back` on the way out."""
    mock.default = Behaviour(input_tokens=5, output_tokens=20, hang=0.5)  # admitted, then answered later
    seen = len(mock.requests)
    answering = asyncio.create_task(chat(agent, mock, session))
    deadline = time.monotonic() + 10
    while len(mock.requests) == seen:  # admitted (its reservation held): at the upstream now
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    away()
    try:
        delivered = await asyncio.wait_for(answering, 10)
        assert delivered.status_code == 200 and delivered.json()["usage"]["total_tokens"] == 25
        await asyncio.wait_for(running.runtime.remote.drain(), 5)
        return await asyncio.wait_for(chat(agent, mock, session), 10)
    finally:
        back()


def day_tokens(url: str, prefix: str, agent_id: str) -> float:
    with RedisStore(url, prefix=prefix) as store:
        return store.snapshot(agent_id, "any", time.time(), [DAY_TOKENS])[DAY_TOKENS]


async def test_64_calls_at_once_twice_stay_within_a_small_day_cap(tmp_path, server):
    prefix = f"p-{uuid.uuid4().hex}:"
    url = f"{server.url}?sessions=local&prefix={prefix}"
    running, mock, agent = await governor(tmp_path, url)
    try:
        answers = []
        for wave in range(2):
            answers += await asyncio.wait_for(asyncio.gather(
                *(chat(agent, mock, f"agent-{i % 8}") for i in range(64))), 60)
        # then one call at a time until the cap refuses one: each settlement is applied before the
        # next admission (FIFO), so what the waves reserved beyond their use comes back
        for _ in range(CAP // 25 + 1):
            answers.append(await chat(agent, mock, "one-at-a-time"))
            if answers[-1].status_code != 200:
                break
        agent_id = running.runtime.agent_id  # the last settlements may still be queued: the stop sends them
    finally:
        await agent.aclose()
        await running.stop()
        await mock.stop()
    statuses = [a.status_code for a in answers]
    delivered = sum(a.json()["usage"]["total_tokens"] for a in answers if a.status_code == 200)
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) > 0 and delivered <= CAP  # the cap ended it, and held
    print(f"delivered {delivered} of {CAP}")
    assert delivered > CAP - 100, delivered  # what was reserved beyond the use came back to later calls
    assert day_tokens(server.url, prefix, agent_id) == delivered  # every settlement reached Redis (the stop's drain), once


async def test_a_settlement_redis_does_not_answer_after_the_response_is_recorded_and_the_session_goes_on(
        tmp_path, server):
    prefix = f"p-{uuid.uuid4().hex}:"
    url = f"{server.url}?sessions=local&timeout=0.3&retry_after=1&prefix={prefix}"
    running, mock, agent = await governor(tmp_path, url)
    session = "deferred"
    try:
        assert (await chat(agent, mock, session)).status_code == 200
        refused = await answered_while_the_store_is_away(
            running, agent, mock, session, away=lambda: os.kill(server.process.pid, signal.SIGSTOP),
            back=lambda: os.kill(server.process.pid, signal.SIGCONT))
        assert refused.status_code == 503 and refused.headers.get("Retry-After") == "1"
        mock.default = Behaviour(input_tokens=5, output_tokens=20)
        assert (await chat(agent, mock, session)).status_code == 200  # the held reservation settled first
        agent_id = running.runtime.agent_id
    finally:
        await agent.aclose()
        await running.stop()
        await mock.stop()
    assert day_tokens(server.url, prefix, agent_id) == 3 * 25  # each call's usage once, nothing held over
    record = json.loads(record_path(tmp_path / "data", session).read_text())
    failures = [e for e in record["events"] if e["cause"] == "on_governor_error"]
    assert failures[0]["detail"]["deferred_settlement"] is True, failures  # after the response: recorded
    assert failures[1]["detail"]["retryable"] is True and len(failures) == 2  # and the refusal while down


async def test_on_shared_sessions_a_settlement_redis_does_not_take_after_the_response_takes_the_same_route(
        tmp_path, server):
    """The same through a shared session (runtime/late_settlement.py): Redis holds writes (CLIENT
    PAUSE WRITE: the queued script never runs, its client gone) when the call's settlement is
    queued; the call is answered, the note recorded (chained once Redis answers), the next call
    refused 503 with Retry-After while it holds them, and once it answers the next call settles
    it first and goes on: each call's usage counted once, the session's saved state freed."""
    import redis

    prefix = f"p-{uuid.uuid4().hex}:"
    running, mock, agent = await governor(tmp_path, f"{server.url}?timeout=0.3&retry_after=1&prefix={prefix}")
    observer = redis.Redis.from_url(server.url)
    session = "deferred-shared"
    try:
        assert (await chat(agent, mock, session)).status_code == 200
        await asyncio.wait_for(running.runtime.remote.drain(), 5)
        refused = await answered_while_the_store_is_away(
            running, agent, mock, session, away=lambda: observer.execute_command("CLIENT", "PAUSE", 10_000, "WRITE"),
            back=lambda: observer.execute_command("CLIENT", "UNPAUSE"))
        assert refused.status_code == 503 and refused.headers.get("Retry-After") == "1"
        mock.default = Behaviour(input_tokens=5, output_tokens=20)
        assert (await chat(agent, mock, session)).status_code == 200  # the held reservation settled first
        await asyncio.wait_for(running.runtime.remote.drain(), 5)
        record = await running.runtime.end_session(session)  # shared sessions outlive a replica's stop
        agent_id = running.runtime.agent_id
        saved = json.loads(observer.get(f"{prefix}st:{session}"))
    finally:
        observer.close()
        await agent.aclose()
        await running.stop()
        await mock.stop()
    assert day_tokens(server.url, prefix, agent_id) == 3 * 25  # each call's usage once, nothing held over
    assert saved["in_flight"] == 0
    failures = [e for e in record["events"] if e["cause"] == "on_governor_error"]
    assert failures[0]["action"] == "continue" and failures[0]["detail"]["deferred_settlement"] is True, failures
    assert failures[0]["detail"]["fail_closed"] is False
    assert failures[1]["detail"]["retryable"] is True and len(failures) == 2  # and the refusal while paused
