"""Refusals a replica could not chain yet, kept on its disk until they are (shared sessions).

A step refused while the shared store was unreachable cannot be chained (the chain is in the
store), so its event waits in the session's `SharedJournal.deferred` to be chained first once
the store answers. This spool makes that wait durable: the event is written here (one
fsync'ed line per event, a file per session under `<data-dir>/sessions/deferred/`) before
the refusal is answered, as a file journal records every refusal before its answer; the
file is rewritten as events are chained, and removed once none is left. A replica killed
meanwhile finds the file at its restart and chains what it holds (the sweeper's pass,
`governor.runtime.sweeper`); an event already in the chain (chained, then the crash came
before the file was rewritten) is not chained twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from governor.evidence.record import write_durably

log = logging.getLogger("governor.evidence")


class DeferredSpool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _file(self, session: str) -> Path:
        return self.directory / f"{hashlib.sha256(session.encode()).hexdigest()}.jsonl"

    def add(self, session: str, event: dict[str, Any]) -> None:
        """Keep one more refused event of `session`, durably (OSError when the disk refuses)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        line = (json.dumps({"session": session, "event": event}, separators=(",", ":"), default=str) + "\n").encode()
        fd = os.open(self._file(session), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def keep(self, session: str, events: list[dict[str, Any]]) -> None:
        """What of `session` is still to chain (none: its file removed)."""
        path = self._file(session)
        if not events:
            path.unlink(missing_ok=True)
            return
        data = "".join(json.dumps({"session": session, "event": event}, separators=(",", ":"), default=str) + "\n"
                       for event in events).encode()
        write_durably(path, data)

    def events(self, session: str) -> list[dict[str, Any]]:
        return self._read(self._file(session)).get(session, [])

    def sessions(self) -> list[str]:
        """The sessions with events still to chain."""
        if not self.directory.is_dir():
            return []
        found: list[str] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            found.extend(self._read(path))
        return found

    def _read(self, path: Path) -> dict[str, list[dict[str, Any]]]:
        """A file's events by session; a line a crash cut short or garbage is skipped, logged."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return {}
        events: dict[str, list[dict[str, Any]]] = {}
        for number, raw in enumerate(data.split(b"\n"), 1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
                session, event = entry["session"], entry["event"]
                if not isinstance(session, str) or not isinstance(event, dict) or path != self._file(session):
                    raise ValueError("not a deferred event of this file's session")
            except (ValueError, KeyError, TypeError) as exc:
                log.error("%s line %d: unreadable, skipped: %s", path, number, exc)
                continue
            events.setdefault(session, []).append(event)
        return events


def already_chained(event: dict[str, Any], chained: list[dict[str, Any]]) -> bool:
    """Whether `event` is one of the chain's events (its cause, action, time and detail)."""
    key = (event.get("cause"), event.get("action"), event.get("at"), event.get("detail"))
    return any((e.get("cause"), e.get("action"), e.get("at"), e.get("detail")) == key for e in chained)


__all__ = ["DeferredSpool", "already_chained"]
