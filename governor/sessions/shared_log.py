"""The session book's log shared by replicas (a list in the store: `RedisSessions.book_*`).

Every entry a replica's book appends (open, end, lock, lift, ...) is also pushed to the
store, tagged with the replica's origin; each replica replays the others' entries in the
store's order. A replica reads what is new at once on a token it does not know (a session
opened on another replica a moment ago; at most every FORCED_MIN_SEC, so a flood of invented
tokens costs one read per interval) and otherwise in the background, at most every
REFRESH_SEC, off the request path: an end, a lock or a lift made elsewhere is in force here
within about that time (an ended session is refused at once anyway: its shared state says so,
governor.runtime.shared). A store that cannot be read leaves the book as it was (an unknown
token stays refused).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from typing import Any, Callable

log = logging.getLogger("governor.sessions")

REFRESH_SEC = 0.5
FORCED_MIN_SEC = 0.02
ORIGIN = "origin"  # the member naming the replica that wrote an entry


class SharedLog:
    def __init__(self, store: Any, replay: Callable[[dict[str, Any]], None], clock: Callable[[], float]) -> None:
        self.store = store  # book_append(bytes), book_read(start, generation) -> (generation, list[bytes])
        self.replay = replay
        self.clock = clock
        self.origin = secrets.token_hex(8)
        self.read = 0  # entries of the store's log read so far
        self.generation = 0  # how many times the store's log had been compacted when it was read
        self.read_at = float("-inf")
        self.forced_at = float("-inf")
        self.fetching: asyncio.Task | None = None  # the background read in progress

    def append(self, entry: dict[str, Any]) -> None:
        """Push one entry for the other replicas (the caller's own state already has it).
        A store that refuses it: logged, the entry is kept in this replica's own log."""
        line = json.dumps({**entry, ORIGIN: self.origin}, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            self.store.book_append(line)
        except Exception:
            log.exception("session book: could not share %s %s with the other replicas", entry.get("op"),
                          entry.get("id"))

    def catch_up(self, *, force: bool = False) -> bool:
        """Replay the other replicas' new entries: at once when forced (whether any were read),
        else in a background read, at most every REFRESH_SEC (False)."""
        now = self.clock()
        if force:
            if now - self.forced_at < FORCED_MIN_SEC:
                return False
            self.forced_at = now
            try:
                generation, lines = self.store.book_read(self.read, self.generation)
            except Exception as exc:
                log.warning("session book: the shared log could not be read: %s", exc)
                return False
            self._replay_lines(generation, lines)
            return bool(lines)
        if now - self.read_at < REFRESH_SEC or self.fetching is not None:
            return False
        self.read_at = now
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a command-line tool): nothing runs in the background
            return False
        self.fetching = loop.create_task(self._fetch())
        return False

    async def _fetch(self) -> None:
        try:
            await self.read_now()
        finally:
            self.fetching = None

    async def read_now(self) -> None:
        """Replay the other replicas' new entries now, the store read off the loop (a control-plane
        read that shows what another replica did a moment ago); a store that cannot be read is logged."""
        try:
            for _ in range(2):  # (another read in between took some: read again from where it left off)
                start, known = self.read, self.generation
                generation, lines = await asyncio.to_thread(self.store.book_read, start, known)
                if (self.read, self.generation) == (start, known):
                    self._replay_lines(generation, lines)
                    return
        except Exception as exc:
            log.warning("session book: the shared log could not be read: %s", exc)

    def _replay_lines(self, generation: int, lines: list[bytes]) -> None:
        if generation != self.generation:  # compacted since the last read: `lines` is the whole log, replayed
            self.generation, self.read = generation, 0  # again (what this book knows already changes nothing)
        for raw in lines:
            self.read += 1
            try:
                entry = json.loads(raw)
                if entry.pop(ORIGIN, None) != self.origin:
                    self.replay(entry)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:  # skipped, never half-applied
                log.error("session book: shared entry %d unreadable, skipped: %s", self.read, exc)


def is_news(entry: dict[str, Any], sessions: dict[str, Any], locks: dict[str, Any]) -> bool:
    """Whether another replica's entry changes what a book holding `sessions` and `locks` knows."""
    op, key = entry.get("op"), entry.get("id")
    if op == "open":
        return key not in sessions
    if op == "end":
        return key in sessions and sessions[key].ended_at is None
    if op == "lock":
        return key not in locks
    if op == "lift":
        return key in locks and locks[key].lifted_at is None
    return op in ("default_halted", "default_released")


__all__ = ["REFRESH_SEC", "SharedLog", "is_news"]
