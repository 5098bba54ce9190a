"""Admission (Trust §1.1) beyond the official vectors: errors, keys, algorithms, DIDs, config."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from governor.common.canonical import b64url
from governor.passport import (
    AdmissionConfig,
    Retrieval,
    SigningError,
    admit,
    example_passport_path,
    load_did_documents,
    load_passport,
    sign_passport,
)
from governor.passport.did import did_web_url
from governor.passport.errors import PassportKeyError
from governor.passport.signature import signed_bytes

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
DID = "did:web:agents.test:agents:t"
DID_URL = "https://agents.test/agents/t/did.json"


def config(**overrides: Any) -> AdmissionConfig:
    return AdmissionConfig(now=NOW, **overrides)


def base_document() -> dict[str, Any]:
    return {
        "adl_spec": "0.4.0",
        "name": "Test Agent",
        "description": "Agent for admission tests",
        "version": "1.0.0",
        "id": "https://agents.test/agents/t",
        "data_classification": {"sensitivity": "internal"},
        "lifecycle": {"status": "active"},
        "provider": {"name": "Test", "url": "https://agents.test"},
        "security": {"attestation": {"type": "self", "issued_at": "2026-11-01T00:00:00Z",
                                     "expires_at": "2027-11-01T00:00:00Z"}},
    }


def spki(public_key: Any) -> str:
    return base64.b64encode(
        public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    ).decode()


def raw_b64(key: ed25519.Ed25519PrivateKey) -> str:
    return base64.b64encode(key.public_key().public_bytes_raw()).decode()


def raw_sign(private_key: Any, algorithm: str, message: bytes) -> bytes:
    if algorithm in ("Ed25519", "Ed448"):
        return private_key.sign(message)
    if algorithm.startswith("ES"):
        hash_cls = {"ES256": hashes.SHA256, "ES384": hashes.SHA384, "ES512": hashes.SHA512}[algorithm]
        r, s = decode_dss_signature(private_key.sign(message, ec.ECDSA(hash_cls())))
        size = (private_key.curve.key_size + 7) // 8
        return r.to_bytes(size, "big") + s.to_bytes(size, "big")  # JWS r||s
    if algorithm == "RS256":
        return private_key.sign(message, padding.PKCS1v15(), hashes.SHA256())
    if algorithm == "PS256":
        return private_key.sign(message, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
    raise AssertionError(algorithm)


def signed(document: dict[str, Any], private_key: Any, algorithm: str, *, public_value: str | None,
           signed_content: str = "canonical") -> dict[str, Any]:
    """Sign like an ADL author would, for any algorithm (the library signs Ed25519 only)."""
    document = copy.deepcopy(document)
    if public_value is not None:
        document.setdefault("cryptographic_identity", {})["public_key"] = {"algorithm": algorithm, "value": public_value}
    attestation = document.setdefault("security", {}).setdefault("attestation", {"type": "self"})
    attestation.pop("signature", None)
    message = signed_bytes(document)
    signature: dict[str, Any] = {"algorithm": algorithm, "signed_content": signed_content}
    if signed_content == "digest":
        message = hashlib.sha256(message).digest()
        signature.update(digest_algorithm="sha-256", digest_value=b64url(message))
    signature["value"] = b64url(raw_sign(private_key, algorithm, message))
    attestation["signature"] = signature
    return document


@pytest.fixture(scope="module")
def ed_key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


def outcome(report, section: str) -> tuple[bool, str]:
    step = report.step(section)
    return step.passed, step.severity


# --- the example passport ----------------------------------------------------------------


def test_example_passport_is_admitted_in_the_default_config():
    document = load_passport(example_passport_path())
    report = admit(document, config())
    assert report.verified, report.to_dict()
    assert report.public_key_source == "inline_only"
    assert outcome(report, "1.1.4") == (True, "warn")  # trust on first use is a warning
    assert outcome(report, "1.1.5") == (True, "block")
    assert report.pinned.digest == report.digest
    strictest = admit(document, config(strict=True, require_signature=True))
    assert strictest.verified, strictest.to_dict()


# --- 1.1.2: every problem, with its path ------------------------------------------------------


def test_a_passport_with_many_errors_reports_them_all_with_paths():
    document = base_document()
    del document["description"]  # 1
    document["version"] = "one"  # 2
    document["data_classification"]["sensitivity"] = "secret"  # 3
    document["lifecycle"]["status"] = "paused"  # 4
    document["permissions"] = {
        "resource_limits": {"max_concurrent": 0,  # 5
                            "budget": {"tokens": {"per_session": -5}}},  # 6
        "sub_agents": [{"tools": ["x"]}],  # 7 (name missing)
    }
    document["runtime"] = {
        "degradation": {"on_budget_exhausted": {"action": "explode"}},  # 8
        "tool_invocation": {"loop_detection": {"window": 1}},  # 9
    }
    document["tools"] = [{"name": "Search", "description": "s"}]  # 10
    report = admit(document, config())
    assert report.blocked_at_section == "1.1.2"
    step = report.step("1.1.2")
    assert step.message == "10 problems against the ADL schema"
    assert [issue.path for issue in step.issues] == [
        "$.data_classification.sensitivity",
        "$.description",
        "$.lifecycle.status",
        "$.permissions.resource_limits.budget.tokens.per_session",
        "$.permissions.resource_limits.max_concurrent",
        "$.permissions.sub_agents[0].name",
        "$.runtime.degradation.on_budget_exhausted.action",
        "$.runtime.tool_invocation.loop_detection.window",
        "$.tools[0].name",
        "$.version",
    ]
    messages = {issue.path: issue.message for issue in step.issues}
    assert messages["$.description"] == "required member is missing"
    assert '"secret" is not one of "public", "internal", "confidential", "restricted"' in messages[
        "$.data_classification.sensitivity"]
    json.dumps(report.to_dict())


def test_incoherent_limits_are_schema_problems():
    document = base_document()
    document["tools"] = [{"name": "search", "description": "s"}, {"name": "search", "description": "again"}]
    document["permissions"] = {
        "resource_limits": {"budget": {"tokens": {"per_session": 500, "per_day": 100}}},
        "sub_agents": [
            {"name": "a", "tools": ["search", "mail"], "budget_share": {"cost_usd": {"per_session": 2, "per_day": 1}}},
            {"name": "a"},
        ],
    }
    document["anomaly_baseline"] = {"cost_per_session_usd": {"min": 2, "max": 1}}
    report = admit(document, config())
    assert [str(issue) for issue in report.step("1.1.2").issues] == [
        "$.anomaly_baseline.cost_per_session_usd: min is greater than max",
        "$.permissions.resource_limits.budget.tokens: per_session is greater than per_day",
        "$.permissions.sub_agents[0].budget_share.cost_usd: per_session is greater than per_day",
        "$.permissions.sub_agents[0].tools[1]: 'mail' is not one of the agent's tools",
        "$.permissions.sub_agents[1].name: duplicate sub-agent name 'a'",
        "$.tools[1].name: duplicate tool name 'search'",
    ]


def test_admit_never_raises_on_garbage():
    for garbage in ([1, 2], "text", None, {"a": float("nan")}, {"name": object()}):
        report = admit(garbage, config())
        assert not report.verified and report.blocked_at_section == "1.1.2"
    assert admit({"a": float("nan")}, config()).digest is None


# --- 1.1.4 / 1.1.5: keys and signatures --------------------------------------------------------


def test_ed25519_raw_key_canonical_signature(ed_key):
    document = signed(base_document(), ed_key, "Ed25519", public_value=raw_b64(ed_key))
    report = admit(document, config(require_signature=True))
    assert report.verified and outcome(report, "1.1.5") == (True, "block")


def test_spki_der_public_key_is_accepted(ed_key):
    value = spki(ed_key.public_key())
    assert base64.b64decode(value)[:12].hex() == "302a300506032b6570032100"  # the spec example's prefix
    document = signed(base_document(), ed_key, "Ed25519", public_value=value)
    report = admit(document, config(require_signature=True))
    assert report.verified, report.to_dict()


def test_digest_signed_content_is_accepted_and_checked(ed_key):
    document = sign_passport(base_document(), ed_key, signed_content="digest")
    signature = document["security"]["attestation"]["signature"]
    assert signature["signed_content"] == "digest" and signature["digest_algorithm"] == "sha-256"
    assert signature["digest_value"] == b64url(hashlib.sha256(signed_bytes(document)).digest())
    report = admit(document, config(require_signature=True))
    assert report.verified, report.to_dict()
    assert "SHA-256 digest" in report.step("1.1.5").message

    changed = copy.deepcopy(document)
    changed["description"] = "something else"
    report = admit(changed, config())
    assert report.blocked_at_section == "1.1.5"
    assert "digest_value is not the sha-256 of the signed bytes" in report.step("1.1.5").message

    odd = copy.deepcopy(document)
    odd["security"]["attestation"]["signature"]["digest_algorithm"] = "md5"
    assert "digest_algorithm 'md5' is not supported" in admit(odd, config()).step("1.1.5").message


def test_tampered_passport_or_signature_is_rejected(ed_key):
    document = sign_passport(base_document(), ed_key)
    tampered = copy.deepcopy(document)
    tampered["data_classification"]["sensitivity"] = "public"
    report = admit(tampered, config())
    assert report.blocked_at_section == "1.1.5" and report.pinned is None
    assert report.step("1.1.5").message == "Ed25519 signature does not verify with the public key"

    flipped = copy.deepcopy(document)
    value = flipped["security"]["attestation"]["signature"]["value"]
    flipped["security"]["attestation"]["signature"]["value"] = ("A" if value[0] != "A" else "B") + value[1:]
    assert admit(flipped, config()).blocked_at_section == "1.1.5"

    garbled = copy.deepcopy(document)
    garbled["security"]["attestation"]["signature"]["value"] = "not base64url!"
    report = admit(garbled, config())
    assert report.blocked_at_section == "1.1.5"
    assert report.step("1.1.5").message == "signature value is not base64url"


def _ec(curve: ec.EllipticCurve) -> Any:
    return ec.generate_private_key(curve)


@pytest.mark.parametrize(
    ("algorithm", "make_key"),
    [
        ("ES256", lambda: _ec(ec.SECP256R1())),
        ("ES384", lambda: _ec(ec.SECP384R1())),
        ("ES512", lambda: _ec(ec.SECP521R1())),
        ("RS256", lambda: rsa.generate_private_key(65537, 2048)),
        ("PS256", lambda: rsa.generate_private_key(65537, 2048)),
        ("Ed448", lambda: ed448.Ed448PrivateKey.generate()),
    ],
)
def test_other_spec_algorithms_are_verified(algorithm: str, make_key):
    key = make_key()
    document = signed(base_document(), key, algorithm, public_value=spki(key.public_key()))
    report = admit(document, config(require_signature=True))
    assert report.verified, report.to_dict()
    assert report.step("1.1.5").message.startswith(f"{algorithm} signature")
    tampered = copy.deepcopy(document)
    tampered["name"] = "Someone Else"
    assert admit(tampered, config()).blocked_at_section == "1.1.5"


def test_ecdsa_der_signature_is_accepted_too():
    key = _ec(ec.SECP256R1())
    document = signed(base_document(), key, "ES256", public_value=spki(key.public_key()))
    der = key.sign(signed_bytes(document), ec.ECDSA(hashes.SHA256()))
    document["security"]["attestation"]["signature"]["value"] = b64url(der)
    assert admit(document, config()).verified


@pytest.mark.parametrize(
    ("algorithm", "make_key", "message"),
    [
        ("RS256", lambda: rsa.generate_private_key(65537, 1024), "RSA key of 1024 bits is refused (minimum 2048)"),
        ("RS256", lambda: dsa.generate_private_key(2048), "DSA keys are refused"),
        ("ES256", lambda: _ec(ec.SECP192R1()), "ECDSA curve secp192r1 is refused (minimum P-256)"),
        ("ES256", lambda: _ec(ec.SECP384R1()), "ES256 needs curve secp256r1; the key is on secp384r1"),
        ("Ed25519", lambda: rsa.generate_private_key(65537, 2048), "RSA-2048 key, not usable for Ed25519"),
    ],
)
def test_weak_or_mismatched_keys_are_refused(algorithm: str, make_key, message: str, ed_key):
    key = make_key()
    document = signed(base_document(), ed_key, "Ed25519", public_value=None)  # signed, then key replaced
    document["cryptographic_identity"] = {"public_key": {"algorithm": algorithm, "value": spki(key.public_key())}}
    report = admit(document, config())
    assert report.blocked_at_section == "1.1.4"
    assert message in report.step("1.1.4").message


def test_a_weak_key_on_an_unsigned_passport_is_only_a_warning():
    document = base_document()
    weak = rsa.generate_private_key(65537, 1024)
    document["cryptographic_identity"] = {"public_key": {"algorithm": "RS256", "value": spki(weak.public_key())}}
    report = admit(document, config())
    assert report.verified and report.public_key_source == "none"
    assert outcome(report, "1.1.4") == (True, "warn")
    assert admit(document, config(require_signature=True)).blocked_at_section == "1.1.4"


def test_unsupported_algorithms_are_refused_clearly(ed_key):
    document = sign_passport(base_document(), ed_key)
    hmac_key = copy.deepcopy(document)
    hmac_key["cryptographic_identity"]["public_key"]["algorithm"] = "HS256"
    report = admit(hmac_key, config())
    assert report.blocked_at_section == "1.1.4"
    assert "algorithm 'HS256' is not supported (supported: Ed25519, Ed448, ES256, ES384, ES512, RS256, PS256)" in \
        report.step("1.1.4").message

    eddsa = copy.deepcopy(document)
    eddsa["security"]["attestation"]["signature"]["algorithm"] = "EdDSA"
    assert "algorithm 'EdDSA' is not supported" in admit(eddsa, config()).step("1.1.5").message

    mismatch = copy.deepcopy(document)
    mismatch["security"]["attestation"]["signature"]["algorithm"] = "ES256"
    assert admit(mismatch, config()).step("1.1.5").message == \
        "signature algorithm ES256 does not match the Ed25519 public key"


def test_unsigned_passport_is_a_warning_unless_signatures_are_required():
    report = admit(base_document(), config())
    assert report.verified and outcome(report, "1.1.5") == (True, "warn")
    required = admit(base_document(), config(require_signature=True))
    assert required.blocked_at_section == "1.1.5"


def test_signed_passport_without_any_key_is_rejected(ed_key):
    document = sign_passport(base_document(), ed_key)
    del document["cryptographic_identity"]
    report = admit(document, config())
    assert report.blocked_at_section == "1.1.5"
    assert report.step("1.1.5").message == "signed, but there is no usable public key to verify with"


# --- sign_passport ---------------------------------------------------------------------------


def test_sign_passport_adds_the_inline_key_and_refuses_a_different_one(ed_key):
    document = sign_passport(base_document(), ed_key)
    assert document["cryptographic_identity"]["public_key"] == {"algorithm": "Ed25519", "value": raw_b64(ed_key)}
    assert document["security"]["attestation"]["issued_at"] == "2026-11-01T00:00:00Z"  # the author's, untouched
    assert admit(document, config(require_signature=True)).verified
    other = ed25519.Ed25519PrivateKey.generate()
    with pytest.raises(SigningError, match="does not match"):
        sign_passport(document, other)
    pem = other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    fresh = sign_passport({k: v for k, v in base_document().items() if k != "security"}, pem.decode())
    assert fresh["security"]["attestation"]["type"] == "self"
    assert admit(fresh, config(require_signature=True)).verified
    rsa_pem = rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(PassportKeyError, match="takes an Ed25519 private key"):
        sign_passport(base_document(), rsa_pem)


def test_the_demo_key_signs_the_example_passport():
    key_pem = example_passport_path().with_name("example-passport.key.pem").read_bytes()
    assert b"DEMO KEY" in key_pem
    document = load_passport(example_passport_path())
    assert sign_passport(document, key_pem) == document  # Ed25519 is deterministic


# --- 1.1.3 / 1.1.4: did:web, offline --------------------------------------------------------------


@pytest.mark.parametrize(
    ("did", "url"),
    [
        ("did:web:example.com", "https://example.com/.well-known/did.json"),
        ("did:web:example.com:agents:bot", "https://example.com/agents/bot/did.json"),
        ("did:web:localhost%3A8443:a", "https://localhost:8443/a/did.json"),
        ("did:web:example.com#key-1", "https://example.com/.well-known/did.json"),
    ],
)
def test_did_web_url_mapping(did: str, url: str):
    assert did_web_url(did) == url


def _did_document(method: dict[str, Any], *, relative: bool = False, embedded: bool = False) -> dict[str, Any]:
    method = {"id": f"{DID}#key-1", "type": "Ed25519VerificationKey2020", "controller": DID, **method}
    if embedded:
        return {"id": DID, "assertionMethod": [method]}
    if relative:
        method["id"] = "#key-1"
    return {"id": DID, "verificationMethod": [method], "assertionMethod": ["#key-1" if relative else f"{DID}#key-1"]}


def _multibase(key: ed25519.Ed25519PrivateKey) -> str:
    data = b"\xed\x01" + key.public_key().public_bytes_raw()
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    number, text = int.from_bytes(data, "big"), ""
    while number:
        number, rest = divmod(number, 58)
        text = alphabet[rest] + text
    return "z" + text


@pytest.mark.parametrize(
    "make_document",
    [
        lambda k: _did_document({"publicKeyBase64": raw_b64(k)}),
        lambda k: _did_document({"publicKeyMultibase": _multibase(k)}),
        lambda k: _did_document({"publicKeyJwk": {"kty": "OKP", "crv": "Ed25519", "x": b64url(k.public_key().public_bytes_raw())}},
                                relative=True),
        lambda k: _did_document({"publicKeyBase64": spki(k.public_key())}, embedded=True),
    ],
    ids=["base64", "multibase", "jwk-relative-ref", "spki-embedded"],
)
def test_did_web_key_is_cross_checked_with_the_inline_key(make_document, ed_key):
    document = base_document()
    document["cryptographic_identity"] = {"did": DID}
    document = sign_passport(document, ed_key)
    report = admit(document, config(require_did_resolution=True, did_documents={DID_URL: make_document(ed_key)}))
    assert report.verified, report.to_dict()
    assert report.public_key_source == "cross_checked"
    assert outcome(report, "1.1.3") == outcome(report, "1.1.4") == (True, "block")
    # the map may be keyed by the DID too
    by_did = admit(document, config(require_did_resolution=True, did_documents={DID: make_document(ed_key)}))
    assert by_did.public_key_source == "cross_checked"


def test_a_did_key_alone_verifies_the_signature(ed_key):
    document = base_document()
    document["cryptographic_identity"] = {"did": DID}
    document = signed(document, ed_key, "Ed25519", public_value=None)  # no inline key at all
    report = admit(document, config(trust_on_first_use=False,
                                    did_documents={DID_URL: _did_document({"publicKeyBase64": raw_b64(ed_key)})}))
    assert report.verified, report.to_dict()
    assert report.public_key_source == "did_resolved"


def test_without_trust_on_first_use_an_inline_key_needs_a_did(ed_key):
    document = sign_passport(base_document(), ed_key)
    report = admit(document, config(trust_on_first_use=False))
    assert report.blocked_at_section == "1.1.4"
    assert "trust on first use is off" in report.step("1.1.4").message


def test_did_resolution_failures(ed_key):
    document = base_document()
    document["cryptographic_identity"] = {"did": DID}
    document = sign_passport(document, ed_key)
    required = config(require_did_resolution=True)
    report = admit(document, required)
    assert report.blocked_at_section == "1.1.3"
    assert report.step("1.1.3").message == (
        f"no DID document for {DID} ({DID_URL}) among the local DID documents")
    # not required: the same failure is a warning, and the inline key is taken on first use
    lenient = admit(document, config(did_documents={DID_URL: {"id": "did:web:elsewhere"}}))
    assert lenient.verified and outcome(lenient, "1.1.3") == (True, "warn")
    assert "is for 'did:web:elsewhere'" in lenient.step("1.1.3").message
    unusable = {DID_URL: _did_document({"publicKeyJwk": {"kty": "EC", "crv": "P-256"}})}
    message = admit(document, config(require_did_resolution=True, did_documents=unusable)).step("1.1.3").message
    assert "no usable assertionMethod key" in message and "kty='EC'" in message
    assert admit(base_document(), required).step("1.1.3").message == (
        "DID resolution is required but the passport declares no DID")


def test_did_documents_load_from_a_file_or_a_directory(tmp_path: Path, ed_key):
    did_document = _did_document({"publicKeyBase64": raw_b64(ed_key)})
    mapping = tmp_path / "dids.json"
    mapping.write_text(json.dumps({DID_URL: did_document}))
    assert load_did_documents(mapping) == {DID_URL: did_document}
    folder = tmp_path / "dids"
    folder.mkdir()
    (folder / "t.json").write_text(json.dumps(did_document))
    assert load_did_documents(folder) == {DID: did_document}
    (folder / "broken.json").write_text("{")
    with pytest.raises(Exception, match="broken.json: invalid JSON"):
        load_did_documents(folder)


# --- 1.1.1, 1.1.6 - 1.1.8 -----------------------------------------------------------------------------


def test_retrieval_provenance():
    document = base_document()
    own = admit(document, config(), retrieval=Retrieval("https", "agents.test:443"))
    assert outcome(own, "1.1.1") == (True, "block")
    other = admit(document, config(), retrieval=Retrieval("header", "proxy.local"))
    assert outcome(other, "1.1.1") == (True, "warn")
    anonymous = admit(document, config(), retrieval=Retrieval("a2a"))
    assert anonymous.blocked_at_section == "1.1.1" and anonymous.public_key_source == "none"


def test_expiry_is_checked_against_the_passed_clock():
    document = base_document()
    assert outcome(admit(document, config()), "1.1.6") == (True, "block")
    soon = AdmissionConfig(now=datetime(2027, 10, 20, tzinfo=timezone.utc))
    assert outcome(admit(document, soon), "1.1.6") == (True, "warn")
    assert "in 12 days" in admit(document, soon).step("1.1.6").message
    late = AdmissionConfig(now=datetime(2027, 11, 1, tzinfo=timezone.utc))
    assert admit(document, late).blocked_at_section == "1.1.6"
    epoch = AdmissionConfig(now=datetime(2027, 11, 1, tzinfo=timezone.utc).timestamp() - 1)
    assert admit(document, epoch).verified
    shorter = AdmissionConfig(now=datetime(2027, 10, 20, tzinfo=timezone.utc), expiry_warning=timedelta(days=7))
    assert outcome(admit(document, shorter), "1.1.6") == (True, "block")


def test_draft_is_refused_in_enforce_mode_and_warned_in_development():
    document = base_document()
    document["lifecycle"] = {"status": "draft"}
    assert admit(document, config()).blocked_at_section == "1.1.7"
    development = admit(document, config(mode="development"))
    assert development.verified and outcome(development, "1.1.7") == (True, "warn")


def test_provider_coherence_and_allowlist_patterns():
    document = base_document()
    document["provider"]["url"] = "https://api.agents.test/"
    assert admit(document, config(provider_allowlist=("*.agents.test",))).verified
    assert admit(document, config(provider_allowlist=("agents.test",))).blocked_at_section == "1.1.8"
    # coherence: provider host must be the identity's domain or a parent of it
    assert admit(document, config(require_provider_coherence=True)).blocked_at_section == "1.1.8"
    document["provider"]["url"] = "https://test"
    assert admit(document, config(require_provider_coherence=True)).step("1.1.8").passed
    document["id"] = "urn:adl:agent:acme:t:1.0.0"
    report = admit(document, config(require_provider_coherence=True))
    assert report.step("1.1.8").message == "the passport identity has no domain to check the provider against"


def test_config_validates_its_clock_and_mode():
    with pytest.raises(ValueError, match="timezone-aware"):
        AdmissionConfig(now=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="mode must be one of enforce, development"):
        AdmissionConfig(now=NOW, mode="audit")
    frozen = AdmissionConfig(now=NOW, did_documents={"a": {}})
    with pytest.raises(TypeError):
        frozen.did_documents["b"] = {}  # type: ignore[index]


def test_schema_validators_are_built_once_per_mode():
    from governor.passport.schema import validator

    assert validator() is validator()
    assert validator(strict=True) is validator(strict=True)
    assert validator() is not validator(strict=True)
