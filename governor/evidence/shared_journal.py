"""A session's journal kept as one hash chain in a shared store, for governor replicas.

The lines are the file journal's (`governor.evidence.journal`: header, events, end; each
`{kind, body, prev, hash}`, `hash` = SHA-256 over JCS({kind, body, prev})), kept in the
store as a list beside its head (length, last hash). A replica appends with a
compare-and-append (`chain.append`: the length and last hash it knows -> its line and the
new head, or nothing when another replica appended first); on a conflict it reads the
lines it missed, checks each one (checksum, link, seq), and chains its event after them.
So the one total order of a session's events is the order of successful appends, whatever
replica made them; the hashes are computed here (the store runs no SHA-256).

Every line read from the store is checked as the file journal checks its lines: an edited
or forged line (checksum), a removed or moved one (link), a wrong seq is a
CorruptJournalError, and the step that met it fails closed. Ending re-reads and re-checks
the whole chain, so an edit behind what this replica already read is found before the
record is signed. The end line is appended like any other: of replicas racing to end a
session, exactly one succeeds (the others find the chain ended: JournalClosedError).

`chain` is duck-typed (the Redis one is `governor.store.redis_sessions.RedisSessions`):
  append(session, length, prev, line, digest) -> bool
  read(session, start) -> list[bytes]            (the lines from index `start` on)
  reseed(session, lines, digest) -> bool         (put back a chain the store lost; False: one is there)

A chain the store lost whole (an emptied Redis) is put back as the appending replica holds it,
so the event that reports the loss is recorded (lines other replicas appended that this one
never read are lost with the store: the store's fence fails every step closed meanwhile).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from governor.evidence.deferred_spool import DeferredSpool, already_chained
from governor.evidence.errors import CorruptJournalError, JournalClosedError, JournalError
from governor.evidence.journal import JOURNAL_FORMAT, Ending, encode_line, parse_line
from governor.evidence.record import OUTCOMES, SessionHeader, SessionRecord, Timestamp, as_timestamp, make_event

log = logging.getLogger("governor.evidence")

# Conflicts one append re-chains through before it gives up (fail closed): each round means
# another replica's line got in first, so this bounds a pathological race, not a normal one.
MAX_APPEND_ROUNDS = 64


class SharedJournal:
    """An open journal whose lines live in a shared chain; the same door as `Journal`
    (`record`, `append`, `end`, `ending`, `close`, `path`, `repaired`). Thread-safe."""

    def __init__(self, chain: Any, session: str, path: Path,
                 on_damage: Callable[[str, str], None] | None = None, spool: DeferredSpool | None = None) -> None:
        self.chain = chain
        self.spool = spool  # where deferred refusals wait durably (governor.evidence.deferred_spool)
        self.on_damage = on_damage  # told (session, what) of each damaged chain found, to record it
        self.session = session
        self.path = path  # where a file journal would be: names the session in errors
        self.record: SessionRecord | None = None  # set once the header line is read
        self.repaired = None  # a chain has no torn tail: a line is appended whole or not at all
        self._prev = ""
        self._length = 0
        self._lines: list[bytes] = []  # the chain as this replica holds it (put back if the store loses it)
        self.deferred: list[dict[str, Any]] = []  # refusals met while the store was unreachable, to chain
        self._ending: Ending | None = None
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def open_or_create(cls, chain: Any, session: str, header: SessionHeader, path: Path,
                       on_damage: Callable[[str, str], None] | None = None,
                       spool: DeferredSpool | None = None) -> SharedJournal:
        """The session's chain as it stands, started with `header` when there is none yet (with
        the refusals an earlier process of this replica deferred and did not chain, to chain)."""
        journal = cls(chain, session, path, on_damage, spool)
        with journal._lock:
            journal._catch_up()
            if journal.record is None:
                line, digest = encode_line("header", {"format": JOURNAL_FORMAT, **header.to_json()}, "")
                if chain.append(session, 0, "", line.rstrip(b"\n"), digest):
                    journal.record = SessionRecord(header, [])
                    journal._prev, journal._length = digest, 1
                    journal._lines.append(line.rstrip(b"\n"))
                else:  # another replica started it first: its header stands
                    journal._catch_up()
            if journal.record is None:
                raise CorruptJournalError(path, "the shared chain has no header line", line=1)
            if spool is not None:
                chained = journal.record.events()
                journal.deferred = [e for e in spool.events(session) if not already_chained(e, chained)]
        return journal

    @classmethod
    def existing(cls, chain: Any, session: str, path: Path) -> SharedJournal | None:
        """The session's chain, read and checked whole; None when the store holds none."""
        journal = cls(chain, session, path)
        with journal._lock:
            journal._catch_up()
        return journal if journal.record is not None else None

    # --- reading ----------------------------------------------------------------------

    def _catch_up(self) -> None:
        """Take the lines other replicas appended since this one last read, each checked."""
        for raw in self.chain.read(self.session, self._length):
            self._take(raw)

    def _take(self, raw: bytes) -> None:
        number = self._length + 1
        try:
            kind, body, digest = parse_line(raw, self._prev)
            if self.record is None:
                if kind != "header" or body.get("format") != JOURNAL_FORMAT:
                    raise ValueError(f"line 1 is not a {JOURNAL_FORMAT} header")
                self.record = SessionRecord(SessionHeader.from_json(body), [])
            elif self._ending is not None:
                raise ValueError("entry after the session's end")
            elif kind == "event":
                if body.get("seq") != len(self.record):
                    raise ValueError(f"event seq {body.get('seq')!r}, expected {len(self.record)}")
                self.record.add_event(make_event(body["cause"], body["action"], body["at"], body.get("detail")))
            elif kind == "end":
                if body.get("outcome") not in OUTCOMES:
                    raise ValueError(f"unknown outcome {body.get('outcome')!r}")
                self._ending = Ending(body["outcome"], as_timestamp(body["at"], "end at"))
            else:
                raise ValueError(f"unknown entry kind {kind!r}")
        except Exception as exc:  # any damage to a line read from the store: nothing after it is trusted
            raise self._damaged(f"shared chain: {exc}", number) from None
        self._prev = digest
        self._length = number
        self._lines.append(raw)

    def verify_whole(self) -> None:
        """Re-read the chain from its first line and check that it is the one this journal
        holds: an edit anywhere (even behind what was read before) raises CorruptJournalError."""
        fresh = SharedJournal(self.chain, self.session, self.path)
        try:
            fresh._catch_up()
        except CorruptJournalError as exc:
            raise self._damaged(str(exc), exc.line) from None
        if fresh.record is None or fresh._length < self._length or fresh.record.events()[:len(self.record or ())] \
                != (self.record.events() if self.record is not None else []):
            raise self._damaged("shared chain: it no longer holds the events this replica read "
                                "(edited or replaced in the store)", 1)

    def _damaged(self, what: str, line: int | None) -> CorruptJournalError:
        """The error for a damaged chain, once its finder was told (to record it)."""
        if self.on_damage is not None:
            try:
                self.on_damage(self.session, what if line is None else f"{what} (line {line})")
            except Exception:
                log.exception("%s: the damaged chain could not be recorded", self.path)
        return CorruptJournalError(self.path, what, line=line)

    # --- writing ----------------------------------------------------------------------

    @property
    def ending(self) -> Ending | None:
        return self._ending

    def append(self, cause: str, action: str, at: Timestamp, detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Chain one event after the chain's head (re-chained after lines other replicas
        appended first) and return it ({seq, cause, action, at[, detail]})."""
        event = make_event(cause, action, at, detail)
        with self._lock:
            body = self._append("event", lambda: {"seq": len(self.record or ()), **event})
            assert self.record is not None
            self.record.add_event(event)
        return body

    def end(self, outcome: str, at: Timestamp) -> Ending:
        """Chain the session's end. JournalClosedError when another replica ended it first."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        ending = Ending(outcome, as_timestamp(at, "end at"))
        with self._lock:
            self._catch_up()
            self.verify_whole()  # the record is signed over what the chain holds: check all of it
            self._append("end", lambda: {"outcome": ending.outcome, "at": ending.at})
            self._ending = ending
        return ending

    def _append(self, kind: str, make_body: Any) -> dict[str, Any]:
        for _ in range(MAX_APPEND_ROUNDS):
            self._check_open()
            body = make_body()
            line, digest = encode_line(kind, body, self._prev)
            if self.chain.append(self.session, self._length, self._prev, line.rstrip(b"\n"), digest):
                self._prev = digest
                self._length += 1
                self._lines.append(line.rstrip(b"\n"))
                return body
            before = self._length
            self._catch_up()  # another replica appended first: its lines, then ours after them
            if self._length == before and self._lines and self.chain.reseed(self.session, self._lines, self._prev):
                # the store lost the chain (emptied, failed over to a replica without it): it is put
                # back as this replica holds it, so the event that says so is recorded after it
                log.error("%s: the shared chain was gone from the store; put back from this replica's copy "
                          "(%d lines: lines other replicas appended that it never read are lost)",
                          self.path, len(self._lines))
        raise JournalError(self.path, f"shared chain: {MAX_APPEND_ROUNDS} appends in a row lost to other replicas; "
                           "event not recorded")

    def defer(self, cause: str, action: str, at: Timestamp, detail: Mapping[str, Any] | None = None) -> None:
        """Keep the event of a refusal that could not be chained (the store is unreachable), to
        chain it first once the store answers (`flush`). Only for refusals and notes of what
        already happened (a settlement the store failed after its response): a step that goes
        ahead is chained before it does."""
        with self._lock:
            event = make_event(cause, action, at, detail)
            if self.spool is not None:  # durable before the refusal is answered
                try:
                    self.spool.add(self.session, event)
                except OSError as exc:  # kept in memory: chained at the next round unless this process dies
                    log.error("session %s: a deferred refusal could not be kept on disk: %s", self.session, exc)
            self.deferred.append(event)

    def flush(self) -> None:
        """Chain the deferred events, in the order they were met."""
        with self._lock:
            if not self.deferred:
                return
            try:
                while self.deferred:
                    event = self.deferred[0]
                    self._append("event", lambda: {"seq": len(self.record or ()), **event})
                    assert self.record is not None
                    self.record.add_event(event)
                    self.deferred.pop(0)
            finally:
                if self.spool is not None:
                    self.spool.keep(self.session, self.deferred)

    def refresh(self) -> None:
        """Read what other replicas appended (an end included)."""
        with self._lock:
            self._catch_up()

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosedError(self.path, "journal is closed")
        if self._ending is not None:
            raise JournalClosedError(self.path, f"session already ended ({self._ending.outcome} at {self._ending.at})")


__all__ = ["MAX_APPEND_ROUNDS", "SharedJournal"]
