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


# RFC 8785 numbers are IEEE doubles: an integer past this is rounded by canonicalize(), so
# two different values would share a digest (and a reviewer shown the canonical form sees
# another number than the one that is sent on).
MAX_EXACT_INTEGER = 2**53 - 1
# Nesting of a value that is digested, shown to reviewers and sent to webhooks (orjson
# writes at most 254 levels; jcs recurses): tool arguments are shallow.
MAX_ARGUMENT_DEPTH = 64


def inexact_json(value: Any, max_depth: int = MAX_ARGUMENT_DEPTH) -> str | None:
    """Why `value` cannot be digested and shown exactly (the JSON path, `.a[2]`, of an
    integer JCS would round, or nesting past `max_depth`), or None. Iterative: `value` may
    be as deep as the JSON parser allowed."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        kind = type(item)
        if kind is int and not -MAX_EXACT_INTEGER <= item <= MAX_EXACT_INTEGER:
            return f"{path or '.'} is an integer beyond 2**53, which the step's digest (RFC 8785) rounds"
        if kind is dict or kind is list:
            if depth >= max_depth:
                return f"{path or '.'} nests deeper than {max_depth} levels"
            if kind is dict:
                stack.extend((v, f"{path}.{k}", depth + 1) for k, v in reversed(list(item.items())))
            else:
                stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in reversed(list(enumerate(item))))
    return None


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
