"""Typed errors of the evidence room: each says what failed, never a bare traceback.

Two live beside the types they carry, so that this module imports none of the room:
`RecordVerificationError` (a VerificationReport) in `verify`, `TornJournalError` (a
TornTail) in `journal`.
"""

from __future__ import annotations

from pathlib import Path


class EvidenceError(Exception):
    """Base of every error raised by governor.evidence."""


class InputError(EvidenceError):
    """A file the caller named is missing, unreadable or not the expected format."""


class KeyFileError(InputError):
    """A key file (PEM) is missing, unreadable, of the wrong type, or inconsistent."""


class DidDocumentError(EvidenceError):
    """A DID document names another identifier or holds no usable assertion key."""


class SchemaNotFoundError(EvidenceError):
    """The project's enforcement-record schema is not where the package looks for it."""


class JournalError(EvidenceError):
    """A session journal cannot be used as asked."""

    def __init__(self, path: Path | str, message: str, line: int | None = None) -> None:
        self.path = Path(path)
        self.line = line
        where = f"{self.path}" + (f", line {line}" if line is not None else "")
        super().__init__(f"{where}: {message}")


class CorruptJournalError(JournalError):
    """A journal line before the last one is damaged: unparseable, bad checksum or broken link.

    Such damage cannot come from a crash (only the line being written can be torn),
    so nothing after it is trusted and the journal is not finalized automatically.
    """


class JournalClosedError(JournalError):
    """An append to a journal whose session has already ended (or that was closed)."""


class DidResolutionError(EvidenceError):
    """A governor's did:web could not be resolved to a DID document (fetch, redirect, size, format)."""
