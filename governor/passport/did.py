"""Offline did:web resolution (Trust §1.1.3).

Nothing is fetched: DID documents come from a local map the operator provides
(a JSON file mapping a DID or its did:web URL to the document, or a directory of
DID document files keyed by their `id`). The key is taken from
`assertionMethod`, following references into `verificationMethod`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import unquote

from governor.passport.errors import DidResolutionError, PassportError
from governor.passport.keys import (
    ED448,
    ED25519,
    PublicKey,
    b64decode_standard,
    key_algorithm,
    load_spki,
    public_key_from_bytes,
    public_key_from_jwk,
    public_key_from_multibase,
)
from governor.common.documents import read_document_file
from governor.passport.loader import JSON, parse_passport

_DID = re.compile(r"^did:([a-z0-9]+):(.+)$")


def did_method(did: str) -> str | None:
    """The method name of a DID (`web` for did:web:...), None when it is not a DID."""
    match = _DID.match(did) if isinstance(did, str) else None
    return match.group(1) if match else None


def did_web_url(did: str) -> str:
    """did:web:d -> https://d/.well-known/did.json; did:web:d:a:b -> https://d/a/b/did.json."""
    if did_method(did) != "web":
        raise DidResolutionError(f"{did!r} is not a did:web identifier")
    identifier = did[len("did:web:"):].split("#", 1)[0].split("?", 1)[0]
    domain, *path = identifier.split(":")
    domain = unquote(domain)  # a port is written %3A
    segments = [unquote(segment) for segment in path]
    if not domain or "/" in domain or any(not s or "/" in s for s in segments):
        raise DidResolutionError(f"{did!r} is not a well-formed did:web identifier")
    if segments:
        return f"https://{domain}/{'/'.join(segments)}/did.json"
    return f"https://{domain}/.well-known/did.json"


@dataclass(frozen=True, slots=True)
class ResolvedDid:
    did: str
    url: str
    keys: tuple[tuple[str, PublicKey], ...]  # (verification method id, key), assertionMethod order


def resolve_did_web(did: str, documents: Mapping[str, Any]) -> ResolvedDid:
    """Resolve a did:web DID against the local documents; DidResolutionError says why not."""
    did = did.split("#", 1)[0]
    url = did_web_url(did)
    document = documents.get(did, documents.get(url))
    if document is None:
        raise DidResolutionError(f"no DID document for {did} ({url}) among the local DID documents")
    if not isinstance(document, Mapping):
        raise DidResolutionError(f"the DID document for {did} is not a JSON object")
    if document.get("id") != did:
        raise DidResolutionError(f"the DID document at {url} is for {document.get('id')!r}, not {did}")
    # ids may be absolute (did#key-1) or relative to the document (#key-1): compare absolute
    def absolute(ref: Any) -> Any:
        return did + ref if isinstance(ref, str) and ref.startswith("#") else ref

    methods = {
        absolute(vm.get("id")): vm for vm in _list(document.get("verificationMethod")) if isinstance(vm, Mapping)
    }
    keys: list[tuple[str, PublicKey]] = []
    problems: list[str] = []
    for entry in _list(document.get("assertionMethod")):
        if isinstance(entry, Mapping):
            method = entry
        elif isinstance(entry, str):
            method = methods.get(absolute(entry))
            if method is None:
                problems.append(f"{entry}: not in verificationMethod")
                continue
        else:
            problems.append(f"{entry!r}: not a verification method")
            continue
        method_id = str(method.get("id", entry))
        try:
            keys.append((method_id, key_from_verification_method(method)))
        except PassportError as exc:
            problems.append(f"{method_id}: {exc}")
    if not keys:
        detail = f" ({'; '.join(problems)})" if problems else ""
        raise DidResolutionError(f"the DID document for {did} has no usable assertionMethod key{detail}")
    return ResolvedDid(did=did, url=url, keys=tuple(keys))


def key_from_verification_method(method: Mapping[str, Any]) -> PublicKey:
    """publicKeyJwk (OKP), publicKeyMultibase (Ed25519) or publicKeyBase64 (raw or SPKI)."""
    if "publicKeyJwk" in method:
        jwk = method["publicKeyJwk"]
        if not isinstance(jwk, Mapping):
            raise DidResolutionError("publicKeyJwk is not a JSON object")
        return public_key_from_jwk(jwk)
    if "publicKeyMultibase" in method:
        return public_key_from_multibase(str(method["publicKeyMultibase"]))
    if "publicKeyBase64" in method:
        data = b64decode_standard(str(method["publicKeyBase64"]), what="publicKeyBase64")
        kind = str(method.get("type", ""))
        if "Ed25519" in kind or (len(data) == 32 and "Ed448" not in kind):
            return public_key_from_bytes(ED25519, data)
        if "Ed448" in kind:
            return public_key_from_bytes(ED448, data)
        return public_key_from_bytes(key_algorithm(load_spki(data)), data)
    raise DidResolutionError("no publicKeyJwk, publicKeyMultibase or publicKeyBase64")


def load_did_documents(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The local DID map: a JSON file {DID or URL: document}, or a directory of DID documents."""
    path = Path(path)
    if path.is_dir():
        documents: dict[str, Any] = {}
        for file in sorted(path.glob("*.json")):
            document = _read_json(file)
            if not isinstance(document.get("id"), str):
                raise DidResolutionError(f"{file}: a DID document needs a string `id`")
            documents[document["id"]] = document
        return documents
    documents = _read_json(path)
    for key, document in documents.items():
        if not isinstance(document, dict):
            raise DidResolutionError(f"{path}: the entry for {key!r} is not a DID document object")
    return documents


def _read_json(path: Path) -> dict[str, Any]:
    data = read_document_file(path, DidResolutionError)
    try:
        return parse_passport(data, format=JSON, source=str(path))
    except PassportError as exc:
        raise DidResolutionError(str(exc).replace("a passport must be", "it must be")) from None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
