"""Passport key material: decoding public keys, verifying and making signatures.

Algorithms are the ones ADL Core §10.2 names. Ed25519 and Ed448 keys may be raw
(32 / 57 bytes) or SubjectPublicKeyInfo DER; the others are SPKI DER only.
Signature encodings follow JWS (RFC 7518): ECDSA signatures are r||s (DER is
accepted too), PS256 uses a salt as long as the hash. Weak keys are refused
whatever algorithm they are declared for: RSA below 2048 bits, any DSA key,
ECDSA on curves below P-256, and a curve that does not match the algorithm.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any, Mapping

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from governor.common.canonical import b64url
from governor.common.ed25519_points import ed25519_key_problem
from governor.passport.errors import (
    PassportKeyError,
    SignatureInvalidError,
    UnsupportedAlgorithmError,
    WeakKeyError,
)

ED25519 = "Ed25519"
ED448 = "Ed448"
# canonical spelling -> (key family, hash, curve)
ALGORITHMS: dict[str, tuple[str, Any, Any]] = {
    ED25519: ("ed25519", None, None),
    ED448: ("ed448", None, None),
    "ES256": ("ec", hashes.SHA256, ec.SECP256R1),
    "ES384": ("ec", hashes.SHA384, ec.SECP384R1),
    "ES512": ("ec", hashes.SHA512, ec.SECP521R1),
    "RS256": ("rsa-pkcs1", hashes.SHA256, None),
    "PS256": ("rsa-pss", hashes.SHA256, None),
}
_BY_LOWER = {name.lower(): name for name in ALGORITHMS}
MIN_RSA_BITS = 2048
MIN_EC_BITS = 256
_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")
_B64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")

PublicKeyObject = (
    ed25519.Ed25519PublicKey | ed448.Ed448PublicKey | ec.EllipticCurvePublicKey | rsa.RSAPublicKey
)


def canonical_algorithm(name: Any) -> str:
    """The spec's spelling of an algorithm name (case-insensitive), or UnsupportedAlgorithmError."""
    if isinstance(name, str) and name.lower() in _BY_LOWER:
        return _BY_LOWER[name.lower()]
    supported = ", ".join(ALGORITHMS)
    raise UnsupportedAlgorithmError(f"algorithm {name!r} is not supported (supported: {supported})")


@dataclass(frozen=True, slots=True)
class PublicKey:
    """A decoded, strength-checked public key and the algorithm it verifies."""

    algorithm: str
    key: PublicKeyObject

    @property
    def spki(self) -> bytes:
        """SubjectPublicKeyInfo DER: one encoding to compare keys by, whatever they came as."""
        return self.key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

    def same_key(self, other: PublicKey) -> bool:
        return self.spki == other.spki

    def verify(self, algorithm: str, signature: bytes, message: bytes) -> None:
        """Raise SignatureInvalidError unless `signature` by this key over `message` holds."""
        algorithm = canonical_algorithm(algorithm)
        if algorithm != self.algorithm:
            raise SignatureInvalidError(
                f"signature algorithm {algorithm} does not match the {self.algorithm} public key"
            )
        family, hash_cls, curve = ALGORITHMS[algorithm]
        try:
            if family in ("ed25519", "ed448"):
                self.key.verify(signature, message)  # type: ignore[call-arg]
            elif family == "ec":
                der = _ecdsa_der(signature, curve.key_size)
                self.key.verify(der, message, ec.ECDSA(hash_cls()))  # type: ignore[call-arg]
            elif family == "rsa-pkcs1":
                self.key.verify(signature, message, padding.PKCS1v15(), hash_cls())  # type: ignore[call-arg]
            else:
                pss = padding.PSS(mgf=padding.MGF1(hash_cls()), salt_length=hash_cls.digest_size)
                self.key.verify(signature, message, pss, hash_cls())  # type: ignore[call-arg]
        except InvalidSignature:
            raise SignatureInvalidError(f"{algorithm} signature does not verify with the public key") from None


def decode_public_key(algorithm: Any, value: Any) -> PublicKey:
    """Decode `cryptographic_identity.public_key` ({algorithm, value}; value standard base64)."""
    algorithm = canonical_algorithm(algorithm)
    if not isinstance(value, str):
        raise PassportKeyError("public key value must be a base64 string")
    return public_key_from_bytes(algorithm, b64decode_standard(value, what="public key"))


def public_key_from_bytes(algorithm: str, data: bytes) -> PublicKey:
    """A key from raw bytes (Ed25519 32, Ed448 57) or SPKI DER, checked against `algorithm`."""
    algorithm = canonical_algorithm(algorithm)
    family, _, curve = ALGORITHMS[algorithm]
    if family == "ed25519" and len(data) == 32:
        check_ed25519(data)
        return PublicKey(algorithm, ed25519.Ed25519PublicKey.from_public_bytes(data))
    if family == "ed448" and len(data) == 57:
        return PublicKey(algorithm, ed448.Ed448PublicKey.from_public_bytes(data))
    key = load_spki(data)
    check_strength(key)
    if isinstance(key, ed25519.Ed25519PublicKey):
        check_ed25519(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    expected = {
        "ed25519": ed25519.Ed25519PublicKey,
        "ed448": ed448.Ed448PublicKey,
        "ec": ec.EllipticCurvePublicKey,
        "rsa-pkcs1": rsa.RSAPublicKey,
        "rsa-pss": rsa.RSAPublicKey,
    }[family]
    if not isinstance(key, expected):
        raise PassportKeyError(f"the public key is a {key_kind(key)} key, not usable for {algorithm}")
    if family == "ec" and not isinstance(key.curve, curve):  # type: ignore[union-attr]
        raise WeakKeyError(f"{algorithm} needs curve {curve.name}; the key is on {key.curve.name}")  # type: ignore[union-attr]
    return PublicKey(algorithm, key)  # type: ignore[arg-type]


def load_spki(data: bytes) -> Any:
    try:
        return serialization.load_der_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise PassportKeyError(
            f"public key is neither a raw key of the expected length nor SPKI DER ({len(data)} bytes: {exc})"
        ) from None


def check_strength(key: Any) -> None:
    """Refuse keys too weak to trust, whatever algorithm they claim."""
    if isinstance(key, dsa.DSAPublicKey):
        raise WeakKeyError("DSA keys are refused")
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < MIN_RSA_BITS:
        raise WeakKeyError(f"RSA key of {key.key_size} bits is refused (minimum {MIN_RSA_BITS})")
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.key_size < MIN_EC_BITS:
        raise WeakKeyError(f"ECDSA curve {key.curve.name} is refused (minimum P-256)")


def check_ed25519(raw: bytes) -> None:
    """Refuse a small-order or non-canonically encoded Ed25519 key (governor.common.ed25519_points)."""
    problem = ed25519_key_problem(raw)
    if problem is not None:
        raise WeakKeyError(f"{problem} is refused")


def key_algorithm(key: Any) -> str:
    """The algorithm a key implies when nothing declares one (keys found in DID documents)."""
    if isinstance(key, ed25519.Ed25519PublicKey):
        return ED25519
    if isinstance(key, ed448.Ed448PublicKey):
        return ED448
    if isinstance(key, ec.EllipticCurvePublicKey):
        for name, (family, _, curve) in ALGORITHMS.items():
            if family == "ec" and isinstance(key.curve, curve):
                return name
    raise UnsupportedAlgorithmError(f"no single algorithm for a {key_kind(key)} key; declare one")


def key_kind(key: Any) -> str:
    if isinstance(key, rsa.RSAPublicKey):
        return f"RSA-{key.key_size}"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"EC {key.curve.name}"
    return type(key).__name__.removesuffix("PublicKey").lstrip("_")


# --- signing (for `governor passport sign` and tests) ---------------------------------


def load_private_key_pem(data: bytes) -> ed25519.Ed25519PrivateKey:
    """An unencrypted Ed25519 private key from PEM (PKCS#8); text before the PEM block is ignored."""
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise PassportKeyError(f"cannot read the private key PEM: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise PassportKeyError(f"passport signing takes an Ed25519 private key, not {type(key).__name__}")
    return key


def raw_public_key(private_key: ed25519.Ed25519PrivateKey) -> bytes:
    return private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def sign_ed25519(private_key: ed25519.Ed25519PrivateKey, message: bytes) -> str:
    """base64url (no padding) Ed25519 signature: the encoding of `signature.value`."""
    return b64url(private_key.sign(message))


# --- encodings ---------------------------------------------------------------------------


def b64decode_standard(text: str, *, what: str) -> bytes:
    """Standard base64; padding may be omitted, anything outside the alphabet is an error."""
    stripped = text.strip()
    if not _B64.match(stripped):
        raise PassportKeyError(f"{what} is not standard base64")
    body = stripped.rstrip("=")
    try:
        return base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except binascii.Error as exc:
        raise PassportKeyError(f"{what} is not valid base64: {exc}") from None


def b64url_decode_strict(text: Any, *, what: str) -> bytes:
    """base64url without padding (signature values); padding tolerated, other characters refused."""
    if not isinstance(text, str):
        raise SignatureInvalidError(f"{what} must be a base64url string")
    stripped = text.rstrip("=")
    if not _B64URL.match(stripped) or len(stripped) % 4 == 1:
        raise SignatureInvalidError(f"{what} is not base64url")
    return base64.urlsafe_b64decode(stripped + "=" * (-len(stripped) % 4))


_BASE58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_BASE58_INDEX = {char: index for index, char in enumerate(_BASE58_ALPHABET)}


def base58btc_decode(text: str) -> bytes:
    number = 0
    for char in text:
        if char not in _BASE58_INDEX:
            raise PassportKeyError(f"invalid base58btc character {char!r}")
        number = number * 58 + _BASE58_INDEX[char]
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    leading_zeros = len(text) - len(text.lstrip("1"))
    return b"\x00" * leading_zeros + body


_MULTICODEC_ED25519_PUB = b"\xed\x01"


def public_key_from_multibase(text: str) -> PublicKey:
    """`publicKeyMultibase`: 'z' + base58btc(0xed01 || 32-byte Ed25519 key)."""
    if not text.startswith("z"):
        raise PassportKeyError("publicKeyMultibase must be base58btc ('z' prefix)")
    data = base58btc_decode(text[1:])
    if not data.startswith(_MULTICODEC_ED25519_PUB) or len(data) != 34:
        raise UnsupportedAlgorithmError("publicKeyMultibase is not an Ed25519 key (multicodec 0xed01)")
    return public_key_from_bytes(ED25519, data[2:])


def public_key_from_jwk(jwk: Mapping[str, Any]) -> PublicKey:
    """`publicKeyJwk` of kty OKP (Ed25519 or Ed448)."""
    if jwk.get("kty") != "OKP" or jwk.get("crv") not in (ED25519, ED448):
        raise UnsupportedAlgorithmError(
            f"publicKeyJwk kty={jwk.get('kty')!r} crv={jwk.get('crv')!r} is not supported (OKP Ed25519/Ed448)"
        )
    x = jwk.get("x")
    try:
        data = b64url_decode_strict(x, what="publicKeyJwk x")
    except SignatureInvalidError as exc:
        raise PassportKeyError(str(exc)) from None
    return public_key_from_bytes(jwk["crv"], data)


def _ecdsa_der(signature: bytes, curve_bits: int) -> bytes:
    """JWS r||s -> DER; a signature that is not exactly 2*size bytes is taken as DER already."""
    size = (curve_bits + 7) // 8
    if len(signature) != 2 * size:
        return signature
    r = int.from_bytes(signature[:size], "big")
    s = int.from_bytes(signature[size:], "big")
    return encode_dss_signature(r, s)
