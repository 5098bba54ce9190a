"""Telling a request that came through the governor's own proxy.

The governed agent must not answer its own pause. Its primary barrier is the
reviewer token, which the agent must never hold. This module adds the second:
the control plane refuses any request that the proxy forwarded, so an agent
whose egress goes through the governor cannot reach the control plane that way
even with a leaked token. Three independent signs, any one suffices:

1. the marker header: the proxy sets `ADL-Governor-Via: <per-process id>` on every
   request it forwards (overwriting one the agent sent); the control plane refuses
   any request carrying that header, whatever its value;
2. the socket: the proxy reports the local address of each upstream connection it
   opens (`connected` / `disconnected`); a request whose peer address is one of
   those came out of the proxy, header or not (e.g. a raw TCP tunnel);
3. the address: the proxy asks `refuses_connect(host, port)` before connecting
   upstream and refuses to connect to the control plane's own listening address.

Plus a `Via` header naming mitmproxy or the governor (mitmproxy 12 adds none by
default; an operator's extra addon or an upstream-proxy chain might).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket

MARKER_HEADER = "ADL-Governor-Via"
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None


def _is_loopback(host: str) -> bool:
    ip = _ip(host)
    return ip.is_loopback if ip is not None else host.lower().rstrip(".") in _LOCAL_NAMES


def _local_addresses() -> set[str]:
    """This host's own addresses, for a control plane bound to all interfaces."""
    try:
        name, aliases, addresses = socket.gethostbyname_ex(socket.gethostname())
    except OSError:
        return set()
    return {name, *aliases, *addresses}


class ProxyOrigin:
    """Shared by the proxy's origin guard (which reports) and the control plane (which refuses)."""

    header = MARKER_HEADER

    def __init__(self) -> None:
        self.marker = secrets.token_urlsafe(12)  # identifies this process in logs; not a credential
        self._upstream_sockets: set[tuple[str, int]] = set()
        self._control_hosts: dict[int, set[str]] = {}  # port -> hosts naming the control plane
        self._control_loopback_ports: set[int] = set()  # ports it listens on over loopback

    # --- reported by the proxy's origin guard (governor.proxy.origin_guard) ----------

    def connected(self, sockname: tuple | None) -> None:
        """The proxy opened an upstream connection from local address `sockname`."""
        if sockname:
            self._upstream_sockets.add((str(sockname[0]), int(sockname[1])))

    def disconnected(self, sockname: tuple | None) -> None:
        if sockname:
            self._upstream_sockets.discard((str(sockname[0]), int(sockname[1])))

    def refuses_connect(self, host: str, port: int) -> bool:
        """True when (host, port) is the control plane: the proxy must not connect there."""
        port = int(port)
        hosts = self._control_hosts.get(port)
        if hosts is None:  # every control-plane port has an entry: any other port is not it (per request: cheap)
            return False
        host = host.strip("[]").lower().rstrip(".")
        return host in hosts or (port in self._control_loopback_ports and _is_loopback(host))

    # --- used by the control plane -----------------------------------------------------

    def listening(self, addresses: list[tuple]) -> None:
        """Record the control plane's bound addresses ((host, port, ...) as from getsockname).

        May resolve this host's name (bound to all interfaces): call it off the event loop.
        """
        self._control_hosts, self._control_loopback_ports = {}, set()
        for address in addresses:
            host, port = str(address[0]).lower(), int(address[1])
            hosts = self._control_hosts.setdefault(port, set())
            hosts.add(host)
            ip = _ip(host)
            if ip is not None and ip.is_unspecified:
                hosts |= {h.lower() for h in _local_addresses()}
                self._control_loopback_ports.add(port)
            elif _is_loopback(host):
                self._control_loopback_ports.add(port)

    def through_proxy(self, headers, peername: tuple | None) -> str | None:
        """Why this request is taken to have come through the proxy, or None."""
        if self.header in headers:
            return f"request carries the {self.header} header set by the governor's proxy"
        if peername and (str(peername[0]), int(peername[1])) in self._upstream_sockets:
            return "request comes from one of the governor proxy's upstream connections"
        for via in headers.getall("Via", ()):
            lowered = via.lower()
            if "mitmproxy" in lowered or "governor" in lowered:
                return f"request passed through an intercepting proxy (Via: {via})"
        return None
