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
  w:<counter>@<window>             a rate limit's count in one tumbling window (governor.store.windows)
  gi:<instance>, gis               a live governor's identity (expiring); the instances announced
(persona "" is the parent's aggregate; <len> is the agent name's length in bytes,
so no two names collide. <session> is `session_key(session)`: with `?sessions=local` the
name in local sessions' own space, LOCAL_SESSIONS.) Per-day keys expire two buckets past the
window after their last write. The scripts derive key names from their arguments and name the fence
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
fence reads as a loss. A counter edited into something that is not a count (text, nan, a
negative or infinite number, a key of another type), a budget counter or a rate limit's window
counter alike, is damage to that key alone: the script that reads it writes nothing and answers
GOVERNOR_DAMAGED, and the store raises CounterDamaged naming it (not a loss: the store goes on;
every step that reads the key is refused until an operator deletes or corrects it).

Failover (Sentinel, a Cluster slot's owner, or any primary whose replication id changes): replication is
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

import asyncio
import dataclasses
import logging
import math
import threading
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import orjson
import redis
from redis.exceptions import AskError

from governor.policy.steps import CounterCharge, CounterKey
from governor.store.base import (
    DAY,
    Reservation,
    RollingWindow,
    StoreError,
    StoreIntegrityError,
    StoreUnavailable,
    UnknownReservation,
    cap_limit,
    check_keys,
    encode_state,
    totals_by_key,
)
from governor.store.redis_async import AsyncCounters
from governor.store.redis_calls import (
    SCOPE_CODE,
    SCOPE_NAME,
    ReserveWithin,
    charge_args,
    commit_args,
    counter_damaged,
    encode_totals,
    refused,
    reserve_args,
    sub,
)
from governor.store.redis_client import make_client, parse_options
from governor.store.redis_sessions import RedisSessions
from governor.store.redis_tls import connection_hint
from governor.store.redis_scripts import (
    ADD,
    COMMIT,
    DAMAGED_ERROR,
    DELETE_SESSION,
    EXTEND,
    FENCE_ERROR,
    OPEN_FENCE,
    PRELUDE,
    RELEASE,
    RESERVE,
    RESERVE_WITHIN,
    SETTLE,
    SNAPSHOT,
    ADJUST_WINDOW,
    TAKE_WINDOW,
)
from governor.store.windows import WindowCharge, WindowTake, check_charges, window_index

log = logging.getLogger("governor.store")

ACKNOWLEDGED = "ack-"  # how a fence an operator's acknowledgement wrote begins
# Where a process-local session (`?sessions=local`) keeps its state, counters and reservations:
# "local" and a unit separator before its name. No session name of the shared mode holds a
# control character (agent-named sessions are printable, --session refuses them, the others are
# generated), so the two modes never read or write each other's sessions, even under one name:
# a local governor beside shared replicas of the same agent once took up a shared session's
# state and wrote it back later, and the replicas' steps made meanwhile were lost from its count.
LOCAL_SESSIONS = "local\x1f"


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
        if prefix is not None:
            options = dataclasses.replace(options, prefix=prefix)
        self.options = options
        self.window = window
        self.prefix = options.prefix
        self.session_space = LOCAL_SESSIONS if options.sessions == "local" else ""
        self._keys = [f"{self.prefix}fence"]  # each script's one declared key: its slot on Cluster
        self._closed = False
        self._ttl_ms = math.ceil((window.length + 2 * window.bucket) * 1000)
        self._primary: str | None = None  # the replication id of the primary this store writes to
        self._primary_lock = threading.Lock()
        self._client = make_client(rest, options, extra, self._on_connect)
        register = self._client.register_script
        self._reserve = register(PRELUDE + RESERVE)
        self._reserve_within = register(PRELUDE + RESERVE_WITHIN)
        self._url, self._extra = rest, extra
        self._async: dict[Any, AsyncCounters] = {}  # event loop -> its asyncio client (counters() makes them)
        self._commit = register(PRELUDE + COMMIT)
        self._release = register(PRELUDE + RELEASE)
        self._extend = register(PRELUDE + EXTEND)
        self._open_fence = register(OPEN_FENCE)
        self._add = register(PRELUDE + ADD)
        self._snapshot = register(PRELUDE + SNAPSHOT)
        self._settle = register(PRELUDE + SETTLE)
        self._delete_session = register(PRELUDE + DELETE_SESSION)
        self._take_window = register(PRELUDE + TAKE_WINDOW)
        self._adjust_window = register(PRELUDE + ADJUST_WINDOW)
        self._lost: str | None = None  # why the store fails closed after losing its data
        self._fence_at_loss: str | None = None  # the fence as it stood when the loss was found
        self.epoch = ""
        with self._guard(), connection_hint(rest.startswith("rediss")):
            self._client.ping()
            self.epoch = self._open_fence(keys=self._keys, args=(self.prefix, uuid.uuid4().hex))

    def _unavailable(self, message: str) -> StoreUnavailable:
        return StoreUnavailable(message, retry_after=self.options.retry_after)

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn any backend failure into StoreUnavailable, so the caller fails closed."""
        self.check_usable()
        try:
            yield
        except redis.RedisError as exc:
            raise self.failure(exc) from exc

    def check_usable(self) -> None:
        """Raise when the store is closed or fails closed after a loss (not acknowledged since)."""
        if self._closed:
            raise self._unavailable("Redis store is closed")
        if self._lost is not None and not self._acknowledged_elsewhere():
            raise StoreIntegrityError(self._lost)

    def failure(self, exc: Exception) -> StoreError:
        """What a backend failure means to the caller (its asyncio client's too): a counter
        a script found damaged is CounterDamaged (fails closed, not retryable)."""
        damaged = counter_damaged(exc)
        if damaged is not None:
            return damaged
        if self._lost is not None:  # a connection found the primary changed
            return StoreIntegrityError(self._lost)
        return self._unavailable(f"Redis store: {type(exc).__name__}: {exc}")

    def _on_connect(self, connection: Any) -> None:
        """Each new connection: the usual handshake, then whether the primary is the one this
        store wrote to (a failover or a restart gives it a new replication id)."""
        connection.on_connect()
        try:
            connection.send_command("INFO", "replication")
            info = connection.read_response()
        except redis.ResponseError:  # INFO refused (a proxy in front of Redis): nothing to compare
            return
        with self._primary_lock:
            lost = self.primary_seen(info)
            if lost is None:
                return
            try:  # an acknowledgement anywhere clears the loss: it writes a new fence after this
                connection.send_command("GET", self._keys[0])
                fence = connection.read_response()
            except redis.RedisError:
                fence = None
            self.primary_lost(lost, fence)
        raise redis.ConnectionError("Redis store: the primary changed; writes may have been lost")

    def primary_seen(self, info: Any) -> str | None:
        """A connection read INFO replication: None when its primary is the one this store
        wrote to (or one that had all it acknowledged); else why it may have lost writes."""
        fields = dict(line.split(":", 1) for line in str(info).splitlines() if ":" in line)
        replid, previous = fields.get("master_replid"), fields.get("master_replid2")
        if not replid:
            return None
        known = self._primary
        self._primary = replid
        if known is None or known == replid:
            return None
        if self.options.wait_replicas and previous == known:
            log.warning("Redis store: a replica of the primary took over (replication id %s, was %s); "
                        "reservations were acknowledged by %d replica(s)", replid, known, self.options.wait_replicas)
            return None
        return (f"on a new primary (replication id {replid}, was {known}), and reservations were not "
                "acknowledged by replicas (wait=0) or it is not a replica of the old one")

    def primary_lost(self, why: str, fence: str | None) -> None:
        """Fail closed after `primary_seen` found a primary that may have missed writes;
        `fence` is the fence as it stood then (an acknowledgement after it clears the loss)."""
        self._fence_at_loss = fence
        self._lost = self._loss(why, what="the primary changed and may have missed the last writes")
        log.error("%s", self._lost)

    @property
    def keys(self) -> list[str]:
        """Each script's one declared key (the fence): its slot on Cluster."""
        return self._keys

    def counters(self) -> AsyncCounters | None:
        """The asyncio client of the per-step path, for the running event loop (one per loop,
        made on first use; on Cluster a client to the slot's owner, redis_slot_async). None
        (the blocking client, from a thread, as before) when reservations wait for replicas
        (wait=N)."""
        if self.options.wait_replicas:
            return None
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            for stale in [other for other in self._async if other.is_closed()]:
                del self._async[stale]
            client = self._async[loop] = AsyncCounters(self._url, self.options, self._extra, self,
                                                       ttl_ms=self._ttl_ms, reserve_within=PRELUDE + RESERVE_WITHIN,
                                                       commit=PRELUDE + COMMIT, release=PRELUDE + RELEASE)
        return client

    def _run(self, script: Any, *args: Any) -> Any:
        for attempt in (1, 2):
            with self._guard():
                try:
                    return script(keys=self._keys, args=(self.prefix, self.epoch, *args))
                except redis.ResponseError as exc:
                    if not (self.fence_error(exc) and attempt == 1):
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
                # a MOVED or ASK (Cluster, after a failover): the script did not run; once more
                # on the owner the cluster names (governor.store.redis_slot)
                if isinstance(result, redis.ResponseError) and attempt == 1 and \
                        (isinstance(result, AskError) or self.fence_error(result)):
                    continue
                for answer in (result, acked):
                    if isinstance(answer, Exception):
                        raise answer
                return result, int(acked)
        raise AssertionError("unreachable")  # pragma: no cover - the second attempt returns or raises

    def fence_error(self, exc: Exception) -> bool:
        """A script found the fence gone or replaced: fail closed from now on. True (the
        script did nothing and may run again): the fence is one an operator's acknowledgement
        wrote, after the loss that replaced this store's (acknowledged on another replica)."""
        text = str(exc)
        at = text.find(FENCE_ERROR)
        if at < 0 or text.startswith(DAMAGED_ERROR):  # a damaged counter's text may quote anything
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
        except StoreError:  # it keeps counting: the store errs on counting
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
        rid = uuid.uuid4().hex
        args, capped = reserve_args(self.window, self._ttl_ms, agent, self.session_space + session, rid, charges, now)
        result, acked = self._held(self._reserve, rid, args)
        if int(result[0]) == 1:
            self._short(acked, rid)
            return Reservation(id=rid, ok=True)
        return refused(capped, result[1], result[2])

    def reserve_within(self, agent: str, session: str, keys: Sequence[CounterKey],
                       charges: Sequence[CounterCharge], now: float) -> tuple[dict[CounterKey, float], Reservation]:
        """The snapshot of `keys` and the reservation of `charges` in one script (one round trip)."""
        call = ReserveWithin.of(self.window, self._ttl_ms, agent, self.session_space + session, keys, charges, now)
        result, acked = self._held(self._reserve_within, call.rid, call.args)
        snapshot, held = call.answer(result)
        if held.ok:
            self._short(acked, call.rid)
        return snapshot, held

    def _held(self, script: Any, rid: str, args: list[Any]) -> tuple[Any, int | None]:
        """Run a script that reserves as `rid`; a failure drops what may have run unacknowledged."""
        try:
            return self._run_acknowledged(script, *args)
        except StoreIntegrityError:
            raise
        except StoreUnavailable:
            if self.options.wait_replicas:  # it may have run unacknowledged: drop it if it did
                self._short(0, rid)
            raise

    def commit(self, reservation_id: str, actual: Sequence[CounterCharge] | None, now: float) -> None:
        args = commit_args(self.window, self._ttl_ms, reservation_id, actual, now)
        result, acked = self._run_acknowledged(self._commit, *args)
        self._noted(acked)
        if int(result) != 1:
            raise UnknownReservation(reservation_id)

    def release(self, reservation_id: str) -> bool:
        return int(self._run(self._release, reservation_id)) == 1

    def extend(self, reservation_id: str, charges: Sequence[CounterCharge], now: float) -> Reservation:
        encoded, capped = charge_args(charges)
        args: list[Any] = [reservation_id, self.window.first_live(now), self._ttl_ms, *encoded]
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
        return refused(capped, result[1], result[2])

    def add(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> None:
        args: list[Any] = [agent, self.session_space + session, self.window.bucket_of(now), self.window.first_live(now),
                           self._ttl_ms]
        _, acked = self._run_acknowledged(self._add, *args, *encode_totals(totals_by_key(charges)))
        self._noted(acked)

    def snapshot(
        self, agent: str, session: str, now: float, keys: Sequence[CounterKey] | None = None
    ) -> dict[CounterKey, float]:
        args: list[Any] = [agent, self.session_space + session, self.window.first_live(now)]
        if keys is None:
            args.append(-1)
        else:
            check_keys(keys)
            args.append(len(keys))
            for scope, persona, dimension in keys:
                args += (SCOPE_CODE[scope], sub(dimension, persona))
        flat = self._run(self._snapshot, *args)
        values: dict[CounterKey, float] = {}
        for i in range(0, len(flat), 3):
            dimension, _, persona = flat[i + 1].partition("|")
            values[(SCOPE_NAME[flat[i]], persona or None, dimension)] = float(flat[i + 2])
        return values

    def settle_reservations(self, before: float) -> int:
        return int(self._run(self._settle, repr(before)))

    # --- rate limits' window counters (governor.store.windows) --------------------------
    def take_window(self, charges: Sequence[WindowCharge], now: float) -> WindowTake:
        check_charges(charges)
        indexes = tuple(window_index(now, c.window_sec) for c in charges)
        args: list[Any] = [len(charges)]
        for c, index in zip(charges, indexes):
            args += (c.counter, index, repr(float(c.amount)), "" if c.cap is None else repr(cap_limit(c.cap)),
                     math.ceil(2 * c.window_sec * 1000))
        result = self._run(self._take_window, *args)
        if int(result[0]) == 1:
            return WindowTake(True, indexes)
        failed = int(result[1]) - 1  # (a counter that is not a count: CounterDamaged, from _run)
        return WindowTake(False, failed=failed, observed=float(result[2]),
                          rolls_at=(indexes[failed] + 1) * charges[failed].window_sec)

    def adjust_window(self, adjustments: Sequence[tuple[WindowCharge, int, float]]) -> None:
        args: list[Any] = [len(adjustments)]
        for charge, index, delta in adjustments:
            args += (f"{charge.counter}@{index}", repr(float(delta)))
        self._run(self._adjust_window, *args)

    # --- governors on this store (governor.runtime.duplicates) ---------------------------
    def announce(self, instance: str, identity: dict[str, Any], ttl: float) -> list[dict[str, Any]]:
        """Say this governor instance is live for `ttl` seconds; the other live instances' identities."""
        members_key = f"{self.prefix}gis"
        with self._guard():
            pipe = self._client.pipeline(transaction=False)
            pipe.set(f"{self.prefix}gi:{instance}", orjson.dumps(identity), px=max(1, math.ceil(ttl * 1000)))
            pipe.sadd(members_key, instance)
            pipe.smembers(members_key)
            members = pipe.execute()[2]
            found, gone = [], []
            for other in sorted(m for m in members if m != instance):
                try:
                    value = self._client.get(f"{self.prefix}gi:{other}")
                    if value is None:
                        gone.append(other)
                    else:
                        found.append(orjson.loads(value))
                except (UnicodeDecodeError, orjson.JSONDecodeError):  # not a governor's entry: ignored
                    continue
            if gone:
                self._client.srem(members_key, *gone)
        return found

    # --- sessions ----------------------------------------------------------------------
    def session_key(self, session: str) -> str:
        """The name `session`'s keys are made from: its own, or in local sessions' space."""
        return self.session_space + session

    def save_session(self, session: str, state: dict) -> None:
        encoded = encode_state(state)
        session = self.session_space + session
        with self._guard():
            pipe = self._client.pipeline(transaction=True)
            pipe.set(f"{self.prefix}st:{session}", encoded)
            pipe.sadd(f"{self.prefix}sessions", session)
            pipe.execute()

    def load_session(self, session: str) -> dict | None:
        with self._guard():
            raw = self._client.get(f"{self.prefix}st:{self.session_space}{session}")
        return None if raw is None else orjson.loads(raw)

    def shared_sessions(self) -> RedisSessions | None:
        """What replicas share of their sessions on this Redis (governor.store.redis_sessions);
        None with `?sessions=local` (each process its own sessions, budgets shared)."""
        if self.options.sessions == "local":
            return None
        return RedisSessions(self._client, self.prefix, self._keys, self._guard, self.options.wait_replicas,
                             self.options.wait_timeout, self.options.retry_after, ended_ttl=self.options.ended_ttl)

    def list_sessions(self) -> list[str]:
        """The saved sessions of this store's mode (shared, or local: see LOCAL_SESSIONS)."""
        with self._guard():
            names = self._client.smembers(f"{self.prefix}sessions")
        if self.session_space:
            return sorted(name[len(self.session_space):] for name in names if name.startswith(self.session_space))
        return sorted(name for name in names if not name.startswith(LOCAL_SESSIONS))

    def delete_session(self, session: str) -> bool:
        return int(self._run(self._delete_session, self.session_space + session)) > 0

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
        for loop, client in list(self._async.items()):  # their connections belong to their loops
            if not loop.is_closed():
                try:
                    asyncio.run_coroutine_threadsafe(client.aclose(), loop)
                except RuntimeError:  # the loop stopped meanwhile
                    pass
        self._async.clear()

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

