"""Enforcement records (Runtime §8.3) and their hash chain (§8.4).

A session's events are kept as plain facts (seq, cause, action, at, detail) and
chained only when a record is built. §8.4 anchors event 0 to the hash of the record
header *as it appears in the final record* (the record minus events and signature),
and the header holds window.end, iat, outcome and the nonce, which are only known
when the record is issued. Every issued record (the final one, or a fresh one for
`GET /record?nonce=N` mid-session) therefore computes its own chain at build time,
and a third party recomputes it from the spec's text alone. Durability while the
session runs is the journal's job (`governor.evidence.journal`), which has its own
per-line checksum chain.
"""

from __future__ import annotations

import enum
import errno
import json
import math
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping

from governor.common.canonical import sha256_b64url
from governor.common.timefmt import iso_utc
from governor.evidence._jcs import canonical

FORMAT_VERSION = "1.0"
TIERS = ("R1", "R2", "R3")
OUTCOMES = ("completed", "halted", "paused")
ACTIONS = ("halt", "pause", "fallback", "continue")  # the §6 actions a record may carry
CAUSE_PATTERN = re.compile(r"^on_[a-z0-9_]+$")  # as the official schema; spec causes and ours
ISO_8601 = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
# Display order of a record's members (JCS ignores it; people reading the file do not).
RECORD_MEMBERS = (
    "adl_enforcement_record", "governor", "subject", "session", "tier", "window",
    "iat", "nonce", "limits", "events", "outcome", "signature",
)

Timestamp = str | float  # ISO 8601 text, or seconds since the epoch (made UTC ISO text)


# --- time -----------------------------------------------------------------------------




def parse_iso(text: str) -> datetime:
    """An aware datetime from ISO 8601 text with a zone (Z or ±hh:mm); ValueError otherwise."""
    if not isinstance(text, str) or not ISO_8601.match(text):
        raise ValueError(f"not an ISO 8601 UTC timestamp with a zone: {text!r}")
    return datetime.fromisoformat(text.upper().replace("Z", "+00:00"))


def as_timestamp(value: Timestamp, what: str = "timestamp") -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return iso_utc(float(value))
    try:
        parse_iso(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    return value


# --- values ---------------------------------------------------------------------------


def json_safe(value: Any) -> Any:
    """A plain JSON value for `value`: enums by value, mappings as dicts, tuples and
    sets as lists, non-finite floats and unknown objects as text.

    Applied to details and limits before they are journaled so that whatever the
    caller hands over is recorded, never refused for its Python type.
    """
    if value is None or type(value) in (str, bool, int):
        return value
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(json_safe(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        items = [json_safe(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return str(value)


def _text(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def make_event(cause: str, action: str, at: Timestamp, detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An unchained event body {cause, action, at[, detail]}; ValueError when it cannot be recorded."""
    cause, action = _text(cause), _text(action)
    if not isinstance(cause, str) or not CAUSE_PATTERN.match(cause):
        raise ValueError(f"event cause must match ^on_[a-z0-9_]+$, got {cause!r}")
    if action not in ACTIONS:
        raise ValueError(f"event action must be one of {', '.join(ACTIONS)} (a §6 action), got {action!r}")
    event: dict[str, Any] = {"cause": cause, "action": action, "at": as_timestamp(at, "event at")}
    if detail is not None:
        if not isinstance(detail, Mapping):
            raise ValueError(f"event detail must be an object, got {type(detail).__name__}")
        event["detail"] = json_safe(detail)
    return event


# --- header ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionHeader:
    """What is fixed when a session starts: the parts of the record header known then."""

    governor: str
    subject_id: str
    passport_digest: str
    session: str
    tier: str
    start: str
    limits: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("governor", "subject_id", "passport_digest", "session"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"session header: {name} must be a non-empty string")
        if not self.governor.startswith(("https://", "did:web:")):
            raise ValueError(f"session header: governor must be an HTTPS URI or did:web, got {self.governor!r}")
        tier = _text(self.tier)
        if tier not in TIERS:
            raise ValueError(f"session header: tier must be R1, R2 or R3, got {self.tier!r}")
        object.__setattr__(self, "tier", tier)
        object.__setattr__(self, "start", as_timestamp(self.start, "session start"))
        if self.limits is not None:
            if not isinstance(self.limits, Mapping):
                raise ValueError("session header: limits must be an object")
            object.__setattr__(self, "limits", json_safe(self.limits))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "governor": self.governor,
            "subject": {"id": self.subject_id, "passport_digest": self.passport_digest},
            "session": self.session,
            "tier": self.tier,
            "start": self.start,
        }
        if self.limits is not None:
            data["limits"] = self.limits
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionHeader:
        try:
            return cls(
                governor=data["governor"],
                subject_id=data["subject"]["id"],
                passport_digest=data["subject"]["passport_digest"],
                session=data["session"],
                tier=data["tier"],
                start=data["start"],
                limits=data.get("limits"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"session header: missing or malformed member {exc}") from None

    def record_header(self, *, outcome: str, end: Timestamp, iat: Timestamp, nonce: str | None = None) -> dict[str, Any]:
        """The §8.4 record header: the record minus events and signature."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        if nonce is not None and (not isinstance(nonce, str) or not nonce):
            raise ValueError("nonce must be a non-empty string")
        header: dict[str, Any] = {
            "adl_enforcement_record": FORMAT_VERSION,
            "governor": self.governor,
            "subject": {"id": self.subject_id, "passport_digest": self.passport_digest},
            "session": self.session,
            "tier": self.tier,
            "window": {"start": self.start, "end": as_timestamp(end, "window end")},
            "iat": as_timestamp(iat, "iat"),
        }
        if nonce is not None:
            header["nonce"] = nonce
        if self.limits is not None:
            header["limits"] = self.limits
        header["outcome"] = outcome
        return header


# --- the chain ------------------------------------------------------------------------


def record_header(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record minus events and signature (what events[0].prev_hash hashes)."""
    return {k: v for k, v in record.items() if k not in ("events", "signature")}


def chain_events(header: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Events with seq and prev_hash per §8.4.

    events[0].prev_hash = b64url(SHA-256(JCS(header))); events[i].prev_hash =
    b64url(SHA-256(JCS(events[i-1]))), where events[i-1] is the chained event,
    its own prev_hash included.
    """
    prev = sha256_b64url(canonical(dict(header)))
    chained: list[dict[str, Any]] = []
    for seq, event in enumerate(events):
        linked = {"seq": seq, "cause": event["cause"], "action": event["action"], "at": event["at"], "prev_hash": prev}
        if "detail" in event:
            linked["detail"] = event["detail"]
        prev = sha256_b64url(canonical(linked))
        chained.append(linked)
    return chained


class SessionRecord:
    """A session's header and its events, in order; builds chained, unsigned records.

    Thread-safe: events may be added from one thread while a record is built in another.
    """

    def __init__(self, header: SessionHeader, events: Iterable[Mapping[str, Any]] = ()) -> None:
        self.header = header
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        for event in events:
            self.add(event["cause"], event["action"], event["at"], event.get("detail"))

    def __len__(self) -> int:
        return len(self._events)

    def add(self, cause: str, action: str, at: Timestamp, detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Append an event (no I/O: use Journal.append for a durable one); returns it with its seq."""
        return self.add_event(make_event(cause, action, at, detail))

    def add_event(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Append an event made by `make_event` (already validated)."""
        with self._lock:
            entry = {"seq": len(self._events), **event}
            self._events.append(entry)
        return dict(entry)

    def events(self) -> list[dict[str, Any]]:
        """A snapshot of the unchained events (seq, cause, action, at[, detail])."""
        with self._lock:
            return [dict(e) for e in self._events]

    def build(self, *, outcome: str, end: Timestamp, iat: Timestamp, nonce: str | None = None) -> dict[str, Any]:
        """An unsigned record of the events so far, chained per §8.4 (sign it with sign_record)."""
        header = self.header.record_header(outcome=outcome, end=end, iat=iat, nonce=nonce)
        with self._lock:
            events = list(self._events)
        record = {**header, "events": chain_events(header, events)}
        return {k: record[k] for k in RECORD_MEMBERS if k in record}


# --- files ----------------------------------------------------------------------------

_SAFE_STEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def file_stem(session: str) -> str:
    """A file name for a session id: the id itself when harmless, else a digest of it."""
    if _SAFE_STEM.match(session) and not session.endswith("."):
        return session
    return "session-" + sha256_b64url(session.encode("utf-8"))[:32]


def journal_path(data_dir: Path | str, session: str) -> Path:
    return Path(data_dir) / "journals" / f"{file_stem(session)}.jsonl"


def record_path(data_dir: Path | str, session: str) -> Path:
    return Path(data_dir) / "records" / f"{file_stem(session)}.json"


TEMP_SUFFIX = ".tmp"  # write_durably's temp files: ".<name>.<random>.tmp"


def write_record(path: Path | str, record: Mapping[str, Any], *, sync_directory: bool = True) -> Path:
    """Write a record atomically and durably (temp file, fsync, rename, fsync the directory).

    `sync_directory=False` leaves the directory's fsync to the caller (one for a batch)."""
    data = (json.dumps(record, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    return write_durably(path, data, sync_directory=sync_directory)


def write_durably(path: Path | str, data: bytes, *, sync_directory: bool = True, sync: bool = True,
                  exclusive: bool = False) -> Path:
    """Write bytes atomically and durably: a temp file beside `path`, fsync, rename over it,
    then (unless the caller batches it) fsync the directory. A reader sees the old file or the
    whole new one, never a torn one, and a crash after return loses nothing.

    `exclusive`: never replace a file already at `path` (FileExistsError), by linking the
    temp file in place of renaming it. `sync=False` skips the fsyncs (throwaway data only).
    A crash before the rename or link leaves only the temp file (`.<name>.*.tmp`), which no
    reader takes for the file: `remove_stale_temp_files` clears them at the next start."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        if exclusive:
            _link_exclusively(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync and sync_directory:
        fsync_directory(path.parent)
    return path


def _link_exclusively(tmp: str, path: Path) -> None:
    """Put `tmp` at `path` unless something is there (FileExistsError): a hard link, which
    never replaces; on a file system without hard links, a check then a rename (the callers
    serialize their writers of one path, so nothing comes in between)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        if path.exists():
            raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def remove_stale_temp_files(directory: Path) -> int:
    """Remove the temp files `write_durably` left in `directory` when the process died
    before renaming them (run at start-up, before anything writes there): none of them was
    ever the file it was meant to become. Returns how many were removed."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        if name.startswith(".") and name.endswith(TEMP_SUFFIX):
            try:
                os.unlink(directory / name)
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def fsync_directory(directory: Path) -> None:
    """Make a created or renamed directory entry durable (POSIX; a no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
