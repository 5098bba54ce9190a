"""A store in Redis, for governor replicas that share budgets.

Every counter operation is one Lua script (EVALSHA), so Redis runs a
reservation's cap checks and increments for all its counters as one atomic
step: replicas cannot admit more than a cap between them.

Layout, under a key prefix (default "governor:"):
  sc:<session>                     hash "<dimension>|<persona>" -> value (per_session)
  d:<len>:<agent>:<dimension>|<persona>
                                   hash of per_day buckets "<bucket>" -> value, plus
                                   "t" (sum of live buckets), "lo"/"hi" (oldest/newest
                                   bucket); expired buckets are evicted from "t" as
                                   time moves on, so a check costs O(1), not O(buckets)
  dk:<agent>                       set of the agent's per_day "<dimension>|<persona>"
  r:<id>, sr:<session>, rt         a reservation; a session's reservations; all by time
  st:<session>, sessions           saved session state; the set of saved sessions
  n:<nonce>                        a nonce's expiry
  fence                            the epoch written by the first store opened on this Redis
(persona "" is the parent's aggregate; <len> is the agent name's length in bytes,
so no two names collide.) Per-day keys expire two buckets past the window after
their last write. The scripts derive key names from their arguments and name the fence
as their one declared key (KEYS[1]): on Redis Cluster the prefix is a hash tag
({governor}:), so every key the store writes lives in the fence's slot and each script
runs atomically on the one node that owns it. URLs and options: governor.store.redis_client.

Integrity: every counter script first checks that `fence` still holds the epoch this
store adopted when it opened. A Redis that lost its data (FLUSHALL, a failover to an
empty replica, a restart without persistence) has no fence (or, once another store
opened on it, another epoch): the store then raises StoreIntegrityError on every
operation, so every step is refused (recorded as on_governor_error) rather than
counted from zero, until `acknowledge()` adopts the fence as it stands (the control
plane's POST /v1/store/acknowledge). A governor that *starts* on an emptied Redis
cannot tell it from a new one. Run Redis with `maxmemory-policy noeviction`: an evicted
fence reads as a loss.

Failover (Sentinel, or any primary whose replication id changes): replication is
asynchronous, so a promoted replica may miss the last reservations. Every new connection
reads the primary's replication id (INFO replication); when it changed, the store fails
closed as after a loss (StoreIntegrityError until acknowledged), unless reservations are
acknowledged by replicas (`wait=N`: each reserve and extend is followed by WAIT on the
same connection, and a step whose reservation fewer replicas acknowledged is refused as
retryable) and the new primary is a replica of the old one (its second replication id is
the old one): what this store admitted is then on it.

No command is retried: a retried reserve or add could count twice. Any failure
raises StoreUnavailable (transient: the step is refused as retryable, the session goes
on) within the socket timeout. A reserve that timed out may
still have run on the server: its reservation is then orphaned and keeps
counting until `settle_reservations` forgets it (the store errs on counting).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import orjson
import redis

from governor.policy.steps import CounterCharge, CounterKey
from governor.store.base import (
    DAY,
    Reservation,
    RollingWindow,
    StoreIntegrityError,
    StoreUnavailable,
    UnknownReservation,
    cap_limit,
    check_keys,
    encode_state,
    counter_key,
    totals_by_key,
)
from governor.store.redis_client import make_client, parse_options
from governor.store.redis_scripts import (
    ADD,
    COMMIT,
    DELETE_SESSION,
    EXTEND,
    FENCE_ERROR,
    OPEN_FENCE,
    PRELUDE,
    RELEASE,
    RESERVE,
    SETTLE,
    SNAPSHOT,
)

log = logging.getLogger("governor.store")

ACKNOWLEDGED = "ack-"  # how a fence an operator's acknowledgement wrote begins

_SCOPE_CODE = {"per_session": "s", "per_day": "d"}
_SCOPE_NAME = {"s": "per_session", "d": "per_day"}


class RedisStore:
    """A store in the Redis at `url` (redis_client's URLs); thread-safe (a connection pool)."""

    remote = True

    def __init__(
        self,
        url: str,
        *,
        window: RollingWindow = DAY,
        prefix: str | None = None,
        timeout: float | None = None,
    ) -> None:
        rest, options, extra = parse_options(url)
        if timeout is not None:
            options = dataclasses.replace(options, timeout=timeout)
        self.options = options
        self.window = window
        self.prefix = prefix if prefix is not None else options.prefix
        self._keys = [f"{self.prefix}fence"]  # each script's one declared key: its slot on Cluster
        self._closed = False
        self._ttl_ms = math.ceil((window.length + 2 * window.bucket) * 1000)
        self._primary: str | None = None  # the replication id of the primary this store writes to
        self._primary_lock = threading.Lock()
        on_connect = None if options.kind == "cluster" else self._on_connect
        self._client = make_client(rest, options, extra, on_connect)
        register = self._client.register_script
        self._reserve = register(PRELUDE + RESERVE)
        self._commit = register(PRELUDE + COMMIT)
        self._release = register(PRELUDE + RELEASE)
        self._extend = register(PRELUDE + EXTEND)
        self._open_fence = register(OPEN_FENCE)
        self._add = register(PRELUDE + ADD)
        self._snapshot = register(PRELUDE + SNAPSHOT)
        self._settle = register(PRELUDE + SETTLE)
        self._delete_session = register(PRELUDE + DELETE_SESSION)
        self._lost: str | None = None  # why the store fails closed after losing its data
        self._fence_at_loss: str | None = None  # the fence as it stood when the loss was found
        self.epoch = ""
        with self._guard():
            self._client.ping()
            self.epoch = self._open_fence(keys=self._keys, args=(self.prefix, uuid.uuid4().hex))

    def _unavailable(self, message: str) -> StoreUnavailable:
        return StoreUnavailable(message, retry_after=self.options.retry_after)

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn any backend failure into StoreUnavailable, so the caller fails closed."""
        if self._closed:
            raise self._unavailable("Redis store is closed")
        if self._lost is not None and not self._acknowledged_elsewhere():
            raise StoreIntegrityError(self._lost)
        try:
            yield
        except redis.RedisError as exc:
            if self._lost is not None:  # a connection found the primary changed
                raise StoreIntegrityError(self._lost) from exc
            raise self._unavailable(f"Redis store: {type(exc).__name__}: {exc}") from exc

    def _on_connect(self, connection: Any) -> None:
        """Each new connection: the usual handshake, then whether the primary is the one this
        store wrote to (a failover or a restart gives it a new replication id)."""
        connection.on_connect()
        try:
            connection.send_command("INFO", "replication")
            info = connection.read_response()
        except redis.ResponseError:  # INFO refused (a proxy in front of Redis): nothing to compare
            return
        fields = dict(line.split(":", 1) for line in str(info).splitlines() if ":" in line)
        replid, previous = fields.get("master_replid"), fields.get("master_replid2")
        if not replid:
            return
        with self._primary_lock:
            known = self._primary
            self._primary = replid
            if known is None or known == replid:
                return
            if self.options.wait_replicas and previous == known:
                log.warning("Redis store: a replica of the primary took over (replication id %s, was %s); "
                            "reservations were acknowledged by %d replica(s)", replid, known,
                            self.options.wait_replicas)
                return
            try:  # an acknowledgement anywhere clears the loss: it writes a new fence after this
                connection.send_command("GET", self._keys[0])
                self._fence_at_loss = connection.read_response()
            except redis.RedisError:
                self._fence_at_loss = None
            self._lost = self._loss(
                f"on a new primary (replication id {replid}, was {known}), and reservations were not "
                "acknowledged by replicas (wait=0) or it is not a replica of the old one",
                what="the primary changed and may have missed the last writes")
        log.error("%s", self._lost)
        raise redis.ConnectionError("Redis store: the primary changed; writes may have been lost")

    def _run(self, script: Any, *args: Any) -> Any:
        for attempt in (1, 2):
            with self._guard():
                try:
                    return script(keys=self._keys, args=(self.prefix, self.epoch, *args))
                except redis.ResponseError as exc:
                    if not (self._fence_error(exc) and attempt == 1):
                        raise
        raise AssertionError("unreachable")  # pragma: no cover - the second attempt returns or raises

    def _run_acknowledged(self, script: Any, *args: Any) -> tuple[Any, int | None]:
        """`_run`, then WAIT for `wait` replicas on the same connection (one round trip): the
        result and how many replicas acknowledged it (None: no wait configured)."""
        if not self.options.wait_replicas:
            return self._run(script, *args), None
        for attempt in (1, 2):
            with self._guard():
                pipe = self._client.pipeline(transaction=False)
                script(keys=self._keys, args=(self.prefix, self.epoch, *args), client=pipe)
                pipe.execute_command("WAIT", self.options.wait_replicas, math.ceil(self.options.wait_timeout * 1000))
                result, acked = pipe.execute(raise_on_error=False)
                if isinstance(result, redis.ResponseError) and self._fence_error(result) and attempt == 1:
                    continue
                for answer in (result, acked):
                    if isinstance(answer, Exception):
                        raise answer
                return result, int(acked)
        raise AssertionError("unreachable")  # pragma: no cover - the second attempt returns or raises

    def _fence_error(self, exc: Exception) -> bool:
        """A script found the fence gone or replaced: fail closed from now on. True (the
        script did nothing and may run again): the fence is one an operator's acknowledgement
        wrote, after the loss that replaced this store's (acknowledged on another replica)."""
        text = str(exc)
        at = text.find(FENCE_ERROR)
        if at < 0:
            return False
        found = text[at + len(FENCE_ERROR):].strip()
        if found.startswith(ACKNOWLEDGED):
            self._adopt(found)
            return True
        self._fence_at_loss = None if found == "false" else found
        self._lost = self._loss("gone" if found == "false" else "another epoch")
        log.error("%s", self._lost)
        raise StoreIntegrityError(self._lost) from None

    def _acknowledged_elsewhere(self) -> bool:
        """While lost: whether an acknowledgement on any replica wrote a new fence since."""
        try:
            fence = self._client.get(self._keys[0])
        except redis.RedisError:
            return False
        if fence and fence.startswith(ACKNOWLEDGED) and fence != self._fence_at_loss:
            self._adopt(fence)
            return True
        return False

    def _adopt(self, fence: str) -> None:
        self.epoch, self._lost, self._fence_at_loss = fence, None, None
        log.warning("Redis store: the loss of its data was acknowledged (fence %s); budgets count from what it "
                    "holds now", fence)

    def _short(self, acked: int | None, rid: str) -> None:
        """A reservation fewer replicas acknowledged than `wait` asks: dropped (best effort)
        and the step refused as retryable."""
        if acked is None or acked >= self.options.wait_replicas:
            return
        try:
            self._run(self._release, rid)
        except StoreUnavailable:  # it keeps counting: the store errs on counting
            log.warning("Redis store: could not drop unacknowledged reservation %s", rid)
        raise self._unavailable(f"Redis store: the reservation was acknowledged by {acked} of "
                                f"{self.options.wait_replicas} replica(s) within {self.options.wait_timeout:g}s")

    def _noted(self, acked: int | None) -> None:
        """Usage recorded after the step went ahead: a short acknowledgement cannot undo the
        step; a failover losing it leaves the reservation counting (acknowledged before)."""
        if acked is not None and acked < self.options.wait_replicas:
            log.warning("Redis store: usage acknowledged by %d of %d replica(s)", acked, self.options.wait_replicas)

    def _loss(self, fence: str, what: str = "its data was lost") -> str:
        return (f"Redis store: {what} (the fence {self.prefix}fence is {fence}: FLUSHALL, a failover "
                "to a replica that missed writes or a restart without persistence); budget counters cannot be "
                "trusted, every step is refused until an operator acknowledges the loss (POST /v1/store/acknowledge)")

    @property
    def integrity(self) -> str | None:
        """Why the store fails closed after losing its data, or None."""
        return self._lost

    def acknowledge(self) -> dict[str, Any]:
        """An operator accepts that the counters were lost: write a new fence (an
        acknowledged one, "ack-…") and serve again from what Redis holds. One acknowledgement
        clears the loss for every store on this Redis: each adopts an acknowledged fence
        written after it found the loss."""
        if self._closed:
            raise self._unavailable("Redis store is closed")
        try:
            was = self._lost
            if was is None and self._client.get(self._keys[0]) != self.epoch:
                was = self._loss("gone or another epoch")  # lost, not noticed yet: acknowledged all the same
            if was is None:
                return {"acknowledged": False, "lost": None}
            epoch = ACKNOWLEDGED + uuid.uuid4().hex
            self._client.set(self._keys[0], epoch)
        except redis.RedisError as exc:
            raise self._unavailable(f"Redis store: {type(exc).__name__}: {exc}") from exc
        self._adopt(epoch)
        return {"acknowledged": True, "lost": was}

    # --- counters ----------------------------------------------------------------------
    def reserve(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> Reservation:
        totals = totals_by_key(charges)
        index = {key: i for i, key in enumerate(totals, start=1)}
        capped = [c for c in charges if c.cap is not None]
        rid = uuid.uuid4().hex
        args: list[Any] = [
            agent, session, rid, self.window.bucket_of(now), self.window.first_live(now), self._ttl_ms, repr(now)
        ]
        args += encode_totals(totals)
        args.append(len(capped))
        for c in capped:
            args += (index[counter_key(c)], repr(cap_limit(c.cap)))
        try:
            result, acked = self._run_acknowledged(self._reserve, *args)
        except StoreIntegrityError:
            raise
        except StoreUnavailable:
            if self.options.wait_replicas:  # it may have run unacknowledged: drop it if it did
                self._short(0, rid)
            raise
        if int(result[0]) == 1:
            self._short(acked, rid)
            return Reservation(id=rid, ok=True)
        return Reservation(id=None, ok=False, failed=capped[int(result[1]) - 1], observed=float(result[2]))

    def commit(self, reservation_id: str, actual: Sequence[CounterCharge] | None, now: float) -> None:
        args: list[Any] = [reservation_id, self.window.first_live(now), self._ttl_ms]
        if actual is None:
            args += ("held", 0)
        else:
            args.append("actual")
            args += encode_totals(totals_by_key(actual))
        result, acked = self._run_acknowledged(self._commit, *args)
        self._noted(acked)
        if int(result) != 1:
            raise UnknownReservation(reservation_id)

    def release(self, reservation_id: str) -> bool:
        return int(self._run(self._release, reservation_id)) == 1

    def extend(self, reservation_id: str, charges: Sequence[CounterCharge], now: float) -> Reservation:
        totals = totals_by_key(charges)
        index = {key: i for i, key in enumerate(totals, start=1)}
        capped = [c for c in charges if c.cap is not None]
        args: list[Any] = [reservation_id, self.window.first_live(now), self._ttl_ms]
        args += encode_totals(totals)
        args.append(len(capped))
        for c in capped:
            args += (index[counter_key(c)], repr(cap_limit(c.cap)))
        result, acked = self._run_acknowledged(self._extend, *args)
        code = int(result[0])
        if code == -1:
            raise UnknownReservation(reservation_id)
        if code == 1:
            if acked is not None and acked < self.options.wait_replicas:
                # the grown part may be lost in a failover: refuse the step, keep what was held
                raise self._unavailable(f"Redis store: the extension was acknowledged by {acked} of "
                                        f"{self.options.wait_replicas} replica(s)")
            return Reservation(id=reservation_id, ok=True)
        return Reservation(id=None, ok=False, failed=capped[int(result[1]) - 1], observed=float(result[2]))

    def add(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> None:
        args: list[Any] = [agent, session, self.window.bucket_of(now), self.window.first_live(now), self._ttl_ms]
        _, acked = self._run_acknowledged(self._add, *args, *encode_totals(totals_by_key(charges)))
        self._noted(acked)

    def snapshot(
        self, agent: str, session: str, now: float, keys: Sequence[CounterKey] | None = None
    ) -> dict[CounterKey, float]:
        args: list[Any] = [agent, session, self.window.first_live(now)]
        if keys is None:
            args.append(-1)
        else:
            check_keys(keys)
            args.append(len(keys))
            for scope, persona, dimension in keys:
                args += (_SCOPE_CODE[scope], _sub(dimension, persona))
        flat = self._run(self._snapshot, *args)
        values: dict[CounterKey, float] = {}
        for i in range(0, len(flat), 3):
            dimension, _, persona = flat[i + 1].partition("|")
            values[(_SCOPE_NAME[flat[i]], persona or None, dimension)] = float(flat[i + 2])
        return values

    def settle_reservations(self, before: float) -> int:
        return int(self._run(self._settle, repr(before)))

    # --- sessions ----------------------------------------------------------------------
    def save_session(self, session: str, state: dict) -> None:
        encoded = encode_state(state)
        with self._guard():
            pipe = self._client.pipeline(transaction=True)
            pipe.set(f"{self.prefix}st:{session}", encoded)
            pipe.sadd(f"{self.prefix}sessions", session)
            pipe.execute()

    def load_session(self, session: str) -> dict | None:
        with self._guard():
            raw = self._client.get(f"{self.prefix}st:{session}")
        return None if raw is None else orjson.loads(raw)

    def list_sessions(self) -> list[str]:
        with self._guard():
            return sorted(self._client.smembers(f"{self.prefix}sessions"))

    def delete_session(self, session: str) -> bool:
        return int(self._run(self._delete_session, session)) > 0

    # --- nonces ------------------------------------------------------------------------
    def put_nonce(self, nonce: str, expires_at: float, now: float) -> None:
        key = f"{self.prefix}n:{nonce}"
        with self._guard():
            if expires_at <= now:
                self._client.delete(key)
            else:
                self._client.set(key, repr(expires_at), px=max(1, math.ceil((expires_at - now) * 1000)))

    def take_nonce(self, nonce: str, now: float) -> bool:
        with self._guard():
            raw = self._client.getdel(f"{self.prefix}n:{nonce}")
        return raw is not None and now < float(raw)

    @property
    def client(self) -> Any:
        """The Redis client, for collaborators with their own keys (store/redis_envelope.py)."""
        return self._client

    def close(self) -> None:
        self._closed = True
        self._client.close()

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sub(dimension: str, persona: str | None) -> str:
    return f"{dimension}|{persona or ''}"


def encode_totals(totals: dict[CounterKey, float]) -> list[Any]:
    args: list[Any] = [len(totals)]
    for (scope, persona, dimension), amount in totals.items():
        args += (_SCOPE_CODE[scope], _sub(dimension, persona), repr(amount))
    return args
