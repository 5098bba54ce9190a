"""C2SP tlog-proof (c2sp.org/tlog-proof@v1): an offline proof that an entry is in a log,
and its verification against the log's key and a witness policy (k of n cosignatures).

    c2sp.org/tlog-proof@v1
    [extra <base64>]
    index <n>
    <base64 hash>            (the inclusion proof, the leaf's sibling first)
    ...
    <blank line>
    <the checkpoint as a signed note, verbatim>
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Sequence

from governor.evidence.tlog.checkpoint import Checkpoint, CheckpointError, parse_checkpoint, parse_decimal
from governor.evidence.tlog.merkle import HASH_SIZE, MAX_PROOF_HASHES, ProofError, leaf_hash, verify_inclusion
from governor.evidence.tlog.note import (
    MAX_NOTE_BYTES,
    Note,
    NoteError,
    Verifier,
    b64decode_strict,
    open_note,
    parse_note,
)

HEADER = "c2sp.org/tlog-proof@v1"
MAX_PROOF_BYTES = MAX_NOTE_BYTES + 4096


@dataclass(frozen=True)
class TlogProof:
    index: int
    hashes: tuple[bytes, ...]
    checkpoint_note: bytes  # the signed checkpoint, verbatim
    extra: bytes | None = None

    def encode(self) -> bytes:
        lines = [HEADER]
        if self.extra is not None:
            lines.append("extra " + base64.b64encode(self.extra).decode("ascii"))
        lines.append(f"index {self.index}")
        lines += [base64.b64encode(h).decode("ascii") for h in self.hashes]
        return ("\n".join(lines) + "\n\n").encode("ascii") + self.checkpoint_note


def parse_proof(data: bytes, max_bytes: int = MAX_PROOF_BYTES) -> TlogProof:
    if len(data) > max_bytes:
        raise ProofError(f"the proof is {len(data)} bytes, over the {max_bytes} accepted")
    head, sep, note = data.partition(b"\n\n")
    if not sep:
        raise ProofError("the proof has no blank line before its checkpoint")
    try:
        lines = head.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise ProofError("the proof's header is not ASCII") from None
    if lines[0] != HEADER:
        raise ProofError(f"the proof does not start with {HEADER}")
    rest = lines[1:]
    extra = None
    try:
        if rest and rest[0].startswith("extra "):
            extra = b64decode_strict(rest.pop(0)[6:], "the proof's extra data")
        if not rest or not rest[0].startswith("index "):
            raise ProofError("the proof has no `index` line")
        index = parse_decimal(rest.pop(0)[6:], "the index")
        if len(rest) > MAX_PROOF_HASHES:
            raise ProofError(f"an inclusion proof of {len(rest)} hashes is longer than any tree allows")
        hashes = []
        for line in rest:
            raw = b64decode_strict(line, "an inclusion proof hash")
            if len(raw) != HASH_SIZE:
                raise ProofError("an inclusion proof hash is not 32 bytes")
            hashes.append(raw)
    except NoteError as problem:
        raise ProofError(str(problem)) from None
    return TlogProof(index, tuple(hashes), note, extra)


@dataclass(frozen=True)
class ProofVerdict:
    checkpoint: Checkpoint
    note: Note
    witnesses: tuple[str, ...]  # the names of the witnesses whose cosignatures verified


def open_checkpoint(
    note_bytes: bytes,
    log: Verifier,
    origin: str | None = None,
    witnesses: Sequence[Verifier] = (),
    quorum: int = 0,
) -> ProofVerdict:
    """A checkpoint note verified: signed by the log's key (its origin the key's name,
    unless `origin` says otherwise) and cosigned by at least `quorum` of `witnesses`."""
    try:
        parsed = parse_note(note_bytes)
        logged = open_note(note_bytes, [log])
    except NoteError as problem:
        raise ProofError(f"the checkpoint: {problem}") from None
    try:
        checkpoint = parse_checkpoint(logged.text)
    except CheckpointError as problem:
        raise ProofError(f"the checkpoint: {problem}") from None
    expected = origin if origin is not None else log.name
    if checkpoint.origin != expected:
        raise ProofError(f"the checkpoint's origin {checkpoint.origin!r} is not the log's {expected!r}")
    cosigned: list[str] = []
    for witness in witnesses:
        lines = [s for s in parsed.signatures if (s.name, s.key_id) == (witness.name, witness.key_id)]
        if not lines:
            continue
        if not all(witness.verify(logged.text, s.signature) for s in lines):
            raise ProofError(f"the cosignature of witness {witness.name} does not verify")
        cosigned.append(witness.name)
    if len(cosigned) < quorum:
        raise ProofError(f"{len(cosigned)} of the required {quorum} witness cosignatures are on the checkpoint")
    return ProofVerdict(checkpoint, logged, tuple(cosigned))


def verify_proof(
    data: bytes,
    entry: bytes,
    log: Verifier,
    origin: str | None = None,
    witnesses: Sequence[Verifier] = (),
    quorum: int = 0,
) -> ProofVerdict:
    """Verifies a tlog-proof for the log entry `entry` (its bytes, before leaf hashing)."""
    proof = parse_proof(data)
    verdict = open_checkpoint(proof.checkpoint_note, log, origin, witnesses, quorum)
    verify_inclusion(leaf_hash(entry), proof.index, verdict.checkpoint.size, proof.hashes, verdict.checkpoint.root)
    return verdict
