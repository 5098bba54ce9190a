"""The Redis store's Lua scripts (governor.store.redis runs them; the layout is described there).

Each script derives its key names from the prefix in ARGV[1] and declares the fence as its
one key (KEYS[1]), so on Redis Cluster, where the prefix is a hash tag, it runs on the node
that owns the store's slot.
"""

# ARGV[1] is always the key prefix, ARGV[2] the store's fence epoch (taken off ARGV here,
# so each script reads its own arguments from ARGV[2] on). Numbers cross into Redis as
# "%.17g" strings so that no precision is lost (Lua's own tostring keeps 14 digits).
FENCE_ERROR = "GOVERNOR_FENCE"
DAMAGED_ERROR = "GOVERNOR_DAMAGED"  # a budget counter that is not a count (redis_calls.counter_damaged)
PRELUDE = r"""
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

-- A budget counter holds what these scripts wrote: a count. Anything else (text, nan, an
-- infinite or negative number, a key of another type: edited in Redis) is damage, never read
-- as zero: the script stops, before it writes a count, with GOVERNOR_DAMAGED naming the key
-- and what it holds (governor.store.base.CounterDamaged); the key is left as found.
local SLACK = 1e-6  -- how far below zero float sums of adds and takes may leave a count
local function damaged(key, field, found)
  local name = field == '' and key or key .. '[' .. field .. ']'
  local shown = string.gsub(string.sub(tostring(found), 1, 64), '[^%w%p ]', '?')
  error({err = 'GOVERNOR_DAMAGED ' .. #name .. ':' .. name .. ' ' .. shown})
end
-- a count as read (false: absent, a count of 0)
local function count(v, key, field)
  if not v then return 0 end
  local x = tonumber(v)
  if x == nil or x ~= x or x < -SLACK or x == math.huge then damaged(key, field, v) end
  return x
end
-- a read through redis.pcall: a key of another type is damage
local function read(r, key)
  if type(r) == 'table' and r.err then damaged(key, '', 'a key of type ' .. redis.call('TYPE', key).ok) end
  return r
end

-- a per_day key's lo, hi, t and (when b is given) bucket b's value or false, all checked;
-- nil when the key is absent
local function day_read(key, b)
  local h
  if b then
    h = read(redis.pcall('HMGET', key, 'lo', 'hi', 't', int(b)), key)
  else
    h = read(redis.pcall('HMGET', key, 'lo', 'hi', 't'), key)
  end
  if not (h[1] and h[2] and h[3]) then
    if h[1] or h[2] or h[3] then damaged(key, 'lo hi t', tostring(h[1]) .. ' ' .. tostring(h[2]) .. ' ' .. tostring(h[3])) end
    return nil
  end
  local lo, hi = count(h[1], key, 'lo'), count(h[2], key, 'hi')
  if lo ~= math.floor(lo) or hi ~= math.floor(hi) or lo > hi then damaged(key, 'lo hi', h[1] .. ' ' .. h[2]) end
  return lo, hi, count(h[3], key, 't'), h[4] and count(h[4], key, int(b))
end

-- the key's live total at first_live, evicting buckets that left the window (b: check that
-- bucket too, before anything is written)
local function day_total(key, first_live, b)
  local lo, hi, t = day_read(key, b)
  if not lo then return 0 end
  if hi < first_live then
    redis.call('DEL', key)
    return 0
  end
  if lo < first_live then
    local gone = {}
    local function evict(f, v)
      t = t - count(v, key, f)
      gone[#gone + 1] = f
    end
    if first_live - lo <= redis.call('HLEN', key) then  -- the usual gap: a bucket or a few
      for e = lo, first_live - 1 do
        local v = redis.call('HGET', key, int(e))
        if v then evict(int(e), v) end
      end
    else  -- lo far behind (a long idle key, or lo edited to 0): the buckets it holds, not every index
      local h = redis.call('HGETALL', key)
      for i = 1, #h, 2 do
        local e = tonumber(h[i])
        if e and e >= lo and e < first_live and int(e) == h[i] then evict(h[i], h[i + 1]) end
      end
    end
    for _, e in ipairs(gone) do redis.call('HDEL', key, e) end
    redis.call('HSET', key, 'lo', int(first_live), 't', fmt(t))
  end
  return t
end

local function day_add(key, b, amount, first_live, ttl)
  if b < first_live then return end  -- dated before the window: no longer counts
  day_total(key, first_live)
  local fb = int(b)
  local lo, hi, t, v = day_read(key, b)
  if not lo then
    redis.call('HSET', key, 'lo', fb, 'hi', fb, 't', fmt(amount), fb, fmt(amount))
  else
    redis.call('HSET', key, fb, fmt((v or 0) + amount), 't', fmt(t + amount))
    if b < lo then redis.call('HSET', key, 'lo', fb) end
    if b > hi then redis.call('HSET', key, 'hi', fb) end
  end
  redis.call('PEXPIRE', key, ttl)
end

-- a per_session counter's count, or false when absent
local function session_read(skey, sub)
  local v = read(redis.pcall('HGET', skey, sub), skey)
  return v and count(v, skey, sub)
end

local function session_add(skey, sub, amount)
  redis.call('HSET', skey, sub, fmt((session_read(skey, sub) or 0) + amount))
end

-- the current value of one counter (b: check its bucket too)
local function counter(agent, session, scope, sub, first_live, b)
  if scope == 's' then return session_read(session_key(session), sub) or 0 end
  return day_total(day_key(agent, sub), first_live, b)
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
-- each counter's current value (every one read, and so checked, before anything is written),
-- and the first capped one the charges would overshoot:
-- scopes, subs, amounts, nil on success; else nil, {0, k, current} (reserve and extend)
local function charges_within_caps(agent, session, first_live, at, b)
  local n = tonumber(ARGV[at])
  local scopes, subs, amounts, current = {}, {}, {}, {}
  for i = 1, n do
    local j = at + 3 * (i - 1)
    scopes[i], subs[i], amounts[i] = ARGV[j + 1], ARGV[j + 2], tonumber(ARGV[j + 3])
    current[i] = counter(agent, session, scopes[i], subs[i], first_live, b)
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

-- a check before unhold writes (COMMIT, SHARED_SETTLE): the counters of the charges ARGV
-- lists from `at` ((scope, sub, amount) * n after n) that the reservation does not hold
local function charges_check(at, first_live)
  return function(agent, session, b, held)
    for i = 1, tonumber(ARGV[at]) do
      local j = at + 3 * (i - 1)
      if not held[ARGV[j + 1] .. ARGV[j + 2]] then counter(agent, session, ARGV[j + 1], ARGV[j + 2], first_live, b) end
    end
  end
end

-- hold the charges charges_within_caps admitted, as reservation rid
local function hold(agent, session, rid, b, created, ok, first_live, ttl)
  local scopes, subs, amounts, n = ok[1], ok[2], ok[3], ok[4]
  local rkey = P .. 'r:' .. rid
  redis.call('HSET', rkey, 'a', agent, 's', session, 'b', int(b), 'c', created, 'n', n)
  for i = 1, n do
    apply(agent, session, scopes[i], subs[i], b, amounts[i], first_live, ttl)
    redis.call('HSET', rkey, 'k' .. i, scopes[i] .. subs[i], 'v' .. i, fmt(amounts[i]))
  end
  redis.call('SADD', P .. 'sr:' .. session, rid)
  redis.call('ZADD', P .. 'rt', created, rid)
end

-- take a reservation off its counters (each read and checked first, then `check`, then the
-- writes) and forget it; false when not outstanding
local function unhold(rid, take, check)
  local rkey = P .. 'r:' .. rid
  local h = redis.call('HMGET', rkey, 'a', 's', 'b', 'n')
  if not h[1] then return false end
  local agent, session, b, n = h[1], h[2], count(h[3], rkey, 'b'), count(h[4], rkey, 'n')
  if take then
    local writes, held = {}, {}
    for i = 1, n do
      local e = redis.call('HMGET', rkey, 'k' .. i, 'v' .. i)
      if not e[1] then damaged(rkey, 'k' .. i, 'nothing') end
      local scope, sub, amount = string.sub(e[1], 1, 1), string.sub(e[1], 2), count(e[2], rkey, 'v' .. i)
      held[e[1]] = true
      if scope == 's' then
        local skey = session_key(session)
        local v = session_read(skey, sub)
        if v then writes[#writes + 1] = {skey, sub, fmt(v - amount)} end
      else
        local key = day_key(agent, sub)
        local lo, hi, t, v = day_read(key, b)
        if v then writes[#writes + 1] = {key, int(b), fmt(v - amount), 't', fmt(t - amount)} end  -- absent: evicted
      end
    end
    if check then check(agent, session, b, held) end
    for _, w in ipairs(writes) do redis.call('HSET', unpack(w)) end
  end
  redis.call('DEL', rkey)
  redis.call('SREM', P .. 'sr:' .. session, rid)
  redis.call('ZREM', P .. 'rt', rid)
  return {agent, session, b}
end
"""

# ARGV: P, agent, session, rid, bucket, first_live, ttl_ms, created,
#       n, (scope, sub, amount) * n, m, (counter index, limit) * m
RESERVE = r"""
local agent, session, rid = ARGV[2], ARGV[3], ARGV[4]
local b, first_live, ttl, created = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local ok, refused = charges_within_caps(agent, session, first_live, 9, b)
if not ok then return refused end
hold(agent, session, rid, b, created, ok, first_live, ttl)
return {1}
"""

# reserve, and the snapshot the step is decided on, in one round trip: the values of the
# snapshot's keys as they stood before the reservation (what `snapshot` would have said)
# ARGV: P, agent, session, rid, bucket, first_live, ttl_ms, created,
#       n, (scope, sub, amount) * n, m, (counter index, limit) * m, k, (scope, sub) * k
# returns {code, failed charge, its value, value of key 1, ..., value of key k}: code 1 held,
# 0 refused by capped charge `failed` (whose counter was at `its value`), 2 nothing to hold
RESERVE_WITHIN = r"""
local agent, session, rid = ARGV[2], ARGV[3], ARGV[4]
local b, first_live, ttl, created = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local n = tonumber(ARGV[9])
local at = 10 + 3 * n
at = at + 1 + 2 * tonumber(ARGV[at])
local out = {1, 0, '0'}
for i = 1, tonumber(ARGV[at]) do
  out[3 + i] = fmt(counter(agent, session, ARGV[at + 2 * i - 1], ARGV[at + 2 * i], first_live))
end
local ok, refused = charges_within_caps(agent, session, first_live, 9, b)
if not ok then
  out[1], out[2], out[3] = 0, refused[2], refused[3]
  return out
end
hold(agent, session, rid, b, created, ok, first_live, ttl)
return out
"""

# ARGV: P, rid, first_live, ttl_ms, mode ("held" | "actual"), n, (scope, sub, amount) * n
COMMIT = r"""
local first_live, ttl, actual = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == 'actual'
local held = unhold(ARGV[2], actual, actual and charges_check(6, first_live))
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
EXTEND = r"""
local rid, first_live, ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local rkey = P .. 'r:' .. rid
local h = redis.call('HMGET', rkey, 'a', 's', 'b', 'n')
if not h[1] then return {-1} end
local agent, session, b, held = h[1], h[2], count(h[3], rkey, 'b'), count(h[4], rkey, 'n')
local ok, refused = charges_within_caps(agent, session, first_live, 5, b)
if not ok then return refused end
local scopes, subs, amounts, n = ok[1], ok[2], ok[3], ok[4]
local index, values = {}, {}
for e = 1, held do
  local kv = redis.call('HMGET', rkey, 'k' .. e, 'v' .. e)
  if not kv[1] then damaged(rkey, 'k' .. e, 'nothing') end
  index[kv[1]], values[e] = e, count(kv[2], rkey, 'v' .. e)
end
for i = 1, n do
  apply(agent, session, scopes[i], subs[i], b, amounts[i], first_live, ttl)
  local name = scopes[i] .. subs[i]
  local e = index[name]
  if e then
    values[e] = values[e] + amounts[i]
    redis.call('HSET', rkey, 'v' .. e, fmt(values[e]))
  else
    held = held + 1
    index[name] = held
    redis.call('HSET', rkey, 'k' .. held, name, 'v' .. held, fmt(amounts[i]), 'n', held)
  end
end
return {1}
"""

# ARGV: P, rid
RELEASE = r"""
if unhold(ARGV[2], true) then return 1 end
return 0
"""

# ARGV: P, agent, session, bucket, first_live, ttl_ms, n, (scope, sub, amount) * n
ADD = r"""
local agent, session = ARGV[2], ARGV[3]
local b, first_live, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
for i = 1, tonumber(ARGV[7]) do  -- every counter read (and so checked) before any is written
  local j = 7 + 3 * (i - 1)
  counter(agent, session, ARGV[j + 1], ARGV[j + 2], first_live, b)
end
for i = 1, tonumber(ARGV[7]) do
  local j = 7 + 3 * (i - 1)
  apply(agent, session, ARGV[j + 1], ARGV[j + 2], b, tonumber(ARGV[j + 3]), first_live, ttl)
end
return 1
"""

# ARGV: P, agent, session, first_live, n (-1: every counter in use), (scope, sub) * n
# returns a flat list (scope, sub, value) * k
SNAPSHOT = r"""
local agent, session, first_live, n = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local out = {}
local function day_value(sub) return fmt(day_total(day_key(agent, sub), first_live)) end
if n >= 0 then
  for i = 1, n do
    local scope, sub = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
    table.insert(out, scope); table.insert(out, sub); table.insert(out, fmt(counter(agent, session, scope, sub, first_live)))
  end
  return out
end
local skey = session_key(session)
local s = read(redis.pcall('HGETALL', skey), skey)
for i = 1, #s, 2 do
  table.insert(out, 's'); table.insert(out, s[i]); table.insert(out, fmt(count(s[i + 1], skey, s[i])))
end
local dk = P .. 'dk:' .. agent
for _, sub in ipairs(read(redis.pcall('SMEMBERS', dk), dk)) do
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
SETTLE = r"""
local ids = redis.call('ZRANGEBYSCORE', P .. 'rt', '-inf', '(' .. ARGV[2])
for _, rid in ipairs(ids) do unhold(rid, false) end
return #ids
"""

# ARGV: P, candidate epoch: the fence as it stands, written with the candidate when missing
OPEN_FENCE = r"""
local key = ARGV[1] .. 'fence'
local epoch = redis.call('GET', key)
if not epoch then
  redis.call('SET', key, ARGV[2])
  epoch = ARGV[2]
end
return epoch
"""

# ARGV: P, session
DELETE_SESSION = r"""
local session = ARGV[2]
for _, rid in ipairs(redis.call('SMEMBERS', P .. 'sr:' .. session)) do unhold(rid, false) end
redis.call('DEL', P .. 'sr:' .. session, P .. 'sc:' .. session)
redis.call('SREM', P .. 'sessions', session)
return redis.call('DEL', P .. 'st:' .. session)
"""

# The rate limits' window counters (governor.store.windows): one string per counter and
# window, w:<counter>@<index>, expiring two windows after its last write. A counter that is not
# a count (edited in Redis: text, nan, a negative or infinite number, a key of another type)
# is never read as zero nor overwritten: the take stops with GOVERNOR_DAMAGED naming it, as a
# budget counter's script does, and an adjustment leaves it as it is, for the operator to find.
WINDOW_COUNT = r"""
-- the count a window counter holds (0 when absent), or nil and what it holds instead
local function window_count(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then return nil, 'a key of type ' .. redis.call('TYPE', key).ok end
  if not v then return 0 end
  local x = tonumber(v)
  if x == nil or x ~= x or x < 0 or x == math.huge then return nil, string.sub(v, 1, 64) end
  return x
end
"""

# ARGV: P, n, (counter, index, amount, cap or '', ttl_ms) * n
#   -> {1} | {0, i, current}: charge i would pass its cap (a counter that is not a count: GOVERNOR_DAMAGED)
TAKE_WINDOW = WINDOW_COUNT + r"""
local n = tonumber(ARGV[2])
local keys, totals, counts = {}, {}, {}
for i = 1, n do
  local j = 3 + 5 * (i - 1)
  keys[i] = P .. 'w:' .. ARGV[j] .. '@' .. ARGV[j + 1]
  totals[keys[i]] = (totals[keys[i]] or 0) + tonumber(ARGV[j + 2])
  local v, found = window_count(keys[i])
  if v == nil then damaged(keys[i], '', found) end
  counts[i] = v
end
for i = 1, n do
  local cap = ARGV[3 + 5 * (i - 1) + 3]
  if cap ~= '' and counts[i] + totals[keys[i]] > tonumber(cap) then return {0, i, fmt(counts[i])} end
end
for i = 1, n do
  local j = 3 + 5 * (i - 1)
  local v = window_count(keys[i])  -- again: one counter may be charged twice
  redis.call('SET', keys[i], fmt(v + tonumber(ARGV[j + 2])), 'PX', ARGV[j + 4])
end
return {1}
"""

# ARGV: P, n, (counter@index, delta) * n: a counter kept is corrected, never below zero
ADJUST_WINDOW = WINDOW_COUNT + r"""
local n = tonumber(ARGV[2])
for i = 1, n do
  local key = P .. 'w:' .. ARGV[1 + 2 * i]
  local v = window_count(key)
  if v ~= nil and redis.call('EXISTS', key) == 1 then
    local nv = v + tonumber(ARGV[2 + 2 * i])
    if nv < 0 then nv = 0 end
    redis.call('SET', key, fmt(nv), 'KEEPTTL')
  end
end
return 1
"""
