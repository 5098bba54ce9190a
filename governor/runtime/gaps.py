"""Events that could not be recorded (issue #32 item 8: a data disk that is full): the step or
refusal they belong to is refused all the same (the callers fail closed), and the governor
says its record is incomplete:

  * readiness fails (`/readyz`: `record: incomplete`) while a gap is not yet named;
  * `governor_record_gaps_total` counts every event that could not be journaled;
  * the next event the session's journal takes is preceded by an `on_governor_record_gap`
    event naming the gap (how many events were lost, when, their causes), so the record
    itself says it is incomplete; once every gap is named, readiness recovers.

`RecordGaps.opener` wraps the runtime's session opener so that every journal a live session
writes to goes through `WatchedJournal`: no call site changes, nothing added on the usual path
but one attribute test per append.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from governor.evidence.journal import JournalClosedError
from governor.policy.causes import ON_GOVERNOR_RECORD_GAP
from governor.store import StoreUnavailable

MAX_CAUSES = 16  # causes named per gap event (the count says how many were lost in all)


class RecordGaps:
    """The gaps of every session of one runtime."""

    def __init__(self, metrics: Any = None) -> None:
        self.metrics = metrics
        self._lock = threading.Lock()
        self._pending: dict[str, dict[str, Any]] = {}  # session -> {missed, first_at, last_at, causes, error}
        self.total = 0

    def opener(self, open_session: Callable[[str], Any]) -> Callable[[str], Any]:
        def opened(session_id: str) -> Any:
            live = open_session(session_id)
            live.journal = WatchedJournal(live.journal, session_id, self)
            return live
        return opened

    def missed(self, session: str, cause: str, at: Any, error: BaseException) -> None:
        with self._lock:
            self.total += 1
            gap = self._pending.get(session)
            if gap is None:
                gap = self._pending[session] = {"missed": 0, "first_at": at, "causes": [], "error": ""}
            gap["missed"] += 1
            gap["last_at"] = at
            gap["error"] = f"{type(error).__name__}: {error}"[:300]
            if cause not in gap["causes"] and len(gap["causes"]) < MAX_CAUSES:
                gap["causes"].append(cause)
        if self.metrics is not None:
            self.metrics.record_gap()

    def take(self, session: str) -> dict[str, Any] | None:
        with self._lock:
            return self._pending.pop(session, None)

    def put_back(self, session: str, gap: dict[str, Any]) -> None:
        """A gap whose naming event could not be written either: still pending (merged)."""
        with self._lock:
            later = self._pending.get(session)
            if later is not None:
                gap = {**gap, "missed": gap["missed"] + later["missed"], "last_at": later["last_at"],
                       "error": later["error"], "causes": (gap["causes"] + [c for c in later["causes"]
                                                                             if c not in gap["causes"]])[:MAX_CAUSES]}
            self._pending[session] = gap

    def mark(self, ready: dict[str, Any]) -> None:
        """A readiness answer, not ready while a gap is not named."""
        if (gaps := self.report()) is not None:
            ready.update(ready=False, record="incomplete", record_gaps=gaps)

    def report(self) -> dict[str, Any] | None:
        """For readiness: None when every gap is named, else what is missing where."""
        with self._lock:
            if not self._pending:
                return None
            return {"sessions": len(self._pending), "events_missed": sum(g["missed"] for g in self._pending.values())}


class WatchedJournal:
    """A session's journal whose failed appends are gaps, named by its next append."""

    def __init__(self, journal: Any, session: str, gaps: RecordGaps) -> None:
        self._journal = journal
        self._session = session
        self._gaps = gaps

    def __getattr__(self, name: str) -> Any:  # everything but append: the journal's own
        return getattr(self._journal, name)

    def append(self, cause: str, action: str, at: Any, detail: Any = None) -> dict[str, Any]:
        gaps = self._gaps
        if gaps._pending:  # one test on the usual path: nothing pending
            gap = gaps.take(self._session)
            if gap is not None:
                try:
                    self._journal.append(ON_GOVERNOR_RECORD_GAP, "continue", at, {
                        **gap, "reason": "events of this session could not be recorded (the governor refused "
                                         "their steps all the same): this record is incomplete there"})
                except Exception as exc:
                    gaps.put_back(self._session, gap)
                    gaps.missed(self._session, cause, at, exc)
                    raise
        try:
            return self._journal.append(cause, action, at, detail)
        except JournalClosedError:  # the session ended: nothing more belongs in its record
            raise
        except StoreUnavailable:
            # a shared chain whose store is unreachable for now (runtime/shared.py): the event is
            # chained once it answers (a refusal) or its step is refused as retryable; no hole is
            # left in the chain, so this is no gap (a full disk's lost line is one)
            raise
        except Exception as exc:
            gaps.missed(self._session, cause, at, exc)
            raise
