"""Parallel streams over three governor processes sharing one Redis (issue #20, finding 2):
the reservations grow in Redis (one Lua script, atomic against the cap across replicas),
so the streams of one session, spread over the replicas, stay within its 10,000-token cap.
64 and 256 streams per case, over three replicas and over one of them alone (one governor
on Redis: the in-process store's case is test_stream_budget.py); both upstream kinds. The
replicas start once for the module (their start-up is the slow part), each with its own
governor id; each case has its own session, and the 256-stream cases their own time bound."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from tests.stream_budget_harness import CAP, Replica, behaviour, parallel_streams, write_passport
from tests.upstreams import MockLLM

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def replicas(tmp_path_factory):
    from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer

    tmp_path = tmp_path_factory.mktemp("replicas")
    if REDIS_SERVER is None:
        pytest.skip(NOT_INSTALLED)
    server = RedisServer()
    mock = MockLLM()
    await mock.start()
    passport = write_passport(tmp_path / "passport.json")
    started = await asyncio.gather(*[Replica.start(passport, tmp_path / f"replica-{i}", server.url, guess=100)
                                     for i in range(3)], return_exceptions=True)
    try:
        failed = [r for r in started if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        yield started, mock
        # each replica has its own id: none took another for a duplicate (its first sweep compares)
        assert not [line for r in started for line in r.duplicates_reported()]
    finally:
        await asyncio.gather(*[r.stop() for r in started if not isinstance(r, BaseException)])
        await mock.stop()
        server.stop()


UPSTREAMS = pytest.mark.parametrize(("max_tokens", "honest"), [(20, False), (None, True)],
                                    ids=["ignoring-max-tokens", "honest-without-max-tokens"])


async def spend(replicas, governors: int, streams: int, max_tokens, honest: bool):
    started, mock = replicas
    mock.default = behaviour(500, per_chunk_usage=not honest, honest=honest)
    session = f"spender-{governors}-{streams}-{'honest' if honest else 'hostile'}"
    # the whole case is bounded: 256 streams against a cap of 10,000 end in seconds when cut
    tally = await parallel_streams([g.proxy for g in started[:governors]], mock.base_url, streams, max_tokens,
                                   session, timeout=150.0)
    print(f"\n{governors} governor(s) on Redis, {streams} streams, max_tokens {max_tokens}, honest {honest}: "
          f"delivered {tally.total} tokens (cap {CAP}), {tally.cut} cut, {tally.statuses.count(429)} refused")
    return tally


@UPSTREAMS
@pytest.mark.parametrize("streams", [64, 256])
async def test_parallel_streams_over_three_replicas_on_one_redis_stay_within_the_cap(replicas, max_tokens, honest,
                                                                                     streams):
    tally = await spend(replicas, 3, streams, max_tokens, honest)
    assert not tally.errors, tally.errors[:3]
    assert len(tally.delivered) == streams
    assert tally.total <= CAP + streams, (tally.total, tally.cut)
    assert tally.cut > 0 or 429 in tally.statuses


@UPSTREAMS
async def test_256_parallel_streams_through_one_governor_on_redis_stay_within_the_cap(replicas, max_tokens, honest):
    streams = 256
    tally = await spend(replicas, 1, streams, max_tokens, honest)
    assert not tally.errors, tally.errors[:3]
    assert len(tally.delivered) == streams
    assert tally.total <= CAP + streams, (tally.total, tally.cut)
    assert tally.cut > 0 or 429 in tally.statuses
