"""The Redis store on a Redis Cluster through failovers (issue #30), against real servers:
one cluster of three primaries, each with one replica (cluster-node-timeout 1 s), shared by
the module; each test works on a slot owned by a primary no earlier test killed.

What each shows:
- wait=2 with one replica: WAIT runs on the slot owner's connection and answers 1, so the
  reservation is dropped and the step refused as retryable (as on plain Redis).
- wait=1: the primary owning the store's slot SIGKILLed under load at a per-day cost cap;
  the cluster promotes its replica, the store finds the new owner itself (no MOVED target
  trusted) and steps are admitted again within 15 s of the kill; what was admitted stays
  within the cap and all of it is counted on the new owner (nothing it admitted was lost).
- wait=0: the same kill is detected as a possible loss (the new owner's replication id is
  not the one the store wrote to, and no replica acknowledged the writes): every step fails
  closed until one acknowledgement, which clears it for every store on the cluster. (It
  shows the detection; whether the promoted replica had in fact missed a write is not
  forced here.)
- wait=1 does not cover a new owner that is not a replica of the old one: the slot resharded
  to another primary (keys moved with it) fails the store closed until acknowledged.
- the asyncio client (the per-step path on the event loop, a redis.asyncio.Redis to the
  slot's owner): 64 concurrent reservations at a cap admit exactly the cap (no reply lost,
  as redis-py's asyncio Cluster client lost them), and the owner killed without wait is
  detected by its own connections, failing the store closed until acknowledged.
- hostile: a node that is not the primary serving the slot (another primary, the owner's
  replica, a Redis without cluster mode) is refused on connect, never used; a forged MOVED
  target is never connected to (the cluster's map is asked again instead)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid

import pytest
import redis

from governor.policy.steps import CounterCharge
from governor.store import StoreIntegrityError, StoreUnavailable, open_store
from governor.store.redis_slot import SlotMap, slot_owner_client
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER
from tests.redis_topology import Cluster, RedisProcess, cluster, wait_until
from tests.test_store_redis_ha import AGENT, DAY_COST, Load, cost

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with cluster(tmp_path_factory.mktemp("cluster"), replicas=1, node_timeout_ms=1000) as c:
        yield c


def fence(prefix: str) -> str:
    return "{" + prefix + "}:fence"


def prefix_on_live_primary(c: Cluster) -> str:
    """A fresh store prefix whose slot a primary with a synced replica owns."""
    for _ in range(200):
        prefix = "gov-" + uuid.uuid4().hex[:8]
        with c.node(c.owner(fence(prefix))).client() as client:
            if client.info("replication").get("connected_slaves", 0) > 0:
                return prefix
    raise AssertionError("no slot on a primary with a replica")


def owner_now(c: Cluster, key: str) -> int | None:
    try:
        return c.owner(key)
    except (redis.RedisError, OSError):
        return None


def kill_owner(c: Cluster, key: str) -> tuple[int, float]:
    old = c.owner(key)
    c.node(old).kill()
    return old, time.monotonic()


def test_a_reservation_fewer_replicas_acknowledged_is_dropped_and_refused_as_retryable(shared):
    c = shared
    prefix = prefix_on_live_primary(c)  # its owner has one replica: wait=2 cannot be met
    store = open_store(c.url(f"prefix={prefix}&wait=2&wait_timeout=0.1&timeout=0.5&retry_after=3"))
    try:
        with pytest.raises(StoreUnavailable, match="acknowledged by 1 of 2") as refused:
            store.reserve(AGENT, "a", cost(0.001, 1.0), time.time())
        assert type(refused.value) is StoreUnavailable and refused.value.retry_after == 3.0  # retryable, no loss
        assert store.snapshot(AGENT, "a", time.time(), [DAY_COST])[DAY_COST] == 0.0  # the reservation dropped
    finally:
        store.close()


def test_the_slot_owner_killed_under_load_with_wait_is_replaced_within_15s_and_the_cap_holds(shared, tmp_path):
    c = shared
    prefix = prefix_on_live_primary(c)
    store = open_store(c.url(f"prefix={prefix}&wait=1&wait_timeout=0.5&timeout=0.5"))
    cap = 0.2  # 200 steps of $0.001
    try:
        with Load(store, cap) as load:
            wait_until(lambda: load.admitted >= 40, 20, "no steps admitted before the kill")
            old, killed = kill_owner(c, fence(prefix))
            wait_until(lambda: owner_now(c, fence(prefix)) not in (None, old), 15, "the cluster did not fail over")
            # the new owner's only replica died with the old one: a supervisor brings one back
            c.add_replica(tmp_path / "replacement", c.owner(fence(prefix)))
            wait_until(lambda: load.last_ok > killed, 15, "no step admitted again within 15s of the kill")
            back = load.last_ok - killed
            wait_until(lambda: load.refused_at_cap > 0, 60, "the cap was never reached")
        admitted = load.admitted * 0.001
        counted = store.snapshot(AGENT, "any", time.time(), [DAY_COST])[DAY_COST]
        print(f"\ncluster: back {back:.1f}s after the kill; admitted ${admitted:.3f} at cap ${cap}, counted "
              f"${counted:.3f}, {len(load.errors)} refusals while failing over")
        assert back < 15
        assert admitted <= cap + 1e-9  # what was admitted stays within the cap
        assert counted >= admitted - 1e-9  # and all of it is on the new owner: nothing lost
        assert load.errors  # the failover was felt (refused as retryable), never as a loss
        assert not any(isinstance(e, StoreIntegrityError) for e in load.errors)
        assert store.integrity is None
    finally:
        store.close()


def test_the_slot_owner_killed_without_wait_is_detected_and_fails_closed_until_acknowledged(shared):
    c = shared
    prefix = prefix_on_live_primary(c)
    store, other = open_store(c.url(f"prefix={prefix}&timeout=0.5")), open_store(c.url(f"prefix={prefix}&timeout=0.5"))
    try:
        assert store.reserve(AGENT, "a", cost(0.001, 1.0), time.time()).ok
        assert other.reserve(AGENT, "b", cost(0.001, 1.0), time.time()).ok
        old, _ = kill_owner(c, fence(prefix))
        wait_until(lambda: owner_now(c, fence(prefix)) not in (None, old), 15, "the cluster did not fail over")

        def lost() -> bool:
            try:
                store.reserve(AGENT, "a", cost(0.001, 1.0), time.time())
            except StoreIntegrityError:
                return True
            except StoreUnavailable:
                return False
            raise AssertionError("a reservation was admitted on a new owner that may have missed writes")

        wait_until(lost, 15, "the failover was not detected")
        assert "primary changed" in store.integrity
        with pytest.raises(StoreIntegrityError):  # for good, not once
            store.snapshot(AGENT, "a", time.time())
        with pytest.raises(StoreIntegrityError):  # the other replica's store finds it too
            wait_until(lambda: _refused_as_retryable(other), 15, "the other store stayed unreachable")
            other.snapshot(AGENT, "b", time.time())
        assert store.acknowledge()["acknowledged"] is True
        assert store.reserve(AGENT, "a", cost(0.001, 1.0), time.time()).ok
        assert other.reserve(AGENT, "b", cost(0.001, 1.0), time.time()).ok  # one acknowledgement for all
    finally:
        store.close()
        other.close()


def move_slot(c: Cluster, key: str, to: int) -> None:
    """An operator's resharding: `key`'s slot and its keys moved to the primary on `to`."""
    source = c.owner(key)
    with c.node(source).client() as src, c.node(to).client() as dst:
        slot = src.execute_command("CLUSTER", "KEYSLOT", key)
        src_id, dst_id = src.execute_command("CLUSTER", "MYID"), dst.execute_command("CLUSTER", "MYID")
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", to, "", 0, 5000, "KEYS", *keys)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


def test_the_slot_moved_to_a_primary_that_is_no_replica_of_its_owner_fails_closed_even_with_wait(shared):
    """wait=1 covers a replica promoted in its primary's place (its second replication id is
    the old one); a slot resharded to another primary is a new owner the store's writes were
    never acknowledged on: the MOVED is followed through the cluster's map, the new owner's
    replication id is unrelated, and the store fails closed until acknowledged (the keys
    moved with the slot: nothing is counted from zero)."""
    c = shared
    prefix = prefix_on_live_primary(c)
    store = open_store(c.url(f"prefix={prefix}&wait=1&wait_timeout=0.5&timeout=0.5"))
    try:
        assert store.reserve(AGENT, "a", cost(0.25, 1.0), time.time()).ok
        owner = c.owner(fence(prefix))
        target = next(n.port for n in c.nodes if n.port != owner and n.process.poll() is None
                      and n.client().info("replication").get("connected_slaves", 0) > 0)
        move_slot(c, fence(prefix), target)
        wait_until(lambda: owner_now(c, fence(prefix)) == target, 10, "the slot did not move")
        with pytest.raises(StoreIntegrityError, match="primary changed"):
            store.reserve(AGENT, "a", cost(0.25, 1.0), time.time())
        assert store.acknowledge()["acknowledged"] is True
        assert store.snapshot(AGENT, "a", time.time(), [DAY_COST])[DAY_COST] == 0.25  # moved, not lost
        assert store.reserve(AGENT, "a", cost(0.25, 1.0), time.time()).ok
    finally:
        store.close()


def _refused_as_retryable(store) -> bool:
    """True once `store` is past transient refusals (it answers, or fails closed)."""
    try:
        store.snapshot(AGENT, "b", time.time())
    except StoreIntegrityError:
        return True
    except StoreUnavailable:
        return False
    return True


class PinnedMap(SlotMap):
    """The cluster's slot map, but naming `node` as the owner (a stale or forged map)."""

    def __init__(self, node: int, key: str) -> None:
        super().__init__([("127.0.0.1", node)], key, {"socket_timeout": 2, "decode_responses": True})
        self.node = node

    def _ask(self) -> tuple[str, int]:
        return "127.0.0.1", self.node


def test_a_node_that_is_not_the_primary_serving_the_slot_is_refused(shared, tmp_path):
    c = shared
    prefix = prefix_on_live_primary(c)
    owner = c.owner(fence(prefix))
    roles = {}
    for n in c.nodes:
        if n.process.poll() is None:
            with n.client() as client:
                roles[n.port] = client.info("replication")["role"]
    replica = next(port for port, role in roles.items() if role == "slave")
    elsewhere = next(port for port, role in roles.items() if role == "master" and port != owner)
    for wrong in (elsewhere, replica):
        client = slot_owner_client(PinnedMap(wrong, fence(prefix)), connect={"socket_timeout": 2, "decode_responses": True},
                                   on_connect=None)
        with pytest.raises(redis.ConnectionError, match="is not the primary serving slot"):
            client.get(fence(prefix))
        client.close()
    plain = RedisProcess(tmp_path / "plain")
    try:  # a Redis without cluster mode names no owner: the store does not open on it
        with pytest.raises(StoreUnavailable, match="no node names the owner"):
            open_store(f"redis+cluster://127.0.0.1:{plain.port}?timeout=0.5")
    finally:
        plain.stop()


class ForgedNode:
    """A loopback server speaking just enough RESP to pass for the primary serving every
    slot, that answers every command with a MOVED to `target` (a forged redirection)."""

    def __init__(self, target: int, slots: bytes | None = None, nodes: str | None = None) -> None:
        self.target = target
        self.slots, self.nodes = slots, nodes  # forged CLUSTER SLOTS / CLUSTER NODES answers
        self.asked_slots = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.server.settimeout(0.2)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        reader = conn.makefile("rb")
        try:
            while line := reader.readline():
                words = []
                for _ in range(int(line[1:])):
                    size = int(reader.readline()[1:])
                    words.append(reader.read(size + 2)[:-2].decode().upper())
                conn.sendall(self._answer(words))
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def _answer(self, words: list[str]) -> bytes:
        def bulk(text: str) -> bytes:
            return f"${len(text)}\r\n{text}\r\n".encode()
        if words[0] == "HELLO":  # redis-py 8 speaks RESP3
            return b"%2\r\n" + bulk("server") + bulk("redis") + bulk("proto") + b":3\r\n"
        if words[0] in ("CLIENT", "PING"):
            return b"+OK\r\n" if words[0] == "CLIENT" else b"+PONG\r\n"
        if words[:2] == ["CLUSTER", "SLOTS"]:
            self.asked_slots += 1
            if self.slots is not None:
                return self.slots
            return b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n" + bulk("127.0.0.1") + f":{self.port}\r\n".encode()
        if words[:2] == ["CLUSTER", "NODES"]:
            if self.nodes is not None:
                return bulk(self.nodes)
            return bulk(f"f00d 127.0.0.1:{self.port}@1 myself,master - 0 0 1 connected 0-16383\n")
        if words[0] == "INFO":
            return bulk("# Replication\r\nrole:master\r\nmaster_replid:forged\r\nmaster_replid2:0\r\n")
        return f"-MOVED 1234 127.0.0.1:{self.target}\r\n".encode()

    def stop(self) -> None:
        self.stopping.set()
        self.server.close()
        self.thread.join(2)


def test_a_forged_moved_target_is_never_followed():
    bogus = socket.create_server(("127.0.0.1", 0))  # where the forged MOVED points: nothing may connect
    bogus.settimeout(0.3)
    node = ForgedNode(bogus.getsockname()[1])
    try:
        with pytest.raises(StoreUnavailable, match="MovedError"):
            open_store(f"redis+cluster://127.0.0.1:{node.port}?timeout=0.5")
        assert node.asked_slots >= 2  # the map was asked again of the cluster's nodes, once per MOVED
        with pytest.raises(socket.timeout):
            bogus.accept()
    finally:
        node.stop()
        bogus.close()


async def test_the_asyncio_client_on_the_slot_owner_holds_the_cap_and_finds_a_failover(shared):
    c = shared
    prefix = prefix_on_live_primary(c)
    store = open_store(c.url(f"prefix={prefix}&timeout=0.5"))
    keys = [DAY_COST]
    try:
        counters = store.counters()
        assert counters is not None  # Cluster has the one-round-trip asyncio path now
        now = time.time()
        results = await asyncio.wait_for(asyncio.gather(*(
            counters.reserve_within(AGENT, f"s{i % 8}", keys, [CounterCharge("per_day", "cost_usd", 1.0, 10.0)], now)
            for i in range(64))), 30)
        held = [r for _, r in results if r.ok]
        assert len(held) == 10  # exactly the cap: every reply read, none lost or counted twice
        await counters.commit(held[0].id, None, now)
        assert await counters.release(held[1].id) is True
        assert store.snapshot(AGENT, "x", now, keys)[DAY_COST] == 9.0

        old, _ = await asyncio.to_thread(kill_owner, c, fence(prefix))
        await asyncio.to_thread(wait_until, lambda: owner_now(c, fence(prefix)) not in (None, old), 15,
                                "the cluster did not fail over")
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            try:
                await counters.reserve_within(AGENT, "a", keys, cost(0.001, 100.0), time.time())
            except StoreIntegrityError:
                break
            except StoreUnavailable:
                assert asyncio.get_running_loop().time() < deadline, "the failover was not detected"
                await asyncio.sleep(0.1)
                continue
            raise AssertionError("a reservation was admitted on a new owner that may have missed writes")
        assert "primary changed" in store.integrity
        with pytest.raises(StoreIntegrityError):  # the blocking client fails closed too
            store.snapshot(AGENT, "a", time.time(), keys)
        assert store.acknowledge()["acknowledged"] is True
        _, again = await counters.reserve_within(AGENT, "a", keys, cost(0.001, 100.0), time.time())
        assert again.ok
    finally:
        store.close()


@pytest.mark.parametrize(("slots", "nodes", "complaint"), [
    (b"+not a list\r\n", None, "no node names the owner"),
    (b"*0\r\n", None, "no node names the owner"),
    (b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:70000\r\n", None, "no node names the owner"),
    (b"*1\r\n*2\r\n:0\r\n:16383\r\n", None, "no node names the owner"),
    (None, "f00d 127.0.0.1:1@1 myself,slave abcd 0 0 1 connected\n", "is not the primary serving slot"),
    (None, "f00d 127.0.0.1:1@1 myself,master - 0 0 1 connected 0-5\n", "is not the primary serving slot"),
    (None, "garbage", "is not the primary serving slot"),
])
def test_a_forged_slot_map_or_node_claim_is_refused_naming_why(slots, nodes, complaint):
    node = ForgedNode(1, slots=slots, nodes=nodes)
    try:
        with pytest.raises(StoreUnavailable, match=complaint):
            open_store(f"redis+cluster://127.0.0.1:{node.port}?timeout=0.5")
    finally:
        node.stop()
