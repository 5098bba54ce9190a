"""The attestation signature (ADL Core §10.2, Trust §1.1.5): what is signed, checking, signing.

Signed bytes: JCS of the whole document with only `security.attestation.signature`
removed. With `signed_content: "canonical"` the signature is over those bytes.
With `signed_content: "digest"` those bytes are hashed with `digest_algorithm`
(sha-256 when absent; sha-384 and sha-512 also accepted), the hash must equal
`digest_value` (base64url, no padding), and the signature is over the raw hash
bytes (32 bytes for sha-256): the signature then binds the document through the
hash, and a verifier that only has the digest can still check it.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
from typing import Any, Mapping

from cryptography.hazmat.primitives.asymmetric import ed25519

from governor.common.canonical import b64url, canonicalize
from governor.passport.errors import PassportKeyError, SignatureInvalidError, SigningError
from governor.passport.keys import (
    ED25519,
    PublicKey,
    b64url_decode_strict,
    decode_public_key,
    load_private_key_pem,
    raw_public_key,
    sign_ed25519,
)

CANONICAL = "canonical"
DIGEST = "digest"
_HASHES = {"sha256": "sha256", "sha384": "sha384", "sha512": "sha512"}


def signed_bytes(document: Mapping[str, Any]) -> bytes:
    """JCS bytes of `document` without `security.attestation.signature`."""
    unsigned = dict(document)
    security = unsigned.get("security")
    if isinstance(security, Mapping) and isinstance(security.get("attestation"), Mapping):
        attestation = {k: v for k, v in security["attestation"].items() if k != "signature"}
        unsigned["security"] = {**security, "attestation": attestation}
    return canonicalize(unsigned)


def signature_message(document: Mapping[str, Any], signature: Mapping[str, Any]) -> bytes:
    """The bytes the signature value must verify over; checks digest_value on the way."""
    content = signed_bytes(document)
    mode = signature.get("signed_content")
    if mode == CANONICAL:
        return content
    if mode != DIGEST:
        raise SignatureInvalidError(f"signed_content {mode!r} is neither 'canonical' nor 'digest'")
    name = str(signature.get("digest_algorithm", "sha-256"))
    algorithm = _HASHES.get(name.lower().replace("-", ""))
    if algorithm is None:
        raise SignatureInvalidError(f"digest_algorithm {name!r} is not supported (sha-256, sha-384, sha-512)")
    digest = hashlib.new(algorithm, content).digest()
    expected = b64url_decode_strict(signature.get("digest_value"), what="digest_value")
    if not hmac.compare_digest(digest, expected):
        raise SignatureInvalidError(
            f"digest_value is not the {name} of the signed bytes: the document changed after signing"
        )
    return digest


def verify_signature(document: Mapping[str, Any], signature: Mapping[str, Any], key: PublicKey) -> None:
    """Raise SignatureInvalidError (or a key error) unless `signature` holds for `document` under `key`."""
    message = signature_message(document, signature)
    value = b64url_decode_strict(signature.get("value"), what="signature value")
    key.verify(signature.get("algorithm"), value, message)


def sign_passport(
    document: Mapping[str, Any],
    private_key: ed25519.Ed25519PrivateKey | bytes | str,
    signed_content: str = CANONICAL,
) -> dict[str, Any]:
    """A signed copy of `document` (Ed25519), ready to verify with its inline key.

    - `private_key`: an Ed25519 key object, or its unencrypted PEM (bytes or text).
    - The inline `cryptographic_identity.public_key` is added when absent (raw key,
      standard base64); when present it must be this key, or SigningError.
    - `security.attestation` is created as `{type: self}` when absent; its other
      members (issuer, issued_at, expires_at) are the author's and left as they are.
    - Any previous signature is replaced.
    """
    if signed_content not in (CANONICAL, DIGEST):
        raise SigningError(f"signed_content must be 'canonical' or 'digest', not {signed_content!r}")
    if not isinstance(private_key, ed25519.Ed25519PrivateKey):
        private_key = load_private_key_pem(private_key.encode() if isinstance(private_key, str) else private_key)
    signed = copy.deepcopy(dict(document))
    identity = _member_object(signed, "cryptographic_identity")
    raw = raw_public_key(private_key)
    if "public_key" not in identity:
        identity["public_key"] = {"algorithm": ED25519, "value": base64.b64encode(raw).decode("ascii")}
    else:
        inline = identity["public_key"]
        try:
            declared = decode_public_key(inline.get("algorithm"), inline.get("value"))
        except (PassportKeyError, AttributeError) as exc:
            raise SigningError(f"the inline public key is unusable: {exc}") from None
        if declared.algorithm != ED25519 or declared.key.public_bytes_raw() != raw:  # type: ignore[union-attr]
            raise SigningError("the private key does not match cryptographic_identity.public_key")
    attestation = _member_object(_member_object(signed, "security"), "attestation", {"type": "self"})
    attestation.pop("signature", None)
    content = signed_bytes(signed)
    signature: dict[str, Any] = {"algorithm": ED25519}
    if signed_content == CANONICAL:
        signature.update(value=sign_ed25519(private_key, content), signed_content=CANONICAL)
    else:
        digest = hashlib.sha256(content).digest()
        signature.update(value=sign_ed25519(private_key, digest), signed_content=DIGEST,
                         digest_algorithm="sha-256", digest_value=b64url(digest))
    attestation["signature"] = signature
    return signed


def _member_object(parent: dict[str, Any], name: str, default: dict[str, Any] | None = None) -> dict[str, Any]:
    value = parent.setdefault(name, default if default is not None else {})
    if not isinstance(value, dict):
        raise SigningError(f"`{name}` must be an object to sign the passport")
    return value
