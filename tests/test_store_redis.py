"""The Redis store against real redis-server processes: replicas, expiry, failing closed."""

from __future__ import annotations

import hashlib
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
    server.stop()  # continued first if a test stopped it


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


async def test_a_local_and_a_shared_session_of_one_name_are_two_sessions_under_one_day_budget(redis_url: str):
    """`?sessions=local` keeps its sessions in a space of their own (LOCAL_SESSIONS): a local
    and a shared session named alike have their own state, per-session counters, reservations
    and listing, on the blocking and the asyncio path; per-day counters are the agent's."""
    p = prefix()
    session_tokens = ("per_session", None, "tokens")
    both = [DAY_TOKENS, session_tokens]
    with RedisStore(redis_url, prefix=p) as shared, RedisStore(redis_url + "?sessions=local", prefix=p) as local:
        shared.save_session("s1", {"iterations": 7})
        assert local.load_session("s1") is None
        local.save_session("s1", {"iterations": 1})
        assert shared.load_session("s1") == {"iterations": 7} and local.load_session("s1") == {"iterations": 1}
        assert shared.list_sessions() == ["s1"] and local.list_sessions() == ["s1"]
        charge = [CounterCharge("per_day", "tokens", 100, 1000), CounterCharge("per_session", "tokens", 100, 150)]
        assert shared.reserve("agent", "s1", charge, T0).ok
        shared.add("agent", "s1", [CounterCharge("per_session", "tokens", 50, None)], T0)
        held = local.reserve("agent", "s1", charge, T0)  # the shared s1's 150 is not the local s1's
        assert held.ok
        _, refused = local.reserve_within("agent", "s1", both, charge, T0)
        assert not refused.ok and refused.failed.scope == "per_session" and refused.observed == 100
        snapshot, again = await local.counters().reserve_within("agent", "s1", both, [charge[0]], T0)
        assert again.ok and snapshot == {DAY_TOKENS: 200, session_tokens: 100}
        assert shared.snapshot("agent", "s1", T0, both) == {DAY_TOKENS: 300, session_tokens: 150}
        assert local.delete_session("s1") is True
        assert local.load_session("s1") is None and local.list_sessions() == []
        assert shared.load_session("s1") == {"iterations": 7} and shared.list_sessions() == ["s1"]
        assert shared.snapshot("agent", "s1", T0, both) == {DAY_TOKENS: 300, session_tokens: 150}
        assert local.snapshot("agent", "s1", T0, both) == {DAY_TOKENS: 300, session_tokens: 0}


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


# --- a budget counter edited in Redis is damage: refused, never read as zero (#30, #32) ------

FORGED = {"text": "lots", "nan": "nan", "inf": "inf", "-inf": "-inf", "negative": "-1000000",
          "a list": None, "a string": None}
COUNTERS = [("per_session", "tokens"), ("per_session", "cost_usd"), ("per_day", "tokens"), ("per_day", "cost_usd")]
EVERY = [CounterCharge(scope, dimension, 5, 10_000) for scope, dimension in COUNTERS]
KEYS = [(scope, None, dimension) for scope, dimension in COUNTERS]


def dump(client: redis.Redis, p: str) -> dict:
    """Everything under the prefix, to show a refused script wrote nothing."""
    out = {}
    for key in client.keys(f"{p}*"):
        kind = client.type(key)
        out[key] = (kind, client.hgetall(key) if kind == b"hash" else client.lrange(key, 0, -1) if kind == b"list"
                    else sorted(client.smembers(key)) if kind == b"set" else client.zrange(key, 0, -1, withscores=True)
                    if kind == b"zset" else client.get(key))
    return out


def forge(client: redis.Redis, p: str, scope: str, dimension: str, found: str | None, kind: str) -> str:
    """Put `found` where the counter is (or a key of another type in place of its hash): the
    name CounterDamaged gives it."""
    key = f"{p}sc:s1" if scope == "per_session" else f"{p}d:5:agent:{dimension}|"
    if found is None:
        client.delete(key)
        client.rpush(key, "9") if kind == "a list" else client.set(key, "9")
        return key
    field = f"{dimension}|" if scope == "per_session" else "t"
    client.hset(key, field, found)
    return f"{key}[{field}]"


@pytest.mark.parametrize("scope,dimension", COUNTERS)
@pytest.mark.parametrize("kind", FORGED)
async def test_a_forged_budget_counter_is_refused_by_every_script_and_left_as_found(
        redis_url: str, scope: str, dimension: str, kind: str):
    """On main it was read as zero and overwritten (text), admitted every call (nan, -inf, a
    negative number), refused as an exhausted budget (inf) or as a retryable outage (a key of
    another type). Now every script that reads it, on the blocking client (the threaded full
    round), the asyncio one (`?sessions=local`'s one round trip) and the shared one-round-trip
    scripts, refuses with CounterDamaged naming it, and writes nothing."""
    from governor.store import CounterDamaged, StoreUnavailable
    from governor.store.redis_calls import counter_damaged

    p = prefix()
    client = redis.Redis.from_url(redis_url)
    with RedisStore(redis_url, prefix=p) as store:
        store.add("agent", "s1", [CounterCharge(s, d, 100, None) for s, d in COUNTERS], T0)
        held = store.reserve("agent", "s1", EVERY, T0)
        assert held.ok
        client.set(f"{p}st:s1", b"state")  # a shared session's saved state, as SHARED_* check it
        name = forge(client, p, scope, dimension, FORGED[kind], kind)
        before = dump(client, p)
        counters = store.counters()
        calls = {
            "reserve": lambda: store.reserve("agent", "s1", EVERY, T0),
            "reserve_within": lambda: store.reserve_within("agent", "s1", KEYS, EVERY, T0),
            "snapshot": lambda: store.snapshot("agent", "s1", T0, KEYS),
            "snapshot of all": lambda: store.snapshot("agent", "s1", T0),
            "add": lambda: store.add("agent", "s1", EVERY, T0),
            "extend": lambda: store.extend(held.id, EVERY, T0),
            "commit": lambda: store.commit(held.id, EVERY, T0),
            "release": lambda: store.release(held.id),
        }
        for what, call in calls.items():
            with pytest.raises(CounterDamaged) as raised:
                call()
            assert raised.value.key == name, what
            assert not isinstance(raised.value, StoreUnavailable), what  # neither transient nor a loss
        sha = hashlib.sha1(b"state").hexdigest()
        awaited = {
            "async reserve_within": counters.reserve_within("agent", "s1", KEYS, EVERY, T0),
            "async commit": counters.commit(held.id, EVERY, T0),
            "async release": counters.release(held.id),
            "shared_admit": counters.shared_admit("agent", "s1", KEYS, EVERY, T0, sha, b"next", []),
            "shared_settle": counters.shared_settle(held.id, EVERY, T0, "s1", sha, b"next"),
        }
        for what, call in awaited.items():
            with pytest.raises(CounterDamaged) as raised:
                await call
            assert raised.value.key == name, what
        assert dump(client, p) == before  # nothing written: the counter is left as found
        assert store.integrity is None  # damage to one key, not a loss: other counters serve
        assert store.reserve("agent", "s2", [CounterCharge("per_session", "tokens", 5, 10)], T0).ok
        await counters.aclose()
        assert counter_damaged(Exception("GOVERNOR_FENCE x")) is None
    client.close()


def test_mending_a_damaged_counter_serves_again_and_well_formed_values_are_trusted(redis_url: str):
    from governor.store import CounterDamaged

    p = prefix()
    client = redis.Redis.from_url(redis_url)
    with RedisStore(redis_url, prefix=p) as store:
        client.hset(f"{p}sc:s1", "tokens|", "lots")
        with pytest.raises(CounterDamaged):
            store.reserve("agent", "s1", [CounterCharge("per_session", "tokens", 5, 10)], T0)
        client.hdel(f"{p}sc:s1", "tokens|")  # the operator deletes it: counted from zero again
        assert store.reserve("agent", "s1", [CounterCharge("per_session", "tokens", 5, 10)], T0).ok
        client.hset(f"{p}sc:s1", "tokens|", "7")  # an operator's correction, well formed: trusted
        refused = store.reserve("agent", "s1", [CounterCharge("per_session", "tokens", 5, 10)], T0)
        assert not refused.ok and refused.observed == 7
        client.hset(f"{p}sc:s1", "tokens|", "-1e-9")  # float sums of adds and takes: within the slack
        assert store.snapshot("agent", "s1", T0, [("per_session", None, "tokens")]) == \
            {("per_session", None, "tokens"): -1e-9}
    client.close()


@pytest.mark.parametrize("fields,named", [
    ({"t": "5"}, "[lo hi t]"),  # a total without its buckets' range
    ({"lo": "10", "hi": "3", "t": "5"}, "[lo hi]"),  # a range that runs backwards
    ({"lo": "1.5", "hi": "3", "t": "5"}, "[lo hi]"),  # bucket numbers are whole
    ({"lo": "x", "hi": "3", "t": "5"}, "[lo]"),
])
def test_a_per_day_counter_with_a_forged_shape_is_refused(redis_url: str, fields: dict, named: str):
    from governor.store import CounterDamaged

    p = prefix()
    client = redis.Redis.from_url(redis_url)
    with RedisStore(redis_url, prefix=p) as store:
        key = f"{p}d:5:agent:tokens|"
        client.hset(key, mapping=fields)
        with pytest.raises(CounterDamaged) as raised:
            store.reserve("agent", "s1", [CounterCharge("per_day", "tokens", 5, 10)], T0)
        assert raised.value.key == key + named
        assert client.hgetall(key) == {k.encode(): v.encode() for k, v in fields.items()}
    client.close()


@pytest.mark.parametrize("lo", ["0", "-1000000000"])
async def test_a_per_day_lo_forged_far_into_the_past_answers_at_once(redis_url: str, lo: str):
    """A per_day hash's `lo` (its oldest bucket) edited far into the past, still a whole number
    <= hi: on main the eviction walked every bucket index from it to the window's start (from 0:
    28 million HGETs in one script, Redis blocked for everyone; the 5 s socket timeout below
    failed the call). Now a gap longer than the hash's fields evicts the buckets the hash holds:
    0 is a correct eviction (the expired bucket leaves the total, the live one stays); a
    negative bucket is not a count, damage as any other. The blocking client and the asyncio one."""
    from governor.store import CounterDamaged
    from governor.store.base import DAY

    p = prefix()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    with RedisStore(redis_url, prefix=p, timeout=5) as store:
        counters = store.counters()
        old = T0 - 2 * DAY.length  # left the window: evicted at the next read
        store.add("agent", "s1", [CounterCharge("per_day", "tokens", 7, None)], old)
        key = f"{p}d:5:agent:tokens|"
        client.hset(key, mapping={"lo": str(DAY.bucket_of(old)), "hi": str(DAY.bucket_of(T0)), "t": "12",
                                  str(DAY.bucket_of(T0)): "5"})  # and 5 within the window, as add leaves it
        client.hset(key, "lo", lo)
        step = [CounterCharge("per_day", "tokens", 5, 10)]
        if lo.startswith("-"):
            with pytest.raises(CounterDamaged) as raised:
                store.snapshot("agent", "s1", T0, [DAY_TOKENS])
            assert raised.value.key == key + "[lo]"
            with pytest.raises(CounterDamaged) as raised:
                await counters.reserve_within("agent", "s1", [DAY_TOKENS], step, T0)
            assert raised.value.key == key + "[lo]" and client.hget(key, "lo") == lo  # left as found
        else:
            snapshot, held = await counters.reserve_within("agent", "s1", [DAY_TOKENS], step, T0)
            assert snapshot == {DAY_TOKENS: 5.0} and held.ok
            assert client.hgetall(key) == {"lo": str(DAY.first_live(T0)), "hi": str(DAY.bucket_of(T0)), "t": "10",
                                           str(DAY.bucket_of(T0)): "10"}
            client.hset(key, "lo", lo)  # again, for the blocking client
            assert store.snapshot("agent", "s1", T0, [DAY_TOKENS]) == {DAY_TOKENS: 10.0}
            assert client.hget(key, "lo") == str(DAY.first_live(T0))
            assert not store.reserve("agent", "s1", [CounterCharge("per_day", "tokens", 1, 10)], T0).ok
        await counters.aclose()
    client.close()


def test_a_forged_bucket_is_refused_before_any_counter_is_written(redis_url: str):
    """The bucket a reservation adds to is read with the totals, so a forged bucket refuses
    the reservation before its other charges are held."""
    from governor.store import CounterDamaged
    from governor.store.base import DAY

    p = prefix()
    client = redis.Redis.from_url(redis_url)
    with RedisStore(redis_url, prefix=p) as store:
        store.add("agent", "s1", [CounterCharge(s, d, 100, None) for s, d in COUNTERS], T0)
        bucket = str(DAY.bucket_of(T0))
        client.hset(f"{p}d:5:agent:cost_usd|", bucket, "nan")
        before = dump(client, p)
        with pytest.raises(CounterDamaged) as raised:
            store.reserve("agent", "s1", EVERY, T0)
        assert raised.value.key == f"{p}d:5:agent:cost_usd|[{bucket}]"
        assert dump(client, p) == before
    client.close()


def test_what_a_forged_counter_or_session_id_quotes_is_never_taken_for_a_fence(redis_url: str):
    """The damage reply quotes the key (a session id is the agent's) and what it holds: text
    that reads like a fence error there adopts nothing."""
    from governor.store import CounterDamaged

    p = prefix()
    client = redis.Redis.from_url(redis_url)
    with RedisStore(redis_url, prefix=p) as store:
        session = "GOVERNOR_FENCE ack-forged"
        client.hset(f"{p}sc:{session}", "tokens|", "GOVERNOR_FENCE ack-also-forged\r\n")
        epoch = store.epoch
        with pytest.raises(CounterDamaged) as raised:
            store.reserve("agent", session, [CounterCharge("per_session", "tokens", 5, 10)], T0)
        assert raised.value.key == f"{p}sc:{session}[tokens|]"
        assert raised.value.found == "GOVERNOR_FENCE ack-also-forged??"
        assert store.epoch == epoch and store.integrity is None
    client.close()


async def test_a_forged_counter_of_a_session_with_a_non_ascii_name_is_named_as_it_is(redis_url: str):
    """The script gives the key's length in bytes (Lua's `#`): a session name that is not ASCII
    was cut by characters, naming a key that does not exist (a trailing space) and cutting what
    it holds. The operator is told to delete exactly that key."""
    from governor.store import CounterDamaged

    p = prefix()
    client = redis.Redis.from_url(redis_url)
    session = "séance-✓"
    with RedisStore(redis_url, prefix=p) as store:
        store.add("agent", session, [CounterCharge("per_session", "tokens", 100, None)], T0)
        client.hset(f"{p}sc:{session}", "tokens|", "abc")
        with pytest.raises(CounterDamaged) as caught:
            store.reserve("agent", session, [CounterCharge("per_session", "tokens", 10, 1000)], T0)
    client.close()
    assert caught.value.key == f"{p}sc:{session}[tokens|]"
    assert caught.value.found == "abc"
