"""What an adapter reads of a request: the request view it matches on and opens (the body
parsed lazily, once), the agent's raw headers, and BadRequest, the refusal of a request that
cannot be understood."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import orjson

from governor.adapters.shapes import (LENIENT_PARSE_LIMIT, TOO_DEEP, charset_conflict, json_encoding, json_text,
                                      nests_too_deep, route_forms)


class BadRequest(Exception):
    """The request cannot be understood: answered with a 400 in the protocol's format, never forwarded."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class RawHeaders(Mapping[str, str]):
    """Request headers as the agent sent them, read from mitmproxy's raw (name, value)
    byte pairs without copying them into a Headers object: case-insensitive, repeats
    joined with ", " as `Headers.get` joins them. Decoded on first use (most requests'
    adapters never look)."""

    __slots__ = ("_fields", "_folded")

    def __init__(self, fields: Sequence[tuple[bytes, bytes]]) -> None:
        self._fields = fields
        self._folded: dict[str, str] | None = None

    def _decoded(self) -> dict[str, str]:
        if self._folded is None:
            folded: dict[str, str] = {}
            for name, value in self._fields:
                key = name.decode("utf-8", "surrogateescape").lower()
                text = value.decode("utf-8", "surrogateescape")
                folded[key] = f"{folded[key]}, {text}" if key in folded else text
            self._folded = folded
        return self._folded

    def __getitem__(self, name: str) -> str:
        return self._decoded()[name.lower()]

    def pairs(self) -> Iterator[tuple[str, str]]:
        """Every (name, value) as sent, repeats kept: for checks that a repeat defeats."""
        for name, value in self._fields:
            yield name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")

    def get_all(self, name: str) -> list[str]:
        wanted = name.lower()
        return [value for key, value in self.pairs() if key.lower() == wanted]

    def pairs(self) -> Iterator[tuple[str, str]]:
        """Every (name, value) as sent, repeats kept: for checks that a repeat defeats."""
        for name, value in self._fields:
            yield name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")

    def get_all(self, name: str) -> list[str]:
        wanted = name.lower()
        return [value for key, value in self.pairs() if key.lower() == wanted]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())


class RequestView:
    """A read-only view of an HTTP request for matching; parses the body lazily, once.

    Built by the addon from a mitmproxy request (or by tests from raw parts).
    Matching on the path costs nothing; `json()` parses the body with orjson on
    first use and caches the result (or the failure), so whichever adapter looks
    first pays and the others reuse it.

    The body is read as the receiving servers read it: UTF-8 by orjson (the hot path,
    nothing else is tried when it succeeds); JSON in another Unicode encoding (a byte order
    mark, UTF-16 or UTF-32) as Python's json.loads(bytes) reads it, which is what the `mcp`
    and `a2a` SDK servers do, so such a body is governed, never passed on as unknown
    traffic (`encoding` says which it was). JSON only to Python's json (NaN, 1e400, a lone
    surrogate escape, deeper nesting) is matched on and refused (`json()` raises BadRequest):
    the governor does not decide on values it cannot read as the server will. Anything
    else is not JSON.
    """

    __slots__ = ("method", "scheme", "host", "port", "path", "headers", "content", "encoding", "_json", "_error",
                 "_conflict", "_normal", "_match")

    _UNPARSED: ClassVar[object] = object()

    def __init__(
        self,
        method: str,
        host: str,
        path: str,
        headers: Mapping[str, str],
        content: bytes | None,
        *,
        port: int = 443,
        scheme: str = "https",
    ) -> None:
        self.method = method.upper()
        self.scheme = scheme
        self.host = host
        self.port = port
        self.path = path
        self.headers = headers  # case-insensitive mapping (mitmproxy Headers) or lower-case dict
        self.content = content or b""
        self.encoding: str | None = None  # the body's encoding when not UTF-8 (shapes.json_encoding)
        self._json: Any = self._UNPARSED
        self._error: str | None = None
        self._conflict: str | None = None  # a charset in Content-Type the body is not in
        self._normal: str | None = None
        self._match: str | None = None

    @property
    def route(self) -> str:
        """The path without its query string."""
        return self.path.split("?", 1)[0]

    @property
    def normal_route(self) -> str:
        """The route as a server routes it (shapes.normalize_path: percent-decoded, slashes
        collapsed, dot segments resolved, no trailing slash), letter case kept."""
        if self._normal is None:
            self._normal, self._match = route_forms(self.path)
        return self._normal

    @property
    def match_route(self) -> str:
        """The normalized route in lower case: what adapters and routes match on."""
        if self._match is None:
            self._normal, self._match = route_forms(self.path)
        return self._match

    @property
    def content_type(self) -> str:
        return (self.headers.get("content-type") or "").split(";", 1)[0].strip().lower()

    def json(self) -> Any:
        """The parsed body; raises BadRequest (once computed, cached) when it is not JSON, when
        it is JSON in an encoding its Content-Type's charset contradicts, or when it is JSON
        only to a lenient parser."""
        self._parse()
        if self._error is not None:
            raise BadRequest(self._error)
        if self._conflict is not None:
            raise BadRequest(self._conflict)
        return self._json

    def json_object(self) -> dict[str, Any]:
        """The parsed body when it is a JSON object, what a model call's body is; BadRequest
        otherwise (json()'s refusals, or another JSON value)."""
        body = self.json()
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    def _parse(self) -> None:
        if self._json is self._UNPARSED and self._error is None:
            try:
                self._json = orjson.loads(self.content)
            except orjson.JSONDecodeError as exc:
                self._reread(exc)
            if self._error is None and self._conflict is None and nests_too_deep(self.content, self._json):
                self._conflict = TOO_DEEP  # matched on, refused by json(): 400 before any step

    def _reread(self, failure: orjson.JSONDecodeError) -> None:
        """Not UTF-8 JSON to orjson. JSON with a BOM or in UTF-16/32 is decoded as Python's
        json reads bytes (shapes.json_text) and parsed: governed like any body. JSON only to
        Python's json (NaN, Infinity, 1e400, a lone surrogate escape, nesting past orjson's
        1024 levels: what the `mcp` SDK server still accepts) is matched on but refused by
        json(), since the governor cannot read its values as the server will. Anything else
        keeps orjson's verdict. The value is kept for matching either way: a body an adapter
        would govern is refused in its protocol (400), never passed on as unknown traffic."""
        content = self.content
        encoding = json_encoding(content)
        text = json_text(content) if encoding is not None else None
        if isinstance(text, str):
            try:
                self._json = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                failure = exc
            else:
                self.encoding = encoding
                self._conflict = charset_conflict(self.headers.get("content-type"), content, encoding)
                return
        if len(content) <= LENIENT_PARSE_LIMIT:
            try:
                self._json = json.loads(content)
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                pass
            else:
                self._conflict = ("request body is JSON only to a lenient parser (NaN, Infinity, a number out of "
                                  "range, a lone surrogate or nesting past 1024 levels): refused, the governor "
                                  "cannot read its values exactly")
                return
        where = f" ({encoding})" if isinstance(text, str) else ""
        self._error = f"request body{where} is not valid JSON: {failure}"

    @property
    def parsed(self) -> bool:
        """The body was parsed already (or found not to be JSON): json_or_none costs nothing."""
        return self._json is not self._UNPARSED or self._error is not None

    @property
    def unparseable(self) -> bool:
        """A parse was tried and failed (not JSON to orjson, nor in another Unicode encoding,
        nor to Python's json)."""
        return self._error is not None

    def json_or_none(self) -> Any:
        """The parsed body, or None when absent or not JSON (for body-shape matching).
        Whatever the Content-Type says: servers that parse JSON regardless of it exist, so a
        JSON body is what it is (its charset is judged by json(), when an adapter opens it)."""
        if not self.content:
            return None
        self._parse()
        return None if self._error is not None else self._json
