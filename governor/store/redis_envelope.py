"""The statistical envelope on Redis: one envelope per agent for the whole fleet.

Every governor of the fleet adds its counts to the agent's one hash (KEYS[1] =
`<prefix>env:<agent>`) through FEED, a Lua script, so the merge is atomic and commutative
(HINCRBYFLOAT, HINCRBY), never last-writer-wins. The first feed of a later window closes the
current one in the same script: the closed counts are folded into the Welford mean and m2 of
each metric (the arithmetic of `policy.envelope.fold`, in doubles, written with %.17g so
nothing is rounded) and returned with the baseline before the fold, so exactly one governor
judges each closed window. A feed older than the current window counts in it (skew never
reopens a window). MARK sets the sticky deviation only when none stands (the first wins);
RESET clears it and returns what it cleared. Fields of the hash:

  window          the current window's index
  c:<metric>      the current window's counts       t:<tool>   its tool calls
  n               active windows folded             mean:<m>, m2:<m>   Welford per metric
  h:<tool>        tool calls of the folded windows  deviation  the sticky deviation (JSON)
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson
import redis

from governor.policy.envelope import METRICS, ClosedWindow, EnvelopeConfig, EnvelopeState, Welford
from governor.store.base import StoreUnavailable

FEED = """
local key = KEYS[1]
local idx = tonumber(ARGV[1])
local nmetrics = tonumber(ARGV[2])
local function fmt(x) return string.format('%.17g', x) end
local cur = tonumber(redis.call('HGET', key, 'window'))
local closed = {}
if cur == nil then
  redis.call('HSET', key, 'window', ARGV[1])
elseif idx > cur then
  closed = redis.call('HGETALL', key)
  local counts, tools, active, drop = {}, {}, false, {}
  for i = 1, #closed, 2 do
    local f, v = closed[i], closed[i + 1]
    local head = string.sub(f, 1, 2)
    if head == 'c:' then
      counts[string.sub(f, 3)] = tonumber(v)
      if tonumber(v) > 0 then active = true end
      drop[#drop + 1] = f
    elseif head == 't:' then
      tools[string.sub(f, 3)] = tonumber(v)
      drop[#drop + 1] = f
    end
  end
  if active then
    local n = tonumber(redis.call('HGET', key, 'n') or '0') + 1
    for j = 1, nmetrics do
      local m = ARGV[2 + j]
      local x = counts[m] or 0
      local mean = tonumber(redis.call('HGET', key, 'mean:' .. m) or '0')
      local m2 = tonumber(redis.call('HGET', key, 'm2:' .. m) or '0')
      local delta = x - mean
      mean = mean + delta / n
      m2 = m2 + delta * (x - mean)
      redis.call('HSET', key, 'mean:' .. m, fmt(mean), 'm2:' .. m, fmt(m2))
    end
    redis.call('HSET', key, 'n', n)
    for t, c in pairs(tools) do redis.call('HINCRBY', key, 'h:' .. t, c) end
  end
  if #drop > 0 then redis.call('HDEL', key, unpack(drop)) end
  redis.call('HSET', key, 'window', ARGV[1])
end
local i = 3 + nmetrics
while i < #ARGV do
  local f, v = ARGV[i], ARGV[i + 1]
  if string.sub(f, 1, 2) == 't:' then redis.call('HINCRBY', key, f, v) else redis.call('HINCRBYFLOAT', key, f, v) end
  i = i + 2
end
return {closed, redis.call('HGETALL', key)}
"""

MARK = """
if redis.call('HEXISTS', KEYS[1], 'deviation') == 0 then redis.call('HSET', KEYS[1], 'deviation', ARGV[1]) end
return redis.call('HGET', KEYS[1], 'deviation')
"""

RESET = """
local was = redis.call('HGET', KEYS[1], 'deviation')
redis.call('HDEL', KEYS[1], 'deviation')
return was
"""


def state_of(flat: list[Any]) -> EnvelopeState:
    """An EnvelopeState from the hash's HGETALL (a flat list of fields and values)."""
    fields = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}
    n = int(fields.get("n", "0"))
    stats = {m: Welford(n, float(fields.get("mean:" + m, "0")), float(fields.get("m2:" + m, "0"))) for m in METRICS} \
        if n else {}
    deviation = fields.get("deviation")
    return EnvelopeState(
        window=int(fields["window"]) if "window" in fields else None,
        counts={f[2:]: float(v) for f, v in fields.items() if f.startswith("c:")},
        tools={f[2:]: int(v) for f, v in fields.items() if f.startswith("t:")},
        stats=stats,
        tool_history={f[2:]: int(v) for f, v in fields.items() if f.startswith("h:")},
        deviation=orjson.loads(deviation) if deviation else None)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisEnvelopeBook:
    def __init__(self, client: Any, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._feed = client.register_script(FEED)
        self._mark = client.register_script(MARK)
        self._reset = client.register_script(RESET)

    def _key(self, agent: str) -> str:
        return f"{self._prefix}env:{agent}"

    def _call(self, script: Any, agent: str, args: list[Any]) -> Any:
        try:
            return script(keys=[self._key(agent)], args=args)
        except redis.RedisError as exc:
            raise StoreUnavailable(f"Redis envelope: {exc}") from exc

    def feed(self, agent: str, config: EnvelopeConfig, now: float, increments: Mapping[str, float],
             tools: Mapping[str, int]) -> tuple[EnvelopeState, ClosedWindow | None]:
        args: list[Any] = [config.window_of(now), len(METRICS), *METRICS]
        for metric, amount in increments.items():
            if amount:
                args += ["c:" + metric, repr(float(amount))]
        for tool, c in tools.items():
            args += ["t:" + tool, int(c)]
        closed_flat, now_flat = self._call(self._feed, agent, args)
        state = state_of(now_flat)
        if not closed_flat:
            return state, None
        before = state_of(closed_flat)
        assert before.window is not None
        return state, ClosedWindow(before.window, before.counts, before.tools, before.stats, before.tool_history)

    def mark(self, agent: str, deviation: Mapping[str, Any]) -> Mapping[str, Any]:
        return orjson.loads(self._call(self._mark, agent, [orjson.dumps(deviation)]))

    def load(self, agent: str) -> EnvelopeState:
        try:
            raw = self._client.hgetall(self._key(agent))
        except redis.RedisError as exc:
            raise StoreUnavailable(f"Redis envelope: {exc}") from exc
        return state_of([x for kv in raw.items() for x in kv])

    def reset(self, agent: str) -> Mapping[str, Any] | None:
        was = self._call(self._reset, agent, [])
        return orjson.loads(was) if was else None

    def close(self) -> None:
        pass  # the client is the store's, closed with it


__all__ = ["FEED", "MARK", "RESET", "RedisEnvelopeBook", "state_of"]
