"""The governor's transparency log (issue #31, Runtime §8.8): one entry per final record,
in an RFC 6962 tree served as C2SP tlog-tiles, its checkpoints signed with the governor's
key as C2SP signed notes.

An entry is the JCS (RFC 8785) bytes of a small statement (docs/transparency-log.md,
schemas/log-entry.schema.json): the record's SHA-256 (of its JCS bytes, signature
included), the agent's passport digest, the session, the tier, the record's window, the
agent's sequence number in this log and the hash of that agent's previous entry.

Files under `DATA_DIR/log/`:
  entries        the write-ahead log: one entry per line, appended and fsynced before the
                 record it names is written as final; the only source of truth
  pending/       a final record waiting for its entry (see `write_record`)
  checkpoint     the latest signed checkpoint (the note, verbatim)
  tile/...       tiles and entry bundles, derived from `entries`, rewritten at start
  log.vkey       the checkpoint key, in the signed-note vkey form

A kill -9 at any point leaves a consistent log: a torn last line of `entries` is cut at the
next start (its record was never written as final); a pending record whose entry is in the
log is moved into place, one whose entry is not is dropped (the journal is finalized again).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.evidence._jcs import canonical
from governor.evidence.record import fsync_directory, remove_stale_temp_files, write_durably
from governor.evidence.tlog.checkpoint import Checkpoint
from governor.evidence.tlog.merkle import HASH_SIZE, HashLevels, leaf_hash
from governor.evidence.tlog.note import Ed25519Signer, add_signatures, parse_note, sign_note
from governor.evidence.tlog.proof import TlogProof
from governor.evidence.tlog.tiles import TILE_WIDTH, encode_bundle, tile_hashes, tiles_for_size

log = logging.getLogger("governor.evidence.translog")

ENTRY_KIND = "adl-governor-log-entry/v1"
DEFAULT_CHECKPOINT_ENTRIES = 256
DEFAULT_CHECKPOINT_SECONDS = 10.0


class LogError(RuntimeError):
    """The log cannot be opened or appended to (the message says why)."""


class NotLogged(LookupError):
    """A record that has no entry in this log."""


def record_sha256(record: Mapping[str, Any]) -> str:
    """Lower-case hex SHA-256 of the record's JCS bytes, its signature included."""
    return hashlib.sha256(canonical(dict(record))).hexdigest()


def entry_statement(record: Mapping[str, Any], seq: int, prev: str | None) -> dict[str, Any]:
    subject = record.get("subject") or {}
    window = record.get("window") or {}
    return {
        "kind": ENTRY_KIND,
        "record_sha256": record_sha256(record),
        "passport_digest": subject.get("passport_digest"),
        "session": record.get("session"),
        "tier": record.get("tier"),
        "window": {"start": window.get("start"), "end": window.get("end")},
        "seq": seq,
        "prev": prev,
    }


def default_origin(governor_id: str) -> str:
    """The checkpoint origin (and key name) derived from the governor's id: a schema-less
    name without spaces or plus signs, as signed-note asks."""
    name = governor_id.split("://", 1)[-1].removeprefix("did:web:").replace(":", "/")
    name = "".join(c for c in name if not c.isspace() and c != "+" and ord(c) >= 0x21) or "governor"
    return f"{name}/log"


@dataclass(frozen=True)
class Logged:
    index: int
    entry: bytes


class TransparencyLog:
    """The append-only log of final records. Thread-safe: records end in worker threads."""

    def __init__(self, data_dir: Path | str, key: Ed25519PrivateKey, origin: str, *,
                 checkpoint_entries: int = DEFAULT_CHECKPOINT_ENTRIES,
                 checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS,
                 clock: Callable[[], float] = time.time, sync: bool = True) -> None:
        self.data_dir = Path(data_dir)
        self.dir = self.data_dir / "log"
        self.signer = Ed25519Signer(origin, key)
        self.origin = origin
        self.checkpoint_entries = max(1, int(checkpoint_entries))
        self.checkpoint_seconds = float(checkpoint_seconds)
        self.clock = clock
        self.sync = sync
        self.levels = HashLevels()
        self.offsets: list[int] = []  # where each entry starts in `entries`
        self.end_offset = 0
        self.tail: dict[int, bytes] = {}  # the entries of bundles not yet written whole
        self.by_record: dict[str, int] = {}
        self.agents: dict[Any, tuple[int, str]] = {}  # passport digest -> (last seq, its entry hash)
        self.checkpoint_note = b""
        self.checkpoint_size = -1
        self.checkpoint_at = 0.0
        self.lock = threading.RLock()
        self._open()

    # -- start ------------------------------------------------------------------------------

    @property
    def entries_path(self) -> Path:
        return self.dir / "entries"

    @property
    def size(self) -> int:
        return self.levels.size

    def _open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "pending").mkdir(exist_ok=True)
        for directory in (self.dir, self.dir / "pending"):
            remove_stale_temp_files(directory)
        vkey = (self.signer.vkey() + "\n").encode("ascii")
        vkey_path = self.dir / "log.vkey"
        if not vkey_path.exists() or vkey_path.read_bytes() != vkey:
            write_durably(vkey_path, vkey)
        self._read_entries()
        self._settle_pending()
        self._write_tiles(0)
        checkpoint = self.dir / "checkpoint"
        if checkpoint.exists():
            self.checkpoint_note = checkpoint.read_bytes()
            try:
                self.checkpoint_size = int(self.checkpoint_note.split(b"\n")[1])
            except (IndexError, ValueError):
                self.checkpoint_size = -1
        if self.checkpoint_size != self.size:
            self.make_checkpoint()

    def _read_entries(self) -> None:
        path = self.entries_path
        if not path.exists():
            write_durably(path, b"")
            return
        data = path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):  # a torn last line: its record was never written as final
            log.warning("log %s: cut a torn last entry of %d bytes at offset %d", path, len(data) - end, end)
            with open(path, "r+b") as fh:
                fh.truncate(end)
                os.fsync(fh.fileno())
            data = data[:end]
        for line in data[:end].split(b"\n")[:-1]:
            self._index(line)

    def _index(self, entry: bytes) -> None:
        try:
            statement = json.loads(entry)
            digest, record = statement["passport_digest"], statement["record_sha256"]
            seq = statement["seq"]
        except (ValueError, KeyError, TypeError) as exc:
            raise LogError(f"entry {self.size} of {self.entries_path} is not a log entry: {exc}") from None
        index = self.levels.append(leaf_hash(entry))
        self.offsets.append(self.end_offset)
        self.end_offset += len(entry) + 1
        self.by_record.setdefault(record, index)
        self.agents[digest] = (seq, hashlib.sha256(entry).hexdigest())

    def _settle_pending(self) -> None:
        """Finish what a kill interrupted between an entry and its record's rename."""
        for pending in sorted((self.dir / "pending").glob("*.json")):
            try:
                record = json.loads(pending.read_bytes())
                logged = record_sha256(record) in self.by_record
            except (OSError, ValueError, TypeError):
                logged = False
            if logged:
                target = self.data_dir / "records" / pending.name
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(pending, target)
                fsync_directory(target.parent)
                log.warning("log: record %s was logged but not yet in place; moved it there", target.name)
            else:
                pending.unlink()
                log.warning("log: dropped %s, whose entry never reached the log", pending.name)

    # -- append -----------------------------------------------------------------------------

    def append(self, record: Mapping[str, Any]) -> Logged:
        """Appends the record's entry durably (fsynced before it returns)."""
        with self.lock:
            subject = record.get("subject") or {}
            digest = subject.get("passport_digest")
            last = self.agents.get(digest)
            seq, prev = (0, None) if last is None else (last[0] + 1, last[1])
            entry = canonical(entry_statement(record, seq, prev))
            if b"\n" in entry or len(entry) > 0xFFFF:
                raise LogError("a log entry is one line of at most 65535 bytes")
            with open(self.entries_path, "ab") as fh:
                fh.write(entry + b"\n")
                fh.flush()
                if self.sync:
                    os.fsync(fh.fileno())
            self._index(entry)
            self.tail[self.size - 1] = entry
            if self.size - (self.checkpoint_size if self.checkpoint_size > 0 else 0) >= self.checkpoint_entries or (
                self.clock() - self.checkpoint_at >= self.checkpoint_seconds
            ):
                self.make_checkpoint()
            return Logged(self.size - 1, entry)

    def write_record(self, path: Path | str, record: Mapping[str, Any], *, sync_directory: bool = True) -> Path:
        """Writes a final record as `governor.evidence.write_record` does, with its entry
        appended durably first: the record goes to `pending/`, its entry to the log, then
        the record is renamed into place."""
        path = Path(path)
        data = (json.dumps(record, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        pending = write_durably(self.dir / "pending" / path.name, data, sync_directory=False, sync=self.sync)
        self.append(json.loads(data))  # hashed as a reader of the file will hash it
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(pending, path)
        if sync_directory and self.sync:
            fsync_directory(path.parent)
        return path

    # -- reads ------------------------------------------------------------------------------

    def entry(self, index: int) -> bytes:
        cached = self.tail.get(index)
        if cached is not None:
            return cached
        with open(self.entries_path, "rb") as fh:
            fh.seek(self.offsets[index])
            return fh.readline().rstrip(b"\n")

    def entries(self, start: int, end: int) -> list[bytes]:
        """Entries [start, end), read in one go (the tail from memory)."""
        if all(i in self.tail for i in range(start, end)):
            return [self.tail[i] for i in range(start, end)]
        stop = self.offsets[end] if end < len(self.offsets) else self.end_offset
        with open(self.entries_path, "rb") as fh:
            fh.seek(self.offsets[start])
            data = fh.read(stop - self.offsets[start])
        return data.split(b"\n")[:-1]

    def index_of(self, record: Mapping[str, Any]) -> int | None:
        return self.by_record.get(record_sha256(record))

    def make_checkpoint(self) -> bytes:
        """Signs a checkpoint at the current size and writes the tiles it needs."""
        with self.lock:
            old = max(self.checkpoint_size, 0)
            size = self.size
            self._write_tiles(old)
            text = Checkpoint(self.origin, size, self.levels.root(size)).text()
            note = sign_note(text, self.signer).encode()
            write_durably(self.dir / "checkpoint", note, sync=self.sync)
            self.checkpoint_note, self.checkpoint_size, self.checkpoint_at = note, size, self.clock()
            self.tail = {i: e for i, e in self.tail.items() if i >= size - size % TILE_WIDTH}
            return note

    def checkpoint(self) -> bytes:
        """The latest checkpoint, a new one first when entries waited past the period."""
        with self.lock:
            if self.checkpoint_size != self.size and self.clock() - self.checkpoint_at >= self.checkpoint_seconds:
                self.make_checkpoint()
            return self.checkpoint_note

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """RFC 6962 PROOF(old_size, new_size), for a witness's `add-checkpoint` (tlog-witness)."""
        with self.lock:
            return self.levels.consistency_proof(old_size, self.checkpoint_size if new_size is None else new_size)

    def add_cosignatures(self, cosigned: bytes) -> bytes:
        """Keeps the latest checkpoint with the signature lines of `cosigned` added (a witness's
        answer): its text must be the latest checkpoint's. Served from then on, and carried by
        the proofs made at this checkpoint."""
        with self.lock:
            theirs, ours = parse_note(cosigned), parse_note(self.checkpoint_note)
            if theirs.text != ours.text:
                raise LogError("the cosigned note is not the latest checkpoint")
            merged = add_signatures(ours, *[s for s in theirs.signatures if s not in ours.signatures]).encode()
            write_durably(self.dir / "checkpoint", merged, sync=self.sync)
            self.checkpoint_note = merged
            return merged

    def prove(self, record: Mapping[str, Any], *, at: bytes | None = None) -> bytes:
        """A C2SP tlog-proof of `record` (its entry in `extra`), at a checkpoint that holds it
        (made now if the latest does not), or at `at`, an earlier checkpoint of this log (the
        latest one its witnesses cosigned)."""
        with self.lock:
            index = self.index_of(record)
            if index is None:
                raise NotLogged("no entry of this log names this record's SHA-256")
            if at is None:
                if self.checkpoint_size <= index:
                    self.make_checkpoint()
                size, note = self.checkpoint_size, self.checkpoint_note
            else:
                size, note = int(at.split(b"\n")[1]), at
                if not index < size <= self.size:
                    raise LogError(f"the checkpoint of size {size} does not hold entry {index}")
            return TlogProof(index, tuple(self.levels.inclusion_proof(index, size)), note,
                             extra=self.entry(index)).encode()

    def _write_tiles(self, old_size: int) -> None:
        """Writes the tiles and bundles of the current size that an `old_size` tree lacked
        (all of them from 0): full ones once, partial ones per width; never rewrites one."""
        size = self.size
        for tile in tiles_for_size(size):
            level = max(tile.level, 0)
            first_new = (old_size // TILE_WIDTH ** level) // TILE_WIDTH
            if tile.index < first_new:
                continue
            path = self.dir / tile.path()
            try:  # a tile is derived: one a power loss emptied (written without fsync) is written again
                if path.stat().st_size == (tile.width * HASH_SIZE if tile.level >= 0 else path.stat().st_size or -1):
                    continue
            except FileNotFoundError:
                pass
            if tile.level < 0:
                start = tile.index * TILE_WIDTH
                data = encode_bundle(self.entries(start, start + tile.width))
            else:
                data = tile_hashes(self.levels, tile)
            # no fsync: tiles are derived from `entries` (fsynced) and checked again at start
            write_durably(path, data, sync=False)


__all__ = ["DEFAULT_CHECKPOINT_ENTRIES", "DEFAULT_CHECKPOINT_SECONDS", "ENTRY_KIND", "LogError", "Logged", "NotLogged",
           "TransparencyLog", "default_origin", "entry_statement", "record_sha256"]
