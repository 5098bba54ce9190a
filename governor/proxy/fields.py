"""The header fields and bodies of governed exchanges: the ADL-* request headers the
governor reads (and strips before anything goes upstream), the admitted request as it goes
upstream, an answer's body with its Content-Encoding undone.

Module functions over mitmproxy's raw header fields, called by the addons on the
per-request path (governor.proxy.binding, admission, answers): one pass over the fields
each, no case-insensitive lookups per header.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from mitmproxy import http

from governor.proxy import bodies

SESSION_HEADER = "ADL-Session"
PERSONA_HEADER = "ADL-Persona"
PASSPORT_HEADER = "ADL-Passport"
GOVERNOR_HEADER_PREFIX = "adl-"  # every ADL-* request header is the governor's, never the upstream's
GOVERNOR_PREFIX = GOVERNOR_HEADER_PREFIX.encode()  # as header field names are stored
SESSION_FIELD, PERSONA_FIELD, PASSPORT_FIELD = (h.lower() for h in (SESSION_HEADER, PERSONA_HEADER, PASSPORT_HEADER))


def rewrite_for_upstream(request: http.Request, body: bytes | None, stream: bool,
                         extra: Mapping[str, str]) -> None:
    """The admitted request as it goes upstream, its header fields rebuilt once: a rewritten
    (unencoded) body with its Content-Length, `Accept-Encoding: identity` for a stream (it is
    parsed as it flows), the adapter's own headers (replacing any of the same name)."""
    fields = request.headers.fields
    drop: set[bytes] = set()
    add: list[tuple[bytes, bytes]] = []
    if body is not None:
        request.raw_content = body
        # as mitmproxy's own content setter: no Content-Length beside a Transfer-Encoding
        if b"transfer-encoding" not in [name.lower() for name, _ in fields]:
            drop.add(b"content-length")
            add.append((b"content-length", str(len(body)).encode()))
    if stream:
        drop.add(b"accept-encoding")
        add.append((b"accept-encoding", b"identity"))
    for name, value in extra.items():
        raw = name.encode()
        drop.add(raw.lower())
        add.append((raw, value.encode()))
    request.headers.fields = tuple([f for f in fields if f[0].lower() not in drop] + add)


def frame_relayed_stream(request: http.Request, response: http.Response) -> None:
    """A relayed stream's framing towards the client, set before its headers go out.

    The relay forwards whole events and, once the stream is cut, the adapter's terminal event
    in place of the rest: the client's body is not the upstream's byte for byte, so the
    upstream's Content-Length cannot frame it (a cut body ends short, and the client waits
    for bytes that never come). It is dropped; an HTTP/1.1 client gets the body chunked
    (mitmproxy chunks what the header says is chunked), HTTP/2 frames it itself, an HTTP/1.0
    client reads it to the close. A stream the upstream chunks (the usual one) is untouched."""
    fields = response.headers.fields
    names = [name.lower() for name, _ in fields]
    if b"content-length" not in names:
        return
    kept = [f for f in fields if f[0].lower() != b"content-length"]
    if b"transfer-encoding" not in names and request.http_version == "HTTP/1.1":
        kept.append((b"transfer-encoding", b"chunked"))
    response.headers.fields = tuple(kept)


_CHARSET = re.compile(r'((?:^|[\s;,])charset\s*=\s*)("[^"]*"|[^;,\s]*)', re.IGNORECASE)


def utf8_charset(content_type: str) -> str:
    """A Content-Type with every charset parameter naming UTF-8: for a body the agent sent in
    UTF-16/32 (or with a BOM) and the governor re-encoded (orjson writes UTF-8) to go upstream."""
    return _CHARSET.sub(r"\1utf-8", content_type)


def scan_headers(fields: tuple[tuple[bytes, bytes], ...]) -> tuple[dict[str, str], bool]:
    """The request's ADL-* headers by lower-case name (repeats folded as `Headers.get` folds
    them) and whether it has a Content-Encoding: one pass over the raw fields instead of a
    case-insensitive lookup per header. Repeats are joined once at the end: folding them
    one by one copied the growing value per repeat (tens of thousands of repeats in a 1 MiB
    head: ~0.7 s of the event loop for one request)."""
    found: dict[str, str] = {}
    repeated: dict[str, list[str]] | None = None
    encoded = False
    for name, value in fields:
        prefix = name[:4].lower()
        if prefix == GOVERNOR_PREFIX:
            key = name.decode("utf-8", "surrogateescape").lower()
            text = value.decode("utf-8", "surrogateescape")
            if key in found:
                if repeated is None:
                    repeated = {}
                repeated.setdefault(key, [found[key]]).append(text)
            else:
                found[key] = text
        elif prefix == b"cont" and name.lower() == b"content-encoding":
            encoded = True
    if repeated is not None:
        for key, values in repeated.items():
            found[key] = ", ".join(values)
    return found, encoded


def has_content_encoding(fields: Any) -> bool:
    for name, _ in fields:  # a loop, not any(generator): no frame per response
        if name.lower() == b"content-encoding":
            return True
    return False


def decoded_body(message: http.Message, bounds: bodies.Bounds) -> bytes:
    """The body with its Content-Encoding undone within `bounds` (bodies.decode: BodyError
    when it cannot be); without one, the raw bytes, found by a pass over the raw fields."""
    raw = message.raw_content or b""
    codings = bodies.encodings(message.headers.fields)
    return bodies.decode(raw, codings, bounds) if codings else raw
