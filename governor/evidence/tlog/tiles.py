"""C2SP tlog-tiles (c2sp.org/tlog-tiles): tile paths, tile contents and entry bundles.

A tile at level L, index N, holds up to 256 hashes of level 8*L subtrees (level 0: leaf
hashes), those of leaves [N * 256**(L+1), (N+1) * 256**(L+1)). A tile not yet full is
served as a partial tile `.p/<W>`. An entry bundle `tile/entries/<N>` holds the entries
hashed into level-0 tile N, each prefixed by its length as a big-endian uint16.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, Sequence

from governor.evidence.tlog.merkle import HASH_SIZE, HashLevels

TILE_WIDTH = 256
TILE_HEIGHT = 8
MAX_LEVEL = 63
MAX_ENTRY_BYTES = 0xFFFF


class TileError(ValueError):
    """A tile path, tile or bundle that is malformed."""


@dataclass(frozen=True, order=True)
class Tile:
    """`level` is the tile level (0..63), or -1 for an entry bundle; `width` 1..256."""

    level: int
    index: int
    width: int = TILE_WIDTH

    @property
    def partial(self) -> bool:
        return self.width < TILE_WIDTH

    def path(self) -> str:
        head = "tile/entries" if self.level < 0 else f"tile/{self.level}"
        tail = f".p/{self.width}" if self.partial else ""
        return f"{head}/{encode_index(self.index)}{tail}"


def encode_index(index: int) -> str:
    """1234067 -> x001/x234/067."""
    if index < 0:
        raise TileError("a tile index is not negative")
    groups = []
    while True:
        groups.append(f"{index % 1000:03d}")
        index //= 1000
        if not index:
            break
    groups.reverse()
    return "/".join(["x" + g for g in groups[:-1]] + [groups[-1]])


def _decimal(text: str, what: str) -> int:
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        raise TileError(f"{what} {text!r} is not a decimal without leading zeroes")
    return int(text)


def parse_tile_path(path: str) -> Tile:
    """`tile/<L>/<N>[.p/<W>]` or `tile/entries/<N>[.p/<W>]` (no leading slash)."""
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "tile":
        raise TileError(f"{path!r} is not a tile path")
    level = -1 if parts[1] == "entries" else _decimal(parts[1], "the tile level")
    if level > MAX_LEVEL:
        raise TileError(f"tile level {level} is above {MAX_LEVEL}")
    width = TILE_WIDTH
    rest = parts[2:]
    if len(rest) >= 2 and rest[-2].endswith(".p"):
        width = _decimal(rest[-1], "the partial tile width")
        if not 1 <= width < TILE_WIDTH:
            raise TileError(f"a partial tile is 1 to 255 hashes wide, not {width}")
        rest = rest[:-2] + [rest[-2][:-2]]
    if not rest or len(rest) > 7:
        raise TileError(f"{path!r} has no tile index, or too long a one")
    for group in rest[:-1]:
        if len(group) != 4 or group[0] != "x" or not group[1:].isascii() or not group[1:].isdigit():
            raise TileError(f"{path!r}: every index element but the last is x and three digits")
    last = rest[-1]
    if len(last) != 3 or not last.isascii() or not last.isdigit():
        raise TileError(f"{path!r}: the last index element is three digits")
    index = int("".join(g.lstrip("x") for g in rest))
    tile = Tile(level, index, width)
    if tile.path() != path:
        raise TileError(f"{path!r} is not the canonical path of its tile")
    return tile


def tiles_for_size(size: int) -> list[Tile]:
    """Every tile a tree of `size` leaves is served as (full and partial, with the entry
    bundles), level by level."""
    found = []
    level = 0
    while True:
        span = TILE_WIDTH ** level  # leaves per hash of this tile level
        hashes = size // span
        if level > 0 and hashes == 0:
            break
        full, rest = divmod(hashes, TILE_WIDTH)
        found += [Tile(level, n) for n in range(full)]
        if rest:
            found.append(Tile(level, full, rest))
        if level == 0:
            found += [Tile(-1, n) for n in range(full)] + ([Tile(-1, full, rest)] if rest else [])
        if hashes < TILE_WIDTH:
            break
        level += 1
    return found


def tile_hashes(levels: HashLevels, tile: Tile) -> bytes:
    """The bytes of a Merkle tile (not an entry bundle), from the stored hashes."""
    if tile.level < 0:
        raise TileError("an entry bundle is read from the entries, not the hashes")
    row = TILE_HEIGHT * tile.level
    start = tile.index * TILE_WIDTH
    stored = levels.levels[row] if row < len(levels.levels) else []
    if start + tile.width > len(stored):
        raise TileError(f"tile {tile.path()} is past the tree's {levels.size} leaves")
    return b"".join(stored[start : start + tile.width])


def split_tile(data: bytes, width: int = TILE_WIDTH) -> list[bytes]:
    if len(data) != width * HASH_SIZE:
        raise TileError(f"a tile of {width} hashes is {width * HASH_SIZE} bytes, not {len(data)}")
    return [data[i : i + HASH_SIZE] for i in range(0, len(data), HASH_SIZE)]


def encode_bundle(entries: Sequence[bytes]) -> bytes:
    out = bytearray()
    for entry in entries:
        if len(entry) > MAX_ENTRY_BYTES:
            raise TileError(f"an entry of {len(entry)} bytes does not fit a uint16 length")
        out += struct.pack(">H", len(entry)) + entry
    return bytes(out)


def iter_bundle(data: bytes) -> Iterator[bytes]:
    """The entries of a bundle; raises TileError on a truncated one."""
    offset = 0
    while offset < len(data):
        if offset + 2 > len(data):
            raise TileError("an entry bundle ends inside a length prefix")
        (length,) = struct.unpack_from(">H", data, offset)
        offset += 2
        if offset + length > len(data):
            raise TileError("an entry bundle ends inside an entry")
        yield data[offset : offset + length]
        offset += length


def decode_bundle(data: bytes, width: int = TILE_WIDTH) -> list[bytes]:
    entries = list(iter_bundle(data))
    if len(entries) != width:
        raise TileError(f"the entry bundle holds {len(entries)} entries, not {width}")
    return entries
