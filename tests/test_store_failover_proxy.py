"""Through a Redis failover the budget holds, end to end (issue #30): the real proxy and
runtime on `redis+sentinel://…?wait=1` (one primary, one replica, one Sentinel, real
servers), eight agents calling at once against a per-day token cap; the primary is SIGKILLed
under that load. Within 15 s calls are answered again (the supervisor's replacement replica
lets `wait=1` acknowledge again), every refusal meanwhile is the retryable one, and what
reached the agents stays within the cap."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from governor.proxy.server import Settings, serve
from tests.capped_passport_harness import CAP, write_passport
from tests.proxy_harness import AGENT_NAMED
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER
from tests.redis_topology import RedisProcess, sentinel_set, wait_until
from tests.upstreams import Behaviour, MockLLM

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)


async def test_a_primary_killed_under_load_the_calls_resume_within_15s_and_the_day_cap_holds(tmp_path):
    with sentinel_set(tmp_path / "redis") as s:
        mock = MockLLM()
        await mock.start()
        mock.default = Behaviour(input_tokens=5, output_tokens=20)
        running = await serve(Settings(**AGENT_NAMED, passport=write_passport(tmp_path / "passport.json"),
                                       listen=("127.0.0.1", 0), control=None, data_dir=tmp_path / "data",
                                       store=s.url("wait=1&wait_timeout=0.5&timeout=0.5"), tick_interval=0))
        agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
        delivered, answers, stop = [0], [], asyncio.Event()

        async def calls(session: str) -> None:
            while not stop.is_set():
                r = await agent.post(f"{mock.base_url}/v1/chat/completions", headers={"ADL-Session": session},
                                     json={"model": "gpt-4o-mini", "max_tokens": 20,
                                           "messages": [{"role": "user", "content": "hi"}]})
                answers.append((time.monotonic(), r.status_code, r.headers.get("Retry-After")))
                if r.status_code == 200:
                    delivered[0] += r.json()["usage"]["total_tokens"]
                await asyncio.sleep(0.01)

        try:
            load = [asyncio.create_task(calls(f"agent-{i}")) for i in range(8)]
            deadline = time.monotonic() + 30
            while sum(1 for a in answers if a[1] == 200) < 30:
                assert time.monotonic() < deadline, answers[-5:]
                await asyncio.sleep(0.05)
            old = s.primary.port
            s.primary.kill()
            killed = time.monotonic()
            await asyncio.to_thread(wait_until, lambda: s.primary_port() != old, 15, "Sentinel did not fail over")
            replacement = await asyncio.to_thread(RedisProcess, tmp_path / "redis" / "replacement", "--replicaof",
                                                  "127.0.0.1", str(s.primary_port()))
            s.processes.append(replacement)
            while not any(t > killed and code == 200 for t, code, _ in answers):
                assert time.monotonic() < killed + 15, "no call answered within 15s of the kill"
                await asyncio.sleep(0.05)
            back = min(t for t, code, _ in answers if t > killed and code == 200) - killed
            while not any(code == 429 for _, code, _ in answers):  # on to the cap
                assert time.monotonic() < killed + 90, "the cap was never reached"
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*load), 30)
        finally:
            stop.set()
            await agent.aclose()
            await running.stop()
            await mock.stop()
        statuses = [code for _, code, _ in answers]
        print(f"\nanswered again {back:.1f}s after the kill; delivered {delivered[0]} tokens at a cap of {CAP}; "
              f"{statuses.count(503)} refused as retryable, {statuses.count(429)} at the cap")
        assert delivered[0] <= CAP  # what reached the agents stays within the cap
        assert delivered[0] >= CAP - 8 * 25 * 2  # and the cap, not an outage, ended it
        assert set(statuses) <= {200, 429, 503}
        assert all(retry == "1" for _, code, retry in answers if code == 503)  # retryable, never a loss
