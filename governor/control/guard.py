"""What a request must look like before any control-plane handler sees it.

The control plane listens on loopback with no token by default, so the browser on the
same machine is its nearest adversary: a web page can make it send requests there.
Three rules keep such a page out (docs/control-plane.md):

- Host: the `Host` header must name this control plane (its listen address,
  localhost, 127.0.0.1, [::1], or a configured `control_hosts` name). A DNS-rebinding
  page reaches 127.0.0.1 under its own name, which is not on the list: 421.
- Origin: browsers send `Origin` on every cross-origin request and on every POST; a
  request whose Origin is not this control plane's own (or `Sec-Fetch-Site` says
  cross-site) is refused: 403. Command-line clients send neither.
- Body: a POST/DELETE that carries a body must be `application/json`: 415. A form or text/plain POST is what a page can send
  cross-origin without asking; a JSON one needs a CORS preflight, never granted here.

Probes (/healthz, /readyz) skip the Host rule: kubelets and load balancers call them
by IP or any name, and they reveal nothing.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, Iterable, Mapping

import orjson

PROBES = frozenset({"/healthz", "/readyz"})
DEFAULT_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
ANY_HOST = "*"
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_TYPES = ("application/json",)
MAX_JSON_DEPTH = 64  # control-plane bodies are flat objects; orjson refuses past 1024 anyway


class Refusal(Exception):
    """A request the guard refuses: HTTP status, error code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def host_name(value: str) -> str:
    """The host part of a Host header or an origin's authority, lower case, no port or brackets."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8081
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        value = value.partition(":")[0]
    return value.rstrip(".")


def _local_names() -> set[str]:
    try:
        name, aliases, addresses = socket.gethostbyname_ex(socket.gethostname())
    except OSError:
        return set()
    return {n.lower() for n in (name, *aliases, *addresses)}


class ControlGuard:
    """The Host allow list and the Origin / Content-Type rules of one control plane."""

    def __init__(self, hosts: Iterable[str] = ()) -> None:
        configured = {host_name(h) for h in hosts if h and h.strip()}
        self.any_host = ANY_HOST in configured
        self._configured = configured - {ANY_HOST}
        self.hosts: frozenset[str] = frozenset(DEFAULT_HOSTS | self._configured)

    def listening(self, addresses: Iterable[tuple]) -> None:
        """Add the bound addresses (and, bound to all interfaces, this host's names and
        addresses). May resolve this host's name: call it off the event loop."""
        hosts = set(self.hosts)
        for address in addresses:
            host = host_name(str(address[0]))
            try:
                unspecified = ipaddress.ip_address(host.split("%")[0]).is_unspecified
            except ValueError:
                unspecified = False
            if unspecified:
                hosts |= _local_names()
            else:
                hosts.add(host)
        self.hosts = frozenset(hosts)

    # --- the rules ---------------------------------------------------------------------

    def check(self, method: str, path: str, headers: Mapping[str, str], has_body: bool) -> None:
        """Raise Refusal when the request breaks a rule."""
        host = headers.get("Host")
        if not self.any_host and path not in PROBES and host is not None and host_name(host) not in self.hosts:
            raise Refusal(421, "unknown_host",
                          f"Host {host!r} does not name this control plane; it answers to "
                          f"{', '.join(sorted(self.hosts))} (add names with --control-host / control_hosts)")
        origin = headers.get("Origin")
        if origin is not None and not self._same_origin(origin, host):
            raise Refusal(403, "cross_origin",
                          f"requests from a web page (Origin {origin!r}) are refused: the control plane "
                          "is for operators' tools, not browsers")
        if headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
            raise Refusal(403, "cross_origin", "cross-site requests from a browser are refused")
        if method in STATE_CHANGING:
            content_type = headers.get("Content-Type")
            if has_body:  # a body-less POST is typed by some clients (aiohttp: octet-stream), by none a page can't send
                media = (content_type or "").partition(";")[0].strip().lower()
                if media not in JSON_TYPES:
                    raise Refusal(415, "json_required",
                                  f"a {method} body must be JSON (Content-Type: application/json), "
                                  f"not {content_type or 'untyped'}")

    def _same_origin(self, origin: str, host: str | None) -> bool:
        """The Origin names this control plane as the Host header does (scheme http)."""
        scheme, sep, authority = origin.strip().lower().partition("://")
        if not sep or scheme != "http" or host is None:
            return False  # "null", file:, https: (the control plane speaks plain HTTP)
        return authority.rstrip("/") == host.strip().lower() and (self.any_host or host_name(authority) in self.hosts)


def page_query(query: Mapping[str, str]) -> tuple[str | None, int]:
    """(after, limit) of a listing's query string: `limit` 1..MAX_PAGE (default
    DEFAULT_PAGE), `after` the cursor (the last id of the previous page)."""
    from governor.sessions.index import DEFAULT_PAGE, MAX_PAGE

    raw = query.get("limit")
    if raw is None:
        limit = DEFAULT_PAGE
    elif raw.isdigit() and 1 <= len(raw) <= 6 and 1 <= int(raw) <= MAX_PAGE:
        limit = int(raw)
    else:
        raise Refusal(400, "bad_limit", f"limit must be a whole number from 1 to {MAX_PAGE}, not {raw[:40]!r}")
    after = query.get("after") or None
    if after is not None and len(after) > 1024:
        raise Refusal(400, "bad_cursor", "after: a session id of at most 1024 characters")
    return after, limit


def json_object(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """A request body that must be a JSON object nested at most `max_depth` deep.

    Raises Refusal(400) with the reason; never RecursionError."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc).lower() or "recursion" in str(exc).lower():
            raise Refusal(400, "json_too_deep", f"the body nests deeper than {max_depth} levels") from None
        raise Refusal(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # defensive: orjson bounds its own depth
        raise Refusal(400, "json_too_deep", f"the body nests deeper than {max_depth} levels") from None
    if not isinstance(body, dict):
        raise Refusal(400, "bad_json", "the body must be a JSON object")
    if _depth(body, max_depth) > max_depth:
        raise Refusal(400, "json_too_deep", f"the body nests deeper than {max_depth} levels")
    return body


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed value, iteratively, stopping once past `limit`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))
    return deepest
