"""Resolving a governor's did:web over HTTPS for `governor verify` (Runtime §8.2, §8.6 step 2).

The evidence room does no I/O: the verifier is handed this resolver. It trusts only
the CA bundle it is given (`--ca-bundle`; the system's store without one), follows no
redirect (a did:web document is served at its own URL), and bounds the time and the
size of the answer, so a hostile or slow host gets a clear refusal, never a hang.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from governor.common.documents import JSON, DocumentError, parse_document
from governor.evidence.errors import DidResolutionError
from governor.evidence.keys import did_web_document_url

DEFAULT_TIMEOUT_SEC = 10.0
MAX_DOCUMENT_BYTES = 64 * 1024  # a DID document is a few hundred bytes; refuse a flood
_CHUNK = 8192


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 (urllib's hook)
        raise DidResolutionError(f"{req.full_url} answered {code}, a redirect to {newurl}: redirects are not followed")


class HttpsDidResolver:
    """did:web -> its DID document, fetched over HTTPS against a pinned CA bundle."""

    def __init__(self, ca_bundle: Path | None = None, *, timeout: float = DEFAULT_TIMEOUT_SEC,
                 max_bytes: int = MAX_DOCUMENT_BYTES) -> None:
        try:
            self.context = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--ca-bundle {ca_bundle}: not a readable PEM bundle of CA certificates ({exc})") from None
        self.ca_bundle = ca_bundle
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self.context), _NoRedirect())

    def __call__(self, did: str) -> dict[str, Any]:
        url = did_web_document_url(did)
        deadline = time.monotonic() + self.timeout
        request = urllib.request.Request(url, headers={"Accept": "application/did+json, application/json"})
        try:
            with self.opener.open(request, timeout=self.timeout) as answer:
                if answer.status != 200:
                    raise DidResolutionError(f"{url} answered {answer.status}, not 200")
                body = self._read(answer, url, deadline)
        except DidResolutionError:
            raise
        except urllib.error.HTTPError as exc:
            raise DidResolutionError(f"{url} answered {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            raise DidResolutionError(f"cannot fetch {url}: {exc.reason}") from None
        except (TimeoutError, OSError) as exc:  # a read timeout, a reset
            raise DidResolutionError(f"cannot fetch {url}: {exc or type(exc).__name__}") from None
        try:
            return parse_document(body, format=JSON, source=url, what="DID document")
        except DocumentError as exc:
            raise DidResolutionError(f"{url}: {exc}") from None

    def _read(self, answer: Any, url: str, deadline: float) -> bytes:
        length = answer.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            raise DidResolutionError(f"{url}: the document is {length} bytes, over the {self.max_bytes}-byte limit")
        parts: list[bytes] = []
        size = 0
        while chunk := answer.read1(_CHUNK):
            size += len(chunk)
            if size > self.max_bytes:
                raise DidResolutionError(f"{url}: the document is over the {self.max_bytes}-byte limit")
            if time.monotonic() > deadline:  # a host trickling bytes must not hold the verifier
                raise DidResolutionError(f"{url}: no complete answer within {self.timeout:g} s")
            parts.append(chunk)
        return b"".join(parts)
