"""Typed errors of the passport room: each names what failed, never a traceback."""

from __future__ import annotations


class PassportError(Exception):
    """Base of every error this package raises on bad input."""


class PassportLoadError(PassportError):
    """The bytes are not a passport document: unreadable, unparseable, not a JSON object."""


class PassportKeyError(PassportError):
    """A public or private key cannot be decoded or is not usable for the algorithm."""


class WeakKeyError(PassportKeyError):
    """The key decodes but is too weak to be trusted (RSA < 2048, DSA, ECDSA < P-256)."""


class UnsupportedAlgorithmError(PassportKeyError):
    """The algorithm is not one this governor verifies."""


class SignatureInvalidError(PassportError):
    """A signature does not verify over the bytes it claims to cover."""


class DidResolutionError(PassportError):
    """A DID could not be resolved to a usable key from the local documents."""


class SigningError(PassportError):
    """A passport cannot be signed as asked (wrong key for the inline public key, ...)."""
