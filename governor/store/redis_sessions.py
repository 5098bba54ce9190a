"""What governor replicas share of their sessions in Redis (beside the counters of `redis.py`).

Layout, under the store's prefix (a hash tag on Cluster, so every key is in the fence's slot
and each script here runs atomically on one node):
  ch:<session>       list: the session's journal lines (governor.evidence.shared_journal)
  chh:<session>      hash: the chain's head {len, hash}, what a compare-and-append checks
  chains             set: every session with a chain
  ids                sorted set (one score, so in id order): every session with a chain, what
                     GET /v1/sessions pages through (governor.store.redis_retention)
  ended              sorted set: session -> when its record was written (what retention removes)
  act                hash: session -> its last step's time (any replica's), for idle ends
  lk:<session>       a replica's decision round on the session (SET NX PX, an owner token)
  rec:<session>      the session's signed final record (JSON), written once
  unproved           hash: session -> the SHA-256 of its final record, logged by the replica that
                     wrote it and waiting for that replica to publish its proof (runtime/shared_proofs.py)
  prf:<session>      the C2SP tlog-proof of the session's final record, as its logging replica made it
  book               list: the session book's log entries (governor.sessions.book), in order
  bookgen            how many times the book's log was compacted (readers re-read it whole)
  holds              hash: approval -> a held step's view {session, ...} (what reviewers list)
  held:<approval>    a held step's review answer (JSON), written once (SET NX)

Every command goes through the store's guard: a Redis failure is StoreUnavailable (the step
fails closed, retryable); the chains, the rounds and the book's log do not check the store's
fence (a loss is recorded in the chain it reports on). Appends honour the store's `wait=N`.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterator

import orjson
import redis
from redis.client import NEVER_DECODE

from governor.store.base import StoreUnavailable

log = logging.getLogger("governor.store")

# KEYS[1] the fence (its slot); ARGV: prefix, session, expected length, expected last hash,
# the line, its hash. Appends when the head is the one expected; answers 1, else 0.
APPEND = r"""
local P, S = ARGV[1], ARGV[2]
local list, head = P .. 'ch:' .. S, P .. 'chh:' .. S
local h = redis.call('HMGET', head, 'len', 'hash')
local n = tonumber(h[1] or '0')
local last = h[2] or ''
if n ~= tonumber(ARGV[3]) or last ~= ARGV[4] or redis.call('LLEN', list) ~= n then return 0 end
redis.call('RPUSH', list, ARGV[5])
redis.call('HSET', head, 'len', n + 1, 'hash', ARGV[6])
redis.call('SADD', P .. 'chains', S)
if n == 0 then redis.call('ZADD', P .. 'ids', 0, S) end
return 1
"""

# KEYS[1] the fence; ARGV: prefix, session, its head hash, then its lines. Puts back a chain
# that is gone from the store (emptied Redis) as a replica holds it; 0 when one is there.
RESEED = r"""
local P, S = ARGV[1], ARGV[2]
local list, head = P .. 'ch:' .. S, P .. 'chh:' .. S
if redis.call('LLEN', list) ~= 0 or redis.call('EXISTS', head) == 1 then return 0 end
for i = 4, #ARGV do redis.call('RPUSH', list, ARGV[i]) end
redis.call('HSET', head, 'len', #ARGV - 3, 'hash', ARGV[3])
redis.call('SADD', P .. 'chains', S)
redis.call('ZADD', P .. 'ids', 0, S)
return 1
"""

# KEYS[1] the fence; ARGV: prefix, session, owner, lease (ms). Takes the session's decision
# round and reads its saved state: {1, state or nil}, or {0} when another round holds it.
BEGIN_ROUND = r"""
local P, S = ARGV[1], ARGV[2]
if not redis.call('SET', P .. 'lk:' .. S, ARGV[3], 'NX', 'PX', ARGV[4]) then return {0} end
return {1, redis.call('GET', P .. 'st:' .. S)}
"""

# KEYS[1] the fence; ARGV: prefix, session, owner, state ('' unchanged), activity ('' none).
# Saves what the round left and lets it go (only the owner's: a lease that ran out is not ended).
END_ROUND = r"""
local P, S = ARGV[1], ARGV[2]
if ARGV[4] ~= '' then
  redis.call('SET', P .. 'st:' .. S, ARGV[4])
  redis.call('SADD', P .. 'sessions', S)
end
if ARGV[5] ~= '' then redis.call('HSET', P .. 'act', S, ARGV[5]) end
local key = P .. 'lk:' .. S
if redis.call('GET', key) == ARGV[3] then redis.call('DEL', key) end
return 1
"""

# KEYS[1] the fence; ARGV: prefix, start, the generation the reader knows. {generation, lines}:
# from `start` when the log is still that generation, else the whole log (compacted since).
BOOK_READ = r"""
local P = ARGV[1]
local gen = tonumber(redis.call('GET', P .. 'bookgen') or '0')
local start = tonumber(ARGV[2])
if gen ~= tonumber(ARGV[3]) then start = 0 end
return {gen, redis.call('LRANGE', P .. 'book', start, -1)}
"""

# KEYS[1] the fence; ARGV: prefix, session, the record (JSON), when (epoch seconds), the SHA-256 of
# the record as logged ('' not logged). Writes the record once; only the record written marks its
# proof as awaited (a replica whose record lost the race logged another one). 1 written, else 0.
PUT_RECORD = r"""
local P, S = ARGV[1], ARGV[2]
if not redis.call('SET', P .. 'rec:' .. S, ARGV[3], 'NX') then return 0 end
redis.call('ZADD', P .. 'ended', 'NX', ARGV[4], S)
if ARGV[5] ~= '' then redis.call('HSET', P .. 'unproved', S, ARGV[5]) end
return 1
"""

LOCK_LEASE_MS = 10_000  # a replica that dies in a decision round holds it this long at most
LOCK_WAIT_SEC = 5.0  # longer than this waiting for another replica's round: refused (retryable)


class RedisSessions:
    """The shared part of sessions, over the store's client (`guard` turns a Redis failure
    into StoreUnavailable, the fence names the slot)."""

    def __init__(self, client: Any, prefix: str, fence_keys: list[str], guard: Callable[[], ContextManager[None]],
                 wait_replicas: int = 0, wait_timeout: float = 0.5, retry_after: float = 1.0, *,
                 ended_ttl: float = 86400.0) -> None:
        self.client = client
        self.prefix = prefix
        self.keys = fence_keys
        self.guard = guard
        self.wait_replicas = wait_replicas
        self.wait_timeout = wait_timeout
        self.retry_after = retry_after
        self.ended_ttl = ended_ttl  # what an ended session leaves is kept this long (redis_retention)
        # session -> rounds of ours the store may hold without our knowing (a begin that timed out may
        # still run once the store answers; an end that failed): ended before our next round on it
        self._stale: dict[str, dict[str, float]] = {}  # session -> {owner: when}
        self._append = client.register_script(APPEND)
        self._reseed = client.register_script(RESEED)
        self._begin = client.register_script(BEGIN_ROUND)
        self._end = client.register_script(END_ROUND)
        self._book_read = client.register_script(BOOK_READ)
        self._put_record = client.register_script(PUT_RECORD)

    @contextmanager
    def _io(self) -> Iterator[None]:
        """A Redis failure is StoreUnavailable; unlike the store's guard, a store that lost its
        data still reaches the chains (the event that reports the loss is chained)."""
        try:
            yield
        except redis.RedisError as exc:
            raise StoreUnavailable(f"Redis store: {type(exc).__name__}: {exc}", retry_after=self.retry_after) from exc

    # --- chains -------------------------------------------------------------------------

    def append(self, session: str, length: int, prev: str, line: bytes, digest: str) -> bool:
        args = (self.prefix, session, length, prev, line, digest)
        with self._io():
            if not self.wait_replicas:
                return bool(int(self._append(keys=self.keys, args=args)))
            # WAIT counts the writes of its own connection: the append and its WAIT pipelined on one
            pipe = self.client.pipeline(transaction=False)
            self._append(keys=self.keys, args=args, client=pipe)
            pipe.execute_command("WAIT", self.wait_replicas, math.ceil(self.wait_timeout * 1000))
            done, acked = pipe.execute()
        if int(done) and int(acked) < self.wait_replicas:
            log.warning("Redis store: an event of session %s acknowledged by %d of %d replica(s)", session,
                        int(acked), self.wait_replicas)
        return bool(int(done))

    def reseed(self, session: str, lines: list[bytes], digest: str) -> bool:
        """Put back a chain the store lost, as `lines` (ending in `digest`); False: one is there."""
        with self._io():
            return bool(int(self._reseed(keys=self.keys, args=(self.prefix, session, digest, *lines))))

    def read(self, session: str, start: int) -> list[bytes]:
        with self._io():
            lines = self.client.lrange(f"{self.prefix}ch:{session}", start, -1)
        return [line.encode() if isinstance(line, str) else line for line in lines]

    def has_chain(self, session: str) -> bool:
        with self.guard():
            return bool(self.client.sismember(f"{self.prefix}chains", session))

    def chains(self) -> list[str]:
        with self.guard():
            return sorted(self.client.smembers(f"{self.prefix}chains"))

    # --- activity, decision rounds -------------------------------------------------------

    def touch(self, session: str, now: float) -> None:
        with self.guard():
            self.client.hset(f"{self.prefix}act", session, repr(now))

    def last_activity(self, session: str) -> float | None:
        with self.guard():
            raw = self.client.hget(f"{self.prefix}act", session)
        return None if raw is None else float(raw)

    def activity(self) -> dict[str, float]:
        with self.guard():
            return {session: float(at) for session, at in self.client.hgetall(f"{self.prefix}act").items()}

    def forget_activity(self, session: str) -> None:
        with self.guard():
            self.client.hdel(f"{self.prefix}act", session)

    def begin_round(self, session: str) -> tuple[str, bytes | None]:
        """Take the session's decision round (waiting for another replica's, bounded) and read
        its saved state, in one round trip: (the owner token for `end_round`, the state).
        StoreUnavailable (retryable) past LOCK_WAIT_SEC."""
        stale = self._stale.get(session)
        if stale:
            now = time.monotonic()
            for owner, at in list(stale.items()):
                if now - at < LOCK_LEASE_MS / 1000:  # (an older one's lease has run out by itself)
                    self.end_round(session, owner, None, None)  # raises while the store is down: kept
                stale.pop(owner, None)
            self._stale.pop(session, None)
        deadline = time.monotonic() + LOCK_WAIT_SEC
        pause = 0.0005
        while True:
            owner = secrets.token_hex(8)
            try:
                with self._io():
                    taken = self._begin(keys=self.keys, args=(self.prefix, session, owner, LOCK_LEASE_MS))
            except StoreUnavailable:
                self._stale.setdefault(session, {})[owner] = time.monotonic()  # it may run once the store answers
                raise
            if int(taken[0]):
                state = taken[1] if len(taken) > 1 else None
                return owner, state.encode() if isinstance(state, str) else state
            if time.monotonic() >= deadline:
                raise StoreUnavailable(f"session {session}: another replica's step did not end within "
                                       f"{LOCK_WAIT_SEC:.0f}s", retry_after=self.retry_after)
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def end_round(self, session: str, owner: str, state: bytes | None, activity: float | None) -> None:
        """Save the state (None: unchanged) and the last activity (None: none), and let the round go."""
        try:
            with self._io():
                self._end(keys=self.keys, args=(self.prefix, session, owner, state if state is not None else "",
                                                repr(activity) if activity is not None else ""))
        except StoreUnavailable:  # ended at this replica's next round on it (else its lease runs out)
            self._stale.setdefault(session, {}).setdefault(owner, time.monotonic())
            raise

    # --- final records ------------------------------------------------------------------

    def put_record(self, session: str, record: dict[str, Any], logged: str | None = None) -> bool:
        """Write the session's final record once; from then on its keys are kept `ended_ttl`.
        `logged`: the record's SHA-256 in the writer's transparency log (its proof is then
        awaited, `unproved`). False: a record was there already (that one stands)."""
        with self.guard():
            return bool(int(self._put_record(keys=self.keys, args=(
                self.prefix, session, orjson.dumps(record), repr(time.time()), logged or ""))))

    def get_record(self, session: str) -> dict[str, Any] | None:
        """The session's final record as written; ValueError when what the key holds is not one
        (edited in the store: never served as a record)."""
        with self.guard():
            raw = self.client.get(f"{self.prefix}rec:{session}")
        if raw is None:
            return None
        record = orjson.loads(raw)
        if not isinstance(record, dict):
            raise ValueError(f"{self.prefix}rec:{session} holds {type(record).__name__}, not a record")
        return record

    # --- proofs of final records (runtime/shared_proofs.py) --------------------------------

    def put_proof(self, session: str, proof: bytes) -> None:
        """The tlog-proof of the session's final record: served by every replica from now on."""
        with self.guard():
            pipe = self.client.pipeline(transaction=True)
            pipe.set(f"{self.prefix}prf:{session}", proof)
            pipe.hdel(f"{self.prefix}unproved", session)
            pipe.execute()

    def get_proof(self, session: str) -> tuple[bytes | None, str | None]:
        """(the published proof of the session's final record or None, the SHA-256 of the
        record whose proof is awaited or None)."""
        with self.guard():  # read undecoded: bytes edited in the store are the proof check's to refuse
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("GET", f"{self.prefix}prf:{session}", **{NEVER_DECODE: True})
            pipe.execute_command("HGET", f"{self.prefix}unproved", session, **{NEVER_DECODE: True})
            proof, awaited = pipe.execute()
        return proof, None if awaited is None else awaited.decode(errors="replace")

    def unproved(self) -> dict[str, str]:
        """session -> the SHA-256 of its final record, for every record whose proof is awaited."""
        with self.guard():  # read undecoded: a field edited into bytes that are not UTF-8 matches nothing
            found = self.client.execute_command("HGETALL", f"{self.prefix}unproved", **{NEVER_DECODE: True})
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in found.items()}

    def drop_unproved(self, session: str) -> None:
        with self.guard():
            self.client.hdel(f"{self.prefix}unproved", session)

    # --- the session book's log -----------------------------------------------------------

    def book_append(self, entry: bytes) -> None:
        with self._io():
            self.client.rpush(f"{self.prefix}book", entry)

    def book_read(self, start: int, generation: int) -> tuple[int, list[bytes]]:
        """The log's entries from `start` when it is still the `generation` the reader knows,
        else (it was compacted since) the whole log: (its generation, the entries)."""
        with self._io():
            answer = self._book_read(keys=self.keys, args=(self.prefix, start, generation))
        lines = answer[1] if len(answer) > 1 else []
        return int(answer[0]), [line.encode() if isinstance(line, str) else line for line in lines]

    # --- held steps: what waits (for any replica's reviewers), and their answers -----------

    def publish_hold(self, approval_id: str, held: dict[str, Any]) -> None:
        with self.guard():
            self.client.hset(f"{self.prefix}holds", approval_id, orjson.dumps(held, default=str))

    def withdraw_hold(self, approval_id: str) -> None:
        with self.guard():
            self.client.hdel(f"{self.prefix}holds", approval_id)

    def hold(self, approval_id: str) -> dict[str, Any] | None:
        with self.guard():
            raw = self.client.hget(f"{self.prefix}holds", approval_id)
        return None if raw is None else orjson.loads(raw)

    def holds(self) -> list[dict[str, Any]]:
        with self.guard():
            return [orjson.loads(raw) for raw in self.client.hvals(f"{self.prefix}holds")]


    def answer_held(self, approval_id: str, answer: dict[str, Any], ttl_sec: float) -> bool:
        """Write a review's answer once; False when the step was answered already."""
        with self.guard():
            return bool(self.client.set(f"{self.prefix}held:{approval_id}", orjson.dumps(answer, default=str), nx=True,
                                        px=max(1, math.ceil(ttl_sec * 1000))))

    def held_answer(self, approval_id: str) -> dict[str, Any] | None:
        with self.guard():
            raw = self.client.get(f"{self.prefix}held:{approval_id}")
        return None if raw is None else orjson.loads(raw)


__all__ = ["LOCK_LEASE_MS", "LOCK_WAIT_SEC", "RedisSessions"]
