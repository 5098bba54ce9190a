"""`governor verify` resolving the record's did:web over real HTTPS (§8.2, §8.6 step 2).

A loopback HTTPS server with a test CA serves DID documents; the verifier trusts only
the CA bundle it is given. Happy: the one VALID verdict (exit 0), all six steps run in
full. Hostile: a document with the wrong key, a redirect, an oversize or malformed
document, a host that never answers, a certificate from another CA, a 404.
"""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from governor.cli import main
from governor.evidence import did_document, generate_key, load_passport, passport_digest, write_record
from tests.conftest import shared_path
from tests.test_evidence_record import signed_record
from tests.upstreams import make_tls

SLOW_SEC = 5.0  # the slow host's delay; the verifier gives up after --resolve-timeout 0.5


class _Handler(http.server.BaseHTTPRequestHandler):
    documents: dict[str, bytes] = {}

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        case = self.path.strip("/").split("/")[0]
        if case == "redirect":
            self.send_response(302)
            self.send_header("Location", "/good/did.json")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if case == "slow":
            time.sleep(SLOW_SEC)
        body = self.server.documents.get(case)  # type: ignore[attr-defined]
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/did+json")
        if case != "big":  # the oversize document comes without a length: the reader must count
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass


@pytest.fixture
def served(tmp_path):
    tls = make_tls(tmp_path / "tls", "didweb")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.socket = tls.server_context().wrap_socket(server.socket, server_side=True)
    host = f"127.0.0.1%3A{server.server_address[1]}"
    key, other = generate_key(), generate_key()

    def did(case: str) -> str:
        return f"did:web:{host}:{case}"

    server.documents = {
        "good": json.dumps(did_document(did("good"), key.public_key())).encode(),
        "slow": json.dumps(did_document(did("slow"), key.public_key())).encode(),
        "wrongkey": json.dumps(did_document(did("wrongkey"), other.public_key())).encode(),
        "big": json.dumps({**did_document(did("big"), key.public_key()), "pad": "x" * 200_000}).encode(),
        "malformed": b'{"id": "did:web:x", "id": "twice"',
    }
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield did, key, other, tls
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _record(tmp_path, key, governor):
    """A record, its admitted passport, and the nonce arguments that make every step run."""
    example = shared_path("adl", "examples", "production.yaml")
    passport = load_passport(example)
    record = signed_record(key, governor=governor, nonce="c-1", subject_id=passport["id"],
                           passport_digest=passport_digest(passport))
    path = write_record(tmp_path / "r.json", record)
    full = ["--passport", example, "--nonce", "c-1", "--nonce-issued-at", "2026-11-18T11:07:00Z", "--nonce-ttl", "60"]
    return path, full


def test_resolved_over_https_with_every_step_is_valid(tmp_path, capsys, served):
    did, key, _, tls = served
    path, full = _record(tmp_path, key, did("good"))
    code, out, _ = run(capsys, "verify", path, "--ca-bundle", tls.ca_file, *full)
    assert code == 0, out
    assert "\nVALID\n" in out and "INCOMPLETE" not in out
    assert f"{did('good')} resolved over HTTPS to its DID document" in out
    assert out.count("PASS ") == 6
    # the same record, a step left out each time: never VALID
    assert run(capsys, "verify", path, "--ca-bundle", tls.ca_file, *full[2:])[0] == 3  # no passport
    assert run(capsys, "verify", path, "--ca-bundle", tls.ca_file, *full[:4])[0] == 3  # nonce TTL not checked
    assert run(capsys, "verify", path, "--ca-bundle", tls.ca_file, *full[:2])[0] == 3  # no nonce decision
    code, out, _ = run(capsys, "verify", path, "--ca-bundle", tls.ca_file, *full[:2], "--no-nonce")
    assert code == 0 and "freshness not shown" in out
    code, out, _ = run(capsys, "verify", path, "--offline", "--did-document",
                       tmp_path / "nothing.json", *full)
    assert code == 2  # a missing local document is an input error


def test_offline_says_it_did_not_resolve(tmp_path, capsys, served):
    did, key, _, tls = served
    path, full = _record(tmp_path, key, did("good"))
    (tmp_path / "pub.pem").write_bytes(__import__("governor.evidence.keys", fromlist=["x"]).public_key_pem(key))
    code, out, _ = run(capsys, "verify", path, "--offline", "--key", tmp_path / "pub.pem", *full)
    assert code == 3
    assert "INCOMPLETE: not every step ran in full: 2 (governor key) partial\n" in out
    assert f"is not bound to {did('good')} (the identifier was not resolved" in out
    # --key with resolution: bound, because the resolved document names it
    code, out, _ = run(capsys, "verify", path, "--key", tmp_path / "pub.pem", "--ca-bundle", tls.ca_file, *full)
    assert code == 0 and "\nVALID\n" in out


def test_a_key_the_did_document_does_not_name_is_refused(tmp_path, capsys, served):
    did, key, other, tls = served
    path, full = _record(tmp_path, key, did("wrongkey"))
    code, out, _ = run(capsys, "verify", path, "--ca-bundle", tls.ca_file, *full)
    assert code == 1 and "INVALID: step 3 (signature): Ed25519 signature does not verify" in out
    (tmp_path / "pub.pem").write_bytes(__import__("governor.evidence.keys", fromlist=["x"]).public_key_pem(key))
    code, out, _ = run(capsys, "verify", path, "--key", tmp_path / "pub.pem", "--ca-bundle", tls.ca_file, *full)
    assert code == 1 and f"INVALID: step 2 (governor key): the given key" in out
    assert f"is not in {did('wrongkey')}'s DID document" in out


@pytest.mark.parametrize("case, expected", [
    ("redirect", "/good/did.json: redirects are not followed"),
    ("big", "over the 65536-byte limit"),
    ("malformed", "did.json: "),
    ("slow", "cannot fetch"),
    ("missing", "answered 404"),
])
def test_hostile_did_hosts_are_refused_with_a_reason(tmp_path, capsys, served, case, expected):
    did, key, _, tls = served
    path, full = _record(tmp_path, key, did(case))
    started = time.monotonic()
    code, out, err = run(capsys, "verify", path, "--ca-bundle", tls.ca_file, "--resolve-timeout", "0.5", *full)
    assert time.monotonic() - started < SLOW_SEC - 1  # the slow host did not hold the verifier
    assert code == 1 and "Traceback" not in out + err, out + err
    assert f"INVALID: step 2 (governor key): {did(case)} did not resolve: " in out
    assert expected in out
    assert "SKIP     3 signature" in out


def test_a_certificate_from_another_ca_is_refused(tmp_path, capsys, served):
    did, key, _, _ = served
    path, full = _record(tmp_path, key, did("good"))
    stranger = make_tls(tmp_path / "other-ca", "stranger")
    code, out, _ = run(capsys, "verify", path, "--ca-bundle", stranger.ca_file, *full)
    assert code == 1 and "did not resolve" in out and "CERTIFICATE_VERIFY_FAILED" in out
    # and the system's store does not know the test CA either
    code, out, _ = run(capsys, "verify", path, *full)
    assert code == 1 and "CERTIFICATE_VERIFY_FAILED" in out


def test_resolver_arguments_are_checked(tmp_path, capsys, served):
    did, key, _, tls = served
    path, full = _record(tmp_path, key, did("good"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    code, _, err = run(capsys, "verify", path, "--ca-bundle", tmp_path / "junk.pem", *full)
    assert code == 2 and "--ca-bundle" in err
    code, _, err = run(capsys, "verify", path, "--offline", "--ca-bundle", tls.ca_file, "--key", tls.ca_file, *full)
    assert code == 2 and "--ca-bundle is for the did:web fetch" in err
    code, _, err = run(capsys, "verify", path, "--resolve-timeout", "0", *full)
    assert code == 2 and "--resolve-timeout" in err
