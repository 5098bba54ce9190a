"""Two session modes on one Redis, and the identities of one governor's processes (issue #30).

Real `governor run` processes on one real redis-server. A `?sessions=local` governor beside a
shared-session governor of the same agent, under the same session name, keeps its own session
(its state, counters and reservations in a space of their own: governor.store.redis
LOCAL_SESSIONS): neither takes up the other's state, no step of either is lost from the other's
count, a switch of a governor from one mode to the other leaves the other's sessions alone, and
the per-day budget stays one budget.
`governor run --workers 2` gives each worker's transparency log an origin of its own, so its
workers are one governor to the duplicate-identity watch (governor.runtime.duplicates), while a
process that keeps a log under a worker's origin is reported."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import pytest
import redis as redis_client

from tests.capped_passport_harness import write_passport
from tests.governor_process import GovernorProcess
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer
from tests.upstreams import Behaviour, MockLLM

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
TOKENS_PER_CALL = 25  # the mock's 5 in and 20 out


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
async def upstream():
    mock = MockLLM()
    await mock.start()
    mock.default = Behaviour(input_tokens=5, output_tokens=20)
    yield mock
    await mock.stop()


async def calls(governor: GovernorProcess, upstream: MockLLM, session: str, n: int) -> None:
    assert governor.proxy is not None
    async with httpx.AsyncClient(proxy=f"http://{governor.proxy[0]}:{governor.proxy[1]}", trust_env=False,
                                 timeout=30) as agent:
        for _ in range(n):
            answer = await agent.post(f"{upstream.base_url}/v1/chat/completions", headers={"ADL-Session": session},
                                      json=CHAT)
            assert answer.status_code == 200, answer.text


async def view(governor: GovernorProcess, session: str) -> dict:
    token = (governor.data_dir / "control-token").read_text().strip()
    async with httpx.AsyncClient(base_url=governor.control_url, trust_env=False, timeout=30,
                                 headers={"Authorization": f"Bearer {token}"}) as control:
        answer = await control.get(f"/v1/sessions/{session}")
        assert answer.status_code == 200, answer.text
        return answer.json()


def tokens_today(url: str, prefix: str) -> float:
    """The agent's per-day token total in the store (every governor's, either mode)."""
    client = redis_client.Redis.from_url(url, decode_responses=True)
    try:
        return sum(float(client.hget(key, "t") or 0) for key in client.scan_iter(f"{prefix}d:*:tokens|*"))
    finally:
        client.close()


async def test_a_local_governor_beside_a_shared_one_under_one_session_name_loses_none_of_its_steps(
        tmp_path, redis_server, upstream):
    """On main before this change, the local governor took up the shared session's saved state
    (its count of steps) and wrote it back about a second later, after the shared governor's
    next steps: those were lost from the shared session's `iterations` (a fail-open of
    max_iterations). A governor switched from local to shared sessions finalizes the local
    session it left from its journal, and the shared session of the same name goes on."""
    prefix = "modes:"
    passport = write_passport(tmp_path / "passport.json")  # one agent for both
    shared = GovernorProcess(tmp_path / "shared", ["--passport", str(passport), "--id", "did:web:localhost:shared",
                                                   "--store", f"{redis_server.url}?prefix={prefix}"])
    local = GovernorProcess(tmp_path / "local", ["--passport", str(passport), "--id", "did:web:localhost:local",
                                                 "--store", f"{redis_server.url}?prefix={prefix}&sessions=local"])
    try:
        await asyncio.gather(shared.start(timeout=90), local.start(timeout=90))
        await calls(shared, upstream, "mix", 3)
        await calls(local, upstream, "mix", 1)  # opens its own "mix": it must not take up the shared one
        await calls(shared, upstream, "mix", 5)  # before the local governor's state is written behind
        await asyncio.sleep(2.5)  # its sweeper (every second) has written its state since
        await calls(shared, upstream, "mix", 1)
        assert (await view(shared, "mix"))["iterations"] == 9
        assert (await view(local, "mix"))["iterations"] == 1
        # each mode's keys: the shared session's, the local one's in a space of their own
        client = redis_client.Redis.from_url(redis_server.url)
        try:
            assert client.exists(f"{prefix}st:mix", f"{prefix}st:local\x1fmix") == 2
        finally:
            client.close()
        # the local governor dies with its "mix" open, and its operator switches it to shared
        # sessions: it finalizes its local "mix" from the journal at start (its record written),
        # and the shared "mix" goes on, on both
        local.proc.kill()
        await asyncio.to_thread(local.proc.wait)
        switched = GovernorProcess(tmp_path / "local", ["--passport", str(passport), "--id", "did:web:localhost:local",
                                                        "--store", f"{redis_server.url}?prefix={prefix}"])
        await switched.start(timeout=90)
        try:
            assert (switched.data_dir / "records" / "mix.json").is_file()
            await calls(shared, upstream, "mix", 1)
            await calls(switched, upstream, "mix", 1)
            after = await view(shared, "mix")
            assert (after["state"], after["iterations"]) == ("active", 11), after
        finally:
            assert await switched.stop(timeout=60) == 0
        # the per-day budget is still one budget for the agent, whatever mode served the call
        assert tokens_today(redis_server.url, prefix) == 12 * TOKENS_PER_CALL
    finally:
        await asyncio.gather(shared.stop(timeout=60), local.stop(timeout=60))


@pytest.mark.parametrize("sessions", ["local", "shared"])
async def test_the_workers_of_one_governor_run_are_one_governor_and_a_process_forking_a_workers_log_is_not(
        tmp_path, redis_server, sessions):
    """`governor run --workers 2`: each worker keeps its transparency log under its own origin
    ("/worker-K"), so the workers (one id, one key) do not report each other as duplicates (on
    main before this change they did: their logs shared one origin, and forked). A process with
    their id and key that keeps its log under worker 0's origin is reported, by worker 0's
    `/readyz` and `governor_duplicate_identities` (the control plane's worker) and its log. In
    both session modes (on main, shared-session workers were not reported, and forked too)."""
    from governor.evidence import ensure_governor_key

    store = f"{redis_server.url}?prefix=workers-{sessions}:&sessions={sessions}"
    passport = write_passport(tmp_path / "passport.json")
    ensure_governor_key(tmp_path / "data")  # the supervisor hands DATA_DIR/keys to its workers
    shutil.copytree(tmp_path / "data" / "keys", tmp_path / "intruder" / "keys")  # one id and key
    # started first, so that worker 0's first check (at its first sweep) finds it
    intruder = GovernorProcess(tmp_path / "intruder", ["--passport", str(passport), "--store", store,
                                                       "--log-origin", "localhost/governor/log/worker-0"])
    workers = GovernorProcess(tmp_path / "data", ["--passport", str(passport), "--store", store, "--workers", "2"])
    try:
        await intruder.start(timeout=90)
        await workers.start(timeout=120)
        origins = [(workers.data_dir / "workers" / str(k) / "log" / "log.vkey").read_text().split("+")[0]
                   for k in (0, 1)]
        assert origins == ["localhost/governor/log/worker-0", "localhost/governor/log/worker-1"]
        token = (workers.data_dir / "control-token").read_text().strip()
        async with httpx.AsyncClient(base_url=workers.control_url, trust_env=False, timeout=30,
                                     headers={"Authorization": f"Bearer {token}"}) as control:
            deadline = time.monotonic() + 30  # at worker 0's first sweep, or 10 s later
            while "duplicate_identity" not in (ready := (await control.get("/readyz")).json()):
                assert time.monotonic() < deadline, ready
                await asyncio.sleep(0.25)
            [duplicate] = ready["duplicate_identity"]  # the intruder, and not worker 1
            assert duplicate["pid"] == intruder.pid and duplicate["shares"] == ["governor_id", "key", "log_origin"]
            assert "governor_duplicate_identities 1.0" in (await control.get("/metrics")).text
        # worker 1's first check (at its first sweep, past worker 0's start) found worker 0 and the
        # intruder: neither shares its log's origin
        await asyncio.sleep(1.5)
        reported = [line for line in workers.log.read_text().splitlines() if "shares this governor's" in line]
        assert len(reported) == 1 and f"pid {intruder.pid})" in reported[0], reported
        assert "shares this governor's governor_id and key and log_origin" in reported[0]
        assert "give each process its own --log-origin" in reported[0]
    finally:
        await intruder.stop(timeout=60)
        assert await workers.stop(timeout=60) == 0
