"""The Redis store's one-round-trip path against a real redis-server: reserve_within (the
snapshot and the reservation in one script), blocking and on its asyncio client."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Iterator

import pytest
import redis

from governor.policy.steps import CounterCharge
from governor.store import MemoryStore, StoreIntegrityError, StoreUnavailable, UnknownReservation
from tests.redis_counters import DAY_TOKENS, KEYS, SESSION_COST, T0, charges, prefix
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer, redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

from governor.store.redis import RedisStore  # noqa: E402  (after the skip: needs the client only)



@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()  # continued first if a test stopped it


def evalsha_calls(url: str) -> int:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    finally:
        client.close()


def test_reserve_within_answers_as_snapshot_then_reserve(redis_url: str):
    """The same sequence on Redis (one script) and on the default (snapshot, then reserve)."""
    memory = MemoryStore()
    with RedisStore(redis_url, prefix=prefix()) as store:
        steps = [charges(400, 0.5), charges(500, 0.25), charges(200, 1.0), charges(100, 0.0)]
        for step in steps:
            fast = store.reserve_within("agent", "s1", KEYS, step, T0)
            slow = (memory.snapshot("agent", "s1", T0, KEYS), memory.reserve("agent", "s1", step, T0))
            assert fast[0] == slow[0]
            assert fast[1].ok == slow[1].ok and fast[1].observed == slow[1].observed
            assert fast[1].failed == slow[1].failed
        # the third step was refused (900 + 200 > 1000): nothing of it counts
        assert store.snapshot("agent", "s1", T0, KEYS) == {DAY_TOKENS: 1000.0, SESSION_COST: 0.75}


def test_reserve_within_is_one_round_trip_and_its_reservation_settles(redis_url: str):
    with RedisStore(redis_url, prefix=prefix()) as store:
        store.reserve_within("agent", "s0", KEYS, [], T0)  # the script loaded (NOSCRIPT, SCRIPT LOAD) first
        before = evalsha_calls(redis_url)
        snapshot, held = store.reserve_within("agent", "s1", KEYS, charges(300, 0.1), T0)
        assert evalsha_calls(redis_url) - before == 1
        assert snapshot == {DAY_TOKENS: 0.0, SESSION_COST: 0.0} and held.ok and held.id
        store.commit(held.id, charges(120, 0.05, cap=None), T0)
        assert store.snapshot("agent", "s1", T0, KEYS) == {DAY_TOKENS: 120.0, SESSION_COST: 0.05}
        with pytest.raises(UnknownReservation):
            store.commit(held.id, None, T0)


def test_reserve_within_with_nothing_to_hold_reads_and_holds_an_empty_reservation(redis_url: str):
    # as every store does (the store model of tests/test_store_properties.py): releasable
    with RedisStore(redis_url, prefix=prefix()) as store:
        store.add("agent", "s1", charges(70, 0.2, cap=None), T0)
        snapshot, held = store.reserve_within("agent", "s1", KEYS, [], T0)
        assert snapshot == {DAY_TOKENS: 70.0, SESSION_COST: 0.2} and held.ok and held.id is not None
        assert store.release(held.id) and store.snapshot("agent", "s1", T0, KEYS) == snapshot


def test_reserve_within_refuses_bad_keys_and_charges_before_any_round_trip(redis_url: str):
    with RedisStore(redis_url, prefix=prefix()) as store:
        before = evalsha_calls(redis_url)
        with pytest.raises(ValueError, match="unknown counter scope"):
            store.reserve_within("agent", "s1", [("per_week", None, "tokens")], charges(1, 0), T0)
        with pytest.raises(ValueError, match="finite"):
            store.reserve_within("agent", "s1", KEYS, [CounterCharge("per_day", "tokens", float("nan"), 10)], T0)
        with pytest.raises(ValueError, match="unknown budget dimension"):
            store.reserve_within("agent", "s1", [("per_day", None, "bananas")], [], T0)
        assert evalsha_calls(redis_url) == before  # nothing reached Redis


async def test_the_asyncio_client_reserves_commits_and_releases(redis_url: str):
    with RedisStore(redis_url, prefix=prefix()) as store:
        counters = store.counters()
        assert counters is not None and store.counters() is counters  # one per event loop
        results = await asyncio.gather(*(counters.reserve_within("agent", f"s{i}", KEYS, charges(300, 0.1), T0)
                                         for i in range(5)))
        held = [r for _, r in results if r.ok]
        refused = [r for _, r in results if not r.ok]
        assert len(held) == 3 and len(refused) == 2  # 3 x 300 <= 1000 < 4 x 300: the cap holds
        assert all(r.failed == charges(300, 0.1)[0] and r.observed == 900.0 for r in refused)
        await counters.commit(held[0].id, charges(100, 0.0, cap=None), T0)
        assert await counters.release(held[1].id) is True
        assert await counters.release(held[1].id) is False
        with pytest.raises(UnknownReservation):
            await counters.commit(held[1].id, None, T0)
        assert store.snapshot("agent", "x", T0, [DAY_TOKENS]) == {DAY_TOKENS: 400.0}  # 100 + the third's 300


async def test_the_asyncio_client_fails_closed_after_a_flushall_until_acknowledged(redis_url: str):
    with RedisStore(redis_url, prefix=prefix()) as store:
        counters = store.counters()
        await counters.reserve_within("agent", "s1", KEYS, charges(10, 0), T0)
        redis.Redis.from_url(redis_url).delete(f"{store.prefix}fence")  # the loss, for this store only
        with pytest.raises(StoreIntegrityError):
            await counters.reserve_within("agent", "s1", KEYS, charges(10, 0), T0)
        with pytest.raises(StoreIntegrityError):  # the blocking client knows it too
            store.snapshot("agent", "s1", T0, KEYS)
        assert store.acknowledge()["acknowledged"] is True
        _, held = await counters.reserve_within("agent", "s1", KEYS, charges(10, 0), T0)
        assert held.ok


async def test_the_asyncio_client_refuses_as_retryable_when_redis_stops_answering(own_server: RedisServer):
    with RedisStore(own_server.url + "?timeout=0.3&retry_after=2", prefix=prefix()) as store:
        counters = store.counters()
        await counters.reserve_within("agent", "s1", KEYS, charges(10, 0), T0)
        os.kill(own_server.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable) as caught:
                await asyncio.wait_for(counters.reserve_within("agent", "s1", KEYS, charges(10, 0), T0), 5)
            assert type(caught.value) is StoreUnavailable and caught.value.retry_after == 2.0
        finally:
            os.kill(own_server.process.pid, signal.SIGCONT)
        # the session goes on once Redis answers again (a new connection, no operator step)
        for _ in range(20):
            try:
                _, held = await counters.reserve_within("agent", "s1", KEYS, charges(10, 0), T0)
                break
            except StoreUnavailable:
                await asyncio.sleep(0.1)
        assert held.ok


async def test_a_closed_store_refuses_its_asyncio_calls(redis_url: str):
    store = RedisStore(redis_url, prefix=prefix())
    counters = store.counters()
    store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await counters.reserve_within("agent", "s1", KEYS, charges(10, 0), T0)


def test_no_asyncio_client_when_reservations_wait_for_replicas(redis_url: str):
    async def made() -> object:
        return store.counters()

    with RedisStore(redis_url + "?wait=1&wait_timeout=0.1", prefix=prefix()) as store:
        assert asyncio.run(made()) is None


async def test_through_sentinel_the_asyncio_client_finds_a_failover_and_fails_closed_until_acknowledged(tmp_path):
    """redis+sentinel:// without wait: the asyncio client's own connections read the new
    primary's replication id, as the blocking client's do, and fail the store closed."""
    from tests.redis_topology import sentinel_set, wait_until

    with sentinel_set(tmp_path) as s:
        store = RedisStore(s.url("timeout=0.5"))
        try:
            counters = store.counters()
            assert counters is not None
            _, held = await counters.reserve_within("agent", "a", KEYS, charges(10, 0), T0)
            assert held.ok
            old = s.primary.port
            s.primary.kill()
            await asyncio.to_thread(wait_until, lambda: s.primary_port() != old, 15, "Sentinel did not fail over")
            deadline = asyncio.get_running_loop().time() + 15
            while True:
                try:
                    await counters.reserve_within("agent", "a", KEYS, charges(10, 0), T0)
                except StoreIntegrityError:
                    break
                except StoreUnavailable:
                    assert asyncio.get_running_loop().time() < deadline, "the failover was not detected"
                    await asyncio.sleep(0.2)
                    continue
                raise AssertionError("a reservation was admitted on a primary that may have missed writes")
            assert "primary changed" in store.integrity
            with pytest.raises(StoreIntegrityError):  # the blocking client fails closed too
                store.snapshot("agent", "a", T0, KEYS)
            assert store.acknowledge()["acknowledged"] is True
            _, held = await counters.reserve_within("agent", "a", KEYS, charges(10, 0), T0)
            assert held.ok
        finally:
            store.close()
