"""The Lua scripts of a shared session's one-round-trip steps (governor.runtime.shared_fast;
docs/reference/shared-sessions.md): optimistic concurrency on the session's saved state.

The replica decides on the state it last saw; the script checks that `st:<session>` is still
those bytes (its SHA-1), that no replica holds the session's decision round (`lk:`), and
then, atomically, reserves or settles the counters, saves the new state and the session's
last activity. On a version conflict it answers the state as it stands, so the replica
re-decides without another read. Both run after redis_scripts.PRELUDE (the fence, the
counter helpers).

Answers: {1, ...} done; {-2} a decision round holds the session (checked first: a round's
state is its own until it ends); {-1, state} the state changed (re-decide on it); {-3} no saved state; SHARED_ADMIT {0, k, value, snapshot...}
refused by capped charge k, {3, 0, '0', snapshot...} a bound does not hold (not a quiet
call: the full round decides); SHARED_SETTLE {0} the reservation is not outstanding.
"""

# ARGV (after the prefix and epoch): RESERVE_WITHIN's (agent, session, rid, bucket,
# first_live, ttl_ms, created, n, (scope, sub, amount) * n, m, (index, limit) * m, k,
# (scope, sub) * k), then the state's expected SHA-1, the new state, the activity, q,
# (snapshot index, addend, limit, strict) * q
SHARED_ADMIT = r"""
local agent, session, rid = ARGV[2], ARGV[3], ARGV[4]
local b, first_live, ttl, created = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local n = tonumber(ARGV[9])
local at = 10 + 3 * n
at = at + 1 + 2 * tonumber(ARGV[at])
local k = tonumber(ARGV[at])
local t = at + 1 + 2 * k
local skey = P .. 'st:' .. session
if redis.call('EXISTS', P .. 'lk:' .. session) == 1 then return {-2} end
local cur = redis.call('GET', skey)
if not cur then return {-3} end
if redis.sha1hex(cur) ~= ARGV[t] then return {-1, cur} end
local out, values = {1, 0, '0'}, {}
for i = 1, k do
  local v = counter(agent, session, ARGV[at + 2 * i - 1], ARGV[at + 2 * i], first_live)
  values[i] = v
  out[3 + i] = fmt(v)
end
for j = 1, tonumber(ARGV[t + 3]) do
  local q = t + 3 + 4 * (j - 1)
  local v, limit = values[tonumber(ARGV[q + 1])] + tonumber(ARGV[q + 2]), tonumber(ARGV[q + 3])
  if (ARGV[q + 4] == '1' and v >= limit) or (ARGV[q + 4] ~= '1' and v > limit) then
    out[1] = 3
    return out
  end
end
local ok, refused = charges_within_caps(agent, session, first_live, 9, b)
if not ok then
  out[1], out[2], out[3] = 0, refused[2], refused[3]
  return out
end
hold(agent, session, rid, b, created, ok, first_live, ttl)
redis.call('SET', skey, ARGV[t + 1])
redis.call('SADD', P .. 'sessions', session)
redis.call('HSET', P .. 'act', session, ARGV[t + 2])
return out
"""

# ARGV (after the prefix and epoch): COMMIT's (rid, first_live, ttl_ms, 'actual', n,
# (scope, sub, amount) * n), then the session, the state's expected SHA-1, the new state,
# the activity
SHARED_SETTLE = r"""
local first_live, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local n = tonumber(ARGV[6])
local t = 7 + 3 * n
local session = ARGV[t]
local skey = P .. 'st:' .. session
if redis.call('EXISTS', P .. 'lk:' .. session) == 1 then return {-2} end
local cur = redis.call('GET', skey)
if not cur then return {-3} end
if redis.sha1hex(cur) ~= ARGV[t + 1] then return {-1, cur} end
local held = unhold(ARGV[2], true, charges_check(6, first_live))
if not held then return {0} end
for i = 1, n do
  local j = 6 + 3 * (i - 1)
  apply(held[1], held[2], ARGV[j + 1], ARGV[j + 2], held[3], tonumber(ARGV[j + 3]), first_live, ttl)
end
redis.call('SET', skey, ARGV[t + 2])
redis.call('SADD', P .. 'sessions', session)
redis.call('HSET', P .. 'act', session, ARGV[t + 3])
return {1}
"""

__all__ = ["SHARED_ADMIT", "SHARED_SETTLE"]
