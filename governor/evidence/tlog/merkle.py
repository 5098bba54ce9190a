"""RFC 6962 §2.1 Merkle trees: leaf and node hashes, tree hashes, inclusion and
consistency proofs generated from stored subtree hashes, and their verification
(the algorithms of RFC 9162 §2.1.3.2 and §2.1.4.2, which check RFC 6962 proofs).

`HashLevels` keeps, for each level l, the hashes of the complete subtrees of 2**l
leaves, in order: level 0 holds the leaf hashes. That is exactly what tlog-tiles serve
(a tile at level L holds level 8*L hashes), and every proof and every past root is
computed from it with O(log n) lookups.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

HASH_SIZE = 32
# Proofs longer than this cannot belong to any tree of at most 2**64 leaves.
MAX_PROOF_HASHES = 64


class ProofError(ValueError):
    """A proof, a size or a hash that does not verify (the message says which check failed)."""


def leaf_hash(entry: bytes) -> bytes:
    """MTH({d}) = SHA-256(0x00 || d)."""
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


EMPTY_ROOT = hashlib.sha256(b"").digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def tree_hash(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH of a whole list of leaf hashes (the root of a tree of len(leaf_hashes) leaves)."""
    if not leaf_hashes:
        return EMPTY_ROOT
    # Fold complete subtrees left to right, like an append-only log does.
    stack: list[tuple[int, bytes]] = []  # (height, hash)
    for h in leaf_hashes:
        height = 0
        while stack and stack[-1][0] == height:
            h = node_hash(stack.pop()[1], h)
            height += 1
        stack.append((height, h))
    root = stack.pop()[1]
    while stack:
        root = node_hash(stack.pop()[1], root)
    return root


class HashLevels:
    """Every complete subtree hash of an append-only tree, level by level."""

    def __init__(self) -> None:
        self.levels: list[list[bytes]] = [[]]

    @property
    def size(self) -> int:
        return len(self.levels[0])

    def append(self, leaf: bytes) -> int:
        """Adds a leaf hash; returns its index."""
        if len(leaf) != HASH_SIZE:
            raise ValueError("a leaf hash is 32 bytes")
        index = len(self.levels[0])
        self.levels[0].append(leaf)
        level, position, h = 0, index, leaf
        while position & 1:
            h = node_hash(self.levels[level][position - 1], h)
            level += 1
            position >>= 1
            if len(self.levels) == level:
                self.levels.append([])
            self.levels[level].append(h)
        return index

    def subtree(self, level: int, index: int) -> bytes:
        """The hash of leaves [index * 2**level, (index + 1) * 2**level)."""
        try:
            return self.levels[level][index]
        except IndexError:
            raise ProofError(f"no complete subtree {index} at level {level} in a tree of {self.size}") from None

    def range_hash(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]), for a range that starts on a boundary of its own size's split
        (every range an RFC 6962 proof or root needs)."""
        n = end - start
        if n <= 0 or end > self.size:
            raise ProofError(f"no range [{start}, {end}) in a tree of {self.size}")
        if n & (n - 1) == 0 and start % n == 0:
            return self.subtree(n.bit_length() - 1, start // n)
        k = _split(n)
        return node_hash(self.range_hash(start, start + k), self.range_hash(start + k, end))

    def root(self, size: int | None = None) -> bytes:
        size = self.size if size is None else size
        if size == 0:
            return EMPTY_ROOT
        return self.range_hash(0, size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """RFC 6962 PATH(index, D[0:size]): the leaf's sibling first, the root's child last."""
        size = self.size if size is None else size
        if not 0 <= index < size <= self.size:
            raise ProofError(f"no leaf {index} in a tree of {size} (the log holds {self.size})")
        proof: list[bytes] = []
        start, end = 0, size
        while end - start > 1:
            k = _split(end - start)
            if index < start + k:
                proof.append(self.range_hash(start + k, end))
                end = start + k
            else:
                proof.append(self.range_hash(start, start + k))
                start = start + k
        proof.reverse()
        return proof

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """RFC 6962 PROOF(old_size, D[0:new_size])."""
        new_size = self.size if new_size is None else new_size
        if not 0 <= old_size <= new_size <= self.size:
            raise ProofError(f"no consistency proof from {old_size} to {new_size} (the log holds {self.size})")
        if old_size == 0 or old_size == new_size:
            return []
        proof: list[bytes] = []
        m, start, end, complete = old_size, 0, new_size, True
        while True:
            n = end - start
            if m == n:
                if not complete:
                    proof.append(self.range_hash(start, end))
                break
            k = _split(n)
            if m <= k:
                proof.append(self.range_hash(start + k, end))
                end = start + k
            else:
                proof.append(self.range_hash(start, start + k))
                m -= k
                start += k
                complete = False
        proof.reverse()
        return proof


def _check_hashes(proof: Sequence[bytes]) -> None:
    if len(proof) > MAX_PROOF_HASHES:
        raise ProofError(f"a proof of {len(proof)} hashes is longer than any tree allows")
    for h in proof:
        if not isinstance(h, bytes) or len(h) != HASH_SIZE:
            raise ProofError("every proof hash is 32 bytes")


def root_from_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """The root that `proof` binds leaf `index` of a tree of `size` to (RFC 9162 §2.1.3.2)."""
    _check_hashes(proof)
    if len(leaf) != HASH_SIZE:
        raise ProofError("the leaf hash is 32 bytes")
    if not 0 <= index < size:
        raise ProofError(f"index {index} is not in a tree of {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("the inclusion proof is too long for the tree size")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the inclusion proof is too short for the tree size")
    return r


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> None:
    """Raises ProofError unless `proof` shows leaf hash `leaf` at `index` in the tree (`size`, `root`)."""
    if root_from_inclusion(leaf, index, size, proof) != root:
        raise ProofError(f"the inclusion proof of leaf {index} does not lead to the root of tree {size}")


def verify_consistency(old_size: int, new_size: int, proof: Sequence[bytes], old_root: bytes, new_root: bytes) -> None:
    """Raises ProofError unless tree (old_size, old_root) is a prefix of (new_size, new_root)
    (RFC 9162 §2.1.4.2)."""
    _check_hashes(proof)
    if not 0 <= old_size <= new_size:
        raise ProofError(f"a tree of {new_size} cannot extend one of {old_size}")
    if old_size == new_size:
        if proof:
            raise ProofError("a consistency proof between equal sizes is empty")
        if old_root != new_root:
            raise ProofError(f"two different roots for the same tree size {old_size}")
        return
    if old_size == 0:
        if proof:
            raise ProofError("a consistency proof from the empty tree is empty")
        return
    if not proof:
        raise ProofError("the consistency proof is empty")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the consistency proof is too short")
    if fr != old_root:
        raise ProofError(f"the consistency proof does not lead to the old root (size {old_size})")
    if sr != new_root:
        raise ProofError(f"the consistency proof does not lead to the new root (size {new_size})")
