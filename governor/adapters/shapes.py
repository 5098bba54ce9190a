"""What a request is, whatever way it is spelled: path normalization and the model-call sniff.

Selection matches paths after `normalize_path` (see docs/wire-protocols.md): servers
decode percent-escapes, and many (Starlette, aiohttp, nginx, Azure's gateway) fold
duplicate slashes, dot segments, a trailing slash or letter case before routing, so
the governor matches the path every such server would route, not the bytes as sent.

`model_shaped` recognises a model call by its body alone, for paths no adapter claims:
JSON with `model` and `messages`/`prompt`/`input` (or Anthropic-on-cloud's
`anthropic_version` with `messages`, or a batch of such calls), whatever the
Content-Type says. It is cheap for what it is not: a byte search decides most bodies
without parsing them.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import orjson

# RFC 3986 unreserved characters and "/": decoding them never changes what a path names
# to a server that decodes before routing (all the ones that matter do).
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_DECODABLE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/")


def _unescape(match: re.Match[str]) -> str:
    char = chr(int(match.group(1), 16))
    return char if char in _DECODABLE else match.group(0)


def normalize_path(path: str) -> str:
    """The path (query dropped) as a router sees it: unreserved characters and "/"
    percent-decoded (once, as servers do), duplicate slashes collapsed, "." and ".."
    segments resolved, no trailing slash. Letter case is kept (the caller folds it
    for matching; an Azure deployment name in the path keeps its case)."""
    route = path.split("?", 1)[0]
    if "%" in route:
        route = _ESCAPE.sub(_unescape, route)
    if "//" in route:
        route = re.sub("/{2,}", "/", route)
    if "/." in route:
        out: list[str] = []
        for segment in route.split("/")[1:]:
            if segment == "..":
                if out:
                    out.pop()
            elif segment != ".":
                out.append(segment)
        route = "/" + "/".join(out)
    if len(route) > 1 and route.endswith("/"):
        route = route.rstrip("/") or "/"
    return route or "/"


@lru_cache(maxsize=4096)
def route_forms(path: str) -> tuple[str, str]:
    """(normalize_path(path), the same in lower case), cached: agents repeat a few paths."""
    route = normalize_path(path)
    return route, route.lower()


# --- model calls by their body ----------------------------------------------------------

PROMPT_KEYS = ("messages", "prompt", "input")
# Bytes without which a body cannot be model-shaped, unless it hides its keys in \u escapes.
_MARKERS = (b'"model"', b'"anthropic_version"', b'"endpoint"', b"\\u")
_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")
# Python's json (what FastAPI/Starlette servers parse with) is tried only up to this size
# when orjson refuses a body (NaN, Infinity); past it, the bytes decide.
LENIENT_PARSE_LIMIT = 8 * 1024 * 1024
_MAX_ITEMS = 64  # items of a top-level array looked at


def _call(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    if "model" in value and any(key in value for key in PROMPT_KEYS):
        return True
    return "anthropic_version" in value and "messages" in value


def _batch(value: dict[str, Any]) -> bool:
    """A batch of model calls: Anthropic's {requests: [{params: {...}}]}, or OpenAI's
    {endpoint: "/v1/chat/completions", input_file_id} (its calls sit in an uploaded file)."""
    requests = value.get("requests")
    if isinstance(requests, list) and any(
            isinstance(item, dict) and _call(item.get("params")) for item in requests[:_MAX_ITEMS]):
        return True
    endpoint = value.get("endpoint")
    return isinstance(endpoint, str) and "input_file_id" in value


def shape_of(value: Any) -> bool:
    """A parsed body that is a model call, a batch of them, or an array holding one."""
    if isinstance(value, list):
        return any(_call(item) for item in value[:_MAX_ITEMS])
    return isinstance(value, dict) and (_call(value) or _batch(value))


def json_encoding(content: bytes) -> str | None:
    """The encoding Python's json.loads(bytes) reads `content` in (json.detect_encoding) when
    it is not plain UTF-8: a byte order mark (UTF-8, UTF-16, UTF-32) or, without one, the NUL
    bytes ASCII has in UTF-16/32. None for anything else (UTF-8 JSON, or no JSON at all)."""
    if content.startswith(_BOMS) or (len(content) >= 2 and (content[0] == 0 or content[1] == 0)):
        return json.detect_encoding(content)
    return None


# orjson writes nothing nested deeper than this (past it: "Recursion limit reached"), though it
# reads up to 1024 levels: a body the governor could not re-serialize is refused (400) before
# any step is admitted, rather than failing when it is rewritten on its way upstream.
MAX_NESTING = 254
TOO_DEEP = (f"request body nests deeper than {MAX_NESTING} levels, past what the governor can re-serialize "
            "exactly: refused")


def nests_too_deep(content: bytes, value: Any) -> bool:
    """Whether a parsed body nests past MAX_NESTING: written once by orjson to find out (about
    a seventh of the parse it follows; cheaper than counting the brackets of the bytes). A body
    too short to hold MAX_NESTING pairs of brackets is not written."""
    if len(content) <= 2 * MAX_NESTING:
        return False
    try:
        orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: the recursion limit (a parsed body holds nothing else it cannot write)
        return True
    return False


def json_text(content: bytes) -> bytes | str | None:
    """The body as JSON parsers would read it: UTF-8 as is; a BOM or UTF-16/32 decoded as
    Python's json.loads(bytes) detects it (what a Python server accepts); None when unreadable."""
    encoding = json_encoding(content)
    if encoding is None:
        return content
    try:
        return content.decode(encoding)
    except (UnicodeError, LookupError):
        return None


# The charsets a Content-Type may name for a body json_encoding reads: each encoding (as
# json.detect_encoding names it, with the byte order a BOM gives) and the charset names,
# folded (lower case, no "-" or "_"), that say the same bytes. A bare "utf-16"/"utf-32" says
# nothing of the byte order, so it agrees only with a body whose BOM says it.
_AGREEING = {
    "utf-8-sig": ("utf8",),
    "utf-16-le": ("utf16le",), "utf-16-be": ("utf16be",),
    "utf-32-le": ("utf32le",), "utf-32-be": ("utf32be",),
    "utf-16-le+bom": ("utf16", "utf16le"), "utf-16-be+bom": ("utf16", "utf16be"),
    "utf-32-le+bom": ("utf32", "utf32le"), "utf-32-be+bom": ("utf32", "utf32be"),
}
_SPELLED = {
    "utf-8-sig": "UTF-8 with a byte order mark",
    "utf-16-le": "UTF-16 little-endian", "utf-16-be": "UTF-16 big-endian",
    "utf-32-le": "UTF-32 little-endian", "utf-32-be": "UTF-32 big-endian",
}
_CHARSET = re.compile(r'(?:^|[\s;,])charset\s*=\s*"?([^";,\s]*)', re.IGNORECASE)


def _byte_order(content: bytes, encoding: str) -> str:
    """json.detect_encoding's name with the byte order a BOM gives ("utf-16" -> "utf-16-le+bom")."""
    if encoding == "utf-16":
        return "utf-16-le+bom" if content.startswith(b"\xff\xfe") else "utf-16-be+bom"
    if encoding == "utf-32":
        return "utf-32-le+bom" if content.startswith(b"\xff\xfe") else "utf-32-be+bom"
    return encoding


def charset_conflict(content_type: str | None, content: bytes, encoding: str) -> str | None:
    """Why a JSON body read in `encoding` (json_encoding's answer, not UTF-8) must be refused
    for the charset its Content-Type names, or None when it names none or one that agrees.

    Receiving servers differ here: the `mcp` SDK's streamable HTTP server (`json.loads` of
    the body) and a2a-python's JSON-RPC app (Starlette's `request.json()`, the same) ignore
    the charset and detect the encoding from the bytes; aiohttp's `request.json()` and Node's
    body-parser decode with the charset named.
    When the two readings can differ the governor cannot know which one the server makes,
    so it refuses rather than guess."""
    if not content_type or "charset" not in content_type.lower():
        return None
    order = _byte_order(content, encoding)
    agreeing = _AGREEING.get(order, ())
    for found in _CHARSET.finditer(content_type):
        named = found.group(1)
        if named.lower().replace("-", "").replace("_", "") not in agreeing:
            spelled = _SPELLED.get(order.removesuffix("+bom"), order)
            mark = " with a byte order mark" if order.endswith("+bom") else ""
            return (f"the JSON body is {spelled}{mark} but its Content-Type says charset={named!r}: servers "
                    "differ on which of the two to believe, so the governor refuses it rather than guess "
                    "(send UTF-8, or name the charset the body is in)")
    return None


def may_be_model_shaped(content: bytes) -> bool:
    """The cheap first test: False rules a body out (no key a model call needs is in it,
    spelled plainly or behind \\u escapes); True asks for model_shaped / shape_of."""
    if not content:
        return False
    if content.startswith(_BOMS) or (len(content) >= 2 and (content[0] == 0 or content[1] == 0)):
        return True  # not UTF-8 without BOM: model_shaped decodes it first
    for marker in _MARKERS:
        if marker in content:
            return True
    return False


def model_shaped(content: bytes) -> bool:
    """True when a body is (or may be, to a lenient server) a model call or a batch of them:
    parsed strictly (orjson), then as Python's json reads it (BOM, UTF-16/32, NaN); when
    neither can, the keys in plain sight decide."""
    if not content:
        return False
    text = json_text(content)
    if text is None:
        return False
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if not any(marker in raw for marker in _MARKERS):
        return False
    # when no parser reads it, the keys in plain sight decide, for what looks like JSON (or
    # JSON lines): a multipart upload that mentions "model" is not a model call
    literal = raw.lstrip()[:1] in (b"{", b"[") and any(marker in raw for marker in _MARKERS[:3])
    try:
        return shape_of(orjson.loads(text))
    except orjson.JSONDecodeError:
        pass
    if len(raw) > LENIENT_PARSE_LIMIT:
        return literal  # too large to try a second parser: the keys in plain sight decide
    try:
        return shape_of(json.loads(text))  # NaN, Infinity: what Python servers still accept
    except (ValueError, RecursionError):  # not JSON to Python either (JSON lines, truncated, ...)
        return literal


__all__ = ["normalize_path", "route_forms", "may_be_model_shaped", "model_shaped", "shape_of", "PROMPT_KEYS",
           "json_encoding", "json_text", "charset_conflict", "nests_too_deep", "MAX_NESTING", "TOO_DEEP"]
