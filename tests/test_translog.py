"""The governor's log files (governor/evidence/translog.py) across the crashes a kill -9 can
leave: a torn last entry, a record waiting in pending/ with or without its entry, tiles
missing or emptied. Each next open continues the same log."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.evidence.logproof import verify_logged_record
from governor.evidence.tlog import merkle, note
from governor.evidence.tlog.merkle import ProofError
from governor.evidence.tlog.proof import parse_proof
from governor.evidence.translog import NotLogged, TransparencyLog, default_origin, record_sha256

ORIGIN = "test.example/log"


def record(i: int, agent: str = "agent-a") -> dict:
    return {"session": f"s{i}", "subject": {"id": "x", "passport_digest": agent}, "tier": "R2",
            "window": {"start": "2026-11-27T10:00:00.000Z", "end": "2026-11-27T10:00:01.000Z"}, "outcome": "completed",
            "events": [], "signature": {"value": f"sig{i}"}}


@pytest.fixture
def key():
    return Ed25519PrivateKey.generate()


def open_log(tmp_path, key, **options) -> TransparencyLog:
    return TransparencyLog(tmp_path, key, ORIGIN, sync=False, **options)


def test_entries_chain_per_agent_and_proofs_verify(tmp_path, key):
    log = open_log(tmp_path, key)
    for i in range(10):
        log.write_record(tmp_path / "records" / f"s{i}.json", record(i, "agent-a" if i % 3 else "agent-b"))
    verifier = note.parse_vkey((tmp_path / "log" / "log.vkey").read_text())
    entries = [json.loads(parse_proof(log.prove(record(i, "agent-a" if i % 3 else "agent-b"))).extra) for i in range(10)]
    assert [e["seq"] for e in entries if e["passport_digest"] == "agent-b"] == [0, 1, 2, 3]
    assert [e["seq"] for e in entries if e["passport_digest"] == "agent-a"] == [0, 1, 2, 3, 4, 5]
    for i in range(10):
        rec = json.loads((tmp_path / "records" / f"s{i}.json").read_text())
        verify_logged_record(rec, log.prove(rec), verifier)
    with pytest.raises(NotLogged):
        log.prove(record(99))
    # a proof whose entry was swapped for another record's entry: refused
    other = log.prove(record(1, "agent-a"))
    with pytest.raises(ProofError, match="not the one logged"):
        verify_logged_record(record(2, "agent-a"), other, verifier)
    assert default_origin("did:web:localhost:governor") == "localhost/governor/log"
    assert default_origin("https://gov.example/a b+c") == "gov.example/abc/log"


def test_a_torn_last_entry_is_cut_and_the_log_continues(tmp_path, key):
    log = open_log(tmp_path, key)
    for i in range(5):
        log.write_record(tmp_path / "records" / f"s{i}.json", record(i))
    root5 = log.levels.root()
    with open(tmp_path / "log" / "entries", "ab") as fh:
        fh.write(b'{"kind":"adl-governor-log-entry/v1","passport_digest":"agent-a","prev":"ab')  # a kill mid-write
    again = open_log(tmp_path, key)
    assert again.size == 5 and again.levels.root() == root5
    again.write_record(tmp_path / "records" / "s5.json", record(5))
    assert again.size == 6
    merkle.verify_consistency(5, 6, again.levels.consistency_proof(5, 6), root5, again.levels.root())
    assert json.loads(parse_proof(again.prove(record(5))).extra)["seq"] == 5


def test_pending_records_are_settled_at_open(tmp_path, key):
    log = open_log(tmp_path, key)
    log.write_record(tmp_path / "records" / "s0.json", record(0))
    pending = tmp_path / "log" / "pending"
    # a kill after the entry was appended, before the rename: the record is put in place
    log.append(record(1))
    (pending / "s1.json").write_text(json.dumps(record(1)))
    # a kill before the entry was appended: the pending record is dropped (never final)
    (pending / "s2.json").write_text(json.dumps(record(2)))
    (pending / "s3.json").write_text("{ torn")
    again = open_log(tmp_path, key)
    assert not list(pending.iterdir())
    assert record_sha256(json.loads((tmp_path / "records" / "s1.json").read_text())) == record_sha256(record(1))
    assert not (tmp_path / "records" / "s2.json").exists()
    assert again.size == 2


def test_tiles_and_the_checkpoint_are_rebuilt_at_open(tmp_path, key):
    log = open_log(tmp_path, key, checkpoint_entries=1000, checkpoint_seconds=3600)
    for i in range(300):
        log.append(record(i))
    note_before = log.make_checkpoint()
    tile = tmp_path / "log" / "tile" / "0" / "000"
    assert tile.stat().st_size == 256 * 32
    tile.write_bytes(b"")  # emptied (a power loss after a write without fsync)
    (tmp_path / "log" / "tile" / "entries" / "001.p" / "44").unlink()
    (tmp_path / "log" / "checkpoint").unlink()
    again = open_log(tmp_path, key)
    assert tile.stat().st_size == 256 * 32
    assert (tmp_path / "log" / "tile" / "entries" / "001.p" / "44").exists()
    opened = note.open_note(again.checkpoint_note, [note.parse_vkey(again.signer.vkey())])
    assert opened.text == note.parse_note(note_before).text


def test_a_damaged_entry_in_the_middle_refuses_to_open(tmp_path, key):
    from governor.evidence.translog import LogError

    log = open_log(tmp_path, key)
    for i in range(3):
        log.append(record(i))
    path = tmp_path / "log" / "entries"
    lines = path.read_bytes().split(b"\n")
    lines[1] = b"not json"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(LogError, match="entry 1"):
        open_log(tmp_path, key)


def test_a_checkpoint_is_signed_every_n_entries_and_after_t_seconds(tmp_path, key):
    now = [1000.0]
    log = open_log(tmp_path, key, checkpoint_entries=4, checkpoint_seconds=10, clock=lambda: now[0])
    sizes = []
    for i in range(9):
        log.append(record(i))
        sizes.append(log.checkpoint_size)
    assert sizes == [0, 0, 0, 4, 4, 4, 4, 8, 8]
    assert log.checkpoint() and log.checkpoint_size == 8  # not yet T seconds since the last
    now[0] += 10
    log.checkpoint()
    assert log.checkpoint_size == 9  # waited T seconds: a checkpoint without any append


def test_cosignatures_added_to_the_latest_checkpoint_reach_its_proofs(tmp_path, key):
    from governor.evidence.tlog.note import CosignatureSigner, Signature, sign_note
    from governor.evidence.translog import LogError

    log = open_log(tmp_path, key)
    for i in range(3):
        log.write_record(tmp_path / "records" / f"s{i}.json", record(i))
    log.make_checkpoint()
    text = note.parse_note(log.checkpoint_note).text
    witness = CosignatureSigner("witness.example/w1", Ed25519PrivateKey.generate(), clock=lambda: 1_800_000_000)
    cosigned = note.add_signatures(note.parse_note(log.checkpoint_note),
                                   Signature(witness.name, witness.key_id, witness.sign(text))).encode()
    log.add_cosignatures(cosigned)
    assert (tmp_path / "log" / "checkpoint").read_bytes() == cosigned
    rec = json.loads((tmp_path / "records" / "s1.json").read_text())
    verdict = verify_logged_record(rec, log.prove(rec), note.parse_vkey(log.signer.vkey()),
                                   witnesses=[witness.verifier()], quorum=1)
    assert verdict.witnesses == ("witness.example/w1",)
    stale = sign_note("test.example/log\n1\n" + "A" * 43 + "=\n", log.signer).encode()
    with pytest.raises(LogError, match="not the latest checkpoint"):
        log.add_cosignatures(stale)
    old = log.checkpoint_size
    log.append(record(9))
    log.make_checkpoint()
    merkle.verify_consistency(old, log.checkpoint_size, log.consistency_proof(old), log.levels.root(old),
                              log.levels.root())
