"""Offline verification of a record's transparency-log proof (docs/transparency-log.md).

The proof is a C2SP tlog-proof whose `extra` line carries the record's log entry (its JCS
statement): the verifier checks that the entry names this very record (its SHA-256, its
session, tier, window and passport digest), that the checkpoint is signed by the log's key
(and cosigned by a quorum of the witnesses given), and that the inclusion proof binds the
entry to the checkpoint's root.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from governor.evidence.translog import ENTRY_KIND, entry_statement, record_sha256
from governor.evidence.tlog.merkle import ProofError
from governor.evidence.tlog.note import Verifier
from governor.evidence.tlog.proof import parse_proof, verify_proof

ENTRY_MEMBERS = ("kind", "record_sha256", "passport_digest", "session", "tier", "window", "seq", "prev")


@dataclass(frozen=True)
class LoggedRecord:
    index: int
    entry: dict[str, Any]
    origin: str
    tree_size: int
    witnesses: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "origin": self.origin, "tree_size": self.tree_size,
                "agent_seq": self.entry["seq"], "witnesses": list(self.witnesses), "entry": self.entry}


def parse_entry(data: bytes) -> dict[str, Any]:
    try:
        entry = json.loads(data)
    except ValueError:
        raise ProofError("the proof's log entry is not JSON") from None
    if not isinstance(entry, dict) or set(entry) != set(ENTRY_MEMBERS):
        raise ProofError(f"the proof's log entry does not hold exactly {', '.join(ENTRY_MEMBERS)}")
    if entry["kind"] != ENTRY_KIND:
        raise ProofError(f"the proof's log entry is not a {ENTRY_KIND}")
    seq = entry["seq"]
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise ProofError("the log entry's seq is not a whole number")
    if (seq == 0) != (entry["prev"] is None):
        raise ProofError("the log entry's prev is null exactly for an agent's first entry")
    return entry


def verify_logged_record(record: Mapping[str, Any], proof: bytes, log: Verifier, *,
                         witnesses: Sequence[Verifier] = (), quorum: int = 0) -> LoggedRecord:
    """Raises ProofError (saying which check failed) unless `proof` shows `record` in the log."""
    parsed = parse_proof(proof)
    if parsed.extra is None:
        raise ProofError("the proof carries no log entry (its `extra` line)")
    entry = parse_entry(parsed.extra)
    digest = record_sha256(record)
    if entry["record_sha256"] != digest:
        raise ProofError(f"the record is not the one logged: its SHA-256 is {digest}, the log entry names "
                         f"{entry['record_sha256']}")
    expected = entry_statement(record, entry["seq"], entry["prev"])
    for member in ("passport_digest", "session", "tier", "window"):
        if entry[member] != expected[member]:
            raise ProofError(f"the log entry's {member} is not the record's")
    verdict = verify_proof(proof, parsed.extra, log, witnesses=witnesses, quorum=quorum)
    return LoggedRecord(parsed.index, entry, verdict.checkpoint.origin, verdict.checkpoint.size, verdict.witnesses)


__all__ = ["ENTRY_MEMBERS", "LoggedRecord", "parse_entry", "verify_logged_record"]
