"""C2SP tlog-checkpoint (c2sp.org/tlog-checkpoint): the note text naming a tree head.

    <origin>\\n<size>\\n<base64 root hash>\\n[<extension line>\\n...]
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from governor.evidence.tlog.merkle import HASH_SIZE
from governor.evidence.tlog.note import NoteError, b64decode_strict

MAX_TREE_SIZE = 2**63 - 1


class CheckpointError(NoteError):
    """A note text that is not a well-formed checkpoint."""


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        check_origin(self.origin)
        if not 0 <= self.size <= MAX_TREE_SIZE:
            raise CheckpointError(f"tree size {self.size} is out of range")
        if len(self.root) != HASH_SIZE:
            raise CheckpointError("a root hash is 32 bytes")
        for line in self.extensions:
            if not line or "\n" in line:
                raise CheckpointError("an extension line is non-empty and one line")
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode("ascii"), *self.extensions]
        return "\n".join(lines) + "\n"


def check_origin(origin: str) -> str:
    if not origin or "\n" in origin or any(ord(c) < 0x20 for c in origin):
        raise CheckpointError("a checkpoint's origin is one non-empty line")
    return origin


def parse_decimal(text: str, what: str, maximum: int = MAX_TREE_SIZE) -> int:
    """An ASCII decimal with no leading zero (unless it is 0)."""
    if not text or not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        raise CheckpointError(f"{what} {text!r} is not a decimal without leading zeroes")
    value = int(text)
    if value > maximum:
        raise CheckpointError(f"{what} {text} is out of range")
    return value


def parse_checkpoint(text: str) -> Checkpoint:
    if not text.endswith("\n"):
        raise CheckpointError("a checkpoint's text ends with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise CheckpointError("a checkpoint has an origin, a size and a root hash")
    origin, size, root, *extensions = lines
    check_origin(origin)
    if any(not line for line in extensions):
        raise CheckpointError("a checkpoint's extension lines are non-empty")
    try:
        raw = b64decode_strict(root, "the checkpoint's root hash")
    except NoteError as problem:
        raise CheckpointError(str(problem)) from None
    if len(raw) != HASH_SIZE:
        raise CheckpointError("the checkpoint's root hash is not 32 bytes")
    return Checkpoint(origin, parse_decimal(size, "the tree size"), raw, tuple(extensions))
