"""The governor's Ed25519 key and identity (Runtime §8.2).

The governor is identified by an HTTPS URI or a did:web; its key is published in a
DID document (did.json) whose assertionMethod names it. Verification here is
offline: the verifier is handed the DID document (or a pinned public key) rather
than fetching it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote, unquote, urlsplit

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from governor.common.canonical import b64url, b64url_decode
from governor.common.documents import JSON, DocumentError, parse_document, read_document_bytes
from governor.common.ed25519_points import ed25519_key_problem
from governor.evidence.errors import DidDocumentError, KeyFileError
from governor.evidence.record import fsync_directory

DEFAULT_IDENTIFIER = "did:web:localhost:governor"
PRIVATE_KEY_FILE = "governor-key.pem"
PUBLIC_KEY_FILE = "governor-pub.pem"
DID_DOCUMENT_FILE = "did.json"
KEY_FRAGMENT = "#key-1"
_ED25519_MULTICODEC = b"\xed\x01"
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


# --- identifiers ----------------------------------------------------------------------


def check_identifier(identifier: str) -> str:
    """The identifier itself if it is an HTTPS URI or a did:web (§8.2); ValueError otherwise."""
    if not isinstance(identifier, str) or any(c.isspace() for c in identifier):
        raise ValueError(f"governor identifier must be an HTTPS URI or a did:web, got {identifier!r}")
    if identifier.startswith("did:web:"):
        host = identifier[len("did:web:"):].split(":", 1)[0]
        if host and "/" not in identifier and "#" not in identifier:
            return identifier
    elif identifier.startswith("https://") and did_web_for_https(identifier):
        return identifier
    raise ValueError(f"governor identifier must be an HTTPS URI or a did:web, got {identifier!r}")


def did_web_for_https(uri: str) -> str | None:
    """The did:web naming the same place as an HTTPS URI (https://h:8443/a/b -> did:web:h%3A8443:a:b)."""
    parts = urlsplit(uri)
    if parts.scheme != "https" or not parts.hostname or parts.username or parts.query or parts.fragment:
        return None
    segments = [quote(unquote(s), safe="") for s in parts.path.split("/") if s]
    return ":".join(["did:web", quote(parts.netloc, safe="")] + segments)


def did_web_document_url(did: str) -> str:
    """Where a did:web's DID document is published (did:web:d -> https://d/.well-known/did.json)."""
    parts = did[len("did:web:"):].split(":")
    host, path = unquote(parts[0]), [unquote(p) for p in parts[1:]]
    return f"https://{host}/" + ("/".join(path) + "/did.json" if path else ".well-known/did.json")


def identifiers_match(document_id: str, governor: str) -> bool:
    """A DID document's id names the governor: equal, or the did:web form of its HTTPS URI."""
    return document_id == governor or (governor.startswith("https://") and document_id == did_web_for_https(governor))


# --- keys -----------------------------------------------------------------------------


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_bytes(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_fingerprint(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """`SHA256:<base64url>` of the raw public key: a short name to compare keys by."""
    return "SHA256:" + b64url(hashlib.sha256(public_key_bytes(key)).digest())


_MAX_KEY_FILE_BYTES = 64 * 1024  # a PEM key is a few hundred bytes


def _read(path: Path | str, what: str) -> bytes:
    try:
        return read_document_bytes(path, max_bytes=_MAX_KEY_FILE_BYTES)
    except OSError as exc:
        raise KeyFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except DocumentError as exc:
        raise KeyFileError(f"{what} {exc}") from None


def load_private_key(path: Path | str) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM (PKCS#8) file; KeyFileError otherwise."""
    data = _read(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(f"{path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(path: Path | str) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM (SubjectPublicKeyInfo) file; KeyFileError otherwise."""
    data = _read(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(f"{path} is not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    problem = ed25519_key_problem(public_key_bytes(key))
    if problem is not None:
        raise KeyFileError(f"{path}: {problem} is refused")
    return key


def usable_public_key(raw: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from 32 raw bytes; ValueError for any other length, a small-order
    point or a non-canonical encoding (governor.common.ed25519_points)."""
    problem = ed25519_key_problem(raw)
    if problem is not None:
        raise ValueError(problem)
    return Ed25519PublicKey.from_public_bytes(raw)


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def public_key_pem(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


# --- DID documents --------------------------------------------------------------------


def _base58_encode(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    text = ""
    while number:
        number, digit = divmod(number, 58)
        text = _BASE58[digit] + text
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + text


def _base58_decode(text: str) -> bytes:
    number = 0
    for char in text:
        number = number * 58 + _BASE58.index(char)  # ValueError on a stray character
    body = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return b"\0" * (len(text) - len(text.lstrip("1"))) + body


def did_for(identifier: str) -> str:
    """The did:web under which an identifier's DID document is published."""
    return identifier if identifier.startswith("did:web:") else did_web_for_https(check_identifier(identifier))


def did_document(identifier: str, public_key: Ed25519PublicKey | Ed25519PrivateKey) -> dict[str, Any]:
    """A DID document publishing the governor key as its assertionMethod.

    Its id is the did:web (for an HTTPS identifier, the did:web naming the same
    place, with the HTTPS URI in alsoKnownAs). The key is given as
    publicKeyMultibase (Ed25519VerificationKey2020) and, for resolvers that read
    the ADL test vectors' form, as standard base64 publicKeyBase64.
    """
    check_identifier(identifier)
    did = did_for(identifier)
    raw = public_key_bytes(public_key)
    method_id = did + KEY_FRAGMENT
    document: dict[str, Any] = {
        "@context": ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/suites/ed25519-2020/v1"],
        "id": did,
    }
    if did != identifier:
        document["alsoKnownAs"] = [identifier]
    document["verificationMethod"] = [
        {
            "id": method_id,
            "type": "Ed25519VerificationKey2020",
            "controller": did,
            "publicKeyMultibase": "z" + _base58_encode(_ED25519_MULTICODEC + raw),
            "publicKeyBase64": base64.b64encode(raw).decode("ascii"),
        }
    ]
    document["assertionMethod"] = [method_id]
    return document


def document_identifier(document: Mapping[str, Any]) -> str | None:
    """The governor identifier a DID document was written for (its HTTPS alias, else its id)."""
    aliases = [a for a in document.get("alsoKnownAs") or () if isinstance(a, str) and a.startswith("https://")]
    for alias in aliases:
        if identifiers_match(document.get("id"), alias):
            return alias
    return document.get("id") if isinstance(document.get("id"), str) else None


def _method_key(method: Mapping[str, Any]) -> Ed25519PublicKey | None:
    """The Ed25519 key a verification method carries, in any of the usual encodings."""
    raw: bytes | None = None
    try:
        if isinstance(method.get("publicKeyMultibase"), str):
            text = method["publicKeyMultibase"]
            if text.startswith("z"):
                decoded = _base58_decode(text[1:])
                raw = decoded[2:] if decoded.startswith(_ED25519_MULTICODEC) else decoded
        elif isinstance(method.get("publicKeyJwk"), Mapping):
            jwk = method["publicKeyJwk"]
            if jwk.get("kty") == "OKP" and jwk.get("crv") == "Ed25519":
                raw = b64url_decode(jwk.get("x"))
        elif isinstance(method.get("publicKeyBase64"), str):
            text = method["publicKeyBase64"]
            raw = base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True)
        elif isinstance(method.get("publicKeyBase58"), str):
            raw = _base58_decode(method["publicKeyBase58"])
    except (ValueError, TypeError):
        return None
    if raw is None:
        return None
    try:
        return usable_public_key(raw)
    except ValueError:
        return None


def assertion_keys(document: Mapping[str, Any], did: str | None = None) -> list[Ed25519PublicKey]:
    """Every Ed25519 key the document's assertionMethod names; DidDocumentError when none.

    With `did`, the document must be that identifier's (its id equal to it, or the
    did:web form of an HTTPS identifier).
    """
    if not isinstance(document, Mapping) or not isinstance(document.get("id"), str):
        raise DidDocumentError("not a DID document: no id")
    doc_id = document["id"]
    if did is not None and not identifiers_match(doc_id, did):
        raise DidDocumentError(f"DID document is for {doc_id}, not for {did}")
    methods = {}
    for method in document.get("verificationMethod") or ():
        if isinstance(method, Mapping) and isinstance(method.get("id"), str):
            mid = method["id"]
            methods[doc_id + mid if mid.startswith("#") else mid] = method
    keys = []
    for entry in document.get("assertionMethod") or ():
        if isinstance(entry, str):
            method = methods.get(doc_id + entry if entry.startswith("#") else entry)
        else:
            method = entry if isinstance(entry, Mapping) else None
        key = _method_key(method) if method is not None else None
        if key is not None:
            keys.append(key)
    if not keys:
        raise DidDocumentError(f"DID document {doc_id} names no Ed25519 key in assertionMethod")
    return keys


def public_key_from_did_document(document: Mapping[str, Any], did: str | None = None) -> Ed25519PublicKey:
    """The first Ed25519 assertionMethod key of a DID document (see assertion_keys)."""
    return assertion_keys(document, did)[0]


def load_did_document(path: Path | str) -> dict[str, Any]:
    """A DID document file: a JSON object, read within the bounds of governor.common.documents."""
    try:
        return parse_document(read_document_bytes(path), format=JSON, source=f"DID document {path}",
                              what="DID document")
    except OSError as exc:
        raise KeyFileError(f"cannot read DID document {path}: {exc.strerror or exc}") from None
    except DocumentError as exc:
        raise KeyFileError(str(exc)) from None


# --- key files ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyFiles:
    """Where a governor key pair and its DID document live (one directory)."""

    directory: Path

    @property
    def private_key(self) -> Path:
        return self.directory / PRIVATE_KEY_FILE

    @property
    def public_key(self) -> Path:
        return self.directory / PUBLIC_KEY_FILE

    @property
    def did_document(self) -> Path:
        return self.directory / DID_DOCUMENT_FILE


def _write_file(path: Path, data: bytes, mode: int, *, exclusive: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask; an existing file keeps its own
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _did_json(identifier: str, key: Ed25519PrivateKey) -> bytes:
    return (json.dumps(did_document(identifier, key), indent=2) + "\n").encode("utf-8")


def write_key_files(
    directory: Path | str, identifier: str = DEFAULT_IDENTIFIER, *, key: Ed25519PrivateKey | None = None, force: bool = False
) -> KeyFiles:
    """Write a key pair (private key mode 0600) and its DID document into `directory`.

    Refuses (FileExistsError) to replace an existing private key unless `force`.
    """
    check_identifier(identifier)
    files = KeyFiles(Path(directory))
    files.directory.mkdir(parents=True, exist_ok=True)
    if not force and files.private_key.exists():
        raise FileExistsError(f"{files.private_key} already exists (use --force to replace the governor key)")
    key = key or generate_key()
    _write_file(files.private_key, private_key_pem(key), 0o600, exclusive=not force)
    _write_file(files.public_key, public_key_pem(key), 0o644, exclusive=False)
    _write_file(files.did_document, _did_json(identifier, key), 0o644, exclusive=False)
    fsync_directory(files.directory)
    return files


def ensure_governor_key(data_dir: Path | str, identifier: str | None = None) -> tuple[Ed25519PrivateKey, str]:
    """The governor's key and identifier, creating them under `<data_dir>/keys` on first run.

    The identifier is `identifier` when given (the DID document is rewritten if it
    named another one: it is derived data), else the id of the existing DID
    document, else DEFAULT_IDENTIFIER.
    """
    files = KeyFiles(Path(data_dir) / "keys")
    if not files.private_key.exists():
        if files.public_key.exists():
            raise KeyFileError(f"{files.public_key} exists without its private key {files.private_key}")
        identifier = identifier or DEFAULT_IDENTIFIER
        key = generate_key()
        write_key_files(files.directory, identifier, key=key)
        return key, identifier
    key = load_private_key(files.private_key)
    if not files.public_key.exists():
        _write_file(files.public_key, public_key_pem(key), 0o644, exclusive=False)
    elif public_key_bytes(load_public_key(files.public_key)) != public_key_bytes(key):
        raise KeyFileError(f"{files.public_key} does not match the private key {files.private_key}")
    current = None
    if files.did_document.exists():
        document = load_did_document(files.did_document)
        current = document_identifier(document)
        try:
            if public_key_bytes(public_key_from_did_document(document)) != public_key_bytes(key):
                current = None  # stale document for another key: rewrite it
        except DidDocumentError:
            current = None
    if identifier is None:
        identifier = current or DEFAULT_IDENTIFIER
    check_identifier(identifier)
    if identifier != current:
        _write_file(files.did_document, _did_json(identifier, key), 0o644, exclusive=False)
    return key, identifier
