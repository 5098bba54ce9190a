"""The governor's signature over a record (Runtime §8.3, Trust §1.1.5 shape)."""

from __future__ import annotations

from typing import Any, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.common.canonical import b64url
from governor.evidence._jcs import canonical, canonical_with_events
from governor.evidence.record import RECORD_MEMBERS

SIGNATURE_ALGORITHM = "Ed25519"
SIGNED_CONTENT = "canonical"  # the signature is over the JCS bytes themselves, not a digest


def signing_input(record: Mapping[str, Any], event_bytes: list[bytes] | None = None) -> bytes:
    """JCS(record minus signature): the bytes the signature covers.

    `event_bytes`, when given, must be the JCS bytes of record["events"] in order
    (the hash chain computes them anyway); they are reused instead of recomputed.
    """
    unsigned = {k: v for k, v in record.items() if k != "signature"}
    if event_bytes is None:
        event_bytes = [canonical(e) for e in unsigned.get("events", ())]
    return canonical_with_events(unsigned, event_bytes)


def sign_record(record: Mapping[str, Any], private_key: Ed25519PrivateKey) -> dict[str, Any]:
    """A copy of `record` with an Ed25519 signature over JCS(record minus signature)."""
    if not isinstance(private_key, Ed25519PrivateKey):
        raise TypeError("the governor signs with an Ed25519 private key")
    value = private_key.sign(signing_input(record))
    signed = {k: v for k, v in record.items() if k != "signature"}
    signed["signature"] = {"algorithm": SIGNATURE_ALGORITHM, "value": b64url(value), "signed_content": SIGNED_CONTENT}
    return {k: signed[k] for k in RECORD_MEMBERS if k in signed} | {
        k: v for k, v in signed.items() if k not in RECORD_MEMBERS
    }
