"""The transparency log's library (governor/evidence/tlog/): RFC 6962 Merkle trees and
proofs, C2SP signed notes, cosignatures, checkpoints, tiles and tlog-proofs.

Checked three ways: against the RFC 6962 test vectors (the Certificate Transparency
reference leaves), against a brute-force recursion of RFC 6962's definitions, and against
aics-tlog, a second C2SP implementation the governor shares no code with (installed by
.ci/dev; skipped, saying so, without it). Each reader also gets hostile input.
"""

from __future__ import annotations

import base64
import random
import struct

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.evidence.tlog import merkle, note, proof, tiles
from governor.evidence.tlog.checkpoint import Checkpoint, CheckpointError, parse_checkpoint
from governor.evidence.tlog.merkle import HashLevels, ProofError, leaf_hash, node_hash

try:
    import aics_tlog
except ImportError:  # pragma: no cover - .ci/dev installs it
    aics_tlog = None

needs_aics = pytest.mark.skipif(
    aics_tlog is None, reason="aics-tlog (the independent C2SP implementation) is not installed: .ci/dev installs it"
)

H = bytes.fromhex
CT_LEAVES = [H(x) for x in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                            "606162636465666768696a6b6c6d6e6f")]
CT_ROOTS = [H(x) for x in (
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
)]
CT_INCLUSION = {
    (0, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (5, 8): ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
}
CT_CONSISTENCY = {
    (2, 8): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (6, 8): ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
    (2, 5): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"],
}


def levels_of(entries):
    levels = HashLevels()
    for entry in entries:
        levels.append(leaf_hash(entry))
    return levels


def reference_mth(entries):
    """RFC 6962 §2.1's MTH, recursively, as written there."""
    n = len(entries)
    if n == 0:
        return merkle.EMPTY_ROOT
    if n == 1:
        return leaf_hash(entries[0])
    k = 1
    while k * 2 < n:
        k *= 2
    return node_hash(reference_mth(entries[:k]), reference_mth(entries[k:]))


# -- RFC 6962 -------------------------------------------------------------------------------


def test_the_rfc6962_reference_roots():
    levels = HashLevels()
    assert levels.root() == CT_ROOTS[0]
    for n, entry in enumerate(CT_LEAVES, start=1):
        levels.append(leaf_hash(entry))
        assert levels.root() == CT_ROOTS[n]
        assert merkle.tree_hash([leaf_hash(e) for e in CT_LEAVES[:n]]) == CT_ROOTS[n]
    for n in range(9):
        assert levels.root(n) == CT_ROOTS[n]


@pytest.mark.parametrize(("index", "size"), sorted(CT_INCLUSION))
def test_the_rfc6962_reference_inclusion_proofs(index, size):
    levels = levels_of(CT_LEAVES)
    expected = [H(x) for x in CT_INCLUSION[index, size]]
    assert levels.inclusion_proof(index, size) == expected
    merkle.verify_inclusion(leaf_hash(CT_LEAVES[index]), index, size, expected, CT_ROOTS[size])


@pytest.mark.parametrize(("old", "new"), sorted(CT_CONSISTENCY))
def test_the_rfc6962_reference_consistency_proofs(old, new):
    levels = levels_of(CT_LEAVES)
    expected = [H(x) for x in CT_CONSISTENCY[old, new]]
    assert levels.consistency_proof(old, new) == expected
    merkle.verify_consistency(old, new, expected, CT_ROOTS[old], CT_ROOTS[new])


def test_every_proof_of_every_small_tree_verifies_and_nothing_wrong_does():
    entries = [struct.pack(">I", i) for i in range(70)]
    levels = levels_of(entries)
    for n in range(1, len(entries) + 1):
        root = levels.root(n)
        assert root == reference_mth(entries[:n])
        for m in range(n):
            path = levels.inclusion_proof(m, n)
            merkle.verify_inclusion(leaf_hash(entries[m]), m, n, path, root)
            with pytest.raises(ProofError):
                merkle.verify_inclusion(leaf_hash(entries[m] + b"x"), m, n, path, root)
            if n > 1:
                with pytest.raises(ProofError):
                    merkle.verify_inclusion(leaf_hash(entries[m]), (m + 1) % n, n, path, root)
        for m in range(n + 1):
            path = levels.consistency_proof(m, n)
            merkle.verify_consistency(m, n, path, levels.root(m), root)
            if 0 < m < n:
                with pytest.raises(ProofError):
                    merkle.verify_consistency(m, n, path, leaf_hash(b"forged"), root)
                with pytest.raises(ProofError):
                    merkle.verify_consistency(m, n, path, levels.root(m), leaf_hash(b"forged"))


def test_hostile_proofs_are_refused_with_a_reason():
    entries = [struct.pack(">H", i) for i in range(300)]
    levels = levels_of(entries)
    size, index = 300, 137
    root = levels.root(size)
    path = levels.inclusion_proof(index, size)
    leaf = leaf_hash(entries[index])
    cases = {
        "truncated": (leaf, index, size, path[:-1], root),
        "extended": (leaf, index, size, path + [path[0]], root),
        "wrong size": (leaf, index, 2 * size + 1, path, root),
        "smaller size": (leaf, index, 200, path, root),
        "index past size": (leaf, size, size, path, root),
        "negative index": (leaf, -1, size, path, root),
        "flipped hash": (leaf, index, size, [path[0][:-1] + bytes([path[0][-1] ^ 1])] + path[1:], root),
        "short hash": (leaf, index, size, [path[0][:31]] + path[1:], root),
        "empty tree": (leaf, 0, 0, [], root),
        "too long": (leaf, index, size, path * 20, root),
    }
    for name, args in cases.items():
        with pytest.raises(ProofError):
            merkle.verify_inclusion(*args)
            pytest.fail(f"{name}: accepted")
    consistency = levels.consistency_proof(100, 300)
    for bad in (consistency[:-1], consistency + [consistency[0]], [], consistency[::-1]):
        with pytest.raises(ProofError):
            merkle.verify_consistency(100, 300, bad, levels.root(100), root)
    with pytest.raises(ProofError):
        merkle.verify_consistency(300, 100, consistency, root, levels.root(100))
    with pytest.raises(ProofError):
        levels.inclusion_proof(5, 301)
    with pytest.raises(ProofError):
        levels.consistency_proof(10, 301)
    with pytest.raises(ValueError):
        levels.append(b"short")


# -- the independent implementation ---------------------------------------------------------


@needs_aics
def test_roots_and_proofs_agree_with_aics_tlog():
    rng = random.Random(31)
    entries = [rng.randbytes(rng.randrange(0, 40)) for _ in range(600)]
    ours = levels_of(entries)
    theirs = aics_tlog.MerkleTree(entries)
    for n in [1, 2, 3, 7, 8, 9, 255, 256, 257, 511, 512, 513, 600]:
        assert ours.root(n) == theirs.root(n)
        for m in {0, n // 3, n - 1}:
            path = ours.inclusion_proof(m, n)
            assert path == theirs.inclusion_proof(m, n)
            assert aics_tlog.verify_leaf_inclusion(entries[m], m, n, path, ours.root(n))
        for m in {1, n // 2, n - 1, n}:
            if not 0 < m <= n:
                continue
            path = ours.consistency_proof(m, n)
            assert path == theirs.consistency_proof(m, n)
            assert aics_tlog.verify_consistency(m, n, ours.root(m), ours.root(n), path)


@needs_aics
@pytest.mark.parametrize("size", [1, 255, 256, 257, 256 * 256 + 3])
def test_tiles_and_bundles_are_byte_for_byte_those_of_aics_tlog(size):
    entries = [struct.pack(">I", i) * 2 for i in range(size)]
    levels = levels_of(entries)
    ours = {}
    for tile in tiles.tiles_for_size(size):
        if tile.level < 0:
            start = tile.index * tiles.TILE_WIDTH
            ours[tile.path()] = tiles.encode_bundle(entries[start : start + tile.width])
        else:
            ours[tile.path()] = tiles.tile_hashes(levels, tile)
    theirs = aics_tlog.tiles.materialise_tiles(entries)
    assert ours.keys() == theirs.keys()
    assert ours == theirs
    reader = aics_tlog.MemoryTileReader(ours)
    assert aics_tlog.tree_root_from_tiles(reader, size) == levels.root()
    for path, data in ours.items():
        assert tiles.parse_tile_path(path).path() == path
        if path.startswith("tile/entries/"):
            assert tiles.decode_bundle(data, tiles.parse_tile_path(path).width)


@needs_aics
def test_notes_vkeys_and_cosignatures_verify_across_both_implementations():
    log_key, witness_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    signer = note.Ed25519Signer("log.example/governor", log_key)
    witness = note.CosignatureSigner("witness.example/w1", witness_key, clock=lambda: 1_790_000_000)
    levels = levels_of([b"a", b"b", b"c"])
    body = Checkpoint("log.example/governor", 3, levels.root(), ("ext one",)).text()
    signed = note.sign_note(body, signer, witness)
    encoded = signed.encode()
    # ours -> theirs
    their_log = aics_tlog.parse_vkey(signer.vkey())
    their_witness = aics_tlog.parse_vkey(witness.verifier().vkey())
    assert aics_tlog.format_vkey(their_log) == signer.vkey()
    parsed = aics_tlog.parse_note(encoded)
    assert aics_tlog.verify_note(parsed, [their_log])
    result = aics_tlog.verify_checkpoint(parsed, their_log, [their_witness], quorum=1)
    assert result.ok, result.error
    assert result.size == 3 and result.root == levels.root()
    # theirs -> ours
    their_line = aics_tlog.sign_note(body, log_key, "log.example/governor")
    _, their_cosig = aics_tlog.sign_cosignature(
        witness_key, "witness.example/w1", 1_790_000_001, "log.example/governor", 3, levels.root(), ["ext one"]
    )
    theirs = aics_tlog.Note(text=body, signatures=(their_line, their_cosig)).to_bytes()
    opened = note.open_note(theirs, [signer.verifier(), witness.verifier()])
    assert len(opened.verified) == 2
    assert note.cosignature_timestamp(opened.verified[1]) == 1_790_000_001
    assert note.parse_vkey(aics_tlog.format_vkey(aics_tlog.cosignature_vkey("witness.example/w1", witness_key.public_key()))).key_id == witness.key_id


@needs_aics
def test_a_tlog_proof_verifies_with_aics_tlogs_primitives():
    entries = [f"entry {i}".encode() for i in range(1000)]
    levels = levels_of(entries)
    signer = note.Ed25519Signer("log.example/governor", Ed25519PrivateKey.generate())
    checkpoint = note.sign_note(Checkpoint("log.example/governor", 1000, levels.root()).text(), signer).encode()
    data = proof.TlogProof(613, tuple(levels.inclusion_proof(613, 1000)), checkpoint).encode()
    verdict = proof.verify_proof(data, entries[613], signer.verifier())
    assert verdict.checkpoint.size == 1000
    # the proof read with nothing of ours: the header lines, then the checkpoint note
    head, _, tail = data.partition(b"\n\n")
    lines = head.decode().split("\n")
    assert lines[0] == "c2sp.org/tlog-proof@v1" and lines[1] == "index 613"
    hashes = [base64.b64decode(x) for x in lines[2:]]
    parsed = aics_tlog.parse_note(tail)
    result = aics_tlog.verify_checkpoint(parsed, aics_tlog.parse_vkey(signer.vkey()))
    assert result.ok, result.error
    assert aics_tlog.verify_leaf_inclusion(entries[613], 613, result.size, hashes, result.root)


# -- signed notes ---------------------------------------------------------------------------


def test_the_signed_note_spec_example():
    vkey = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
    text = ("This is an example message.\n\n\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONn"
            "cAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n").encode()
    verifier = note.parse_vkey(vkey)
    assert verifier.vkey() == vkey
    opened = note.open_note(text, [verifier])
    assert opened.text == "This is an example message.\n"
    with pytest.raises(note.NoteError, match="does not verify"):
        note.open_note(text.replace(b"example message", b"example massage"), [verifier])


def _signed(text="origin.example/log\n1\n" + base64.b64encode(bytes(32)).decode() + "\n"):
    signer = note.Ed25519Signer("origin.example/log", Ed25519PrivateKey.generate())
    return signer, note.sign_note(text, signer).encode()


def test_hostile_notes_are_refused_with_a_reason():
    signer, good = _signed()
    other = note.Ed25519Signer("origin.example/log", Ed25519PrivateKey.generate())
    stranger = note.Ed25519Signer("stranger.example", Ed25519PrivateKey.generate())
    assert note.open_note(good, [signer.verifier()]).verified
    # only an unknown key signed it: rejected; an unknown key beside a known one: ignored
    with pytest.raises(note.NoteError, match="no signature on the note is by a known key"):
        note.open_note(good, [stranger.verifier(), other.verifier()])
    text = note.parse_note(good).text
    both = note.add_signatures(note.parse_note(good), note.Signature(stranger.name, stranger.key_id, stranger.sign(text)))
    assert [s.name for s in note.open_note(both.encode(), [signer.verifier()]).verified] == ["origin.example/log"]
    # a known key's line whose signature fails rejects the whole note
    forged = note.Note(text, (note.Signature(signer.name, signer.key_id, bytes(64)),)).encode()
    with pytest.raises(note.NoteError, match="does not verify"):
        note.open_note(forged, [signer.verifier()])
    doubled = note.Note(text, note.parse_note(good).signatures * 2).encode()
    with pytest.raises(note.NoteError, match="two signatures"):
        note.open_note(doubled, [signer.verifier()])
    hostile = {
        "oversize": good[:-1] + b" " * note.MAX_NOTE_BYTES,
        "not utf-8": b"\xff\xfe\n\n" + good.split(b"\n\n")[1],
        "control character": good.replace(b"origin", b"orig\x01in", 1),
        "no blank line": good.replace(b"\n\n", b"\n"),
        "bad base64": good[:-3] + b"!=\n",
        "non-canonical base64": good[:-3] + b"R=\n",
        "no em dash": good.replace("\u2014".encode(), b"-"),
        "no signature": good.split(b"\n\n")[0] + b"\n\n",
        "short signature": good.split(b"\n\n")[0] + "\n\n\u2014 a AAAA\n".encode(),
        "no final newline": good[:-1],
        "space in name": good.replace("\u2014 origin.example/log".encode(), "\u2014 origin example/log".encode()),
        "too many signatures": good + ("\u2014 x " + base64.b64encode(bytes(68)).decode() + "\n").encode() * 70,
    }
    for name, data in hostile.items():
        with pytest.raises(note.NoteError):
            note.open_note(data, [signer.verifier()])
            pytest.fail(f"{name}: accepted")


def test_hostile_vkeys_are_refused():
    signer = note.Ed25519Signer("a.example/k", Ed25519PrivateKey.generate())
    good = signer.vkey()
    name, kid, blob = good.split("+", 2)
    for bad in (
        "", "a.example/k", f"{name}+{kid}", f"{name}+{kid.upper()}+{blob}", f"{name}+00000000+{blob}",
        f"{name}+{kid}+{blob[:-2]}", f"{name}+{kid}+!!!!", f"a b+{kid}+{blob}",
        f"{name}+{kid}+" + base64.b64encode(b"\x02" + bytes(32)).decode(),
        f"{name}+{kid}+" + base64.b64encode(b"\x01" + bytes(31)).decode(),
        # a small-order point (the identity): it would verify a forged signature
        "a.example/k+" + f"{note.key_id('a.example/k', 1, bytes([1]) + bytes(31)):08x}+"
        + base64.b64encode(b"\x01" + bytes([1]) + bytes(31)).decode(),
    ):
        with pytest.raises(note.NoteError):
            note.parse_vkey(bad)
    assert note.parse_vkey(good + "\n").key_id == signer.key_id


def test_a_cosignature_binds_its_timestamp_and_type():
    key = Ed25519PrivateKey.generate()
    witness = note.CosignatureSigner("w.example", key, clock=lambda: 1234)
    text = Checkpoint("log.example", 0, merkle.EMPTY_ROOT).text()
    line = note.Signature(witness.name, witness.key_id, witness.sign(text))
    assert note.cosignature_timestamp(line) == 1234
    assert witness.verifier().verify(text, line.signature)
    moved = struct.pack(">Q", 1235) + line.signature[8:]
    assert not witness.verifier().verify(text, moved)
    # the same key as a plain note signer has another key ID: its lines are not confused
    assert note.Ed25519Signer("w.example", key).key_id != witness.key_id


# -- checkpoints, tiles, proofs --------------------------------------------------------------


def test_checkpoints_round_trip_and_refuse_malformed_bodies():
    cp = Checkpoint("example.com/behind-the-sofa", 20852163, base64.b64decode("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I="))
    assert cp.text() == "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    assert parse_checkpoint(cp.text()) == cp
    root = "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I="
    for bad in (
        f"o\n1\n{root}", f"o\n01\n{root}\n", f"o\n-1\n{root}\n", f"o\n1\n{root[:-4]}\n", f"\n1\n{root}\n",
        f"o\n1\n{root}\n\n", "o\n1\n", f"o\n{2**64}\n{root}\n", f"o\n1\n{root[:-1]}!\n", f"o\n１\n{root}\n",
    ):
        with pytest.raises(CheckpointError):
            parse_checkpoint(bad)


def test_tile_paths_follow_the_spec():
    assert tiles.encode_index(1234067) == "x001/x234/067"
    assert tiles.Tile(0, 0).path() == "tile/0/000"
    assert tiles.Tile(2, 1234067, 8).path() == "tile/2/x001/x234/067.p/8"
    assert tiles.Tile(-1, 5, 3).path() == "tile/entries/005.p/3"
    assert tiles.parse_tile_path("tile/entries/x001/x234/067.p/8") == tiles.Tile(-1, 1234067, 8)
    shapes = [(t.level, t.width) for t in tiles.tiles_for_size(70_000) if t.partial]
    assert shapes == [(0, 112), (-1, 112), (1, 17), (2, 1)]
    assert len([t for t in tiles.tiles_for_size(70_000) if t.level == 0]) == 274
    assert [t.path() for t in tiles.tiles_for_size(256)] == ["tile/0/000", "tile/entries/000", "tile/1/000.p/1"]
    for bad in ("tile/0/1", "tile/0/0001", "tile/00/000", "tile/64/000", "tile/0/x000/001", "tile/0/001/002",
                "tile/0/000.p/0", "tile/0/000.p/256", "tile/0/000.p/01", "tile/x/000", "tiles/0/000",
                "tile/0/000.p", "tile/0/../000", "tile/0/٠٠٠", "tile/0"):
        with pytest.raises(tiles.TileError):
            tiles.parse_tile_path(bad)


def test_hostile_bundles_are_refused():
    bundle = tiles.encode_bundle([b"abc", b"", b"d" * 300])
    assert list(tiles.iter_bundle(bundle)) == [b"abc", b"", b"d" * 300]
    for bad in (bundle[:-1], bundle[:1], bundle + b"\x00"):
        with pytest.raises(tiles.TileError):
            tiles.decode_bundle(bad, 3)
    with pytest.raises(tiles.TileError):
        tiles.decode_bundle(bundle, 4)
    with pytest.raises(tiles.TileError):
        tiles.encode_bundle([bytes(70_000)])
    with pytest.raises(tiles.TileError):
        tiles.split_tile(bytes(33), 1)


def test_hostile_tlog_proofs_are_refused():
    entries = [f"e{i}".encode() for i in range(10)]
    levels = levels_of(entries)
    signer = note.Ed25519Signer("log.example", Ed25519PrivateKey.generate())
    checkpoint = note.sign_note(Checkpoint("log.example", 10, levels.root()).text(), signer).encode()
    good = proof.TlogProof(4, tuple(levels.inclusion_proof(4, 10)), checkpoint, extra=b"hello").encode()
    assert proof.parse_proof(good).extra == b"hello"
    assert proof.verify_proof(good, entries[4], signer.verifier()).checkpoint.root == levels.root()
    stranger = note.Ed25519Signer("log.example", Ed25519PrivateKey.generate())
    with pytest.raises(ProofError, match="known key"):
        proof.verify_proof(good, entries[4], stranger.verifier())
    with pytest.raises(ProofError, match="origin"):
        proof.verify_proof(good, entries[4], signer.verifier(), origin="other.example")
    with pytest.raises(ProofError):
        proof.verify_proof(good, entries[5], signer.verifier())
    witness = note.CosignatureSigner("w.example", Ed25519PrivateKey.generate())
    with pytest.raises(ProofError, match="0 of the required 1"):
        proof.verify_proof(good, entries[4], signer.verifier(), witnesses=[witness.verifier()], quorum=1)
    lines = good.split(b"\n")
    hostile = {
        "wrong header": good.replace(b"@v1", b"@v2", 1),
        "no index": good.replace(b"index 4\n", b""),
        "leading zero": good.replace(b"index 4", b"index 04"),
        "other index": good.replace(b"index 4", b"index 5"),
        "bad base64": good.replace(lines[3], b"!!!!"),
        "short hash": good.replace(lines[3], base64.b64encode(bytes(31))),
        "truncated proof": good.replace(lines[3] + b"\n", b""),
        "no checkpoint": good.split(b"\n\n")[0],
        "oversize": good + b"x" * proof.MAX_PROOF_BYTES,
        "bad extra": good.replace(b"extra aGVsbG8=", b"extra %%%"),
        "too many hashes": good.replace(lines[3], b"\n".join([lines[3]] * 70)),
    }
    for name, data in hostile.items():
        with pytest.raises(ProofError):
            proof.verify_proof(data, entries[4], signer.verifier())
            pytest.fail(f"{name}: accepted")
