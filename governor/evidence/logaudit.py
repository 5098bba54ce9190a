"""Auditing a governor's transparency log from its tiles (issue #31, `governor audit`).

Reads the signed checkpoint and every tile and entry bundle through a `TileSource` (a
directory laid out as DATA_DIR/log/, or the control plane's /log/ over HTTP), and reports
what it finds, each as a `Finding`:

  signature   the checkpoint is not signed by the log key, or lacks the witness quorum
  tile        a tile or bundle is missing, malformed, or disagrees with the entries
  root        the tree recomputed from the entries is not the checkpoint's root
  rollback    the log is smaller than a checkpoint saved earlier (`since`)
  fork        the log's tree at the saved size is not the saved checkpoint's root
  entry       an entry that is not the statement below
  gap         an agent's sequence skips numbers (an entry of it is missing)
  repeat      an agent's sequence number appears again or goes back
  link        an entry's `prev` is not the hash of that agent's previous entry
  missing     (with a records directory) an entry names a record the directory lacks
  unlogged    (with a records directory) a record no entry names (edited, or never logged)

The entry statement (schemas/log-entry.schema.json): the JCS (RFC 8785) bytes of
{kind, record_sha256, passport_digest, session, tier, window {start, end}, seq, prev}.
`ENTRY_FIELDS` below is the one place this reader names them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

from governor.common.canonical import canonicalize
from governor.evidence.tlog.checkpoint import Checkpoint
from governor.evidence.tlog.merkle import HASH_SIZE, HashLevels, ProofError, leaf_hash
from governor.evidence.tlog.note import MAX_NOTE_BYTES, Verifier
from governor.evidence.tlog.proof import open_checkpoint
from governor.evidence.tlog.tiles import TILE_WIDTH, TileError, decode_bundle, tile_hashes, tiles_for_size

ENTRY_KIND = "adl-governor-log-entry/v1"
ENTRY_FIELDS = ("kind", "record_sha256", "passport_digest", "session", "tier", "window", "seq", "prev")
TIERS = ("R1", "R2", "R3")
HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_TILE_BYTES = TILE_WIDTH * HASH_SIZE
MAX_BUNDLE_BYTES = TILE_WIDTH * (2 + 0xFFFF)


class SourceError(Exception):
    """The log cannot be read at all (unreachable, or no checkpoint): a usage error, not a finding."""


class MissingFile(Exception):
    """One tile or bundle the source does not have."""


class TooLarge(MissingFile):
    """A file longer than any well-formed one: a finding, not a reason to read on."""


class TileSource(Protocol):
    def read(self, path: str, max_bytes: int) -> bytes:
        """The bytes at `path` (`checkpoint`, `tile/...`); MissingFile if absent; at most
        `max_bytes` (TooLarge for a longer file)."""
        ...


class DirectorySource:
    """A log laid out as DATA_DIR/log/ (DIR may be the data directory or its log/)."""

    def __init__(self, directory: Path) -> None:
        directory = Path(directory)
        if not (directory / "checkpoint").is_file() and (directory / "log" / "checkpoint").is_file():
            directory = directory / "log"
        if not (directory / "checkpoint").is_file():
            raise SourceError(f"{directory} holds no checkpoint")
        self.directory = directory

    def read(self, path: str, max_bytes: int) -> bytes:
        target = self.directory / path
        try:
            with open(target, "rb") as fh:
                data = fh.read(max_bytes + 1)
        except FileNotFoundError:
            raise MissingFile(f"{path} is missing") from None
        except OSError as problem:
            raise MissingFile(f"{path} is unreadable ({problem.strerror})") from None
        if len(data) > max_bytes:
            raise TooLarge(f"{path} is over {max_bytes} bytes")
        return data


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str


@dataclass
class AgentEntries:
    passport_digest: str
    entries: list[dict[str, Any]] = field(default_factory=list)  # {index, seq, session, tier, record_sha256}


@dataclass
class AuditReport:
    checkpoint: Checkpoint | None = None
    checkpoint_note: bytes = b""
    witnesses: tuple[str, ...] = ()
    findings: list[Finding] = field(default_factory=list)
    agents: dict[str, AgentEntries] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.findings

    def add(self, kind: str, message: str) -> None:
        self.findings.append(Finding(kind, message))

    def to_json(self) -> dict[str, Any]:
        cp = self.checkpoint
        return {
            "clean": self.clean,
            "checkpoint": None if cp is None else {"origin": cp.origin, "size": cp.size, "root": cp.root.hex()},
            "witnesses": list(self.witnesses),
            "findings": [{"kind": f.kind, "message": f.message} for f in self.findings],
            "agents": {d: a.entries for d, a in sorted(self.agents.items())},
        }


def audit_log(source: TileSource, log_key: Verifier, witnesses: Sequence[Verifier] = (), quorum: int = 0,
              since: bytes | None = None) -> AuditReport:
    report = AuditReport()
    try:
        note = source.read("checkpoint", MAX_NOTE_BYTES)
    except TooLarge as problem:
        report.add("signature", f"the checkpoint: {problem}")
        return report
    except MissingFile as problem:
        raise SourceError(f"the log's checkpoint: {problem}") from None
    try:
        verdict = open_checkpoint(note, log_key, witnesses=witnesses, quorum=quorum)
    except ProofError as problem:
        report.add("signature", str(problem))
        return report
    report.checkpoint, report.checkpoint_note, report.witnesses = verdict.checkpoint, note, verdict.witnesses
    size = verdict.checkpoint.size
    entries = read_entries(source, size, report)
    if entries is None:
        return report
    levels = HashLevels()
    for entry in entries:
        levels.append(leaf_hash(entry))
    if levels.root() != verdict.checkpoint.root:
        report.add("root", f"the tree of the {size} entries in the bundles is not the checkpoint's root")
    check_tiles(source, levels, report)
    if since is not None:
        check_since(since, log_key, levels, verdict.checkpoint, report)
    check_sequences(entries, report)
    return report


def read_entries(source: TileSource, size: int, report: AuditReport) -> list[bytes] | None:
    entries: list[bytes] = []
    for tile in tiles_for_size(size):
        if tile.level >= 0:
            continue
        try:
            entries += decode_bundle(source.read(tile.path(), MAX_BUNDLE_BYTES), tile.width)
        except (MissingFile, TileError) as problem:
            report.add("tile", f"entry bundle {tile.path()}: {problem}")
            return None
    return entries


def check_tiles(source: TileSource, levels: HashLevels, report: AuditReport) -> None:
    """Every Merkle tile served must be the one the entries give (a client proving
    inclusion from the tiles would otherwise see another tree)."""
    for tile in tiles_for_size(levels.size):
        if tile.level < 0:
            continue
        try:
            served = source.read(tile.path(), MAX_TILE_BYTES)
        except MissingFile as problem:
            report.add("tile", f"tile {tile.path()}: {problem}")
            continue
        if len(served) != tile.width * HASH_SIZE:
            report.add("tile", f"tile {tile.path()} is {len(served)} bytes, not {tile.width * HASH_SIZE}")
        elif served != tile_hashes(levels, tile):
            report.add("tile", f"tile {tile.path()} is not the tile of the entries' tree")


def check_since(saved: bytes, log_key: Verifier, levels: HashLevels, now: Checkpoint, report: AuditReport) -> None:
    try:
        earlier = open_checkpoint(saved, log_key).checkpoint
    except ProofError as problem:
        report.add("signature", f"the saved checkpoint: {problem}")
        return
    if earlier.size > now.size:
        report.add("rollback", f"the log holds {now.size} entries, fewer than the {earlier.size} of the saved checkpoint")
    elif levels.root(earlier.size) != earlier.root:
        report.add("fork", f"the log's first {earlier.size} entries are not the tree of the saved checkpoint "
                           "(the log was rewritten, or two different logs were served)")


def parse_entry(entry: bytes) -> dict[str, Any]:
    """The statement an entry holds; ValueError says what is wrong with it."""
    try:
        statement = json.loads(entry)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(statement, dict) or tuple(sorted(statement)) != tuple(sorted(ENTRY_FIELDS)):
        raise ValueError(f"not an object with exactly the fields {', '.join(ENTRY_FIELDS)}")
    try:
        canonical = canonicalize(statement)
    except (ValueError, TypeError, OverflowError, RecursionError):
        canonical = None
    if canonical != entry:
        raise ValueError("not in its JCS (RFC 8785) form")
    window = statement["window"]
    checks = (
        (statement["kind"] == ENTRY_KIND, f"kind is not {ENTRY_KIND}"),
        (isinstance(statement["record_sha256"], str) and HEX64.fullmatch(statement["record_sha256"]),
         "record_sha256 is not 64 lower-case hex digits"),
        (isinstance(statement["passport_digest"], str) and statement["passport_digest"], "passport_digest is empty"),
        (isinstance(statement["session"], str) and statement["session"], "session is empty"),
        (statement["tier"] in TIERS, f"tier is not one of {', '.join(TIERS)}"),
        (isinstance(window, dict) and sorted(window) == ["end", "start"]
         and all(isinstance(v, str) and v for v in window.values()), "window is not {start, end}"),
        (type(statement["seq"]) is int and statement["seq"] >= 0, "seq is not a whole number"),
        (statement["prev"] is None or (isinstance(statement["prev"], str) and HEX64.fullmatch(statement["prev"])),
         "prev is neither null nor 64 lower-case hex digits"),
    )
    for ok, problem in checks:
        if not ok:
            raise ValueError(problem)
    return statement


def check_sequences(entries: Sequence[bytes], report: AuditReport) -> None:
    last: dict[str, tuple[int, str]] = {}  # passport digest -> (seq, entry hash) of its latest entry
    for index, entry in enumerate(entries):
        try:
            statement = parse_entry(entry)
        except ValueError as problem:
            report.add("entry", f"entry {index}: {problem}")
            continue
        digest, seq, prev = statement["passport_digest"], statement["seq"], statement["prev"]
        agent = report.agents.setdefault(digest, AgentEntries(digest))
        agent.entries.append({"index": index, "seq": seq, "session": statement["session"], "tier": statement["tier"],
                              "record_sha256": statement["record_sha256"], "window": statement["window"]})
        before = last.get(digest)
        expected = 0 if before is None else before[0] + 1
        if seq > expected:
            missing = f"{expected}" if seq == expected + 1 else f"{expected} to {seq - 1}"
            report.add("gap", f"agent {digest}: entry {index} has seq {seq}; seq {missing} is missing from the log")
        elif seq < expected:
            report.add("repeat", f"agent {digest}: entry {index} has seq {seq} again, after seq {expected - 1}")
        if seq == 0 and prev is not None:
            report.add("link", f"agent {digest}: entry {index} is its first (seq 0) but names a previous entry")
        elif seq > 0:
            if before is None:
                pass  # the gap is reported; there is no previous entry to link to
            elif prev != before[1]:
                report.add("link", f"agent {digest}: entry {index} (seq {seq}) does not link to its previous "
                                   f"entry (seq {before[0]}): prev {prev} is not {before[1]}")
        last[digest] = (seq, hashlib.sha256(entry).hexdigest())


def check_records(records_dir: Path, report: AuditReport) -> None:
    """Each entry's record is in `records_dir` (DATA_DIR/records/: final records, named by
    session), and each record there is named by an entry (its SHA-256: JCS, signature in)."""
    logged = {e["record_sha256"]: e for agent in report.agents.values() for e in agent.entries}
    found: set[str] = set()
    for path in sorted(Path(records_dir).glob("*.json")):
        try:
            digest = hashlib.sha256(canonicalize(json.loads(path.read_bytes()))).hexdigest()
        except (OSError, ValueError, TypeError) as problem:
            report.add("unlogged", f"record {path.name} cannot be read as JSON ({problem})")
            continue
        found.add(digest)
        if digest not in logged:
            report.add("unlogged", f"record {path.name} (SHA-256 {digest}) is named by no log entry: edited after "
                                   "it was logged, or never logged")
    for digest, entry in logged.items():
        if digest not in found:
            report.add("missing", f"entry {entry['index']} (session {entry['session']}, seq {entry['seq']}) names "
                                  f"record {digest}, which {records_dir} lacks: deleted or replaced")


__all__ = ["AuditReport", "check_records", "DirectorySource", "ENTRY_FIELDS", "ENTRY_KIND", "Finding", "MissingFile", "SourceError",
           "TileSource", "TooLarge", "audit_log", "parse_entry"]
