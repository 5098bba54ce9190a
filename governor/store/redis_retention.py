"""Every shared session in Redis, listed; and what an ended one leaves there, removed in time.

Listing. Every session with a chain is in the sorted set `ids` (one score, so in id order:
the chain's first append puts it there, `redis_sessions.APPEND`), so a page after a cursor is
one ZRANGE BYLEX (O(log n + page)), whatever replica served the sessions, and `entries` reads
each one's chain head and saved state in one pipelined round trip.

Counting (the `governor_shared_sessions` gauge): the open sessions are those with a last
activity (`act`: set when a session starts, forgotten when it ends), the ended ones those in
`ended`; `tally_sources` reads both in one round trip, O(open sessions), never the whole index.

Retention. A session's record written, its time is in `ended`; `ended_ttl` later (the store
URL's `?ended_ttl=`, a day by default) a replica's sweeper removes what it left (`REMOVE_ENDED`:
chain, head, state, record, round, activity, index), in batches, and the session book's log
is compacted (`compact_book`): the open and end entries of sessions ended before that (and
removed: an end entry forged for a session whose chain is there drops nothing) are dropped, as each replica's own file log drops them (`SessionBook._snapshot`), locks and
everything else kept. A compaction rewrites the list atomically and bumps `bookgen`, so every
reader reads the log whole once again (`RedisSessions.book_read`); replaying what a book
knows already changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

# KEYS[1] the fence; ARGV: prefix, cutoff (epoch seconds), batch. Removes what the sessions whose
# record was written before the cutoff left (at most `batch` of them); answers their ids.
REMOVE_ENDED = r"""
local P = ARGV[1]
local gone = redis.call('ZRANGEBYSCORE', P .. 'ended', '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, S in ipairs(gone) do
  redis.call('DEL', P .. 'ch:' .. S, P .. 'chh:' .. S, P .. 'st:' .. S, P .. 'rec:' .. S, P .. 'lk:' .. S,
    P .. 'prf:' .. S)
  redis.call('HDEL', P .. 'unproved', S)
  redis.call('SREM', P .. 'chains', S)
  redis.call('ZREM', P .. 'ids', S)
  redis.call('ZREM', P .. 'ended', S)
  redis.call('HDEL', P .. 'act', S)
end
return gone
"""

# KEYS[1] the fence; ARGV: prefix, the generation compacted, the entries examined (n), then the
# entries kept of those n. Replaces the log's first n entries by the kept ones (entries appended
# since are kept after them) and bumps the generation; 0 when another compaction came first.
REPLACE_BOOK = r"""
local P = ARGV[1]
local book, gen = P .. 'book', P .. 'bookgen'
if tonumber(redis.call('GET', gen) or '0') ~= tonumber(ARGV[2]) then return 0 end
local tail = redis.call('LRANGE', book, tonumber(ARGV[3]), -1)
redis.call('DEL', book)
for i = 4, #ARGV do redis.call('RPUSH', book, ARGV[i]) end
for _, line in ipairs(tail) do redis.call('RPUSH', book, line) end
redis.call('INCR', gen)
return 1
"""

REMOVE_BATCH = 200  # sessions removed per script run (Redis runs nothing else meanwhile)
BOOK_COMPACT_SHARE = 4  # the log is rewritten once a quarter of its entries can go
BOOK_SMALL = 2000  # (or whenever something can go, while it is this short: a rewrite costs little)


class SharedRetention:
    """The listing and the retention above, over `RedisSessions` (its client, prefix, fence, guard)."""

    def __init__(self, sessions: Any) -> None:
        self.sessions = sessions
        self.client = sessions.client
        self.prefix = sessions.prefix
        self.ttl = sessions.ended_ttl
        self._remove = self.client.register_script(REMOVE_ENDED)
        self._replace = self.client.register_script(REPLACE_BOOK)
        self.droppable = 0  # sessions removed since the book's log was last compacted
        self.indexed = False  # sessions chained before the index existed are in it (`backfill`)

    # --- listing --------------------------------------------------------------------------

    def page(self, after: str | None, limit: int) -> list[str]:
        """The ids of shared sessions after `after`, at most `limit`, in id order."""
        low = "-" if after is None else "(" + after
        with self.sessions.guard():
            return list(self.client.zrange(f"{self.prefix}ids", low, "+", bylex=True, offset=0, num=limit))

    def entries(self, sessions: list[str]) -> dict[str, tuple[int, bytes | None, bool, str | None]]:
        """Each session's chain length, saved state, whether its record is written and (for one
        no round saved a state for yet) when its chain began, in one round trip (two when some
        have no state); a session without a chain head (a forged index member, one removed
        meanwhile) is left out."""
        if not sessions:
            return {}
        P = self.prefix
        with self.sessions.guard():
            pipe = self.client.pipeline(transaction=False)
            for session in sessions:
                pipe.hget(f"{P}chh:{session}", "len")
                pipe.get(f"{P}st:{session}")
                pipe.exists(f"{P}rec:{session}")
            answers = pipe.execute()
            fresh = [s for n, s in enumerate(sessions) if answers[3 * n] is not None and answers[3 * n + 1] is None]
            heads = self.client.pipeline(transaction=False)
            for session in fresh:
                heads.lindex(f"{P}ch:{session}", 0)
            began = dict(zip(fresh, heads.execute() if fresh else []))
        found: dict[str, tuple[int, bytes | None, bool, str | None]] = {}
        for n, session in enumerate(sessions):
            length, state, recorded = answers[3 * n: 3 * n + 3]
            if length is None or not str(length).isdigit():
                continue
            found[session] = (int(length), state.encode() if isinstance(state, str) else state, bool(recorded),
                              header_start(began.get(session)))
        return found

    def tally_sources(self) -> tuple[list[str], int]:
        """What the count of shared sessions by state starts from, in one round trip: the sessions
        with a last activity (the open ones, and any a late settlement touched after its end), in
        id order, and how many sessions' records are written and kept (`ended`)."""
        P = self.prefix
        with self.sessions.guard():
            pipe = self.client.pipeline(transaction=False)
            pipe.hkeys(f"{P}act")
            pipe.zcard(f"{P}ended")
            live, ended = pipe.execute()
        return sorted(s.decode() if isinstance(s, bytes) else s for s in live), int(ended)

    # --- retention ------------------------------------------------------------------------

    def remove_ended(self, now: float) -> list[str]:
        """Remove what the sessions ended more than `ttl` ago left (the chains, states, records);
        the book's log compacted when enough of it can go. Answers the sessions removed (their
        counters are the store's to delete). Blocking."""
        cutoff = now - self.ttl
        removed: list[str] = []
        with self.sessions.guard():
            if not self.indexed:
                self.backfill(now)
            while True:
                batch = list(self._remove(keys=self.sessions.keys, args=(self.prefix, repr(cutoff), REMOVE_BATCH)))
                removed.extend(batch)
                if len(batch) < REMOVE_BATCH:
                    break
            self.droppable += len(removed)
            length = self.client.llen(f"{self.prefix}book") if self.droppable else 0
            if self.droppable and (length <= BOOK_SMALL or self.droppable * 2 * BOOK_COMPACT_SHARE >= length):
                self.compact_book(now, cutoff)  # (a book's end entry is a moment later than its record)
        return removed

    def backfill(self, now: float) -> None:
        """Sessions a governor chained before it kept the index and the ended set (an upgrade):
        put in both (an ended one as if it ended now), once per process (SSCAN: the chains'
        set holds the sessions retention has not removed yet). Blocking."""
        batch: list[str] = []
        for session in self.client.sscan_iter(f"{self.prefix}chains", count=500):
            batch.append(session)
            if len(batch) >= 500:
                self._index(batch, now)
                batch = []
        self._index(batch, now)
        self.indexed = True

    def _index(self, sessions: list[str], now: float) -> None:
        if not sessions:
            return
        P = self.prefix
        check = self.client.pipeline(transaction=False)
        for session in sessions:
            check.exists(f"{P}rec:{session}")
        recorded = check.execute()
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(f"{P}ids", {session: 0 for session in sessions}, nx=True)
        ended = {session: now for session, there in zip(sessions, recorded) if there}
        if ended:
            pipe.zadd(f"{P}ended", ended, nx=True)
        pipe.execute()

    def compact_book(self, now: float, cutoff: float) -> bool:
        """Rewrite the book's log without the open and end entries of the sessions whose chains
        are gone and that ended before `now` or were opened before `cutoff` (a session another
        replica ended before its book had read the open has no end entry) and without lines that
        are not entries (garbage another writer left). False when another replica compacted it
        meanwhile. Blocking."""
        P = self.prefix
        pipe = self.client.pipeline(transaction=False)  # (a compaction in between: REPLACE_BOOK refuses)
        pipe.get(f"{P}bookgen")
        pipe.lrange(f"{P}book", 0, -1)
        generation, lines = pipe.execute()
        ended = list(dict.fromkeys(ended_before(lines, now) + opened_before(lines, cutoff)))
        if ended:  # a session whose chain is still here is kept, whatever its end entry says (forged)
            check = self.client.pipeline(transaction=False)
            for session in ended:
                check.exists(f"{P}chh:{session}")
            ended = {session for session, there in zip(ended, check.execute()) if not there}
        kept = [line for line, entry in readable(lines) if not (entry["op"] in ("open", "end") and entry.get("id") in ended)]
        done = bool(int(self._replace(keys=self.sessions.keys, args=(P, int(generation or 0), len(lines), *kept))))
        if done:
            self.droppable = 0
        return done


def header_start(line: Any) -> str | None:
    """When a chain's header line says its session began (None: no readable header)."""
    try:
        start = json.loads(line)["body"]["start"]
    except (TypeError, ValueError, KeyError):
        return None
    return start if isinstance(start, str) else None


def readable(lines: list[Any]) -> list[tuple[Any, dict[str, Any]]]:
    """The log's lines that are entries (a JSON object with an op), each with its entry."""
    parsed = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("op"), str):
            parsed.append((line, entry))
    return parsed


def opened_before(lines: list[Any], cutoff: float) -> list[str]:
    """The sessions the log says were opened before `cutoff`."""
    return [entry["id"] for _, entry in readable(lines) if entry["op"] == "open" and isinstance(entry.get("id"), str)
            and entry.get("by") != "default"  # (a default session's name is never reused: as in the file log)
            and isinstance(entry.get("at"), (int, float)) and entry["at"] < cutoff]


def ended_before(lines: list[Any], cutoff: float) -> list[str]:
    """The sessions the log says ended before `cutoff`."""
    return list(dict.fromkeys(entry["id"] for _, entry in readable(lines) if entry["op"] == "end"
                              and isinstance(entry.get("id"), str) and isinstance(entry.get("at"), (int, float))
                              and entry["at"] < cutoff))


__all__ = ["SharedRetention", "ended_before", "opened_before", "readable"]
