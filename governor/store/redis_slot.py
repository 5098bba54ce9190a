"""The Redis store on Redis Cluster: a plain client to the node that owns the store's slot.

Every key of one store is in one hash slot (its prefix is a hash tag, redis_client), so
every command and script of the store goes to one node: the slot's owner. The store talks
to it through an ordinary `redis.Redis` whose connections look the owner up when they
connect (SlotMap, from the cluster's own CLUSTER SLOTS answers), as redis-py's Sentinel
connections look up the primary. So everything plain Redis does holds on Cluster too:
a script and its WAIT share one connection (`wait=N`), and each new connection reads the
owner's replication id (a failover to a node that may have missed writes fails the store
closed, governor.store.redis).

Not trusted: a MOVED or ASK reply's target (the map is asked again of the cluster's nodes,
and a reply that did not run is run once more on the owner the map names), and a node
that does not say it is a primary owning the slot (CLUSTER NODES, on every new
connection): the connection is refused, the step retryable.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import AskError
from redis.retry import Retry


class SlotMap:
    """Which node owns `slot`, as the cluster's nodes say (CLUSTER SLOTS); asked again
    after `stale()`. Thread-safe; the asyncio client shares it (its look-ups are quick,
    and only after a failover or a refusal)."""

    def __init__(self, startup: Sequence[tuple[str, int]], key: str, connect: dict[str, Any], *,
                 tls: bool = False) -> None:
        self.slot = key_slot(key.encode())
        self._startup = list(startup)
        self._known: list[tuple[str, int]] = list(startup)  # every node the last answer named
        self._connect = connect  # username, password, timeouts of a look-up's connection
        self.tls = tls
        self._owner: tuple[str, int] | None = None
        self._lock = threading.Lock()

    def owner(self) -> tuple[str, int]:
        """The slot's owner (host, port); asks the cluster when stale. ConnectionError when
        no node answers or none names an owner."""
        with self._lock:
            if self._owner is None:
                self._owner = self._ask()
            return self._owner

    def stale(self) -> None:
        """The owner may have changed (a refusal, a MOVED, a lost connection): ask again."""
        with self._lock:
            self._owner = None

    @property
    def current(self) -> tuple[str, int] | None:
        return self._owner

    def _ask(self) -> tuple[str, int]:
        errors: list[str] = []
        # the last answer's nodes first (the owner of a failover is among them), then the URL's
        for host, port in dict.fromkeys(self._known + self._startup):
            try:
                answer = self._cluster_slots(host, port)
            except (redis.RedisError, OSError) as exc:
                errors.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
                continue
            owner, nodes = self._read(answer, host)
            if nodes:
                self._known = nodes
            if owner is not None:
                return owner
            errors.append(f"{host}:{port}: no owner of slot {self.slot}")
        raise redis.ConnectionError(f"Redis Cluster: no node names the owner of slot {self.slot} ({'; '.join(errors)})")

    def _cluster_slots(self, host: str, port: int) -> Any:
        kind = redis.SSLConnection if self.tls else redis.Connection
        connection = kind(host=host, port=port, **self._connect)
        try:
            connection.send_command("CLUSTER", "SLOTS")
            return connection.read_response()
        finally:
            connection.disconnect()

    def _read(self, answer: Any, asked: str) -> tuple[tuple[str, int] | None, list[tuple[str, int]]]:
        """The slot's primary in a CLUSTER SLOTS answer, and every node it names."""
        owner, nodes = None, []
        if not isinstance(answer, list):
            return None, []
        for entry in answer:
            if not (isinstance(entry, list) and len(entry) >= 3 and isinstance(entry[0], int)
                    and isinstance(entry[1], int)):
                continue
            addresses = []
            for node in entry[2:]:
                if isinstance(node, list) and len(node) >= 2 and isinstance(node[1], int) and 0 < node[1] < 65536:
                    host = node[0] if isinstance(node[0], str) and node[0] else asked  # "": the node asked
                    addresses.append((host, node[1]))
            nodes += addresses
            if addresses and entry[0] <= self.slot <= entry[1]:
                owner = addresses[0]  # a range's first node is its primary
        return owner, list(dict.fromkeys(nodes))


def owns(nodes: str, slot: int) -> bool:
    """Whether a CLUSTER NODES answer's "myself" line is a primary serving `slot`."""
    for line in str(nodes).splitlines():
        fields = line.split()
        if len(fields) < 8 or "myself" not in fields[2].split(","):
            continue
        if "master" not in fields[2].split(","):
            return False
        for served in fields[8:]:
            if served.startswith("["):  # a slot being migrated or imported: not served
                continue
            low, _, high = served.partition("-")
            if low.isdigit() and (high or low).isdigit() and int(low) <= slot <= int(high or low):
                return True
        return False
    return False


class SlotOwnerConnection(redis.Connection):
    """A connection to the store slot's owner: looked up when it connects, checked to be a
    primary serving the slot, and found again after a MOVED or a lost connection."""

    def __init__(self, *, slot_map: SlotMap, **kwargs: Any) -> None:
        self.slot_map = slot_map
        self._moved = False  # a MOVED or ASK came on this connection: it is to another node
        self._serves_slot = False  # this connection's node said it is the primary serving the slot
        super().__init__(**kwargs)

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if self._sock:
            return
        for attempt in (1, 2):
            self.host, self.port = self.slot_map.owner()
            self._serves_slot = False
            try:
                return super().connect_check_health(check_health=check_health, retry_socket_connect=False)
            except (redis.ConnectionError, redis.TimeoutError):
                self.slot_map.stale()
                # no node serving the slot answered (nothing was sent): the owner named next
                # may; a refusal past that (the store's own check of the owner) stands
                if attempt == 2 or self._serves_slot:
                    raise

    def on_connect_check_health(self, check_health: bool = True) -> None:
        super().on_connect_check_health(check_health=check_health)
        try:
            self.send_command("CLUSTER", "NODES")
            nodes = self.read_response()
        except redis.ResponseError as exc:
            raise redis.ConnectionError(f"Redis Cluster: {self.host}:{self.port} is no cluster node ({exc})") from exc
        if not owns(nodes, self.slot_map.slot):
            raise redis.ConnectionError(f"Redis Cluster: {self.host}:{self.port} is not the primary serving slot "
                                        f"{self.slot_map.slot}")
        self._serves_slot = True

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            response = super().read_response(*args, **kwargs)
        except AskError:  # MOVED or ASK: the command did not run here; the target is not trusted
            self._wrong_node()
            raise
        except (redis.ConnectionError, redis.TimeoutError):
            self.slot_map.stale()
            raise
        if isinstance(response, AskError):  # inside a pipeline's answers
            self._wrong_node()
        return response

    def _wrong_node(self) -> None:
        self._moved = True
        self.slot_map.stale()

    def should_reconnect(self) -> bool:
        """After a MOVED (back in the pool, or before a command runs again): reconnect, to
        the owner the map names then."""
        return self._moved or super().should_reconnect()

    def reset_should_reconnect(self) -> None:
        self._moved = False
        super().reset_should_reconnect()


class SlotOwnerSSLConnection(SlotOwnerConnection, redis.SSLConnection):
    pass


def slot_owner_client(slot_map: SlotMap, *, connect: dict[str, Any], on_connect: Any) -> redis.Redis:
    """A redis.Redis whose every connection goes to the owner `slot_map` names. A command
    that drew a MOVED or ASK runs once more (it did not run); nothing else is retried (a
    retried reservation could count twice)."""
    tls = slot_map.tls
    retry = Retry(NoBackoff(), 1, supported_errors=(AskError,))
    pool = redis.ConnectionPool(connection_class=SlotOwnerSSLConnection if tls else SlotOwnerConnection,
                                slot_map=slot_map, retry=retry, redis_connect_func=on_connect, **connect)
    return redis.Redis.from_pool(pool)
