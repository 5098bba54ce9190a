"""`governor run --workers N` (governor/cli/workers.py): real processes, a real redis-server,
real HTTP through the one proxy port. Two workers share the port (both serve), a per-day cap
holds across them, SIGTERM drains both and their records are written, a worker killed with
-9 is started again; --workers above 1 without a Redis store is refused with the reason."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.governor_process import GovernorProcess
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer
from tests.test_store_failover_proxy import CAP, write_passport
from tests.upstreams import Behaviour, MockLLM

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

REPO = Path(__file__).resolve().parent.parent
CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def served(data_dir: Path, worker: int) -> int:
    """How many session journals a worker has written (each agent's session it served)."""
    journals = data_dir / "workers" / str(worker) / "journals"
    return len(list(journals.iterdir())) if journals.is_dir() else 0


async def fresh_call(proxy: tuple[str, int], url: str, session: str) -> httpx.Response:
    """One call on its own connection: the kernel picks the worker for each new connection."""
    async with httpx.AsyncClient(proxy=f"http://{proxy[0]}:{proxy[1]}", trust_env=False, timeout=60) as client:
        return await client.post(url, headers={"ADL-Session": session}, json=CHAT)


async def started(tmp_path: Path, redis_url: str, workers: int = 2) -> GovernorProcess:
    governor = GovernorProcess(tmp_path / "data", ["--passport", str(write_passport(tmp_path / "passport.json")),
                                                   "--store", redis_url, "--workers", str(workers)])
    await governor.start(timeout=120)
    return governor


async def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        await asyncio.sleep(0.1)


@pytest.fixture
def redis_url():
    # sessions=local: each worker keeps its own sessions and journals (what these tests read);
    # workers sharing sessions are the shared-sessions tests' (tests/test_shared_sessions.py)
    server = RedisServer()
    yield server.url + "?sessions=local"
    server.stop()


async def test_two_workers_serve_one_port_and_hold_a_day_cap_between_them(tmp_path, redis_url):
    mock = MockLLM()
    await mock.start()
    mock.default = Behaviour(input_tokens=5, output_tokens=20)
    governor = await started(tmp_path, redis_url)
    try:
        assert len(children(governor.pid)) == 2
        url = f"{mock.base_url}/v1/chat/completions"
        answers: list[httpx.Response] = []
        for round_ in range(4):  # 4 rounds of 64 at once, each on its own connection: 6,400 tokens at a 4,000 cap
            answers += await asyncio.wait_for(asyncio.gather(*[
                fresh_call(governor.proxy, url, f"agent-{round_}-{i}") for i in range(64)]), 120)
        statuses = [a.status_code for a in answers]
        delivered = sum(a.json()["usage"]["total_tokens"] for a in answers if a.status_code == 200)
        assert set(statuses) <= {200, 429}, [a.text for a in answers if a.status_code not in (200, 429)][:2]
        assert delivered <= CAP  # no overshoot across the two processes
        assert statuses.count(429) > 0 and delivered >= CAP - 64 * 25
        assert all(a.json()["error"]["governor"]["cause"] == "on_budget_exhausted"
                   for a in answers if a.status_code == 429)
        assert served(governor.data_dir, 0) > 0 and served(governor.data_dir, 1) > 0  # both took connections
        # one CA for the agent: every worker presents the same one
        ca = [(governor.data_dir / "workers" / str(k) / "mitmproxy-ca-cert.pem").read_bytes() for k in (0, 1)]
        assert ca[0] == ca[1] == governor.ca_file.read_bytes()
    finally:
        code = await governor.stop(timeout=60)
        await mock.stop()
    assert code == 0


async def test_sigterm_drains_both_workers_and_each_writes_its_records(tmp_path, redis_url):
    mock = MockLLM()
    await mock.start()
    mock.default = Behaviour(input_tokens=5, output_tokens=20, hang=2.0)  # each call takes 2 s upstream
    governor = await started(tmp_path, redis_url)
    try:
        url = f"{mock.base_url}/v1/chat/completions"
        calls = [asyncio.create_task(fresh_call(governor.proxy, url, f"slow-{i}")) for i in range(12)]
        await wait_for(lambda: served(governor.data_dir, 0) + served(governor.data_dir, 1) >= 12, 30,
                       "every call admitted")
        assert served(governor.data_dir, 0) > 0 and served(governor.data_dir, 1) > 0
        workers = children(governor.pid)
        governor.proc.send_signal(signal.SIGTERM)
        answers = await asyncio.wait_for(asyncio.gather(*calls), 60)
        assert [a.status_code for a in answers] == [200] * 12  # in flight: finished, not cut
        code = await asyncio.wait_for(asyncio.to_thread(governor.proc.wait), 60)
        assert code == 0
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
        for k in (0, 1):  # each worker ended its sessions: a final record for every one it served
            records = governor.data_dir / "workers" / str(k) / "records"
            assert len(list(records.glob("slow-*.json"))) == served(governor.data_dir, k)
        assert "Traceback" not in governor.log.read_text()
    finally:
        await governor.stop()
        await mock.stop()


async def test_a_worker_killed_with_sigkill_is_reported_and_started_again(tmp_path, redis_url):
    mock = MockLLM()
    await mock.start()
    mock.default = Behaviour(input_tokens=5, output_tokens=20)
    governor = await started(tmp_path, redis_url)
    try:
        before = children(governor.pid)
        assert len(before) == 2
        os.kill(before[1], signal.SIGKILL)
        await wait_for(lambda: "serves again" in governor.log.read_text(), 60, "a new worker in the killed one's place")
        log = governor.log.read_text()
        assert f"worker 1 (pid {before[1]}) exited with -9; starting it again" in log
        now = children(governor.pid)
        assert len(now) == 2 and before[0] in now and before[1] not in now
        url = f"{mock.base_url}/v1/chat/completions"
        answers = await asyncio.wait_for(asyncio.gather(*[fresh_call(governor.proxy, url, f"after-{i}")
                                                          for i in range(16)]), 60)
        assert [a.status_code for a in answers] == [200] * 16
        assert served(governor.data_dir, 1) > 0  # the new worker 1 takes connections too
    finally:
        code = await governor.stop(timeout=60)
        await mock.stop()
    assert code == 0


@pytest.mark.parametrize(("workers", "store", "message"), [
    ("2", None, "use a Redis store"),
    ("2", "memory:", "use a Redis store"),
    ("0", None, "expected 1 to 64"),
    ("many", None, "expected a whole number"),
])
def test_workers_without_a_shared_store_or_a_sane_count_are_refused(tmp_path, workers, store, message):
    command = [sys.executable, "-m", "governor", "run", "--passport", str(write_passport(tmp_path / "p.json")),
               "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0", "--control", "off",
               "--workers", workers, *(["--store", store] if store else [])]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "data" / "workers").exists()
