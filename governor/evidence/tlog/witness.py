"""The C2SP tlog-witness `add-checkpoint` decision (c2sp.org/tlog-witness), with no I/O:
parse the request body, check the checkpoint against the log keys and the state the
witness last cosigned, and cosign it. The caller persists the new state before answering
(the spec requires it) and holds one lock over check and persist, so two requests cannot
roll the state back.

    old <size>\\n
    <base64 consistency proof hash>\\n     (0 to 63 lines)
    \\n
    <signed checkpoint note>
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from governor.evidence.tlog.checkpoint import Checkpoint, CheckpointError, parse_checkpoint, parse_decimal
from governor.evidence.tlog.merkle import EMPTY_ROOT, HASH_SIZE, ProofError, verify_consistency
from governor.evidence.tlog.note import (
    MAX_NOTE_BYTES,
    CosignatureSigner,
    NoteError,
    Signature,
    Verifier,
    b64decode_strict,
    open_note,
    parse_note,
)

MAX_PROOF_LINES = 63
# an old-size line, 63 proof lines of 45 bytes, a blank line and the largest note accepted
MAX_REQUEST_BYTES = 32 + MAX_PROOF_LINES * 45 + 1 + MAX_NOTE_BYTES
SIZE_CONTENT_TYPE = "text/x.tlog.size"


class WitnessRefusal(Exception):
    """A request the witness does not cosign: `status` is the HTTP status the spec names,
    `latest_size` is set on a 409 (the size the witness last cosigned)."""

    def __init__(self, status: int, message: str, latest_size: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.latest_size = latest_size


@dataclass(frozen=True)
class AddCheckpoint:
    old_size: int
    proof: tuple[bytes, ...]
    note: bytes  # the signed checkpoint, verbatim

    def encode(self) -> bytes:
        """The request body a log sends (the client side of the protocol)."""
        lines = [f"old {self.old_size}", *(base64.b64encode(h).decode("ascii") for h in self.proof)]
        return ("\n".join(lines) + "\n\n").encode("ascii") + self.note


@dataclass(frozen=True)
class LogState:
    """What the witness last cosigned for one log."""

    size: int
    root: bytes
    note: bytes = b""  # the checkpoint with the log's signatures and the witness's cosignature


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    """The request body split into its parts; WitnessRefusal(400) on anything malformed."""
    if len(body) > MAX_REQUEST_BYTES:
        raise WitnessRefusal(400, f"the request is {len(body)} bytes, over the {MAX_REQUEST_BYTES} accepted")
    head, sep, note = body.partition(b"\n\n")
    if not sep:
        raise WitnessRefusal(400, "the request has no blank line before the checkpoint")
    try:
        lines = head.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise WitnessRefusal(400, "the old size and proof lines are not ASCII") from None
    if not lines[0].startswith("old "):
        raise WitnessRefusal(400, "the request does not start with an `old <size>` line")
    try:
        old_size = parse_decimal(lines[0][4:], "the old size")
    except CheckpointError as problem:
        raise WitnessRefusal(400, str(problem)) from None
    proof_lines = lines[1:]
    if len(proof_lines) > MAX_PROOF_LINES:
        raise WitnessRefusal(400, f"{len(proof_lines)} consistency proof lines, over the {MAX_PROOF_LINES} allowed")
    proof = []
    for line in proof_lines:
        try:
            raw = b64decode_strict(line, "a consistency proof line")
        except NoteError as problem:
            raise WitnessRefusal(400, str(problem)) from None
        if len(raw) != HASH_SIZE:
            raise WitnessRefusal(400, "a consistency proof line is not a 32-byte hash")
        proof.append(raw)
    return AddCheckpoint(old_size, tuple(proof), note)


class StateLookup(Protocol):
    def get(self, origin: str) -> LogState | None: ...


class Witness:
    """Cosigns checkpoints of the logs it knows (origin -> the log's verifier keys)."""

    def __init__(self, signer: CosignatureSigner, logs: Mapping[str, Sequence[Verifier]]) -> None:
        self.signer = signer
        self.logs = {origin: tuple(keys) for origin, keys in logs.items()}

    def check(self, request: AddCheckpoint, states: "StateLookup") -> Checkpoint:
        """The checkpoint to cosign, or WitnessRefusal with the status the spec names.
        `states.get(origin)` is what the witness last cosigned for a log, if anything."""
        try:
            unverified = parse_note(request.note)
            checkpoint = parse_checkpoint(unverified.text)
        except NoteError as problem:  # CheckpointError is a NoteError
            raise WitnessRefusal(400, f"the checkpoint: {problem}") from None
        keys = self.logs.get(checkpoint.origin)
        if keys is None:
            raise WitnessRefusal(404, f"unknown log {checkpoint.origin!r}")
        try:
            open_note(request.note, keys)
        except NoteError as problem:
            raise WitnessRefusal(403, f"the checkpoint's signature: {problem}") from None
        state = states.get(checkpoint.origin)
        if request.old_size > checkpoint.size:
            raise WitnessRefusal(400, f"old size {request.old_size} is above the checkpoint's size {checkpoint.size}")
        latest = state.size if state is not None else 0
        if request.old_size != latest:
            raise WitnessRefusal(409, f"old size {request.old_size} is not {latest}, the size last cosigned",
                                 latest_size=latest)
        if checkpoint.size == 0 and checkpoint.root != EMPTY_ROOT:
            raise WitnessRefusal(422, "a checkpoint of size 0 must carry the empty tree's root")
        old_root = state.root if state is not None else EMPTY_ROOT
        try:
            verify_consistency(request.old_size, checkpoint.size, request.proof, old_root, checkpoint.root)
        except ProofError as problem:
            raise WitnessRefusal(422, f"not consistent with the checkpoint last cosigned: {problem}") from None
        return checkpoint

    def cosign(self, request: AddCheckpoint, checkpoint: Checkpoint) -> tuple[Signature, LogState]:
        """The cosignature line and the state to persist before answering with it."""
        note = parse_note(request.note)  # its text is what the log signed, extension lines included
        signature = Signature(self.signer.name, self.signer.key_id, self.signer.sign(note.text))
        kept = [s for s in note.signatures if (s.name, s.key_id) != (signature.name, signature.key_id)]
        stored = (note.text + "\n" + "".join(s.line() for s in kept) + signature.line()).encode("utf-8")
        return signature, LogState(checkpoint.size, checkpoint.root, stored)


__all__ = ["AddCheckpoint", "LogState", "MAX_REQUEST_BYTES", "SIZE_CONTENT_TYPE", "Witness", "WitnessRefusal",
           "parse_add_checkpoint"]
