"""The Redis store on Redis Cluster and through Sentinel failovers, against real servers
(issue #30): its URLs, every operation on a three-primary Cluster with 64 concurrent
reservations at a cap, and a primary SIGKILLed under concurrent load at a per-day cost cap:
with `wait=1` the store is back within 15 s and what it admitted stays within the cap and
is all on the new primary; without `wait` the failover is detected and the store fails
closed until acknowledged."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from governor.policy.steps import CounterCharge
from governor.store import StoreIntegrityError, StoreUnavailable, open_store
from governor.store.redis_client import parse_options
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER
from tests.redis_topology import RedisProcess, cluster, sentinel_set, wait_until

needs_redis = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

AGENT = "ha-agent"
DAY_COST = ("per_day", None, "cost_usd")


def cost(amount: float, cap: float | None) -> list[CounterCharge]:
    return [CounterCharge("per_day", "cost_usd", amount, cap)]


# --- URLs ------------------------------------------------------------------------------


def test_the_governor_options_are_read_and_the_rest_left_to_redis_py():
    rest, options, extra = parse_options("redis://127.0.0.1:6379/0?timeout=0.5&wait=1&wait_timeout=0.2"
                                         "&retry_after=3&health_check_interval=5")
    assert rest == "redis://127.0.0.1:6379/0?health_check_interval=5"
    assert (options.kind, options.timeout, options.wait_replicas, options.wait_timeout, options.retry_after) == \
        ("redis", 0.5, 1, 0.2, 3.0)
    _, options, extra = parse_options("rediss+sentinel://u:p@h1:1,h2:2/svc/3?sentinel_password=s")
    assert options.kind == "sentinel" and extra == {"sentinel_password": "s"}
    _, options, _ = parse_options("redis+cluster://h1:1,h2:2?prefix=tenant-a")
    assert options.kind == "cluster" and options.prefix == "{tenant-a}:"  # one hash slot per store
    _, options, _ = parse_options("redis+cluster://h1:1?wait=1")
    assert options.wait_replicas == 1  # WAIT runs on the slot owner's connection (store/redis_slot.py)


@pytest.mark.parametrize(("url", "complaint"), [
    ("redis+sentinel://h:1/svc?bogus=1", "unknown option"),
    ("redis://h:1/0?wait=many", "wait must be"),
    ("redis://h:1/0?timeout=-1", "timeout must be"),
    ("redis://h:1/0?timeout=nan", "timeout must be"),
    ("redis://h:1/0?prefix={x}", "without braces"),
    ("redis+sentinel://:secret@h:1", "SERVICE"),
    ("redis+sentinel://:secret@h/svc", "HOST:PORT"),
    ("redis+cluster://:secret@h:1/0", "no databases"),
    ("redis+bogus://h:1", "unknown store scheme"),
])
def test_a_malformed_url_is_refused_naming_why_and_never_showing_the_password(url, complaint):
    with pytest.raises(ValueError) as refused:
        open_store(url)
    assert complaint in str(refused.value)
    assert "secret" not in str(refused.value)


# --- Cluster ---------------------------------------------------------------------------


@needs_redis
def test_on_a_three_primary_cluster_every_operation_runs_and_64_concurrent_reservations_stay_within_the_cap(tmp_path):
    with cluster(tmp_path) as c:
        store = open_store(c.url("prefix=gov-" + uuid.uuid4().hex[:6]))
        try:
            cap, start = 10.0, threading.Barrier(64)

            def reserve(_: int) -> bool:
                start.wait(10)
                return store.reserve(AGENT, f"s{_ % 4}", cost(1.0, cap), time.time()).ok

            with ThreadPoolExecutor(64) as pool:
                admitted = sum(pool.map(reserve, range(64)))
            assert admitted == 10  # exactly the cap: no overshoot, no refusal below it
            assert store.snapshot(AGENT, "s0", time.time(), [DAY_COST])[DAY_COST] == 10.0

            # every script and command of the store, on the Cluster
            now = time.time()
            store.add(AGENT, "s9", [CounterCharge("per_session", "tokens", 5, None)], now)
            held = store.reserve(AGENT, "s9", [CounterCharge("per_session", "tokens", 5, 20)], now)
            assert store.extend(held.id, [CounterCharge("per_session", "tokens", 5, 20)], now).ok
            store.commit(held.id, [CounterCharge("per_session", "tokens", 7, None)], now)
            assert store.snapshot(AGENT, "s9", now)[("per_session", None, "tokens")] == 12
            other = store.reserve(AGENT, "s9", [CounterCharge("per_session", "tokens", 1, None)], now)
            assert store.release(other.id)
            store.save_session("s9", {"n": 1})
            assert store.load_session("s9") == {"n": 1} and "s9" in store.list_sessions()
            assert store.delete_session("s9")
            store.put_nonce("n1", now + 60, now)
            assert store.take_nonce("n1", now) and not store.take_nonce("n1", now)
            assert store.settle_reservations(now + 1) == 10  # the 10 held above
            assert store.acknowledge()["acknowledged"] is False

            # the keys the store wrote share one slot, on one of the three primaries
            slots, holders = set(), 0
            for node in c.nodes:
                with node.client() as client:
                    keys = [k for k in client.scan_iter(match=store.prefix + "*")]
                    holders += bool(keys)
                    slots |= {client.execute_command("CLUSTER", "KEYSLOT", k) for k in keys}
            assert len(slots) == 1 and holders == 1
        finally:
            store.close()


# --- Sentinel failover -----------------------------------------------------------------


class Load:
    """Threads reserving and settling $0.001 steps at a per-day cap, until told to stop."""

    def __init__(self, store, cap: float, threads: int = 8) -> None:
        self.store, self.cap = store, cap
        self.admitted = 0
        self.refused_at_cap = 0
        self.errors: list[BaseException] = []
        self.last_ok = time.monotonic()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(threads)]

    def run(self, i: int) -> None:
        while not self.stopping.is_set():
            try:
                held = self.store.reserve(AGENT, f"load-{i}", cost(0.001, self.cap), time.time())
                if held.ok:
                    with self.lock:
                        self.admitted += 1
                        self.last_ok = time.monotonic()
                    self.store.commit(held.id, None, time.time())
                else:
                    with self.lock:
                        self.refused_at_cap += 1
            except StoreUnavailable as exc:  # unreachable, or fail closed (integrity): wait, try again
                with self.lock:
                    self.errors.append(exc)
                time.sleep(0.05)

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(10)


@needs_redis
def test_a_primary_killed_under_load_with_wait_is_replaced_within_15s_and_the_cap_holds(tmp_path):
    with sentinel_set(tmp_path) as s:
        store = open_store(s.url("wait=1&wait_timeout=0.5&timeout=0.5"))
        cap = 0.2  # 200 steps of $0.001
        try:
            with Load(store, cap) as load:
                wait_until(lambda: load.admitted >= 40, 20, "no steps admitted before the kill")
                old = s.primary.port
                s.primary.kill()
                killed = time.monotonic()
                wait_until(lambda: s.primary_port() != old, 15, "Sentinel did not fail over")
                # the supervisor brings a replica back (the new primary's only replica died with the old one)
                s.processes.append(RedisProcess(tmp_path / "replacement", "--replicaof", "127.0.0.1",
                                                str(s.primary_port())))
                wait_until(lambda: load.last_ok > killed, 15, "no step admitted again within 15s of the kill")
                back = load.last_ok - killed
                wait_until(lambda: load.refused_at_cap > 0, 60, "the cap was never reached")
            admitted = load.admitted * 0.001
            counted = store.snapshot(AGENT, "any", time.time(), [DAY_COST])[DAY_COST]
            print(f"\nback {back:.1f}s after the kill; admitted ${admitted:.3f} at cap ${cap}, counted ${counted:.3f}, "
                  f"{len(load.errors)} refusals while failing over")
            assert admitted <= cap + 1e-9  # what was admitted stays within the cap
            assert counted >= admitted - 1e-9  # and all of it is on the new primary: nothing lost
            assert load.errors  # the failover was felt (refused as retryable), never as a loss
            assert not any(isinstance(e, StoreIntegrityError) for e in load.errors)
        finally:
            store.close()


@needs_redis
def test_a_failover_without_wait_is_detected_and_fails_closed_until_acknowledged(tmp_path):
    with sentinel_set(tmp_path) as s:
        store, other = open_store(s.url("timeout=0.5")), open_store(s.url("timeout=0.5"))
        try:
            assert store.reserve(AGENT, "a", cost(0.001, 1.0), time.time()).ok
            assert other.reserve(AGENT, "b", cost(0.001, 1.0), time.time()).ok
            old = s.primary.port
            s.primary.kill()
            wait_until(lambda: s.primary_port() != old, 15, "Sentinel did not fail over")

            def lost() -> bool:
                try:
                    store.reserve(AGENT, "a", cost(0.001, 1.0), time.time())
                except StoreIntegrityError:
                    return True
                except StoreUnavailable:
                    return False
                raise AssertionError("a reservation was admitted on a primary that may have missed writes")

            wait_until(lost, 15, "the failover was not detected")
            assert "primary changed" in store.integrity
            with pytest.raises(StoreIntegrityError):  # for good, not once
                store.snapshot(AGENT, "a", time.time())
            with pytest.raises(StoreIntegrityError):  # the other replica's store finds it too
                other.snapshot(AGENT, "b", time.time())
            assert store.acknowledge()["acknowledged"] is True
            assert store.reserve(AGENT, "a", cost(0.001, 1.0), time.time()).ok
            assert other.reserve(AGENT, "b", cost(0.001, 1.0), time.time()).ok  # one acknowledgement for all
        finally:
            store.close()
            other.close()


@needs_redis
def test_through_sentinel_with_passwords_and_never_showing_them(tmp_path):
    with sentinel_set(tmp_path, password="primary-secret", sentinel_password="sentinel-secret") as s:
        url = (f"redis+sentinel://:primary-secret@127.0.0.1:{s.sentinel.port}/{s.SERVICE}/0"
               "?sentinel_password=sentinel-secret&timeout=1")
        store = open_store(url)
        try:
            assert store.reserve(AGENT, "a", cost(0.001, 1.0), time.time()).ok
        finally:
            store.close()
        for wrong in (url.replace(":primary-secret@", ":wrong-secret@"),
                      url.replace("sentinel_password=sentinel-secret", "sentinel_password=wrong-secret")):
            with pytest.raises(StoreUnavailable) as refused:
                open_store(wrong)
            assert "secret" not in str(refused.value)


@needs_redis
def test_a_shared_chains_append_waits_for_replicas_on_its_own_connection(tmp_path, caplog):
    """WAIT counts the writes of the connection it is sent on: the append and its WAIT go out
    pipelined on one, so under concurrent appends each one is acknowledged for itself; too
    few replicas is said (the event is in the chain on the primary either way)."""
    import logging

    from governor.store.redis_sessions import RedisSessions

    primary = RedisProcess(tmp_path / "primary")
    replica = RedisProcess(tmp_path / "replica", "--replicaof", "127.0.0.1", str(primary.port))
    try:
        wait_until(lambda: replica.client().info("replication").get("master_link_status") == "up", 10,
                   "the replica did not sync")
        client = primary.client()
        client.set("governor:fence", "f")

        @contextlib.contextmanager
        def guard():
            yield

        def chain(wait: int) -> RedisSessions:
            return RedisSessions(client, "governor:", ["governor:fence"], guard, wait_replicas=wait, wait_timeout=0.3)

        one = chain(1)
        with ThreadPoolExecutor(8) as pool:  # concurrent appends on pooled connections, one session each
            assert all(pool.map(lambda k: one.append(f"s{k}", 0, "", b'{"n":0}', f"h{k}"), range(16)))
        assert all(replica.client().llen(f"governor:ch:s{k}") == 1 for k in range(16))
        assert "acknowledged by" not in caplog.text
        with caplog.at_level(logging.WARNING, logger="governor.store"):
            assert chain(2).append("lonely", 0, "", b'{"n":0}', "h")  # one replica of the two asked
        assert "an event of session lonely acknowledged by 1 of 2 replica(s)" in caplog.text
    finally:
        replica.stop()
        primary.stop()
