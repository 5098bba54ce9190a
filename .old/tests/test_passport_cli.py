"""`governor passport verify|digest|sign`, through governor.cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from governor.cli import main
from governor.passport import dump_passport, example_passport_path, load_passport, passport_digest

EXAMPLE = example_passport_path()
KEY = EXAMPLE.with_name("example-passport.key.pem")
CLOCK = ["--now", "2026-12-01T00:00:00Z"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_verify_admits_the_example(capsys):
    code, out, _ = run(capsys, "passport", "verify", str(EXAMPLE), *CLOCK)
    assert code == 0
    assert "ADMITTED with 2 warnings; public key source: inline_only" in out
    assert "ok   1.1.5 signature" in out
    assert f"digest: {passport_digest(load_passport(EXAMPLE))}" in out


def test_verify_json_report(capsys):
    code, out, _ = run(capsys, "passport", "verify", str(EXAMPLE), "--json", "--strict", "--require-signature", *CLOCK)
    report = json.loads(out)
    assert code == 0 and report["verified"] is True
    assert [step["section"] for step in report["steps"]] == [f"1.1.{n}" for n in range(1, 10)]
    assert report["digest"] == passport_digest(load_passport(EXAMPLE))


def test_verify_rejects_with_exit_1_and_lists_every_problem(capsys, tmp_path: Path):
    document = load_passport(EXAMPLE)
    document["permissions"]["resource_limits"]["budget"]["tokens"]["per_session"] = 19999  # after signing
    del document["version"]
    document["surprise"] = True
    changed = tmp_path / "changed.json"
    changed.write_bytes(dump_passport(document, "json"))
    code, out, _ = run(capsys, "passport", "verify", str(changed), "--strict", *CLOCK)
    assert code == 1
    assert "REJECTED at 1.1.2" in out
    assert "$.version: required member is missing" in out
    assert "$.surprise: unknown top-level member (strict mode)" in out
    document["version"] = "1.0.0"
    del document["surprise"]
    changed.write_bytes(dump_passport(document, "json"))
    code, out, _ = run(capsys, "passport", "verify", str(changed), *CLOCK)
    assert code == 1 and "FAIL 1.1.5 signature" in out and "REJECTED at 1.1.5" in out


def test_verify_options(capsys, tmp_path: Path):
    code, out, _ = run(capsys, "passport", "verify", str(EXAMPLE), "--require-did", *CLOCK)
    assert code == 1 and "REJECTED at 1.1.3" in out
    code, out, _ = run(capsys, "passport", "verify", str(EXAMPLE), "--provider-allowlist", "other.org, *.other.org", *CLOCK)
    assert code == 1 and "not on the provider allowlist" in out
    code, _, _ = run(capsys, "passport", "verify", str(EXAMPLE), "--provider-allowlist", "example.com", *CLOCK)
    assert code == 0
    code, out, _ = run(capsys, "passport", "verify", str(EXAMPLE), "--now", "2028-11-22T00:00:00Z")
    assert code == 1 and "REJECTED at 1.1.6" in out
    # the example's DID resolved from a local document: the key is cross-checked
    document = load_passport(EXAMPLE)
    did = document["cryptographic_identity"]["did"]
    did_document = {"id": did, "verificationMethod": [{"id": f"{did}#k", "type": "Ed25519VerificationKey2020",
                    "publicKeyBase64": document["cryptographic_identity"]["public_key"]["value"]}],
                    "assertionMethod": [f"{did}#k"]}
    (tmp_path / "did.json").write_text(json.dumps(did_document))
    code, out, _ = run(capsys, "passport", "verify", str(EXAMPLE), "--did-documents", str(tmp_path),
                       "--require-did", "--no-tofu", *CLOCK)
    assert code == 0 and "public key source: cross_checked" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ('{"name": ', "invalid JSON at line 1"),
        ("a: [\n", "invalid YAML"),
        ("- just\n- a list\n", "must be a JSON object"),
    ],
)
def test_unreadable_input_exits_2_without_traceback(capsys, tmp_path: Path, content: str | None, message: str):
    path = tmp_path / ("p.json" if content and content.startswith("{") else "p.yaml")
    if content is not None:
        path.write_text(content)
    for command in ("verify", "digest"):
        code, out, err = run(capsys, "passport", command, str(path))
        assert code == 2 and out == ""
        assert err.startswith("governor passport: ") and message in err and "Traceback" not in err


def test_usage_errors_exit_2(capsys, tmp_path: Path):
    code, _, err = run(capsys, "passport", "verify", str(EXAMPLE), "--now", "tomorrow")
    assert code == 2 and "not an RFC 3339 date-time" in err
    code, _, err = run(capsys, "passport", "verify", str(EXAMPLE), "--did-documents", str(tmp_path / "none.json"))
    assert code == 2 and "cannot read" in err
    with pytest.raises(SystemExit) as caught:  # argparse: missing --key
        main(["passport", "sign", str(EXAMPLE)])
    assert caught.value.code == 2


def test_digest(capsys, tmp_path: Path):
    code, out, _ = run(capsys, "passport", "digest", str(EXAMPLE))
    assert code == 0 and out.strip() == passport_digest(load_passport(EXAMPLE))
    as_json = tmp_path / "p.json"
    as_json.write_bytes(dump_passport(load_passport(EXAMPLE), "json"))
    assert run(capsys, "passport", "digest", str(as_json))[1] == out


def test_sign_round_trip(capsys, tmp_path: Path):
    document = load_passport(EXAMPLE)
    document["permissions"]["resource_limits"]["budget"]["tokens"]["per_session"] = 5000
    edited = tmp_path / "edited.yaml"
    edited.write_bytes(dump_passport(document, "yaml"))
    code, out, _ = run(capsys, "passport", "verify", str(edited), *CLOCK)
    assert code == 1  # the edit broke the signature
    out_yaml = tmp_path / "signed.yaml"
    code, _, err = run(capsys, "passport", "sign", str(edited), "--key", str(KEY), "-o", str(out_yaml))
    assert code == 0 and "signed" in err
    assert run(capsys, "passport", "verify", str(out_yaml), "--require-signature", *CLOCK)[0] == 0
    assert load_passport(out_yaml)["permissions"]["resource_limits"]["budget"]["tokens"]["per_session"] == 5000

    code, out, _ = run(capsys, "passport", "sign", str(edited), "--key", str(KEY), "--signed-content", "digest")
    assert code == 0
    signed = json.loads(out)  # JSON on stdout by default
    assert signed["security"]["attestation"]["signature"]["signed_content"] == "digest"
    as_json = tmp_path / "signed.json"
    as_json.write_text(out)
    assert run(capsys, "passport", "verify", str(as_json), *CLOCK)[0] == 0


def test_sign_refuses_a_key_that_is_not_the_passports(capsys, tmp_path: Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    other = tmp_path / "other.pem"
    other.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    code, out, err = run(capsys, "passport", "sign", str(EXAMPLE), "--key", str(other))
    assert code == 2 and out == "" and "does not match cryptographic_identity.public_key" in err
    not_a_key = tmp_path / "junk.pem"
    not_a_key.write_text("junk")
    code, _, err = run(capsys, "passport", "sign", str(EXAMPLE), "--key", str(not_a_key))
    assert code == 2 and "cannot read the private key PEM" in err
