"""The origin guard addon: the proxy's upstream connections reported to the control plane's
origin (governor.control.origin.ProxyOrigin), which refuses requests that arrive through
them, and no connection made to the control plane itself. Registered only with a control
plane (governor.proxy.chain).
"""

from __future__ import annotations

from typing import Any


class OriginGuard:
    """The mitmproxy addon of the server connection hooks."""

    def __init__(self, origin: Any) -> None:
        self.origin = origin  # governor.control.origin.ProxyOrigin

    def server_connected(self, data: Any) -> None:
        self.origin.connected(data.server.sockname)

    def server_disconnected(self, data: Any) -> None:
        self.origin.disconnected(data.server.sockname)

    def server_connect(self, data: Any) -> None:
        address = data.server.address
        if address and self.origin.refuses_connect(address[0], address[1]):
            data.server.error = "the governor does not connect to its own control plane"
