"""Ed25519 public keys no one may hold: small-order points and non-canonical encodings.

A signature by a small-order key A (one of the eight torsion points, 8A = 0)
proves nothing: with A the identity, R = identity and S = 0 "verify" any message,
and OpenSSL (behind `cryptography`) accepts such keys and signatures. So every
place that decodes an Ed25519 public key (passports, DID documents, the
governor key given to `governor verify`) refuses them here.

An encoding is 32 bytes: y little-endian in bits 0..254, the sign of x in bit 255.
A canonical encoding has y < p. The eight torsion points are the ones with y in
{1, p-1, 0, Y8, p-Y8} (y = 0 and y = Y8, p-Y8 each with both signs of x; y = 1
and p-1 have x = 0); their canonical encodings are listed below: the well-known
list libsodium blocks (by y, in `ge25519_has_small_order`) and the ed25519-speccheck
test vectors use (Chalkias, Garillot, Nikolaenko, "Taming the many EdDSAs", 2020). Refusing by y catches both signs, x = 0 with the sign
bit set, and every non-canonical encoding (y >= p) of any point, those of
small-order points included.

Shared by the passport and evidence rooms (it imports neither).
"""

from __future__ import annotations

P = 2**255 - 19  # the field prime
L = 2**252 + 27742317777372353535851937790883648493  # the prime order of the base point

# The eight points of order 1, 2, 4 and 8, canonically encoded (hex of the 32 bytes).
SMALL_ORDER_POINTS = (
    "0100000000000000000000000000000000000000000000000000000000000000",  # order 1: (0, 1), the identity
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # order 2: (0, -1)
    "0000000000000000000000000000000000000000000000000000000000000000",  # order 4: (+sqrt(-1), 0)
    "0000000000000000000000000000000000000000000000000000000000000080",  # order 4: (-sqrt(-1), 0)
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",  # order 8: y = Y8, x even
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",  # order 8: y = Y8, x odd
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",  # order 8: y = p - Y8, x even
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",  # order 8: y = p - Y8, x odd
)
_SMALL_ORDER_Y = frozenset(int.from_bytes(bytes.fromhex(h), "little") & ((1 << 255) - 1) for h in SMALL_ORDER_POINTS)


def ed25519_key_problem(raw: bytes) -> str | None:
    """Why a raw 32-byte Ed25519 public key must not be trusted, or None when it may be."""
    if len(raw) != 32:
        return f"an Ed25519 public key is 32 bytes, not {len(raw)}"
    y = int.from_bytes(raw, "little") & ((1 << 255) - 1)
    if y >= P:
        return "non-canonical Ed25519 public key encoding (y >= 2^255-19)"
    if y in _SMALL_ORDER_Y:
        return "small-order Ed25519 public key (a torsion point: its signatures verify any message)"
    return None
