"""`governor keygen` and `governor verify` offline: files, exit codes 1/2/3, messages.

The did:web resolution over HTTPS (the only way to a VALID, exit 0) is tests/test_verify_did_web.py."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import yaml

from governor.cli import main
from governor.evidence import did_document, load_private_key, passport_digest, sign_record, write_record
from tests.conftest import REPO, shared_path
from tests.test_evidence_record import signed_record


@pytest.fixture
def keydir(tmp_path, capsys):
    assert main(["keygen", "--out", str(tmp_path / "keys"), "--id", "did:web:gov.example:governor"]) == 0
    capsys.readouterr()
    return tmp_path / "keys"


@pytest.fixture
def key(keydir):
    return load_private_key(keydir / "governor-key.pem")


def write(tmp_path, name, record):
    return str(write_record(tmp_path / name, record))


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- keygen -----------------------------------------------------------------------------


def test_keygen_writes_key_pair_and_did_document(tmp_path, capsys):
    out_dir = tmp_path / "k"
    code, out, _ = run(capsys, "keygen", "--out", str(out_dir))
    assert code == 0
    assert stat.S_IMODE((out_dir / "governor-key.pem").stat().st_mode) == 0o600
    assert (out_dir / "governor-pub.pem").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    document = json.loads((out_dir / "did.json").read_text())
    assert document["id"] == "did:web:localhost:governor"
    assert "identifier    did:web:localhost:governor" in out
    assert "https://localhost/governor/did.json" in out


def test_keygen_refuses_to_overwrite_without_force(tmp_path, capsys, keydir):
    before = (keydir / "governor-key.pem").read_bytes()
    code, _, err = run(capsys, "keygen", "--out", str(keydir))
    assert code == 2 and "already exists" in err and "--force" in err
    assert (keydir / "governor-key.pem").read_bytes() == before
    assert run(capsys, "keygen", "--out", str(keydir), "--force")[0] == 0
    assert (keydir / "governor-key.pem").read_bytes() != before


def test_keygen_rejects_a_bad_identifier(tmp_path, capsys):
    code, _, err = run(capsys, "keygen", "--out", str(tmp_path / "k"), "--id", "http://gov.example")
    assert code == 2 and "HTTPS URI or a did:web" in err
    assert not (tmp_path / "k" / "governor-key.pem").exists()


# --- verify -----------------------------------------------------------------------------


def test_valid_record(tmp_path, capsys, keydir, key):
    path = write(tmp_path, "r.json", signed_record(key, governor="did:web:gov.example:governor"))
    code, out, _ = run(capsys, "verify", path, "--did-document", str(keydir / "did.json"))
    # a local DID document is not a resolution, no passport, no nonce decision: not VALID
    assert code == 3
    assert "\nINCOMPLETE: not every step ran in full: 2 (governor key) partial, 4 (passport binding) skip, " \
        "5 (nonce) skip\n" in out
    assert "\nVALID" not in out
    assert "does NOT prove completeness" in out and "tamper-evidence" in out
    assert "freshness not shown" in out and "No passport was given" in out
    assert "PARTIAL  2 governor key" in out and "was not resolved" in out
    assert "SKIP     4 passport binding" in out and "PASS     6 hash chain" in out


def test_events_are_listed_one_a_line_and_hostile_text_is_escaped(tmp_path, capsys, keydir, key):
    events = [("on_tool_error", "continue", {"tool": "search", "message": "\x1b[2Jcleared" + "x" * 300}),
              ("on_budget_exhausted", "halt", {"dimension": "tokens", "observed": 1040, "limit": 1000})]
    path = write(tmp_path, "r.json", signed_record(key, events=events, governor="did:web:gov.example:governor"))
    code, out, _ = run(capsys, "verify", path, "--did-document", str(keydir / "did.json"), "--events")
    assert code == 3 and "INCOMPLETE" in out
    listed = out[out.index("Events (2)"):].splitlines()[1:]
    assert len(listed) == 2
    assert listed[0].split()[:4] == ["0", "2026-11-18T11:06:41.500Z", "on_tool_error", "continue"]
    assert "\x1b" not in out and "\\u001b[2J" in listed[0] and listed[0].endswith("...")
    assert listed[1].split()[2:4] == ["on_budget_exhausted", "halt"]
    assert listed[1].endswith('{"dimension":"tokens","limit":1000,"observed":1040}')


def test_pinned_key_and_nonce_with_ttl(tmp_path, capsys, keydir, key):
    path = write(tmp_path, "r.json", signed_record(key, nonce="c-1"))  # iat = START + 61
    issued = "2026-11-18T11:07:00Z"  # START + 20 s
    ok = run(capsys, "verify", path, "--offline", "--key", str(keydir / "governor-pub.pem"), "--nonce", "c-1",
             "--nonce-issued-at", issued, "--nonce-ttl", "60")
    assert ok[0] == 3 and "produced after your challenge" in ok[1] and "PASS     5 nonce" in ok[1]
    assert "INCOMPLETE: not every step ran in full: 2 (governor key) partial, 4 (passport binding) skip\n" in ok[1]
    assert "is not bound to did:web:governor.example:gov" in ok[1]
    no_ttl = run(capsys, "verify", path, "--offline", "--key", str(keydir / "governor-pub.pem"), "--nonce", "c-1")
    assert no_ttl[0] == 3 and "PARTIAL  5 nonce" in no_ttl[1] and "time to live was not checked" in no_ttl[1]
    expired = run(capsys, "verify", path, "--offline", "--key", str(keydir / "governor-pub.pem"), "--nonce", "c-1",
                  "--nonce-issued-at", issued, "--nonce-ttl", "30")
    assert expired[0] == 1 and "INVALID: step 5 (nonce)" in expired[1] and "after the nonce expired" in expired[1]
    early = run(capsys, "verify", path, "--offline", "--key", str(keydir / "governor-pub.pem"), "--nonce", "c-1",
                "--nonce-issued-at", "2026-11-18T11:08:00Z", "--nonce-ttl", "300")
    assert early[0] == 1 and "before the nonce was issued" in early[1]
    wrong = run(capsys, "verify", path, "--offline", "--key", str(keydir / "governor-pub.pem"), "--nonce", "c-2")
    assert wrong[0] == 1 and "is not the issued nonce 'c-2'" in wrong[1]


def test_tampered_record_names_the_first_failing_step(tmp_path, capsys, keydir, key):
    record = signed_record(key)
    edited = copy.deepcopy(record)
    edited["events"][2]["action"] = "continue"
    code, out, _ = run(capsys, "verify", write(tmp_path, "t.json", edited), "--offline", "--key", str(keydir / "governor-pub.pem"))
    assert code == 1
    assert "INVALID: step 3 (signature): Ed25519 signature does not verify" in out
    assert "FAIL     6 hash chain" in out and "event 2 was changed: its hash no longer matches event 3's prev_hash"  in out
    assert "not evidence of anything" in out


def test_resigned_record_with_broken_chain_fails_at_step_6(tmp_path, capsys, keydir, key):
    edited = copy.deepcopy(signed_record(key))
    edited["events"][1]["detail"]["message"] = "nothing happened"
    resigned = sign_record(edited, key)
    code, out, _ = run(capsys, "verify", write(tmp_path, "t.json", resigned), "--offline", "--key", str(keydir / "governor-pub.pem"))
    assert code == 1
    assert "INVALID: step 6 (hash chain): event 1 was changed: its hash no longer matches event 2's prev_hash" in out


def test_https_governor_resolved_through_its_did_web_document(tmp_path, capsys):
    out_dir = tmp_path / "k"
    code, out, _ = run(capsys, "keygen", "--out", str(out_dir), "--id", "https://gov.example/governor")
    assert code == 0 and "https://gov.example/governor/did.json" in out and "identifier    https://gov.example/governor" in out
    key = load_private_key(out_dir / "governor-key.pem")
    path = write(tmp_path, "r.json", signed_record(key, governor="https://gov.example/governor"))
    code, out, _ = run(capsys, "verify", path, "--did-document", str(out_dir / "did.json"))
    assert code == 3 and "https://gov.example/governor was not resolved: a local copy of its DID document names" in out


def test_did_document_for_another_governor(tmp_path, capsys, key):
    other = tmp_path / "other.json"
    other.write_text(json.dumps(did_document("did:web:other.example", key.public_key())))
    path = write(tmp_path, "r.json", signed_record(key))
    code, out, _ = run(capsys, "verify", path, "--did-document", str(other))
    assert code == 1 and "INVALID: step 2 (governor key): DID document is for did:web:other.example" in out


def test_passport_binding_json_and_yaml(tmp_path, capsys, keydir, key):
    passport_yaml = textwrap.dedent("""\
        adl_spec: "0.2.0"
        id: https://agents.example/agents/doc-helper
        name: doc-helper
        description: helps with documents
        version: 1.0.0
        data_classification: {sensitivity: internal}
        security:
          attestation: {type: self, issued_at: 2026-01-01T00:00:00Z}
    """)
    document = yaml.load(passport_yaml, Loader=yaml.BaseLoader)  # everything as text, as a reference
    assert document["security"]["attestation"]["issued_at"] == "2026-01-01T00:00:00Z"
    (tmp_path / "p.yaml").write_text(passport_yaml)
    from governor.evidence import load_passport

    digest = passport_digest(load_passport(tmp_path / "p.yaml"))
    assert load_passport(tmp_path / "p.yaml")["security"]["attestation"]["issued_at"] == "2026-01-01T00:00:00Z"
    (tmp_path / "p.json").write_text(json.dumps(load_passport(tmp_path / "p.yaml")))
    path = write(tmp_path, "r.json", signed_record(key, passport_digest=digest))
    pub = str(keydir / "governor-pub.pem")
    for passport in ("p.yaml", "p.json"):
        code, out, _ = run(capsys, "verify", path, "--offline", "--key", pub, "--passport", str(tmp_path / passport))
        assert code == 3 and "PASS     4 passport binding" in out
    (tmp_path / "p2.yaml").write_text(passport_yaml.replace("1.0.0", "1.0.1"))
    code, out, _ = run(capsys, "verify", path, "--offline", "--key", pub, "--passport", str(tmp_path / "p2.yaml"))
    assert code == 1 and "INVALID: step 4 (passport binding)" in out and "different passport version" in out


TRICKY_YAML = textwrap.dedent("""\
    adl_spec: "0.2.0"
    name: tricky
    description: YAML 1.1 would change these values
    version: 1.0.0
    data_classification: {sensitivity: internal}
    flags: [yes, no, on, off, y, n, True, false, ~, null]
    numbers: [0777, 0o17, 0x1F, 1_000, 1:20, 1e3, .5, +12, -0]
    times: [2026-01-01T00:00:00Z, 2026-01-01, "12:30"]
""")


def test_passport_is_read_exactly_as_the_passport_room_reads_it(tmp_path):
    """Step 4 compares digests: the verifier must load YAML to the governor's very value."""
    from governor.evidence import load_passport
    from governor.passport.loader import load_passport as passport_room_load

    (tmp_path / "p.yaml").write_text(TRICKY_YAML)
    ours = load_passport(tmp_path / "p.yaml")
    assert ours == passport_room_load(tmp_path / "p.yaml")
    assert ours["flags"][:4] == ["yes", "no", "on", "off"] and ours["numbers"][0] == 777
    assert ours["times"][0] == "2026-01-01T00:00:00Z" and ours["numbers"][4] == "1:20"
    from governor.passport.pin import passport_digest as pinned_digest

    example = shared_path("adl", "examples", "production.yaml")
    assert passport_digest(load_passport(example)) == pinned_digest(passport_room_load(example))
    assert passport_digest(ours) == pinned_digest(passport_room_load(tmp_path / "p.yaml"))
    (tmp_path / "dup.yaml").write_text("a: 1\na: 2\n")
    from governor.evidence import InputError

    with pytest.raises(InputError, match="duplicate key"):
        load_passport(tmp_path / "dup.yaml")


def test_passport_digest_of_an_official_example(tmp_path, capsys, keydir, key):
    example = shared_path("adl", "examples", "production.yaml")
    from governor.evidence import load_passport

    document = load_passport(example)
    path = write(tmp_path, "r.json", signed_record(key, subject_id=document["id"], passport_digest=passport_digest(document)))
    code, out, _ = run(capsys, "verify", path, "--offline", "--key", str(keydir / "governor-pub.pem"),
                       "--passport", str(example), "--no-nonce")
    assert code == 3 and "PASS     4 passport binding" in out
    assert "INCOMPLETE: not every step ran in full: 2 (governor key) partial\n" in out


def test_json_report(tmp_path, capsys, keydir, key):
    edited = signed_record(key)
    edited["outcome"] = "completed"
    code, out, _ = run(capsys, "verify", write(tmp_path, "r.json", edited), "--offline", "--key", str(keydir / "governor-pub.pem"), "--json")
    report = json.loads(out)
    assert code == 1 and report["valid"] is False and report["verdict"] == "INVALID"
    assert report["first_failure"]["step"] == 3 and report["first_failure"]["name"] == "signature"
    assert [s["status"] for s in report["steps"]] == ["pass", "partial", "fail", "skip", "skip", "fail"]
    assert report["steps"][5]["message"].startswith("the record header was changed: its hash no longer matches")


@pytest.mark.parametrize("case", ["missing", "not-json", "duplicate-member", "not-an-object", "no-key", "bad-key", "bad-ttl-args", "bad-issued-at"])
def test_usage_and_input_errors_exit_2(tmp_path, capsys, keydir, key, case):
    good = write(tmp_path, "r.json", signed_record(key))
    pub = str(keydir / "governor-pub.pem")
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "dup.json").write_text('{"session": "a", "session": "b"}')
    (tmp_path / "list.json").write_text('[{"session": "a"}]')
    (tmp_path / "bad.pem").write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    argv = {
        "missing": ["verify", str(tmp_path / "nope.json"), "--offline", "--key", pub],
        "not-json": ["verify", str(tmp_path / "junk.json"), "--offline", "--key", pub],
        "duplicate-member": ["verify", str(tmp_path / "dup.json"), "--offline", "--key", pub],
        "not-an-object": ["verify", str(tmp_path / "list.json"), "--offline", "--key", pub],
        "no-key": ["verify", good, "--offline"],
        "bad-key": ["verify", good, "--offline", "--key", str(tmp_path / "bad.pem")],
        "bad-ttl-args": ["verify", good, "--offline", "--key", pub, "--nonce-ttl", "5"],
        "bad-issued-at": ["verify", good, "--offline", "--key", pub, "--nonce", "n", "--nonce-issued-at", "noon", "--nonce-ttl", "5"],
    }[case]
    code, out, err = run(capsys, *argv)
    assert code == 2 and err.startswith("governor verify: ") and "Traceback" not in err
    expected = {"missing": "cannot read", "not-json": "invalid JSON", "duplicate-member": "duplicate key 'session'",
                "not-an-object": "a record must be a JSON object",
                "no-key": "--offline needs a governor key", "bad-key": "not a PEM public key", "bad-ttl-args": "go together",
                "bad-issued-at": "ISO 8601"}[case]
    assert expected in err


def test_verify_runs_in_a_fresh_interpreter_without_proxy_or_policy(tmp_path, keydir, key):
    path = write(tmp_path, "r.json", signed_record(key))
    script = textwrap.dedent(f"""
        import sys
        from governor.cli.evidence import register
        import argparse
        parser = argparse.ArgumentParser(); register(parser.add_subparsers())
        args = parser.parse_args(["verify", {path!r}, "--offline", "--key", {str(keydir / 'governor-pub.pem')!r}])
        code = args.func(args)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("mitmproxy", "aiohttp", "orjson")
                       or m.startswith(("governor.proxy", "governor.policy", "governor.passport", "governor.store")))
        print("LOADED", heavy)
        sys.exit(code)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "LOADED []" in done.stdout and "INCOMPLETE" in done.stdout
