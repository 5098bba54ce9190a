"""The governor key and its DID document (Runtime §8.2)."""

from __future__ import annotations

import base64
import json
import stat

import pytest

from governor.evidence import (
    DEFAULT_IDENTIFIER,
    DidDocumentError,
    KeyFileError,
    assertion_keys,
    did_document,
    ensure_governor_key,
    generate_key,
    load_private_key,
    load_public_key,
    public_key_from_did_document,
    write_key_files,
)
from governor.evidence.keys import (
    check_identifier,
    did_web_document_url,
    did_web_for_https,
    identifiers_match,
    public_key_bytes,
)
from tests.conftest import shared_path


def raw(key) -> bytes:
    return public_key_bytes(key)


def test_did_document_round_trips_through_every_encoding_it_carries():
    key = generate_key()
    document = did_document("did:web:gov.example", key.public_key())
    method = document["verificationMethod"][0]
    assert document["assertionMethod"] == [method["id"]] == ["did:web:gov.example#key-1"]
    assert method["type"] == "Ed25519VerificationKey2020" and method["publicKeyMultibase"].startswith("z6Mk")
    assert base64.b64decode(method["publicKeyBase64"]) == raw(key)
    assert raw(public_key_from_did_document(document, "did:web:gov.example")) == raw(key)
    for only in ("publicKeyMultibase", "publicKeyBase64"):
        slim = json.loads(json.dumps(document))
        slim["verificationMethod"][0] = {k: v for k, v in method.items()
                                          if k not in ("publicKeyMultibase", "publicKeyBase64") or k == only}
        assert raw(public_key_from_did_document(slim)) == raw(key)


def test_jwk_and_relative_and_embedded_assertion_methods():
    key = generate_key()
    x = base64.urlsafe_b64encode(raw(key)).rstrip(b"=").decode()
    document = {
        "id": "did:web:gov.example",
        "verificationMethod": [{"id": "#k", "type": "JsonWebKey2020", "publicKeyJwk": {"kty": "OKP", "crv": "Ed25519", "x": x}}],
        "assertionMethod": ["#k"],
    }
    assert raw(public_key_from_did_document(document)) == raw(key)
    embedded = {"id": "did:web:gov.example", "assertionMethod": [document["verificationMethod"][0]]}
    assert raw(public_key_from_did_document(embedded)) == raw(key)


def test_did_documents_in_the_adl_vectors_resolve_to_the_test_keys():
    vector = json.loads(shared_path("adl", "verify-vectors", "vectors", "002-valid-did-resolved-cross-checked.json").read_text())
    keys = json.loads(shared_path("adl", "verify-vectors", "test-keys.json").read_text())
    (document,) = [r["body"] for r in vector["input"]["did_resolution_responses"].values()]
    key = public_key_from_did_document(document, "https://test.example/agents/personal-assistant")
    assert raw(key) == base64.b64decode(keys["consumer"]["public_key"])
    empty = json.loads(shared_path("adl", "verify-vectors", "vectors", "021-did-document-no-assertion-method.json").read_text())
    (document,) = [r["body"] for r in empty["input"]["did_resolution_responses"].values()]
    with pytest.raises(DidDocumentError, match="no Ed25519 key"):
        assertion_keys(document)


def test_document_for_another_identifier_is_refused():
    document = did_document("did:web:gov.example", generate_key().public_key())
    with pytest.raises(DidDocumentError, match="not for did:web:other.example"):
        assertion_keys(document, "did:web:other.example")
    with pytest.raises(DidDocumentError, match="no id"):
        assertion_keys({"assertionMethod": []})


def test_https_identifier_is_published_under_its_did_web():
    key = generate_key()
    document = did_document("https://gov.example:8443/governor", key.public_key())
    assert document["id"] == "did:web:gov.example%3A8443:governor"
    assert document["alsoKnownAs"] == ["https://gov.example:8443/governor"]
    assert document["assertionMethod"] == ["did:web:gov.example%3A8443:governor#key-1"]
    assert raw(public_key_from_did_document(document, "https://gov.example:8443/governor")) == raw(key)
    with pytest.raises(DidDocumentError):
        assertion_keys(document, "https://gov.example/governor")  # same host, another port


def test_identifiers():
    assert did_web_for_https("https://gov.example/a/b") == "did:web:gov.example:a:b"
    assert did_web_for_https("https://gov.example:8443/g") == "did:web:gov.example%3A8443:g"
    assert did_web_document_url("did:web:gov.example") == "https://gov.example/.well-known/did.json"
    assert did_web_document_url("did:web:gov.example%3A8443:a:b") == "https://gov.example:8443/a/b/did.json"
    assert identifiers_match("did:web:gov.example:g", "https://gov.example/g")
    assert not identifiers_match("did:web:evil.example:g", "https://gov.example/g")
    for good in (DEFAULT_IDENTIFIER, "https://gov.example/governor", "did:web:gov.example"):
        assert check_identifier(good) == good
    for bad in ("http://gov.example", "did:key:z6Mk", "did:web:", "https://", "did:web:a b", "https://g.example/#f",
                "https://g.example/?q=1", "https://user@g.example/"):
        with pytest.raises(ValueError):
            check_identifier(bad)


def test_key_files(tmp_path):
    files = write_key_files(tmp_path / "keys", "did:web:gov.example")
    assert stat.S_IMODE(files.private_key.stat().st_mode) == 0o600
    key = load_private_key(files.private_key)
    assert raw(load_public_key(files.public_key)) == raw(key)
    assert raw(public_key_from_did_document(json.loads(files.did_document.read_text()))) == raw(key)
    with pytest.raises(FileExistsError):
        write_key_files(tmp_path / "keys", "did:web:gov.example")
    assert raw(load_private_key(files.private_key)) == raw(key)  # untouched
    write_key_files(tmp_path / "keys", "did:web:gov.example", force=True)
    assert raw(load_private_key(files.private_key)) != raw(key)
    assert stat.S_IMODE(files.private_key.stat().st_mode) == 0o600


def test_bad_key_files(tmp_path):
    with pytest.raises(KeyFileError, match="cannot read"):
        load_private_key(tmp_path / "missing.pem")
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        load_public_key(tmp_path / "junk.pem")
    files = write_key_files(tmp_path / "k", DEFAULT_IDENTIFIER)
    with pytest.raises(KeyFileError):
        load_public_key(files.private_key)  # a private key where a public one is expected


def test_ensure_governor_key_creates_once_then_reuses(tmp_path):
    key, identifier = ensure_governor_key(tmp_path)
    assert identifier == DEFAULT_IDENTIFIER
    assert stat.S_IMODE((tmp_path / "keys" / "governor-key.pem").stat().st_mode) == 0o600
    again, identifier_again = ensure_governor_key(tmp_path)
    assert raw(again) == raw(key) and identifier_again == identifier
    renamed, new_id = ensure_governor_key(tmp_path, "https://gov.example/governor")
    assert raw(renamed) == raw(key) and new_id == "https://gov.example/governor"
    document = json.loads((tmp_path / "keys" / "did.json").read_text())
    assert document["id"] == "did:web:gov.example:governor" and document["alsoKnownAs"] == [new_id]
    assert ensure_governor_key(tmp_path)[1] == new_id  # remembered through the DID document


def test_ensure_governor_key_refuses_mismatched_files(tmp_path):
    ensure_governor_key(tmp_path)
    other = generate_key()
    from governor.evidence.keys import public_key_pem

    (tmp_path / "keys" / "governor-pub.pem").write_bytes(public_key_pem(other))
    with pytest.raises(KeyFileError, match="does not match"):
        ensure_governor_key(tmp_path)
