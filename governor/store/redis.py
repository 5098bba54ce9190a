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
their last write. The scripts derive key names from their arguments, so this
runs on a single Redis primary (with replicas or Sentinel), not on Redis Cluster.

Integrity: every counter script first checks that `fence` still holds the epoch this
store adopted when it opened. A Redis that lost its data (FLUSHALL, a failover to an
empty replica, a restart without persistence) has no fence (or, once another store
opened on it, another epoch): the store then raises StoreIntegrityError on every
operation, so every step is refused (recorded as on_governor_error) rather than
counted from zero, until `acknowledge()` adopts the fence as it stands (the control
plane's POST /v1/store/acknowledge). A governor that *starts* on an emptied Redis
cannot tell it from a new one. Run Redis with `maxmemory-policy noeviction`: an evicted
fence reads as a loss.

No command is retried: a retried reserve or add could count twice. Any failure
raises StoreUnavailable within the socket timeout. A reserve that timed out may
still have run on the server: its reservation is then orphaned and keeps
counting until `settle_reservations` forgets it (the store errs on counting).
"""

from __future__ import annotations

import logging
import math
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import orjson
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

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

# ARGV[1] is always the key prefix, ARGV[2] the store's fence epoch (taken off ARGV here,
# so each script reads its own arguments from ARGV[2] on). Numbers cross into Redis as
# "%.17g" strings so that no precision is lost (Lua's own tostring keeps 14 digits).
_FENCE_ERROR = "GOVERNOR_FENCE"
_PRELUDE = r"""
local P = ARGV[1]
local E = table.remove(ARGV, 2)
-- the fence written when the store was opened: missing or another epoch, the data this
-- store wrote may be gone (FLUSHALL, an empty replica promoted): touch nothing
local fence = redis.call('GET', P .. 'fence')
if fence ~= E then return redis.error_reply('GOVERNOR_FENCE ' .. tostring(fence)) end
local function fmt(x) return string.format('%.17g', x) end
local function int(x) return string.format('%d', x) end
local function day_key(agent, sub) return P .. 'd:' .. #agent .. ':' .. agent .. ':' .. sub end
local function session_key(session) return P .. 'sc:' .. session end

-- the key's live total at first_live, evicting buckets that left the window
local function day_total(key, first_live)
  local h = redis.call('HMGET', key, 'lo', 'hi', 't')
  if not h[1] then return 0 end
  local lo, hi, t = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
  if hi < first_live then
    redis.call('DEL', key)
    return 0
  end
  if lo < first_live then
    for b = lo, first_live - 1 do
      local v = redis.call('HGET', key, int(b))
      if v then
        t = t - tonumber(v)
        redis.call('HDEL', key, int(b))
      end
    end
    redis.call('HSET', key, 'lo', int(first_live), 't', fmt(t))
  end
  return t
end

local function day_add(key, b, amount, first_live, ttl)
  if b < first_live then return end  -- dated before the window: no longer counts
  day_total(key, first_live)
  local fb = int(b)
  local h = redis.call('HMGET', key, 'lo', 'hi', 't', fb)
  if not h[1] then
    redis.call('HSET', key, 'lo', fb, 'hi', fb, 't', fmt(amount), fb, fmt(amount))
  else
    redis.call('HSET', key, fb, fmt((tonumber(h[4]) or 0) + amount), 't', fmt(tonumber(h[3]) + amount))
    if b < tonumber(h[1]) then redis.call('HSET', key, 'lo', fb) end
    if b > tonumber(h[2]) then redis.call('HSET', key, 'hi', fb) end
  end
  redis.call('PEXPIRE', key, ttl)
end

local function day_take(key, b, amount)
  local fb = int(b)
  local h = redis.call('HMGET', key, fb, 't')
  if h[1] then  -- absent: evicted, it no longer counts
    redis.call('HSET', key, fb, fmt(tonumber(h[1]) - amount), 't', fmt(tonumber(h[2]) - amount))
  end
end

local function session_add(skey, sub, amount)
  local v = redis.call('HGET', skey, sub)
  redis.call('HSET', skey, sub, fmt((tonumber(v) or 0) + amount))
end

local function session_take(skey, sub, amount)
  local v = redis.call('HGET', skey, sub)
  if v then redis.call('HSET', skey, sub, fmt(tonumber(v) - amount)) end
end

local function apply(agent, session, scope, sub, b, amount, first_live, ttl)
  if scope == 's' then
    session_add(session_key(session), sub, amount)
  else
    day_add(day_key(agent, sub), b, amount, first_live, ttl)
    redis.call('SADD', P .. 'dk:' .. agent, sub)
    redis.call('PEXPIRE', P .. 'dk:' .. agent, ttl)
  end
end

-- the charges ARGV lists from `at` ((scope, sub, amount) * n, then m, (index, limit) * m),
-- each counter's current value, and the first capped one the charges would overshoot:
-- scopes, subs, amounts, nil on success; else nil, {0, k, current} (reserve and extend)
local function charges_within_caps(agent, session, first_live, at)
  local n = tonumber(ARGV[at])
  local scopes, subs, amounts, current = {}, {}, {}, {}
  for i = 1, n do
    local j = at + 3 * (i - 1)
    scopes[i], subs[i], amounts[i] = ARGV[j + 1], ARGV[j + 2], tonumber(ARGV[j + 3])
    if scopes[i] == 's' then
      current[i] = tonumber(redis.call('HGET', session_key(session), subs[i])) or 0
    else
      current[i] = day_total(day_key(agent, subs[i]), first_live)
    end
  end
  local c = at + 1 + 3 * n
  for k = 1, tonumber(ARGV[c]) do
    local i, limit = tonumber(ARGV[c + 2 * k - 1]), tonumber(ARGV[c + 2 * k])
    if current[i] + amounts[i] > limit then
      return nil, {0, k, fmt(current[i])}
    end
  end
  return {scopes, subs, amounts, n}
end

-- take a reservation off its counters and forget it; false when not outstanding
local function unhold(rid, take)
  local rkey = P .. 'r:' .. rid
  local h = redis.call('HMGET', rkey, 'a', 's', 'b', 'n')
  if not h[1] then return false end
  local agent, session, b, n = h[1], h[2], tonumber(h[3]), tonumber(h[4])
  if take then
    for i = 1, n do
      local e = redis.call('HMGET', rkey, 'k' .. i, 'v' .. i)
      local scope, sub, amount = string.sub(e[1], 1, 1), string.sub(e[1], 2), tonumber(e[2])
      if scope == 's' then
        session_take(session_key(session), sub, amount)
      else
        day_take(day_key(agent, sub), b, amount)
      end
    end
  end
  redis.call('DEL', rkey)
  redis.call('SREM', P .. 'sr:' .. session, rid)
  redis.call('ZREM', P .. 'rt', rid)
  return {agent, session, b}
end
"""

# ARGV: P, agent, session, rid, bucket, first_live, ttl_ms, created,
#       n, (scope, sub, amount) * n, m, (counter index, limit) * m
_RESERVE = r"""
local agent, session, rid = ARGV[2], ARGV[3], ARGV[4]
local b, first_live, ttl, created = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local ok, refused = charges_within_caps(agent, session, first_live, 9)
if not ok then return refused end
local scopes, subs, amounts, n = ok[1], ok[2], ok[3], ok[4]
local rkey = P .. 'r:' .. rid
redis.call('HSET', rkey, 'a', agent, 's', session, 'b', int(b), 'c', created, 'n', n)
for i = 1, n do
  apply(agent, session, scopes[i], subs[i], b, amounts[i], first_live, ttl)
  redis.call('HSET', rkey, 'k' .. i, scopes[i] .. subs[i], 'v' .. i, fmt(amounts[i]))
end
redis.call('SADD', P .. 'sr:' .. session, rid)
redis.call('ZADD', P .. 'rt', created, rid)
return {1}
"""

# ARGV: P, rid, first_live, ttl_ms, mode ("held" | "actual"), n, (scope, sub, amount) * n
_COMMIT = r"""
local first_live, ttl, actual = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == 'actual'
local held = unhold(ARGV[2], actual)
if not held then return 0 end
if actual then
  local agent, session, b = held[1], held[2], held[3]
  for i = 1, tonumber(ARGV[6]) do
    local j = 6 + 3 * (i - 1)
    apply(agent, session, ARGV[j + 1], ARGV[j + 2], b, tonumber(ARGV[j + 3]), first_live, ttl)
  end
end
return 1
"""

# ARGV: P, rid, first_live, ttl_ms, n, (scope, sub, amount) * n, m, (counter index, limit) * m
# returns {1} extended, {0, k, value} refused by capped charge k, {-1} not outstanding
_EXTEND = r"""
local rid, first_live, ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local rkey = P .. 'r:' .. rid
local h = redis.call('HMGET', rkey, 'a', 's', 'b', 'n')
if not h[1] then return {-1} end
local agent, session, b, held = h[1], h[2], tonumber(h[3]), tonumber(h[4])
local ok, refused = charges_within_caps(agent, session, first_live, 5)
if not ok then return refused end
local scopes, subs, amounts, n = ok[1], ok[2], ok[3], ok[4]
local index = {}
for e = 1, held do index[redis.call('HGET', rkey, 'k' .. e)] = e end
for i = 1, n do
  apply(agent, session, scopes[i], subs[i], b, amounts[i], first_live, ttl)
  local name = scopes[i] .. subs[i]
  local e = index[name]
  if e then
    redis.call('HSET', rkey, 'v' .. e, fmt(tonumber(redis.call('HGET', rkey, 'v' .. e)) + amounts[i]))
  else
    held = held + 1
    index[name] = held
    redis.call('HSET', rkey, 'k' .. held, name, 'v' .. held, fmt(amounts[i]), 'n', held)
  end
end
return {1}
"""

# ARGV: P, rid
_RELEASE = r"""
if unhold(ARGV[2], true) then return 1 end
return 0
"""

# ARGV: P, agent, session, bucket, first_live, ttl_ms, n, (scope, sub, amount) * n
_ADD = r"""
local agent, session = ARGV[2], ARGV[3]
local b, first_live, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
for i = 1, tonumber(ARGV[7]) do
  local j = 7 + 3 * (i - 1)
  apply(agent, session, ARGV[j + 1], ARGV[j + 2], b, tonumber(ARGV[j + 3]), first_live, ttl)
end
return 1
"""

# ARGV: P, agent, session, first_live, n (-1: every counter in use), (scope, sub) * n
# returns a flat list (scope, sub, value) * k
_SNAPSHOT = r"""
local agent, session, first_live, n = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local out = {}
local function day_value(sub) return fmt(day_total(day_key(agent, sub), first_live)) end
if n >= 0 then
  for i = 1, n do
    local scope, sub = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
    local v
    if scope == 's' then
      v = redis.call('HGET', session_key(session), sub) or '0'
    else
      v = day_value(sub)
    end
    table.insert(out, scope); table.insert(out, sub); table.insert(out, v)
  end
  return out
end
local s = redis.call('HGETALL', session_key(session))
for i = 1, #s, 2 do
  table.insert(out, 's'); table.insert(out, s[i]); table.insert(out, s[i + 1])
end
local dk = P .. 'dk:' .. agent
for _, sub in ipairs(redis.call('SMEMBERS', dk)) do
  local v = day_value(sub)
  if redis.call('EXISTS', day_key(agent, sub)) == 1 then
    table.insert(out, 'd'); table.insert(out, sub); table.insert(out, v)
  else
    redis.call('SREM', dk, sub)
  end
end
return out
"""

# ARGV: P, before
_SETTLE = r"""
local ids = redis.call('ZRANGEBYSCORE', P .. 'rt', '-inf', '(' .. ARGV[2])
for _, rid in ipairs(ids) do unhold(rid, false) end
return #ids
"""

# ARGV: P, candidate epoch: the fence as it stands, written with the candidate when missing
_OPEN_FENCE = r"""
local key = ARGV[1] .. 'fence'
local epoch = redis.call('GET', key)
if not epoch then
  redis.call('SET', key, ARGV[2])
  epoch = ARGV[2]
end
return epoch
"""

# ARGV: P, session
_DELETE_SESSION = r"""
local session = ARGV[2]
for _, rid in ipairs(redis.call('SMEMBERS', P .. 'sr:' .. session)) do unhold(rid, false) end
redis.call('DEL', P .. 'sr:' .. session, P .. 'sc:' .. session)
redis.call('SREM', P .. 'sessions', session)
return redis.call('DEL', P .. 'st:' .. session)
"""

log = logging.getLogger("governor.store")

_SCOPE_CODE = {"per_session": "s", "per_day": "d"}
_SCOPE_NAME = {"s": "per_session", "d": "per_day"}


class RedisStore:
    """A store in the Redis at `url` (redis:// or rediss://); thread-safe (a connection pool)."""

    remote = True

    def __init__(
        self,
        url: str,
        *,
        window: RollingWindow = DAY,
        prefix: str = "governor:",
        timeout: float = 2.0,
    ) -> None:
        self.window = window
        self.prefix = prefix
        self._closed = False
        self._ttl_ms = math.ceil((window.length + 2 * window.bucket) * 1000)
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )
        register = self._client.register_script
        self._reserve = register(_PRELUDE + _RESERVE)
        self._commit = register(_PRELUDE + _COMMIT)
        self._release = register(_PRELUDE + _RELEASE)
        self._extend = register(_PRELUDE + _EXTEND)
        self._open_fence = register(_OPEN_FENCE)
        self._add = register(_PRELUDE + _ADD)
        self._snapshot = register(_PRELUDE + _SNAPSHOT)
        self._settle = register(_PRELUDE + _SETTLE)
        self._delete_session = register(_PRELUDE + _DELETE_SESSION)
        self._lost: str | None = None  # why the store fails closed after losing its data
        self.epoch = ""
        with self._guard():
            self._client.ping()
            self.epoch = self._open_fence(args=(self.prefix, uuid.uuid4().hex))

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn any backend failure into StoreUnavailable, so the caller fails closed."""
        if self._closed:
            raise StoreUnavailable("Redis store is closed")
        if self._lost is not None:
            raise StoreIntegrityError(self._lost)
        try:
            yield
        except redis.RedisError as exc:
            raise StoreUnavailable(f"Redis store: {type(exc).__name__}: {exc}") from exc

    def _run(self, script: Any, *args: Any) -> Any:
        with self._guard():
            try:
                return script(args=(self.prefix, self.epoch, *args))
            except redis.ResponseError as exc:
                if not str(exc).startswith(_FENCE_ERROR):
                    raise
                found = str(exc)[len(_FENCE_ERROR):].strip()
                self._lost = self._loss("gone" if found == "false" else "another epoch")
                log.error("%s", self._lost)
                raise StoreIntegrityError(self._lost) from None

    def _loss(self, fence: str) -> str:
        return (f"Redis store: its data was lost (the fence {self.prefix}fence is {fence}: FLUSHALL, a failover "
                "to an empty replica or a restart without persistence); budget counters cannot be trusted, every "
                "step is refused until an operator acknowledges the loss (POST /v1/store/acknowledge)")

    @property
    def integrity(self) -> str | None:
        """Why the store fails closed after losing its data, or None."""
        return self._lost

    def acknowledge(self) -> dict[str, Any]:
        """An operator accepts that the counters were lost: adopt the fence as it now stands
        (written afresh when missing) and serve again from what Redis holds. Each replica
        acknowledges for itself (the first one writes the new fence, the others adopt it)."""
        if self._closed:
            raise StoreUnavailable("Redis store is closed")
        try:
            was = self._lost
            if was is None and self._client.get(f"{self.prefix}fence") != self.epoch:
                was = self._loss("gone or another epoch")  # lost, not noticed yet: acknowledged all the same
            epoch = self._open_fence(args=(self.prefix, uuid.uuid4().hex))
        except redis.RedisError as exc:
            raise StoreUnavailable(f"Redis store: {type(exc).__name__}: {exc}") from exc
        self.epoch, self._lost = epoch, None
        if was is not None:
            log.warning("Redis store: the loss of its data was acknowledged; budgets count from what it holds now")
        return {"acknowledged": was is not None, "lost": was}

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
        result = self._run(self._reserve, *args)
        if int(result[0]) == 1:
            return Reservation(id=rid, ok=True)
        return Reservation(id=None, ok=False, failed=capped[int(result[1]) - 1], observed=float(result[2]))

    def commit(self, reservation_id: str, actual: Sequence[CounterCharge] | None, now: float) -> None:
        args: list[Any] = [reservation_id, self.window.first_live(now), self._ttl_ms]
        if actual is None:
            args += ("held", 0)
        else:
            args.append("actual")
            args += encode_totals(totals_by_key(actual))
        if int(self._run(self._commit, *args)) != 1:
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
        result = self._run(self._extend, *args)
        code = int(result[0])
        if code == -1:
            raise UnknownReservation(reservation_id)
        if code == 1:
            return Reservation(id=reservation_id, ok=True)
        return Reservation(id=None, ok=False, failed=capped[int(result[1]) - 1], observed=float(result[2]))

    def add(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> None:
        args: list[Any] = [agent, session, self.window.bucket_of(now), self.window.first_live(now), self._ttl_ms]
        self._run(self._add, *args, *encode_totals(totals_by_key(charges)))

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
