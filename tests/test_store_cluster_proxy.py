"""64 concurrent calls at a per-day token cap through the real proxy and runtime on a real
Redis Cluster of three primaries (`redis+cluster://`, issue #30): the store's scripts run
on the node that owns its hash slot, and what reaches the agents stays within the cap."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from governor.proxy.server import Settings, serve
from governor.store.redis_async import AsyncCounters
from tests.capped_passport_harness import CAP, write_passport
from tests.proxy_harness import AGENT_NAMED
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER
from tests.redis_topology import cluster
from tests.upstreams import Behaviour, MockLLM

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

CALL = 25  # tokens a call uses: 5 in, 20 out


@pytest.fixture(scope="module")
def three_primaries(tmp_path_factory):
    with cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.mark.parametrize("query", ["timeout=2&prefix=shared", "timeout=2&prefix=local&sessions=local"])
async def test_64_concurrent_calls_on_a_three_primary_cluster_stay_within_the_day_cap(three_primaries, tmp_path,
                                                                                      query, monkeypatch):
    """Shared sessions (each step a round on the shared state, blocking client in a thread)
    and local ones (the model call's one-round-trip path on the asyncio client)."""
    asyncio_steps = []
    original = AsyncCounters.reserve_within

    async def counted(self, *args, **kwargs):
        asyncio_steps.append(1)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(AsyncCounters, "reserve_within", counted)
    c = three_primaries
    mock = MockLLM()
    await mock.start()
    mock.default = Behaviour(input_tokens=5, output_tokens=20)
    running = await serve(Settings(**AGENT_NAMED, passport=write_passport(tmp_path / "passport.json"),
                                   listen=("127.0.0.1", 0), control=None, data_dir=tmp_path / "data",
                                   store=c.url(query), tick_interval=0))
    try:
        async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=60,
                                     limits=httpx.Limits(max_connections=64)) as agent:
            async def call(i: int, round_: int) -> httpx.Response:
                return await agent.post(f"{mock.base_url}/v1/chat/completions",
                                        headers={"ADL-Session": f"agent-{i % 16}"},
                                        json={"model": "gpt-4o-mini", "max_tokens": 20,
                                              "messages": [{"role": "user", "content": "hi"}]})

            answers: list[httpx.Response] = []
            for round_ in range(4):  # 4 rounds of 64 at once: 6,400 tokens asked of a 4,000 cap
                answers += await asyncio.wait_for(asyncio.gather(*[call(i, round_) for i in range(64)]), 120)
    finally:
        await running.stop()
        await mock.stop()
    statuses = [a.status_code for a in answers]
    delivered = sum(a.json()["usage"]["total_tokens"] for a in answers if a.status_code == 200)
    print(f"\n256 calls, 64 at a time, on a 3-primary cluster: delivered {delivered} tokens at a cap of {CAP}; "
          f"{statuses.count(429)} refused at the cap; {len(asyncio_steps)} steps on the asyncio client")
    if "sessions=local" in query:
        assert asyncio_steps  # the one-round-trip path ran on Cluster
    else:
        assert not asyncio_steps
    assert set(statuses) <= {200, 429}, [a.text for a in answers if a.status_code not in (200, 429)][:2]
    assert delivered <= CAP  # no overshoot
    assert delivered >= CAP - 64 * CALL and statuses.count(429) > 0  # the cap, reached, is what refused them
    for a in answers:
        if a.status_code == 429:
            assert a.json()["error"]["governor"]["cause"] == "on_budget_exhausted"
