"""The session book's log on disk: `<data-dir>/sessions/book.jsonl`, one JSON entry a line
(open, end, default_halted, default_released, lock, lift; tokens only by their SHA-256).

Appended as the book decides; compacted (rewritten whole as the book's `snapshot`, then
renamed over the old log) at start-up and whenever it has doubled since the last compaction.
A crash leaves the old log or the new one, whole; a last line a crash cut short is set aside
at start-up. What the entries mean is the book's business (`SessionBook` replays them).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable

from governor.evidence.record import remove_stale_temp_files, write_durably
from governor.sessions.entries import DAY, Lock, Opened, SessionBookError

log = logging.getLogger("governor.sessions")

ENDED_RETENTION = DAY  # how long a compacted book keeps a session after it ended
COMPACT_MIN_LINES = 10_000  # a running governor compacts its book past this many lines, then past double

Snapshot = tuple[list[dict[str, Any]], list[Opened]]


def snapshot(sessions: Iterable[Opened], default_halted: tuple[str, str] | None, locks: Iterable[Lock],
             now: float, ended_retention: float) -> Snapshot:
    """The log's entries that rebuild what the book holds now, minus what it no longer
    needs: every session still open, every one that ended within `ended_retention`,
    every agent-named one opened within the rolling day (the cap counts them) and every
    default session (a configured default name is never reopened); the halted default
    session; every lock, with its lift. A principal's session dropped here has ended long
    ago: its token is refused as unknown instead of as ended. Returns the entries and the
    sessions left out."""
    entries: list[dict[str, Any]] = []
    dropped: list[Opened] = []
    for opened in sessions:
        keep = (opened.ended_at is None or opened.ended_at > now - ended_retention or opened.by == "default"
                or (opened.by == "agent" and opened.opened_at > now - DAY))
        if not keep:
            dropped.append(opened)
            continue
        entry: dict[str, Any] = {"op": "open", "id": opened.id, "by": opened.by, "at": opened.opened_at}
        if opened.token_sha256 is not None:
            entry["token_sha256"] = opened.token_sha256
        entry.update({"identity": opened.identity.to_json()} if opened.identity is not None else {})
        for key in ("label", "nonce", "ended_at", "halt_cause"):
            if (value := getattr(opened, key)) is not None:
                entry[key] = value
        entries.append(entry)
    if default_halted is not None:
        session, cause = default_halted
        entries.append({"op": "default_halted", "id": session, "cause": cause, "at": now})
    entries.extend({"op": "lock", **asdict(lock)} for lock in locks)
    return entries, dropped


class BookLog:
    """The log file of one book. `snapshot(now)` is what a compaction writes; `forget` is
    handed the sessions a compaction left out, once the new log is in place, so the book
    stays as small as its log."""

    def __init__(self, path: Path, *, clock: Callable[[], float], compact_min_lines: int,
                 snapshot: Callable[[float], Snapshot], forget: Callable[[list[Opened]], None]) -> None:
        self.path = path
        self.clock = clock
        self.snapshot = snapshot
        self.forget = forget
        self.lines = 0  # lines in the log
        self.compact_at = compact_min_lines  # the line count that triggers the next compaction
        self.compact_min_lines = compact_min_lines
        self._write_lock = threading.Lock()

    def append(self, entry: dict[str, Any], *, sync: bool = False) -> None:
        line = (json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        with self._write_lock:
            if self.lines + 1 >= self.compact_at:
                # the snapshot, then this line: an op whose state is already in memory replays
                # idempotently, and one whose state is not yet (open) is kept by the line
                self.compact(extra=line)
                return
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line)
                    if sync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise SessionBookError(f"cannot write {self.path}: {exc.strerror or exc}") from None
            self.lines += 1

    def compact(self, extra: bytes = b"") -> None:
        """Rewrite the log as its snapshot (plus `extra`, a line being appended): a temp file,
        fsync'ed, renamed over the log. A crash leaves the old log or the new one, whole."""
        entries, dropped = self.snapshot(self.clock())
        lines = [json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n" for entry in entries]
        data = "".join(lines).encode() + extra
        try:
            write_durably(self.path, data)
        except OSError as exc:
            raise SessionBookError(f"cannot compact {self.path}: {exc.strerror or exc}") from None
        self.forget(dropped)
        before, self.lines = self.lines, len(lines) + (1 if extra else 0)
        self.compact_at = max(self.compact_min_lines, 2 * self.lines)
        log.info("%s compacted: %d lines to %d", self.path, before + (1 if extra else 0), self.lines)

    def load(self, replay: Callable[[dict[str, Any], float], None]) -> bool:
        """Replay the log's entries (`replay(entry, now)`), set a torn last line aside, and
        start from a compact log when the snapshot would drop or merge something. False: no
        log yet."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_files(self.path.parent)  # a compaction a crash cut short: the old log stands
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise SessionBookError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        now = self.clock()
        *complete, tail = data.split(b"\n")
        for number, raw in enumerate(complete, 1):
            if not raw.strip():
                continue
            try:
                replay(json.loads(raw), now)
            except (ValueError, KeyError, TypeError) as exc:
                raise SessionBookError(f"{self.path} line {number}: {exc}") from None
            self.lines += 1
        if tail:  # a last line without its newline: a write a crash cut short, set aside
            intact = len(data) - len(tail)
            aside = self.path.with_name(f"{self.path.name}.torn-{intact}")
            try:
                aside.write_bytes(tail)
                os.truncate(self.path, intact)
            except OSError as exc:
                raise SessionBookError(f"cannot set aside the torn last line of {self.path}: {exc}") from None
            log.warning("%s: torn last line (%d bytes) set aside in %s", self.path, len(tail), aside)
        if len(self.snapshot(now)[0]) < self.lines:  # something to drop or merge: start from a compact log
            self.compact()
        self.compact_at = max(self.compact_min_lines, 2 * self.lines)
        return True
