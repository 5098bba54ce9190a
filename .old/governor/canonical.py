"""Canonical bytes and the encodings every signed or hashed thing here uses.

One module so that the passport digest, the record hash chain and the signatures
can never disagree about how a JSON value becomes bytes (RFC 8785 / JCS) or how
bytes become text (base64url without padding).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import jcs


def canonicalize(value: Any) -> bytes:
    """RFC 8785 (JCS) bytes of a JSON value."""
    return jcs.canonicalize(value)


def b64url(data: bytes) -> str:
    """base64url without padding (the encoding of signatures and hashes in ADL)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Inverse of b64url; accepts missing padding, rejects anything else malformed."""
    if not isinstance(text, str):
        raise ValueError("base64url value must be a string")
    padded = text + "=" * (-len(text) % 4)
    return base64.urlsafe_b64decode(padded.encode("ascii"))


def sha256_b64url(data: bytes) -> str:
    return b64url(hashlib.sha256(data).digest())


def digest_of(value: Any) -> str:
    """base64url(SHA-256(JCS(value))): the passport digest and the prev_hash links."""
    return sha256_b64url(canonicalize(value))
