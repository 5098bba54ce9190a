"""A C2SP transparency log's formats, with nothing of the governor in them: RFC 6962
Merkle trees and proofs (`merkle`), signed notes and cosignatures (`note`), checkpoints
(`checkpoint`), tiles and entry bundles (`tiles`), and offline proofs (`proof`).

The governor's own log (its entries, its files) is `governor.evidence.translog`; a
witness or an auditor builds on this package alone.
"""

from governor.evidence.tlog.checkpoint import Checkpoint, CheckpointError, parse_checkpoint
from governor.evidence.tlog.merkle import (
    HashLevels,
    ProofError,
    leaf_hash,
    node_hash,
    tree_hash,
    verify_consistency,
    verify_inclusion,
)
from governor.evidence.tlog.note import (
    CosignatureSigner,
    CosignatureVerifier,
    Ed25519Signer,
    Ed25519Verifier,
    Note,
    NoteError,
    Signature,
    add_signatures,
    open_note,
    parse_note,
    parse_vkey,
    sign_note,
)
from governor.evidence.tlog.proof import TlogProof, open_checkpoint, parse_proof, verify_proof
from governor.evidence.tlog.tiles import Tile, TileError, parse_tile_path, tile_hashes, tiles_for_size

__all__ = [
    "Checkpoint", "CheckpointError", "parse_checkpoint",
    "HashLevels", "ProofError", "leaf_hash", "node_hash", "tree_hash", "verify_consistency", "verify_inclusion",
    "CosignatureSigner", "CosignatureVerifier", "Ed25519Signer", "Ed25519Verifier", "Note", "NoteError",
    "Signature", "add_signatures", "open_note", "parse_note", "parse_vkey", "sign_note",
    "TlogProof", "open_checkpoint", "parse_proof", "verify_proof",
    "Tile", "TileError", "parse_tile_path", "tile_hashes", "tiles_for_size",
]
