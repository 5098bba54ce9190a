"""`governor audit` over a log written by the library (tests/tlog_fixtures.py), from a
directory and over HTTP: a clean log exits 0; each lie (an entry deleted, a gap in one
agent's sequence, a broken link, a fork or rollback against a saved checkpoint, a bad
signature, a wrong tile) exits 1 naming it; unreachable logs and bad arguments exit 2.
Hostile tiles, bundles, entries and checkpoints next to the happy ones."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.common.canonical import canonicalize
from governor.evidence.logaudit import DirectorySource, audit_log, parse_entry
from governor.evidence.tlog.note import CosignatureSigner, Signature, add_signatures, parse_note
from tests.tlog_fixtures import TestLog, statement

REPO = Path(__file__).resolve().parent.parent
AGENT_A, AGENT_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def audit(*args, timeout=120):
    done = subprocess.run([sys.executable, "-m", "governor", "audit", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def two_agents(skip_a=()):
    log = TestLog()
    for _ in range(3):
        log.add_agent_entries(AGENT_A, 2, skip=skip_a)
        log.add_agent_entries(AGENT_B, 1)
    return log


def test_a_clean_log_exits_0_and_lists_each_agents_entries(tmp_path):
    log = two_agents()
    directory = log.write(tmp_path / "data" / "log")
    code, out = audit("--log", tmp_path / "data", "--log-key", log.signer.vkey())
    assert code == 0, out
    assert f"agent {AGENT_A}: 6 entries, seq 0..5" in out and f"agent {AGENT_B}: 3 entries, seq 0..2" in out
    assert "CLEAN" in out
    code, out = audit("--log", directory, "--log-key", log.signer.vkey(), "--json")
    report = json.loads(out)
    assert code == 0 and report["clean"] and report["checkpoint"]["size"] == 9
    assert [e["seq"] for e in report["agents"][AGENT_A]] == [0, 1, 2, 3, 4, 5]


def test_a_log_past_one_tile_is_recomputed_from_its_bundles(tmp_path):
    log = TestLog()
    log.add_agent_entries(AGENT_A, 600)
    log.write(tmp_path / "log")
    assert (tmp_path / "log" / "tile" / "entries" / "002.p" / "88").is_file()
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey())
    assert code == 0, out


def test_a_gap_in_one_agents_sequence_is_found(tmp_path):
    # the operator dropped agent A's entry seq 3 and rebuilt and re-signed the log
    log = two_agents(skip_a=(3,))
    log.write(tmp_path / "log")
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey())
    assert code == 1, out
    assert f"GAP: agent {AGENT_A}" in out and "seq 3 is missing" in out
    assert f"agent {AGENT_B}" not in out.split("FOUND")[1]


def test_an_entry_deleted_from_a_bundle_is_found(tmp_path):
    log = two_agents()
    log.write(tmp_path / "log")
    bundle = tmp_path / "log" / "tile" / "entries" / "000.p" / "9"
    data = bundle.read_bytes()
    first = int.from_bytes(data[:2], "big")
    bundle.write_bytes(data[2 + first:])  # entry 0 cut out, the checkpoint unchanged
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey())
    assert code == 1 and "TILE: entry bundle tile/entries/000.p/9" in out and "holds 8 entries, not 9" in out


def test_an_edited_entry_is_a_root_mismatch(tmp_path):
    log = two_agents()
    log.write(tmp_path / "log")
    bundle = tmp_path / "log" / "tile" / "entries" / "000.p" / "9"
    bundle.write_bytes(bundle.read_bytes().replace(b'"tier":"R2"', b'"tier":"R3"', 1))
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey())
    assert code == 1 and "ROOT:" in out


def test_a_broken_link_is_found(tmp_path):
    log = TestLog()
    log.add_agent_entries(AGENT_A, 2)
    log.append(statement(AGENT_A, 2, hashlib.sha256(b"not the previous entry").hexdigest()))
    log.write(tmp_path / "log")
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey())
    assert code == 1 and f"LINK: agent {AGENT_A}: entry 2 (seq 2) does not link" in out


def test_a_repeated_sequence_number_is_found(tmp_path):
    log = TestLog()
    log.add_agent_entries(AGENT_A, 2)
    log.append(statement(AGENT_A, 1, hashlib.sha256(log.entries[0]).hexdigest(), session="again"))
    log.write(tmp_path / "log")
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey())
    assert code == 1 and "REPEAT:" in out and "seq 1 again" in out


def test_a_fork_against_a_saved_checkpoint_is_found(tmp_path):
    log = two_agents()
    log.write(tmp_path / "one")
    saved = tmp_path / "saved.checkpoint"
    code, out = audit("--log", tmp_path / "one", "--log-key", log.signer.vkey(), "--save", saved)
    assert code == 0 and saved.read_bytes() == log.checkpoint()
    # the same key, another history of the same agents, longer: a fork served to this auditor
    forked = TestLog(key=log.signer.private_key)
    for _ in range(4):
        forked.add_agent_entries(AGENT_B, 1)
        forked.add_agent_entries(AGENT_A, 2)
    forked.write(tmp_path / "two")
    code, out = audit("--log", tmp_path / "two", "--log-key", log.signer.vkey(), "--since", saved)
    assert code == 1 and "FORK:" in out and "first 9 entries" in out
    # the honest log, grown, is consistent with what was saved
    log.add_agent_entries(AGENT_A, 3)
    log.write(tmp_path / "three")
    code, out = audit("--log", tmp_path / "three", "--log-key", log.signer.vkey(), "--since", saved)
    assert code == 0, out


def test_a_rollback_against_a_saved_checkpoint_is_found(tmp_path):
    log = two_agents()
    log.write(tmp_path / "full")
    saved = tmp_path / "saved"
    assert audit("--log", tmp_path / "full", "--log-key", log.signer.vkey(), "--save", saved)[0] == 0
    shorter = TestLog(key=log.signer.private_key)
    for entry in log.entries[:5]:
        shorter.append(entry)
    shorter.write(tmp_path / "short")
    code, out = audit("--log", tmp_path / "short", "--log-key", log.signer.vkey(), "--since", saved)
    assert code == 1 and "ROLLBACK: the log holds 5 entries, fewer than the 9" in out


def test_a_bad_signature_is_found(tmp_path):
    log = two_agents()
    log.write(tmp_path / "log")
    other = TestLog()  # another key under the same name
    assert audit("--log", tmp_path / "log", "--log-key", log.signer.vkey())[0] == 0
    checkpoint = tmp_path / "log" / "checkpoint"
    note = parse_note(checkpoint.read_bytes())
    forged = note.text.replace("\n9\n", "\n8\n", 1)
    checkpoint.write_bytes((forged + "\n" + "".join(s.line() for s in note.signatures)).encode())
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey())
    assert code == 1 and "SIGNATURE:" in out and "does not verify" in out
    code, out = audit("--log", tmp_path / "log", "--log-key", other.signer.vkey())
    assert code == 1 and "SIGNATURE:" in out


def test_witness_cosignatures_and_quorum(tmp_path):
    log = two_agents()
    log.write(tmp_path / "log")
    witnesses = [CosignatureSigner(f"w{i}.test/witness", Ed25519PrivateKey.generate()) for i in range(2)]
    checkpoint = tmp_path / "log" / "checkpoint"
    note = parse_note(checkpoint.read_bytes())
    one = add_signatures(note, Signature(witnesses[0].name, witnesses[0].key_id, witnesses[0].sign(note.text)))
    checkpoint.write_bytes(one.encode())
    keys = [a for w in witnesses for a in ("--witness-key", w.vkey())]
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey(), *keys)
    assert code == 1 and "1 of the required 2 witness cosignatures" in out
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey(), *keys, "--quorum", "1")
    assert code == 0 and "cosigned by: w0.test/witness" in out
    bad = add_signatures(note, Signature(witnesses[0].name, witnesses[0].key_id, bytes(72)))
    checkpoint.write_bytes(bad.encode())
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey(), *keys, "--quorum", "1")
    assert code == 1 and "cosignature of witness w0.test/witness does not verify" in out


def test_over_http_from_a_static_server(tmp_path):
    log = two_agents(skip_a=(1,))
    log.write(tmp_path / "site" / "log")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "site"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/log"
        code, out = audit("--log", url, "--log-key", log.signer.vkey())
        assert code == 1 and "GAP:" in out
        (tmp_path / "site" / "log" / "tile" / "0" / "000.p" / "8").unlink()
        code, out = audit("--log", url, "--log-key", log.signer.vkey())
        assert code == 1 and "TILE: tile tile/0/000.p/8: tile/0/000.p/8 answered 404" in out
        code, out = audit("--log", url + "/nothing-here", "--log-key", log.signer.vkey())
        assert code == 2 and "checkpoint" in out
    finally:
        server.shutdown()
        server.server_close()
    code, out = audit("--log", url, "--log-key", log.signer.vkey(), timeout=120)
    assert code == 2 and "unreachable" in out


def test_usage_errors_exit_2(tmp_path):
    log = two_agents()
    log.write(tmp_path / "log")
    assert audit("--log", tmp_path / "empty", "--log-key", log.signer.vkey())[0] == 2
    code, out = audit("--log", tmp_path / "log", "--log-key", "x+y+z")
    assert code == 2 and "--log-key" in out
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey(), "--quorum", "1")
    assert code == 2 and "--quorum" in out
    code, out = audit("--log", tmp_path / "log", "--log-key", log.signer.vkey(), "--since", tmp_path / "none")
    assert code == 2 and "--since" in out


# -- hostile bytes, through the library (the CLI maps findings to exit 1) --------------------

def findings(directory, log):
    return [(f.kind, f.message) for f in audit_log(DirectorySource(directory), log.signer.verifier()).findings]


def test_a_tile_of_the_wrong_length_or_content(tmp_path):
    log = TestLog()
    log.add_agent_entries(AGENT_A, 300)
    log.write(tmp_path)
    full = tmp_path / "tile" / "0" / "000"
    full.write_bytes(full.read_bytes()[:-1])
    (tmp_path / "tile" / "1" / "000.p" / "1").write_bytes(bytes(32))
    found = findings(tmp_path, log)
    assert ("tile", "tile tile/0/000 is 8191 bytes, not 8192") in found
    assert ("tile", "tile tile/1/000.p/1 is not the tile of the entries' tree") in found
    full.write_bytes(b"\0" * 100_000)  # oversize: not read past the limit
    assert any("over 8192 bytes" in m for k, m in findings(tmp_path, log))


@pytest.mark.parametrize("bundle, why", [
    (b"\x00", "ends inside a length prefix"),
    (b"\x00\x10abc", "ends inside an entry"),
    (b"", "holds 0 entries"),
])
def test_truncated_bundles(tmp_path, bundle, why):
    log = two_agents()
    log.write(tmp_path)
    (tmp_path / "tile" / "entries" / "000.p" / "9").write_bytes(bundle)
    assert any(k == "tile" and why in m for k, m in findings(tmp_path, log))


@pytest.mark.parametrize("entry, why", [
    (b"not json", "not JSON"),
    (b"[]", "not an object"),
    (b'{"kind":"adl-governor-log-entry/v1"}', "exactly the fields"),
    (b'{ "kind": 1 }', "exactly the fields"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 10000 + b"]" * 10000, "not JSON"),
])
def test_entries_that_are_not_statements(entry, why):
    with pytest.raises(ValueError, match=why):
        parse_entry(entry)


@pytest.mark.parametrize("change, why", [
    ({"kind": "other"}, "kind is not"),
    ({"record_sha256": "A" * 64}, "record_sha256"),
    ({"passport_digest": ""}, "passport_digest"),
    ({"session": 7}, "session"),
    ({"tier": "R9"}, "tier"),
    ({"window": {"start": "x"}}, "window"),
    ({"seq": -1}, "seq"),
    ({"seq": True}, "seq"),
    ({"seq": 1.5}, "seq"),
    ({"prev": "xyz"}, "prev"),
])
def test_entry_fields_of_the_wrong_type(change, why):
    good = json.loads(statement(AGENT_A, 0, None))
    with pytest.raises(ValueError, match=why):
        parse_entry(canonicalize({**good, **change}))


def test_an_entry_not_in_jcs_form():
    good = statement(AGENT_A, 0, None)
    with pytest.raises(ValueError, match="JCS"):
        parse_entry(json.dumps(json.loads(good), indent=1).encode())
    assert parse_entry(good)["seq"] == 0


def test_a_log_of_unparseable_entries_is_found_not_crashed(tmp_path):
    log = TestLog()
    log.grow(3)  # entries that are not statements at all
    log.write(tmp_path)
    found = findings(tmp_path, log)
    assert [k for k, _ in found] == ["entry"] * 3


@pytest.mark.parametrize("checkpoint", [b"", b"\xff" * 10, b"x" * 200_000, b"origin\n1\n\n"])
def test_hostile_checkpoints(tmp_path, checkpoint):
    log = two_agents()
    log.write(tmp_path)
    (tmp_path / "checkpoint").write_bytes(checkpoint)
    found = findings(tmp_path, log)
    assert [k for k, _ in found] == ["signature"]
