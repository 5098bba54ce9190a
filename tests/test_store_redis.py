"""The Redis store against real redis-server processes: replicas, expiry, failing closed."""

from __future__ import annotations

import os
import signal
import uuid
from typing import Iterator

import pytest
import redis

from governor.policy.steps import CounterCharge
from governor.store import StoreUnavailable, open_store
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer, redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

from governor.store.redis import RedisStore  # noqa: E402  (after the skip: needs the client only)

T0 = 1_699_999_980.0
DAY_TOKENS = ("per_day", None, "tokens")


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server this test may stop or kill."""
    server = RedisServer()
    yield server
    if server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


def prefix() -> str:
    return f"test-{uuid.uuid4().hex}:"


def test_replicas_share_counters(redis_url: str):
    p = prefix()
    with RedisStore(redis_url, prefix=p) as a, RedisStore(redis_url, prefix=p) as b:
        r = a.reserve("agent", "s1", [CounterCharge("per_day", "tokens", 600, 1000)], T0)
        refused = b.reserve("agent", "s2", [CounterCharge("per_day", "tokens", 600, 1000)], T0)
        assert r.ok and not refused.ok and refused.observed == 600
        b.commit(r.id, [CounterCharge("per_day", "tokens", 100, None)], T0)  # any replica may commit
        assert a.snapshot("agent", "s3", T0, [DAY_TOKENS]) == {DAY_TOKENS: 100}


def test_open_store_opens_redis_urls(redis_url: str):
    store = open_store(redis_url)
    try:
        assert isinstance(store, RedisStore)
    finally:
        store.close()


def test_per_day_keys_expire_after_the_window(redis_url: str):
    p = prefix()
    with RedisStore(redis_url, prefix=p) as store:
        store.add("agent", "s1", [CounterCharge("per_day", "tokens", 5, None)], T0)
    client = redis.Redis.from_url(redis_url)
    try:
        keys = client.keys(f"{p}d:*") + client.keys(f"{p}dk:*")
        assert len(keys) == 2
        for key in keys:
            assert 86400_000 < client.pttl(key) <= (86400 + 120) * 1000
    finally:
        client.close()


def test_expired_buckets_are_evicted_from_the_running_total(redis_url: str):
    p = prefix()
    with RedisStore(redis_url, prefix=p) as store:
        for minute in range(0, 30):
            store.add("agent", "s1", [CounterCharge("per_day", "tokens", 1, None)], T0 + 60 * minute)
        later = T0 + 86400 + 60 * 10  # the first 10 minutes have left the window
        assert store.snapshot("agent", "s1", later, [DAY_TOKENS]) == {DAY_TOKENS: 20}
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        (key,) = client.keys(f"{p}d:*")
        fields = client.hgetall(key)
        assert len(fields) == 20 + 3  # the live buckets, "t", "lo", "hi"
        assert float(fields["t"]) == 20
    finally:
        client.close()


def test_an_unreachable_server_is_unavailable_at_open():
    with pytest.raises(StoreUnavailable):
        RedisStore("redis://127.0.0.1:1/0", timeout=0.5)


def test_a_killed_server_fails_closed(own_server: RedisServer):
    store = RedisStore(own_server.url, prefix=prefix(), timeout=0.5)
    try:
        assert store.reserve("agent", "s1", [CounterCharge("per_day", "tokens", 1, 10)], T0).ok
        own_server.process.kill()
        own_server.process.wait()
        for call in (
            lambda: store.reserve("agent", "s1", [CounterCharge("per_day", "tokens", 1, 10)], T0),
            lambda: store.snapshot("agent", "s1", T0),
            lambda: store.commit("x", None, T0),
            lambda: store.release("x"),
            lambda: store.save_session("s1", {}),
            lambda: store.load_session("s1"),
            lambda: store.take_nonce("n", T0),
        ):
            with pytest.raises(StoreUnavailable):
                call()
    finally:
        store.close()


def test_a_hung_server_times_out_instead_of_hanging(own_server: RedisServer):
    store = RedisStore(own_server.url, prefix=prefix(), timeout=0.3)
    try:
        store.add("agent", "s1", [CounterCharge("per_day", "tokens", 1, None)], T0)
        os.kill(own_server.process.pid, signal.SIGSTOP)
        with pytest.raises(StoreUnavailable, match="Timeout"):
            store.reserve("agent", "s1", [CounterCharge("per_day", "tokens", 1, 10)], T0)
        os.kill(own_server.process.pid, signal.SIGCONT)
        # the timed-out reserve may still have run on the server: then it is counted (an
        # orphaned reservation), never lost
        assert store.snapshot("agent", "s1", T0, [DAY_TOKENS])[DAY_TOKENS] in (1, 2)
    finally:
        store.close()


# --- integrity: a Redis that lost its data fails closed until acknowledged -----------------


def test_an_emptied_redis_fails_closed_until_acknowledged(own_server: RedisServer):
    from governor.store import StoreIntegrityError

    p = prefix()
    cap = [CounterCharge("per_session", "tokens", 5, 10_000)]
    with RedisStore(own_server.url, prefix=p) as a, RedisStore(own_server.url, prefix=p) as b:
        assert a.epoch == b.epoch  # replicas adopt the fence the first one wrote
        a.add("agent", "s1", [CounterCharge("per_session", "tokens", 9_995, None)], T0)
        assert not a.reserve("agent", "s1", [CounterCharge("per_session", "tokens", 50, 10_000)], T0).ok
        redis.Redis.from_url(own_server.url).flushall()
        for store in (a, b):  # every counter operation, on every replica, refuses
            with pytest.raises(StoreIntegrityError, match="lost"):
                store.reserve("agent", "s1", cap, T0)
        with pytest.raises(StoreIntegrityError):
            a.snapshot("agent", "s1", T0)
        with pytest.raises(StoreIntegrityError):  # and it sticks, session state included
            a.load_session("s1")
        lost = a.integrity
        assert lost is not None and "FLUSHALL" in lost
        assert a.acknowledge() == {"acknowledged": True, "lost": lost}
        assert a.integrity is None
        r = a.reserve("agent", "s1", [CounterCharge("per_session", "tokens", 50, 10_000)], T0)
        assert r.ok  # budgets count from what the store holds now: the counters were lost
        # one acknowledgement anywhere clears it for every replica (issue #30): b adopts a's
        assert b.snapshot("agent", "s1", T0, [("per_session", None, "tokens")]) == {("per_session", None, "tokens"): 50}
        assert b.integrity is None and b.epoch == a.epoch
        assert b.acknowledge()["acknowledged"] is False
        assert b.snapshot("agent", "s1", T0, [("per_session", None, "tokens")]) == {("per_session", None, "tokens"): 50}


def test_a_reservation_made_before_the_loss_cannot_be_settled_after_it(own_server: RedisServer):
    from governor.store import StoreIntegrityError

    with RedisStore(own_server.url, prefix=prefix()) as store:
        r = store.reserve("agent", "s1", [CounterCharge("per_session", "tokens", 5, 100)], T0)
        redis.Redis.from_url(own_server.url).flushall()
        for call in (lambda: store.commit(r.id, None, T0), lambda: store.release(r.id),
                     lambda: store.extend(r.id, [CounterCharge("per_session", "tokens", 5, 100)], T0)):
            with pytest.raises(StoreIntegrityError):
                call()


def test_acknowledging_a_loss_not_noticed_yet_says_it_was_lost(own_server: RedisServer):
    with RedisStore(own_server.url, prefix=prefix()) as store:
        assert store.acknowledge() == {"acknowledged": False, "lost": None}  # nothing lost
        redis.Redis.from_url(own_server.url).flushall()
        answer = store.acknowledge()  # before any operation noticed
        assert answer["acknowledged"] is True and "FLUSHALL" in answer["lost"]
        assert store.reserve("agent", "s1", [CounterCharge("per_session", "tokens", 5, 100)], T0).ok


def test_a_fence_written_by_a_new_store_is_not_an_acknowledgement(own_server: RedisServer):
    """A governor that starts on the emptied Redis writes a fresh fence: that clears nobody
    (it cannot tell a loss from a new Redis); only an acknowledgement does, and it also
    clears a replica that had not noticed the loss yet."""
    from governor.store import StoreIntegrityError

    p = prefix()
    with RedisStore(own_server.url, prefix=p) as a, RedisStore(own_server.url, prefix=p) as b:
        redis.Redis.from_url(own_server.url).flushall()
        with pytest.raises(StoreIntegrityError):
            a.snapshot("agent", "s1", T0)
        with RedisStore(own_server.url, prefix=p) as newcomer:
            assert newcomer.epoch != a.epoch
            with pytest.raises(StoreIntegrityError):  # another epoch, not an acknowledged one
                a.snapshot("agent", "s1", T0)
            assert newcomer.acknowledge() == {"acknowledged": False, "lost": None}  # it lost nothing
            assert a.acknowledge()["acknowledged"] is True
            for store in (a, b, newcomer):  # b had not noticed; the newcomer's fence was replaced
                assert store.snapshot("agent", "s1", T0, [("per_session", None, "tokens")]) == \
                    {("per_session", None, "tokens"): 0}
                assert store.epoch.startswith("ack-")
