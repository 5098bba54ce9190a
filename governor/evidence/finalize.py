"""Start-up finalization: every session journal left without an end gets one, and a record.

A journal without an `end` line belongs to a session the governor was governing when it
stopped without ending it (kill -9, a crash, OOM, power loss). At the next start, before
the proxy serves traffic, each such journal is:

  1. read and checked: a torn tail is set aside in `<journal>.torn-<offset>` (as
     `Journal.open(repair_torn_tail=True)` does); a journal damaged before its last line
     cannot come from a crash and is left untouched and reported (`failed`);
  2. given the event `on_governor_error` / `halt`, detail `reason: governor_stopped`: the
     governor stopped without ending the session; `last_recorded_at` is the last instant the
     journal attests (its last event, else its start), `at` the time of finalization;
  3. when the governor now runs another pin than the one the session was admitted with (a
     different passport digest or tier): also `on_governor_session_integrity` / `halt`, detail
     `reason: pin_changed_across_restart` with both digests and tiers: the operator swapped
     the passport under a live session (Runtime §1.3); the record keeps naming the
     passport the session was admitted with (its journal header);
  4. ended, outcome `halted`, and its record signed and written to `records/<session>.json`.

A journal that ended but has no record (the governor died between the two) gets its
record, with the outcome it ended with. A journal file that holds no line at all (only a
data directory of a governor before journals were created whole can have one: a kill
between creating the file and writing its header) belongs to a session that never started,
in which nothing was served: it is set aside in `<journal>.torn-0` and counted. Temp files
that a kill left before their rename (`.<name>.*.tmp`, see `write_durably`) are removed.

Both causes match the record schema's `^on_[a-z0-9_]+$` and `halt` is a §6 action, so
`governor verify` checks these records like any other. The work runs in a small thread
pool (the fsyncs overlap; one fsync per journal, one per record, one per directory).
Imports only the evidence room, so it can run without the proxy or the policy engine.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.evidence.errors import EvidenceError
from governor.evidence.journal import Journal, has_ended, never_started
from governor.evidence.record import fsync_directory, iso_utc, record_path, remove_stale_temp_files, write_record
from governor.evidence.signing import sign_record

log = logging.getLogger("governor.evidence.finalize")

# the causes recorded here (the policy room names them too: governor.policy.steps)
ON_GOVERNOR_ERROR = "on_governor_error"
ON_SESSION_INTEGRITY = "on_governor_session_integrity"
GOVERNOR_STOPPED = "governor_stopped"
PIN_CHANGED = "pin_changed_across_restart"
WORKERS = 8


@dataclass(frozen=True, slots=True)
class Pin:
    """What a session is bound to (§1.3): the admitted passport's digest and the enforced tier."""

    digest: str
    tier: str


@dataclass(frozen=True, slots=True)
class Finalized:
    """A session finalized at start-up: its (ended) journal and its signed record."""

    session: str
    journal: Journal
    record: dict[str, Any]
    pin_changed: bool


@dataclass(slots=True)
class FinalizeReport:
    finalized: list[Finalized] = field(default_factory=list)
    already_ended: int = 0
    never_started: list[Path] = field(default_factory=list)  # set aside: no header was ever written
    failed: list[tuple[Path, str]] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> str:
        text = (f"finalized {len(self.finalized)} interrupted session(s) as halted in {self.seconds:.2f}s "
                f"({self.already_ended} already ended")
        swapped = sum(1 for f in self.finalized if f.pin_changed)
        if swapped:
            text += f"; {swapped} admitted under another passport or tier: recorded as on_governor_session_integrity"
        if self.never_started:
            text += f"; {len(self.never_started)} never started (no header), set aside"
        if self.failed:
            text += f"; {len(self.failed)} could not be finalized, see the log"
        return text + ")"


def journal_files(data_dir: Path | str) -> list[Path]:
    """The session journals in a data directory (not the torn tails set aside beside them)."""
    directory = Path(data_dir) / "journals"
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(directory / name for name in names if name.endswith(".jsonl"))


def set_aside_never_started(path: Path) -> Path:
    """Move a journal that never started out of the way (never deleted: an operator may look)."""
    aside = path.with_name(f"{path.name}.torn-0")
    os.replace(path, aside)
    return aside


def _session_of(path: Path) -> str:
    """The session a journal file belongs to, from its header line (file names may be digests)."""
    with open(path, "rb") as fh:
        first = fh.readline(1 << 20)
    try:
        return str(json.loads(first)["body"]["session"])
    except (ValueError, KeyError, TypeError):
        return path.stem  # unreadable header: the full read in finalize_journal reports it


def finalize_journal(path: Path, *, data_dir: Path, key: Ed25519PrivateKey, now: float,
                     pin: Pin | None = None, sync: bool = True,
                     write: Callable[..., Path] = write_record) -> Finalized:
    """End one unfinished journal as halted (see the module docstring) and write its record
    (with `write`: the transparency log's, which logs it first, when there is one).
    A journal that ended without its record (the governor died in between) gets its record."""
    journal = Journal.open(path, repair_torn_tail=True, sync=False)  # one fsync below for all lines
    if journal.repaired is not None:
        log.warning("journal %s: %s", path, journal.repaired.describe())
    header = journal.record.header
    if journal.ending is not None:
        record = sign_record(journal.record.build(outcome=journal.ending.outcome, end=journal.ending.at, iat=now), key)
        write(record_path(data_dir, header.session), record, sync_directory=False)
        return Finalized(header.session, journal, record, False)
    events = journal.record.events()
    last = events[-1]["at"] if events else header.start
    journal.append(ON_GOVERNOR_ERROR, "halt", now, {
        "reason": GOVERNOR_STOPPED,
        "message": "the governor stopped without ending this session (crash, kill or power loss); "
                   "it was finalized as halted when the governor started again",
        "last_recorded_at": last,
    })
    changed = pin is not None and (pin.digest != header.passport_digest or pin.tier != header.tier)
    if changed:
        assert pin is not None
        journal.append(ON_SESSION_INTEGRITY, "halt", now, {
            "reason": PIN_CHANGED,
            "message": "the governor started again with another passport or tier than this session was "
                       "admitted with; the session keeps its pin and is not continued under the new one",
            "pinned_digest": header.passport_digest, "pinned_tier": header.tier,
            "admitted_digest": pin.digest, "configured_tier": pin.tier,
        })
    journal.end("halted", now)
    if sync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    journal.close()
    record = sign_record(journal.record.build(outcome="halted", end=now, iat=now), key)
    write(record_path(data_dir, header.session), record, sync_directory=False)
    return Finalized(header.session, journal, record, changed)


def finalize_interrupted(data_dir: Path | str, *, key: Ed25519PrivateKey, pin: Pin | None = None,
                         clock: Callable[[], float] = time.time, sync: bool = True,
                         workers: int = WORKERS, write: Callable[..., Path] = write_record) -> FinalizeReport:
    """Finalize every journal in `data_dir` that has no end (blocking: run it off the event loop)."""
    started = time.perf_counter()
    data_dir = Path(data_dir)
    report = FinalizeReport()
    for directory in (data_dir / "journals", data_dir / "records"):
        if removed := remove_stale_temp_files(directory):
            log.warning("%s: removed %d temp file(s) a stop left before their rename", directory, removed)
    unfinished = []
    for path in journal_files(data_dir):
        try:
            ended = has_ended(path)
            if not ended and never_started(path):
                report.never_started.append(set_aside_never_started(path))
                log.warning("journal %s holds no header: its session never started; set aside in %s",
                            path, report.never_started[-1])
                continue
        except OSError as exc:
            report.failed.append((path, f"cannot read: {exc}"))
            continue
        if not ended:
            unfinished.append(path)
        elif not record_path(data_dir, _session_of(path)).exists():
            unfinished.append(path)  # ended, but the governor died before writing its record
        else:
            report.already_ended += 1
    now = clock()

    def one(path: Path) -> Finalized | tuple[Path, str]:
        try:
            return finalize_journal(path, data_dir=data_dir, key=key, now=now, pin=pin, sync=sync, write=write)
        except (EvidenceError, OSError, ValueError) as exc:
            return path, str(exc)
        except Exception as exc:  # one journal must not stop the others, nor the start
            log.exception("journal %s: unexpected error while finalizing", path)
            return path, f"{type(exc).__name__}: {exc}"

    if unfinished:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(unfinished))),
                                thread_name_prefix="governor-finalize") as pool:
            for result in pool.map(one, unfinished):
                if isinstance(result, Finalized):
                    report.finalized.append(result)
                else:
                    log.error("journal %s could not be finalized (left as it is): %s", *result)
                    report.failed.append(result)
        if sync and report.finalized:
            fsync_directory(data_dir / "records")
    report.seconds = time.perf_counter() - started
    if report.finalized or report.failed or report.never_started:
        log.warning("%s at %s", report.describe(), iso_utc(now))
    return report


__all__ = ["FinalizeReport", "Finalized", "GOVERNOR_STOPPED", "PIN_CHANGED", "Pin", "finalize_interrupted",
           "finalize_journal", "has_ended", "journal_files"]
