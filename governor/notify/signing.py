"""HMAC-SHA256 signatures of webhook deliveries, and their verification by a receiver.

The signed bytes are `<timestamp>.<body>`: the Unix time in seconds (the
ADL-Webhook-Timestamp header), a dot, and the exact request body. The signature header is
`ADL-Webhook-Signature: v1=<hex>`; a receiver recomputes it with the shared secret,
compares in constant time, and refuses a timestamp older (or newer) than its tolerance,
so a captured delivery cannot be replayed later. Several `v1=` values (comma-separated)
let a sender sign with an old and a new secret while rotating.

Standard library only: a receiver can copy this file.
"""

from __future__ import annotations

import hashlib
import hmac
import time

TIMESTAMP_HEADER = "ADL-Webhook-Timestamp"
SIGNATURE_HEADER = "ADL-Webhook-Signature"
EVENT_HEADER = "ADL-Webhook-Event"
ID_HEADER = "ADL-Webhook-Id"
SCHEME = "v1"
DEFAULT_TOLERANCE = 300.0  # seconds a delivery's timestamp may be from the receiver's clock


class SignatureError(ValueError):
    """The delivery's signature is missing, malformed, wrong, or its timestamp out of tolerance."""


def _mac(secret: bytes | str, timestamp: str, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, timestamp.encode("ascii") + b"." + body, hashlib.sha256).hexdigest()


def sign(secret: bytes | str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The timestamp and signature headers for `body`."""
    stamp = str(int(time.time() if timestamp is None else timestamp))
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: f"{SCHEME}={_mac(secret, stamp, body)}"}


def verify(secret: bytes | str, body: bytes, timestamp: str | None, signature: str | None, *,
           tolerance: float = DEFAULT_TOLERANCE, now: float | None = None) -> None:
    """Raise SignatureError unless `signature` (the ADL-Webhook-Signature header) signs
    `timestamp` (ADL-Webhook-Timestamp) and `body` with `secret`, and the timestamp is
    within `tolerance` seconds of `now`. Returns None when the delivery is authentic."""
    if not timestamp or not timestamp.isdigit() or len(timestamp) > 12:
        raise SignatureError("missing or malformed timestamp")
    if not signature:
        raise SignatureError("missing signature")
    skew = abs((time.time() if now is None else now) - int(timestamp))
    if skew > tolerance:
        raise SignatureError(f"timestamp {skew:.0f}s from now, over the {tolerance:g}s tolerance (a replay?)")
    expected = _mac(secret, timestamp, body)
    offered = [part.strip()[len(SCHEME) + 1:] for part in signature.split(",")
               if part.strip().startswith(SCHEME + "=")]
    if not any(hmac.compare_digest(expected.encode(), candidate.encode()) for candidate in offered):
        raise SignatureError("signature does not match")
