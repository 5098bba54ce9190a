"""MCP 2026-07-28's routing headers, held to the body the governor decides on.

The stateless revision has the client mirror parts of each request into HTTP headers so
that load balancers and gateways can route without reading the body: `Mcp-Method` (the
JSON-RPC method), `Mcp-Name` (the tool's name for tools/call and prompts/get, the URI for
resources/read), `MCP-Protocol-Version`, and `Mcp-Param-<token>` for tool arguments whose
schema carries an `x-mcp-header` annotation. A value that needs it travels base64-wrapped
as `=?base64?...?=`.

The governor decides on the body. Anything past it that routes on a header would act on a
value the governor never judged if the two disagreed (a `Mcp-Name: read_note` on a body
calling `delete_note`), so a request whose routing headers disagree with its body, or that
repeats one (first-copy and last-copy readers would disagree), is refused. The official
server SDK refuses the same requests (HEADER_MISMATCH); the governor does not count on every
server doing so.

`Mcp-Param-*` headers: which argument each mirrors is in the tool's input schema, which the
governor does not hold per call; so each such header must carry the rendering of some scalar
argument of the call (reached through objects, as the SDK reaches it). A header carrying a
value the body never had is refused: the spec's own reason for these headers is an
intermediary routing on them.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Iterator, Mapping

METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
VERSION_HEADER = "mcp-protocol-version"
PARAM_PREFIX = "mcp-param-"
ROUTING_HEADERS = (METHOD_HEADER, NAME_HEADER, VERSION_HEADER)
# the params member Mcp-Name mirrors, per method (MCP 2026-07-28, basic/transports)
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
_SENTINEL = re.compile(r"=\?base64\?(?P<payload>.*)\?=", re.DOTALL)


def header_values(headers: Any, name: str) -> list[str]:
    """Every value of header `name` (RawHeaders keep repeats; a plain mapping has one)."""
    get_all = getattr(headers, "get_all", None)
    if get_all is not None:
        return list(get_all(name))
    value = headers.get(name)
    return [] if value is None else [value]


def decode(value: str) -> str | None:
    """A header value as the SDK reads it: verbatim, or the UTF-8 of a canonical base64
    sentinel; None for a malformed sentinel (it matches nothing)."""
    match = _SENTINEL.fullmatch(value)
    if match is None:
        return value
    payload = match.group("payload")
    try:
        decoded = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None
    if base64.b64encode(decoded).decode("ascii") != payload:
        return None
    try:
        return decoded.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _rendered(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        try:
            return str(value)
        except ValueError:  # an int past CPython's digit limit has no rendering
            return None
    return None


def _scalars(arguments: Mapping[str, Any]) -> Iterator[str]:
    stack: list[Any] = [arguments]
    while stack:
        node = stack.pop()
        for value in node.values():
            if isinstance(value, Mapping):
                stack.append(value)
            elif (text := _rendered(value)) is not None:
                yield text


def routing_mismatch(headers: Any, body: Any) -> str | None:
    """Why the request's MCP routing headers disagree with its body, or None when they agree
    (or it carries none)."""
    present = {}
    for name in ROUTING_HEADERS:
        values = header_values(headers, name)
        if len(values) > 1:
            return f"the {name} header appears more than once"
        if values:
            present[name] = values[0]
    params_headers = [(k, v) for k, v in _items(headers) if k.lower().startswith(PARAM_PREFIX)]
    if not present and not params_headers:
        return None
    if not isinstance(body, dict):
        if present.get(METHOD_HEADER) is not None or params_headers:
            return "MCP routing headers on a body that is not one JSON-RPC request"
        return None
    method = body.get("method")
    if METHOD_HEADER in present and present[METHOD_HEADER] != method:
        return f"the Mcp-Method header ({present[METHOD_HEADER][:80]!r}) is not the body's method ({method!r})"
    params = body.get("params") if isinstance(body.get("params"), dict) else {}
    if NAME_HEADER in present:
        key = NAME_BEARING.get(method) if isinstance(method, str) else None
        if key is None:
            return f"an Mcp-Name header on {method!r}, which names nothing"
        if decode(present[NAME_HEADER]) != params.get(key):
            return f"the Mcp-Name header is not the body's {key} ({str(params.get(key))[:80]!r})"
    if VERSION_HEADER in present:
        meta = params.get("_meta")
        version = meta.get("io.modelcontextprotocol/protocolVersion") if isinstance(meta, dict) else None
        if version is not None and version != present[VERSION_HEADER]:
            return "the MCP-Protocol-Version header is not the request's _meta protocol version"
    if params_headers:
        if method != "tools/call":
            return f"Mcp-Param-* headers on {method!r}; only tools/call mirrors arguments"
        seen: set[str] = set()
        arguments = params.get("arguments") if isinstance(params.get("arguments"), dict) else {}
        values = set(_scalars(arguments))
        for name, raw in params_headers:
            folded = name.lower()
            if folded in seen:
                return f"the {name} header appears more than once"
            seen.add(folded)
            if decode(raw) not in values:
                return f"the {name} header carries a value none of the call's arguments has"
    return None


def _items(headers: Any) -> Iterator[tuple[str, str]]:
    pairs = getattr(headers, "pairs", None)
    if pairs is not None:  # RawHeaders (what the proxy hands adapters): as sent, repeats kept
        return pairs()
    return iter(headers.items())  # a plain mapping (tests): one value a name
