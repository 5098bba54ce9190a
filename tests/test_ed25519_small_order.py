"""Small-order and non-canonical Ed25519 public keys are refused wherever a key is read
(issue #20 finding 6): a passport's inline key, DID documents (passport and evidence
rooms), the governor key given to `governor verify` (--key PEM, or the API)."""

from __future__ import annotations

import base64
import copy
import json

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ed25519

from governor.common.canonical import b64url
from governor.cli import main
from governor.common.ed25519_points import L, P, SMALL_ORDER_POINTS, ed25519_key_problem
from governor.evidence import verify_record
from governor.evidence.errors import DidDocumentError, KeyFileError
from governor.evidence.keys import assertion_keys, did_document, load_public_key
from governor.passport import AdmissionConfig, PassportKeyError, SignatureInvalidError, WeakKeyError, admit
from governor.passport.did import key_from_verification_method
from governor.passport.keys import decode_public_key, public_key_from_bytes
from governor.passport.loader import load_passport
from governor.passport.resources import example_passport_path
from tests.test_evidence_record import signed_record

# --- the constants are what they claim: eight distinct points of order dividing 8 -----------
# (RFC 8032 §5.1.3 decoding and extended-coordinate addition, here only to check the table)

_D = -121665 * pow(121666, P - 2, P) % P
_SQRT_M1 = pow(2, (P - 1) // 4, P)


def _decode(raw: bytes) -> tuple[int, int, int, int]:
    y = int.from_bytes(raw, "little") & ((1 << 255) - 1)
    sign = raw[31] >> 7
    assert y < P
    u, v = (y * y - 1) % P, (_D * y * y + 1) % P
    x = u * pow(v, 3, P) * pow(u * pow(v, 7, P), (P - 5) // 8, P) % P
    if v * x * x % P == (-u) % P:
        x = x * _SQRT_M1 % P
    assert v * x * x % P == u % P, "not on the curve"
    if x == 0:
        assert sign == 0 or y in (1, P - 1), "x = 0 with the sign bit"
    elif x & 1 != sign:
        x = P - x
    return x, y, 1, x * y % P


def _add(a, b):
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa, bb = (y1 - x1) * (y2 - x2) % P, (y1 + x1) * (y2 + x2) % P
    cc, dd = 2 * _D * t1 * t2 % P, 2 * z1 * z2 % P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return e * f % P, g * h % P, f * g % P, e * h % P


def _is_identity(point) -> bool:
    x, y, z, _ = point
    return x % P == 0 and (y - z) % P == 0


def test_the_table_holds_the_eight_torsion_points():
    points = [_decode(bytes.fromhex(h)) for h in SMALL_ORDER_POINTS]
    affine = {(x, y) for x, y, _, _ in points}
    assert len(affine) == 8
    for point in points:
        eight = point
        for _ in range(3):
            eight = _add(eight, eight)
        assert _is_identity(eight)
    assert (0, 1) in affine and (0, P - 1) in affine


# --- the check itself -------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", SMALL_ORDER_POINTS)
def test_each_torsion_point_is_refused(encoding):
    assert "small-order" in ed25519_key_problem(bytes.fromhex(encoding))


def _noncanonical(y: int, sign: int) -> bytes:
    return (y | (sign << 255)).to_bytes(32, "little")


@pytest.mark.parametrize("offset", range(19))
@pytest.mark.parametrize("sign", [0, 1])
def test_every_non_canonical_encoding_is_refused(offset, sign):
    # y = p + k for k in 0..18: the non-canonical encodings of y = 0 .. 18, small-order ones
    # (y = p, p + 1) among them
    assert "non-canonical" in ed25519_key_problem(_noncanonical(P + offset, sign))


def test_x_zero_with_the_sign_bit_is_refused():
    assert ed25519_key_problem(_noncanonical(1, 1)) is not None  # the identity's "negative zero"
    assert ed25519_key_problem(_noncanonical(P - 1, 1)) is not None


def test_ordinary_keys_pass():
    for _ in range(20):
        raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes_raw()
        assert ed25519_key_problem(raw) is None


def test_a_signature_with_s_at_or_above_l_does_not_verify():
    private = ed25519.Ed25519PrivateKey.generate()
    key = public_key_from_bytes("Ed25519", private.public_key().public_bytes_raw())
    signature = private.sign(b"message")
    key.verify("Ed25519", signature, b"message")
    s = int.from_bytes(signature[32:], "little")
    for bad in (s + L, L, L + 1):
        if bad < 2**256:
            with pytest.raises(SignatureInvalidError):
                key.verify("Ed25519", signature[:32] + bad.to_bytes(32, "little"), b"message")


# --- every place a key is read ------------------------------------------------------------------


def _spki(raw: bytes) -> bytes:
    # SubjectPublicKeyInfo DER for Ed25519: a fixed 12-byte prefix, then the raw key
    return bytes.fromhex("302a300506032b6570032100") + raw


@pytest.mark.parametrize("encoding", SMALL_ORDER_POINTS)
def test_passport_room_refuses_small_order_keys_in_every_encoding(encoding):
    raw = bytes.fromhex(encoding)
    with pytest.raises(WeakKeyError, match="small-order"):
        decode_public_key("Ed25519", base64.b64encode(raw).decode())
    with pytest.raises(WeakKeyError, match="small-order"):
        decode_public_key("Ed25519", base64.b64encode(_spki(raw)).decode())
    multibase = "z" + _base58(b"\xed\x01" + raw)
    methods = [{"publicKeyMultibase": multibase}, {"publicKeyBase64": base64.b64encode(raw).decode()},
               {"publicKeyJwk": {"kty": "OKP", "crv": "Ed25519", "x": b64url(raw)}}]
    for method in methods:
        with pytest.raises(PassportKeyError, match="small-order"):
            key_from_verification_method(method)


@pytest.mark.parametrize("encoding", SMALL_ORDER_POINTS)
def test_evidence_room_refuses_small_order_keys(tmp_path, encoding):
    raw = bytes.fromhex(encoding)
    pem = tmp_path / "pub.pem"
    pem.write_bytes(b"-----BEGIN PUBLIC KEY-----\n" + base64.encodebytes(_spki(raw)) + b"-----END PUBLIC KEY-----\n")
    with pytest.raises(KeyFileError, match="small-order"):
        load_public_key(pem)
    good = ed25519.Ed25519PrivateKey.generate()
    document = did_document("did:web:gov.example", good)
    method = document["verificationMethod"][0]
    method.pop("publicKeyBase64")
    method["publicKeyMultibase"] = "z" + _base58(b"\xed\x01" + raw)
    with pytest.raises(DidDocumentError, match="names no Ed25519 key"):
        assertion_keys(document)
    for member, value in (("publicKeyBase64", base64.b64encode(raw).decode()),
                          ("publicKeyJwk", {"kty": "OKP", "crv": "Ed25519", "x": b64url(raw)})):
        method.pop("publicKeyMultibase", None)
        method.pop("publicKeyBase64", None)
        method[member] = value
        with pytest.raises(DidDocumentError):
            assertion_keys(document)


def forged_record() -> dict:
    """A schema-valid record 'signed' identity||0: it verifies under the identity key."""
    record = signed_record(ed25519.Ed25519PrivateKey.generate())
    record["signature"]["value"] = b64url(bytes.fromhex(SMALL_ORDER_POINTS[0]) + bytes(32))
    return record


def test_verify_record_refuses_a_small_order_key_given_by_the_caller():
    identity = ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(SMALL_ORDER_POINTS[0]))
    identity.verify(base64.urlsafe_b64decode(forged_record()["signature"]["value"] + "=="), b"any message")
    report = verify_record(forged_record(), public_key=identity)
    assert not report.ok and report.first_failure.number == 2
    assert "small-order" in report.first_failure.message, report.to_json()


def test_governor_verify_refuses_the_identity_key_with_exit_2(tmp_path, capsys):
    record = tmp_path / "record.json"
    record.write_text(json.dumps(forged_record()))
    pem = tmp_path / "identity.pem"
    pem.write_bytes(b"-----BEGIN PUBLIC KEY-----\n"
                    + base64.encodebytes(_spki(bytes.fromhex(SMALL_ORDER_POINTS[0])))
                    + b"-----END PUBLIC KEY-----\n")
    code = main(["verify", str(record), "--offline", "--key", str(pem)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "small-order Ed25519 public key" in err, (code, out, err)


def _base58(data: bytes) -> str:
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    number, text = int.from_bytes(data, "big"), ""
    while number:
        number, digit = divmod(number, 58)
        text = alphabet[digit] + text
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + text


# --- the reported attack: identity key, signature identity||0 ---------------------------------

IDENTITY_KEY = "AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="


def identity_signed_passport() -> dict:
    document = copy.deepcopy(load_passport(example_passport_path()))
    document["cryptographic_identity"]["public_key"] = {"algorithm": "Ed25519", "value": IDENTITY_KEY}
    document["security"]["attestation"]["signature"]["value"] = b64url(base64.b64decode(IDENTITY_KEY) + bytes(32))
    return document


def test_the_identity_key_passport_is_refused_at_admission():
    report = admit(identity_signed_passport(), AdmissionConfig(now=example_now()))
    assert not report.verified and report.blocked_at_section == "1.1.4"
    assert "small-order" in report.step("1.1.4").message


def test_passport_verify_exits_1_naming_the_reason(tmp_path, capsys):
    path = tmp_path / "identity.yaml"
    path.write_text(yaml.safe_dump(identity_signed_passport(), sort_keys=False))
    code = main(["passport", "verify", str(path), "--now", example_now().isoformat()])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert "small-order Ed25519 public key" in out and "verifies" not in out
    assert "REJECTED at 1.1.4" in out


def example_now():
    from datetime import timedelta

    from governor.passport.schema import parse_datetime

    document = load_passport(example_passport_path())
    return parse_datetime(document["security"]["attestation"]["issued_at"]) + timedelta(days=1)
