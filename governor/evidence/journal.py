"""The durable session journal: every event on stable storage before enforcement.

One file per session, one JSON object per line:

    {"kind": "header", "body": {format, governor, subject, session, tier, start, limits}, "prev": "", "hash": h0}
    {"kind": "event",  "body": {seq, cause, action, at, detail?}, "prev": h0, "hash": h1}
    ...
    {"kind": "end",    "body": {outcome, at}, "prev": h(n-1), "hash": hn}     (when the session ended)

`hash` = base64url(SHA-256(JCS({kind, body, prev}))) and `prev` is the previous
line's hash: a per-line checksum and a journal-local chain, so a reader detects a
damaged line (checksum), a removed or reordered line (link) and a torn tail (the
line being written when the process died: no newline, or not intact). This chain
is the journal's own integrity check, not the §8.4 chain: records chain their
events at issue time (see governor.evidence.record).

`append` returns only after the line is written and fsync'ed, so an event whose
append returned survives a kill -9 or power loss. A journal holds no file descriptor
between appends: each append opens the file, writes, fsyncs and closes it (the open
and close cost ~10 us against the fsync's milliseconds, and events are appended only
when enforcement fires), so ten thousand idle sessions hold no descriptors. Damage on the last line is a
torn tail (reported, never silently dropped or accepted); damage on any earlier
line cannot come from a crash and is reported as corruption.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from governor.common.canonical import sha256_b64url
from governor.evidence._jcs import canonical
from governor.evidence.errors import CorruptJournalError, JournalClosedError, JournalError
from governor.evidence.record import (
    OUTCOMES,
    SessionHeader,
    SessionRecord,
    Timestamp,
    as_timestamp,
    fsync_directory,
    make_event,
    write_durably,
)

JOURNAL_FORMAT = "governor-journal/1"
_LINE_MEMBERS = {"kind", "body", "prev", "hash"}
_END_LINE_START = b'{"kind":"end"'  # how encode_line writes an end line (compact JSON, kind first)


@dataclass(frozen=True, slots=True)
class TornTail:
    """The incomplete last line of a journal: where it starts and what it held."""

    line: int  # 1-based line number
    offset: int  # byte offset of the line's start (the journal's intact length)
    data: bytes
    reason: str

    def describe(self) -> str:
        return f"torn last line {self.line} at byte {self.offset} ({len(self.data)} bytes): {self.reason}"


class TornJournalError(JournalError):
    """The journal's last line is incomplete or damaged (a write cut short by a crash)."""

    def __init__(self, path: Path | str, torn: TornTail) -> None:
        self.torn = torn
        super().__init__(path, torn.describe(), line=torn.line)


@dataclass(frozen=True, slots=True)
class Ending:
    """How and when a session ended, as journaled."""

    outcome: str
    at: str


@dataclass(frozen=True, slots=True)
class Recovery:
    """What a journal holds intact, plus its torn tail when it has one."""

    path: Path
    header: SessionHeader
    events: tuple[dict[str, Any], ...]
    ending: Ending | None
    torn_tail: TornTail | None

    @property
    def outcome(self) -> str:
        """The journaled outcome, or "halted" for a session that never ended (the governor stopped)."""
        return self.ending.outcome if self.ending else "halted"

    @property
    def end(self) -> str:
        """The journaled end, else the last instant the journal attests (its last event, or its start)."""
        if self.ending:
            return self.ending.at
        return self.events[-1]["at"] if self.events else self.header.start

    def session_record(self) -> SessionRecord:
        return SessionRecord(self.header, self.events)

    def build(self, *, iat: Timestamp, end: Timestamp | None = None, nonce: str | None = None) -> dict[str, Any]:
        """The unsigned record of what the journal holds (sign it with sign_record)."""
        return self.session_record().build(outcome=self.outcome, end=self.end if end is None else end, iat=iat, nonce=nonce)


def _line_hash(kind: str, body: Mapping[str, Any], prev: str) -> str:
    return sha256_b64url(canonical({"kind": kind, "body": body, "prev": prev}))


def encode_line(kind: str, body: Mapping[str, Any], prev: str) -> tuple[bytes, str]:
    digest = _line_hash(kind, body, prev)
    line = json.dumps({"kind": kind, "body": body, "prev": prev, "hash": digest}, ensure_ascii=False, separators=(",", ":"))
    return (line + "\n").encode("utf-8"), digest


class _Damaged(Exception):
    """A line that is not intact (could be a torn write when it is the last one)."""


class _Invalid(Exception):
    """An intact line that says something impossible (never a torn write)."""


@dataclass(slots=True)
class _Contents:
    header: SessionHeader
    events: list[dict[str, Any]]
    ending: Ending | None
    last_hash: str
    intact_size: int
    torn: TornTail | None


def parse_line(raw: bytes, prev: str) -> tuple[str, dict[str, Any], str]:
    try:
        entry = json.loads(raw)
    except ValueError as exc:
        raise _Damaged(f"not JSON ({exc})") from None
    except RecursionError:  # nesting the governor never writes (its own json.dumps stops there too)
        raise _Damaged("not JSON (nested too deeply)") from None
    if not isinstance(entry, dict) or set(entry) != _LINE_MEMBERS or not isinstance(entry["body"], dict):
        raise _Damaged("not a journal entry")
    kind, body = entry["kind"], entry["body"]
    try:
        expected = _line_hash(kind, body, entry["prev"])
    except (ValueError, TypeError) as exc:
        raise _Damaged(f"not canonicalizable ({exc})") from None
    if entry["hash"] != expected:
        raise _Damaged("checksum mismatch: the line was altered")
    if entry["prev"] != prev:  # an intact line in the wrong place: never a torn write
        raise _Invalid("broken link: prev is not the hash of the line before (a line was removed or moved)")
    return kind, body, entry["hash"]


def _read(path: Path) -> _Contents:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise JournalError(path, f"cannot read: {exc.strerror or exc}") from None
    *complete, tail = data.split(b"\n")
    header: SessionHeader | None = None
    events: list[dict[str, Any]] = []
    ending: Ending | None = None
    prev, offset, torn = "", 0, None
    for index, raw in enumerate(complete):
        number = index + 1
        try:
            kind, body, digest = parse_line(raw, prev)
            if header is None:
                if kind != "header" or body.get("format") != JOURNAL_FORMAT:
                    raise _Invalid(f"line 1 is not a {JOURNAL_FORMAT} header")
                header = SessionHeader.from_json(body)
            elif ending is not None:
                raise _Invalid("entry after the session's end")
            elif kind == "event":
                if body.get("seq") != len(events):
                    raise _Invalid(f"event seq {body.get('seq')!r}, expected {len(events)}")
                events.append(make_event(body["cause"], body["action"], body["at"], body.get("detail")))
            elif kind == "end":
                if body.get("outcome") not in OUTCOMES:
                    raise _Invalid(f"unknown outcome {body.get('outcome')!r}")
                ending = Ending(body["outcome"], as_timestamp(body["at"], "end at"))
            else:
                raise _Invalid(f"unknown entry kind {kind!r}")
        except _Damaged as exc:
            if number == len(complete) and not tail:
                torn = TornTail(number, offset, raw + b"\n", str(exc))
                break
            raise CorruptJournalError(path, str(exc), line=number) from None
        except (_Invalid, ValueError, KeyError, TypeError) as exc:
            raise CorruptJournalError(path, str(exc), line=number) from None
        prev = digest
        offset += len(raw) + 1
    else:
        if tail:
            torn = TornTail(len(complete) + 1, offset, tail, "no newline: the write was cut short")
    if header is None:
        raise CorruptJournalError(path, "no intact header line: the session never started durably", line=1)
    return _Contents(header, events, ending, prev, offset, torn)


def recover_journal(path: Path | str) -> Recovery:
    """Read a journal (read-only) after a crash or restart.

    Returns the intact header and events, how the session ended (None when it never
    did: finalize it as halted) and the torn tail, if any, stated explicitly.
    Raises CorruptJournalError for damage before the last line.
    """
    path = Path(path)
    contents = _read(path)
    return Recovery(path, contents.header, tuple(contents.events), contents.ending, contents.torn)


class Journal:
    """An open session journal: appends are durable and serialized (thread-safe)."""

    def __init__(self, path: Path, contents: _Contents, *, sync: bool) -> None:
        self.path = path
        self.record = SessionRecord(contents.header, contents.events)
        self._closed = False
        self._prev = contents.last_hash
        self._size = contents.intact_size
        self._ending = contents.ending
        self._sync = sync
        self._lock = threading.Lock()
        self.repaired: TornTail | None = None  # the torn tail `open(repair_torn_tail=True)` set aside

    # --- opening ------------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path | str, header: SessionHeader, *, sync: bool = True) -> Journal:
        """Start a session's journal; FileExistsError if one already exists there.

        `sync=False` skips fsync (for benchmarks and throwaway tests only: a crash may
        then lose events the caller believed recorded).
        """
        path = Path(path)
        line, digest = encode_line("header", {"format": JOURNAL_FORMAT, **header.to_json()}, "")
        # whole or not at all: a kill between creating the file and writing its header would
        # leave a journal with no header, which no start could finalize (nor list)
        write_durably(path, line, sync=sync, exclusive=True)
        return cls(path, _Contents(header, [], None, digest, len(line), None), sync=sync)

    @classmethod
    def open(cls, path: Path | str, *, repair_torn_tail: bool = False, sync: bool = True) -> Journal:
        """Reopen an existing journal to append to it (e.g. after a restart).

        A torn tail raises TornJournalError unless `repair_torn_tail`: then its bytes
        are set aside in `<journal>.torn-<offset>` (never silently discarded), the
        journal is cut back to its intact length, and `journal.repaired` names them.
        """
        path = Path(path)
        contents = _read(path)
        if contents.torn is not None and not repair_torn_tail:
            raise TornJournalError(path, contents.torn)
        if contents.torn is not None:
            set_aside_torn_tail(path, contents.torn)
        journal = cls(path, contents, sync=sync)
        journal.repaired = contents.torn
        return journal

    # --- writing ------------------------------------------------------------------------

    @property
    def ending(self) -> Ending | None:
        return self._ending

    def append(self, cause: str, action: str, at: Timestamp, detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Journal one event durably and return it ({seq, cause, action, at[, detail]}).

        Returns only once the line is on stable storage. Raises ValueError (nothing
        written) for an event that cannot be recorded, JournalClosedError after
        `end`/`close`, and JournalError when the disk refuses the write (the journal
        is then cut back to its last intact line, so it stays readable).
        """
        event = make_event(cause, action, at, detail)
        with self._lock:
            self._check_open()
            body = {"seq": len(self.record), **event}
            self._write_line("event", body)
            self.record.add_event(event)
        return body

    def end(self, outcome: str, at: Timestamp) -> Ending:
        """Journal the session's end; no event can be appended afterwards."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        ending = Ending(outcome, as_timestamp(at, "end at"))
        with self._lock:
            self._check_open()
            self._write_line("end", {"outcome": ending.outcome, "at": ending.at})
            self._ending = ending
        return ending

    def close(self) -> None:
        """No further appends (there is no descriptor to release: appends open their own)."""
        with self._lock:
            self._closed = True

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosedError(self.path, "journal is closed")
        if self._ending is not None:
            raise JournalClosedError(self.path, f"session already ended ({self._ending.outcome} at {self._ending.at})")

    def _write_line(self, kind: str, body: Mapping[str, Any]) -> None:
        line, digest = encode_line(kind, body, self._prev)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:  # e.g. EMFILE: nothing written, the step fails closed
            raise JournalError(self.path, f"cannot open to append, event not recorded: {exc.strerror or exc}") from None
        try:
            _write_all(fd, line)
            if self._sync:
                os.fsync(fd)
        except OSError as exc:
            try:  # drop the partial line so the journal stays intact for the next append
                os.ftruncate(fd, self._size)
            except OSError:
                self._closed = True  # its length is unknown now: refuse further appends
            raise JournalError(self.path, f"write failed, event not recorded: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        self._prev = digest
        self._size += len(line)


def has_ended(path: Path) -> bool:
    """Whether the journal's last line is an end line: cheap, no parsing (an unfinished or
    damaged journal goes through the full read, `Journal.open`)."""
    with open(path, "rb") as fh:
        try:
            fh.seek(-4096, os.SEEK_END)
            whole = False
        except OSError:  # shorter than that
            fh.seek(0)
            whole = True
        tail = fh.read()
    if not tail.endswith(b"\n"):
        return False
    before, newline, last = tail[:-1].rpartition(b"\n")
    if not newline and not whole:  # the last line starts before the window: read it all
        return False
    return last.startswith(_END_LINE_START)


def never_started(path: Path) -> bool:
    """Whether a journal holds no complete line: its header write never happened (or was cut
    short), so no step of its session was ever taken."""
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 16):
            if b"\n" in chunk:
                return False
    return True


def set_aside_torn_tail(path: Path, torn: TornTail) -> Path:
    """Move a torn tail's bytes to `<journal>.torn-<offset>` (never silently dropped) and
    cut the journal back to its intact length; durable before it returns."""
    aside = path.with_name(f"{path.name}.torn-{torn.offset}")
    aside_fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(aside_fd, torn.data)
        os.fsync(aside_fd)
    finally:
        os.close(aside_fd)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, torn.offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_directory(path.parent)
    return aside


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
