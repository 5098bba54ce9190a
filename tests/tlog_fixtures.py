"""A transparency log built with the library alone, for the witness and audit tests:
entries (the governor's JCS statements), the tree, signed checkpoints, tiles on disk."""

from __future__ import annotations

import hashlib
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.common.canonical import canonicalize
from governor.evidence.tlog.checkpoint import Checkpoint
from governor.evidence.tlog.merkle import HashLevels, leaf_hash
from governor.evidence.tlog.note import Ed25519Signer, sign_note
from governor.evidence.tlog.tiles import encode_bundle, tile_hashes, tiles_for_size

ORIGIN = "governor.test/log"


def statement(agent: str, seq: int, prev: str | None, session: str = "s") -> bytes:
    return canonicalize({
        "kind": "adl-governor-log-entry/v1",
        "record_sha256": hashlib.sha256(f"{agent}/{seq}/{session}".encode()).hexdigest(),
        "passport_digest": agent, "session": session, "tier": "R2",
        "window": {"start": "2026-11-27T10:00:00Z", "end": "2026-11-27T10:01:00Z"},
        "seq": seq, "prev": prev,
    })


class TestLog:
    """An append-only log signed with its own key."""

    __test__ = False

    def __init__(self, origin: str = ORIGIN, key: Ed25519PrivateKey | None = None) -> None:
        self.signer = Ed25519Signer(origin, key or Ed25519PrivateKey.generate())
        self.origin = origin
        self.entries: list[bytes] = []
        self.levels = HashLevels()
        self.last: dict[str, tuple[int, str]] = {}

    def append(self, entry: bytes) -> None:
        self.entries.append(entry)
        self.levels.append(leaf_hash(entry))

    def add_agent_entries(self, agent: str, count: int, skip: tuple[int, ...] = ()) -> None:
        """`count` entries continuing `agent`'s sequence; the seqs in `skip` are left out
        (as an operator who dropped them and rebuilt the log would)."""
        for _ in range(count):
            seq, prev = self.last.get(agent, (-1, None))
            seq += 1
            entry = statement(agent, seq, prev, session=f"{agent}-{seq}")
            self.last[agent] = (seq, hashlib.sha256(entry).hexdigest())
            if seq not in skip:
                self.append(entry)

    def grow(self, count: int) -> None:
        for _ in range(count):
            self.append(f"entry {len(self.entries)}".encode())

    def checkpoint(self, size: int | None = None, root: bytes | None = None) -> bytes:
        size = self.levels.size if size is None else size
        text = Checkpoint(self.origin, size, root or self.levels.root(size)).text()
        return sign_note(text, self.signer).encode()

    def write(self, directory: Path) -> Path:
        """The log as DATA_DIR/log/ lays it out: checkpoint, tiles, entry bundles."""
        directory.mkdir(parents=True, exist_ok=True)
        for tile in tiles_for_size(self.levels.size):
            path = directory / tile.path()
            path.parent.mkdir(parents=True, exist_ok=True)
            if tile.level < 0:
                start = tile.index * 256
                path.write_bytes(encode_bundle(self.entries[start:start + tile.width]))
            else:
                path.write_bytes(tile_hashes(self.levels, tile))
        (directory / "checkpoint").write_bytes(self.checkpoint())
        return directory
