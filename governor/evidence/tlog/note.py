"""C2SP signed notes (c2sp.org/signed-note): text, signature lines, key names and IDs,
verifier keys (vkeys), Ed25519 signatures (type 0x01) and timestamped Ed25519
cosignatures (`cosignature/v1`, type 0x04, c2sp.org/tlog-cosignature).

A note is opened against a set of verifiers: signatures from unknown keys are ignored
(kept, so a checkpoint can be passed on with them); a known key whose signature fails
rejects the whole note; a note no known key signed is rejected.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
import time
from dataclasses import dataclass, field
from typing import Iterable, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from governor.common.ed25519_points import ed25519_key_problem

ED25519 = 0x01
COSIGNATURE_V1 = 0x04
EM_DASH = "\u2014"
# The spec asks verifiers to accept at least 16 signatures; post-quantum ones reach 5 kB.
MAX_NOTE_BYTES = 128 * 1024
MAX_SIGNATURES = 64
MAX_TIMESTAMP = 2**63 - 1


class NoteError(ValueError):
    """A note that is malformed, or that does not verify (the message says why)."""


def b64decode_strict(text: str, what: str) -> bytes:
    """Standard base64 (RFC 4648 §4) with padding, nothing else accepted."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise NoteError(f"{what} is not standard base64") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise NoteError(f"{what} is not canonical base64")
    return raw


def check_key_name(name: str) -> str:
    if not name or any(c.isspace() or c == "+" for c in name) or any(ord(c) < 0x20 for c in name):
        raise NoteError(f"key name {name!r} is empty or holds a space or a plus")
    return name


def key_id(name: str, signature_type: int, public_key: bytes) -> int:
    """SHA-256(name || 0x0A || type || public key)[:4] as a big-endian uint32."""
    digest = hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([signature_type]) + public_key).digest()
    return struct.unpack(">I", digest[:4])[0]


@dataclass(frozen=True)
class Signature:
    """One signature line: `— <name> base64(key ID || signature)`."""

    name: str
    key_id: int
    signature: bytes

    def line(self) -> str:
        blob = struct.pack(">I", self.key_id) + self.signature
        return f"{EM_DASH} {self.name} {base64.b64encode(blob).decode('ascii')}\n"


@dataclass(frozen=True)
class Note:
    text: str
    signatures: tuple[Signature, ...] = ()
    # The signatures that verified against the verifiers the note was opened with.
    verified: tuple[Signature, ...] = field(default=(), compare=False)

    def encode(self) -> bytes:
        return (self.text + "\n" + "".join(s.line() for s in self.signatures)).encode("utf-8")


def check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise NoteError("a note's text ends with a newline")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise NoteError("a note holds an ASCII control character")


def parse_note(data: bytes, max_bytes: int = MAX_NOTE_BYTES) -> Note:
    """Splits a signed note into its text and signature lines (nothing verified yet)."""
    if len(data) > max_bytes:
        raise NoteError(f"the note is {len(data)} bytes, over the {max_bytes} this reader accepts")
    try:
        message = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NoteError("the note is not UTF-8") from None
    if any(ord(c) < 0x20 and c != "\n" for c in message):
        raise NoteError("the note holds an ASCII control character")
    split = message.rfind("\n\n")
    if split < 0:
        raise NoteError("the note has no blank line before its signatures")
    text, block = message[: split + 1], message[split + 2 :]
    if not block.endswith("\n"):
        raise NoteError("the note's last signature line does not end with a newline")
    lines = block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise NoteError(f"the note has {len(lines)} signatures, over the {MAX_SIGNATURES} accepted")
    signatures = []
    for line in lines:
        if not line.startswith(EM_DASH + " "):
            raise NoteError("a signature line does not start with an em dash and a space")
        parts = line[2:].split(" ")
        if len(parts) != 2:
            raise NoteError("a signature line is not `— <name> <signature>`")
        name, blob = check_key_name(parts[0]), b64decode_strict(parts[1], "a signature")
        if len(blob) < 5:
            raise NoteError(f"the signature of {name} is too short")
        signatures.append(Signature(name, struct.unpack(">I", blob[:4])[0], blob[4:]))
    if not signatures:
        raise NoteError("the note has no signature")
    return Note(text, tuple(signatures))


class Verifier(Protocol):
    name: str
    key_id: int

    def verify(self, text: str, signature: bytes) -> bool: ...


class Signer(Protocol):
    name: str
    key_id: int

    def sign(self, text: str) -> bytes: ...


class Ed25519Verifier:
    """A note verifier of signature type 0x01."""

    signature_type = ED25519

    def __init__(self, name: str, public_key: bytes) -> None:
        if len(public_key) != 32:
            raise NoteError("an Ed25519 public key is 32 bytes")
        if problem := ed25519_key_problem(public_key):  # a small-order key verifies forged signatures
            raise NoteError(f"the Ed25519 key of {name!r} cannot be trusted: {problem}")
        self.name = check_key_name(name)
        self.public_key = public_key
        self.key_id = key_id(name, self.signature_type, public_key)
        try:
            self._key = Ed25519PublicKey.from_public_bytes(public_key)
        except ValueError as exc:
            raise NoteError(f"the Ed25519 key of {name!r} is not a key: {exc}") from None

    def verify(self, text: str, signature: bytes) -> bool:
        if len(signature) != 64:
            return False
        try:
            self._key.verify(signature, text.encode("utf-8"))
        except InvalidSignature:
            return False
        return True

    def vkey(self) -> str:
        return format_vkey(self.name, self.key_id, self.signature_type, self.public_key)


class CosignatureVerifier(Ed25519Verifier):
    """A witness's `cosignature/v1` (type 0x04): a timestamp and an Ed25519 signature over
    `cosignature/v1\\ntime <t>\\n` followed by the checkpoint text."""

    signature_type = COSIGNATURE_V1

    def verify(self, text: str, signature: bytes) -> bool:
        if len(signature) != 72:
            return False
        timestamp = struct.unpack(">Q", signature[:8])[0]
        if timestamp > MAX_TIMESTAMP:
            return False
        try:
            self._key.verify(signature[8:], cosigned_message(text, timestamp))
        except InvalidSignature:
            return False
        return True


def cosigned_message(text: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n{text}".encode("utf-8")


def cosignature_timestamp(signature: Signature) -> int:
    """The POSIX time a `cosignature/v1` signature carries."""
    if len(signature.signature) != 72:
        raise NoteError(f"the cosignature of {signature.name} is not 8 + 64 bytes")
    return struct.unpack(">Q", signature.signature[:8])[0]


class Ed25519Signer:
    """Signs a note's text with Ed25519 (type 0x01)."""

    signature_type = ED25519

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        self.name = check_key_name(name)
        self.private_key = private_key
        self.public_key = private_key.public_key().public_bytes_raw()
        self.key_id = key_id(name, self.signature_type, self.public_key)

    def sign(self, text: str) -> bytes:
        return self.private_key.sign(text.encode("utf-8"))

    def verifier(self) -> Ed25519Verifier:
        return Ed25519Verifier(self.name, self.public_key)

    def vkey(self) -> str:
        return format_vkey(self.name, self.key_id, self.signature_type, self.public_key)


class CosignatureSigner(Ed25519Signer):
    """A witness's `cosignature/v1` signer; `clock` gives the POSIX seconds to sign with."""

    signature_type = COSIGNATURE_V1

    def __init__(self, name: str, private_key: Ed25519PrivateKey, clock=None) -> None:
        super().__init__(name, private_key)
        self.clock = clock or time.time

    def sign(self, text: str) -> bytes:
        timestamp = int(self.clock())
        return struct.pack(">Q", timestamp) + self.private_key.sign(cosigned_message(text, timestamp))

    def verifier(self) -> CosignatureVerifier:
        return CosignatureVerifier(self.name, self.public_key)


def sign_note(text: str, *signers: Signer) -> Note:
    check_text(text)
    return Note(text, tuple(Signature(s.name, s.key_id, s.sign(text)) for s in signers))


def add_signatures(note: Note, *signatures: Signature) -> Note:
    """The note with more signature lines (a witness's cosignatures); a line already
    present (same name and key ID) is replaced."""
    new = {(s.name, s.key_id) for s in signatures}
    kept = tuple(s for s in note.signatures if (s.name, s.key_id) not in new)
    return Note(note.text, kept + tuple(signatures), note.verified)


def format_vkey(name: str, kid: int, signature_type: int, public_key: bytes) -> str:
    return f"{name}+{kid:08x}+{base64.b64encode(bytes([signature_type]) + public_key).decode('ascii')}"


def parse_vkey(vkey: str) -> Ed25519Verifier:
    """A verifier from its vkey text (types 0x01 and 0x04 are supported)."""
    text = vkey.strip()
    parts = text.split("+", 2)  # the base64 key may hold a plus; the name and hex ID may not
    if len(parts) != 3:
        raise NoteError("a vkey is `<name>+<hex key ID>+<base64 key>`")
    name, hex_id, blob = parts
    check_key_name(name)
    if len(hex_id) != 8 or any(c not in "0123456789abcdef" for c in hex_id):
        raise NoteError("a vkey's key ID is 8 lower-case hex digits")
    raw = b64decode_strict(blob, "the vkey's key")
    if not raw:
        raise NoteError("the vkey holds no key")
    kinds = {ED25519: Ed25519Verifier, COSIGNATURE_V1: CosignatureVerifier}
    kind = kinds.get(raw[0])
    if kind is None:
        raise NoteError(f"signature type 0x{raw[0]:02x} is not supported here (Ed25519 0x01, cosignature/v1 0x04)")
    verifier = kind(name, raw[1:])
    if verifier.key_id != int(hex_id, 16):
        raise NoteError(f"the vkey's key ID {hex_id} is not the one its name and key give")
    return verifier


def open_note(data: bytes, verifiers: Iterable[Verifier], max_bytes: int = MAX_NOTE_BYTES) -> Note:
    """Parses and verifies a note: every signature by a known key must verify, and at least
    one must. Returns the note with `verified` set."""
    note = parse_note(data, max_bytes)
    known = {(v.name, v.key_id): v for v in verifiers}
    verified = []
    seen = set()
    for signature in note.signatures:
        verifier = known.get((signature.name, signature.key_id))
        if verifier is None:
            continue  # unknown keys are ignored, as the spec requires
        if (signature.name, signature.key_id) in seen:
            raise NoteError(f"the note carries two signatures of {signature.name} ({signature.key_id:08x})")
        seen.add((signature.name, signature.key_id))
        if not verifier.verify(note.text, signature.signature):
            raise NoteError(f"the signature of {signature.name} ({signature.key_id:08x}) does not verify")
        verified.append(signature)
    if not verified:
        raise NoteError("no signature on the note is by a known key")
    return Note(note.text, note.signatures, tuple(verified))
