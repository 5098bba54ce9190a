"""The proxy's listen backlog: room for a burst of agents' connections while the loop is busy.

mitmproxy listens with asyncio's default backlog of 100. A burst of connections (an agent
opening 256 streams at once) that arrives while the event loop is busy overflows the kernel's
accept queue: the handshakes past it are dropped, and one completed with a SYN cookie that the
kernel no longer honours is reset. The agent sees its connection broken (ECONNRESET, httpx's
`ReadError`) before the governor ever accepted it, so nothing could be recorded (the
fresh-clone run's flaky 256-stream case: `TcpExtListenOverflows`, `SyncookiesFailed`).
Listening again with a large backlog (the kernel caps it at net.core.somaxconn) queues the
burst instead; the connection guard's cap (governor.proxy.connections) still bounds what is
served, and refuses past it with a recorded reason. The number is governor.common.listening's,
which the control plane's listener uses too.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from mitmproxy.proxy import mode_servers

from governor.common.listening import BACKLOG  # shared with the control plane's listener
_INSTALLED = "_governor_backlog"


def widen(server: Any, backlog: int = BACKLOG) -> int:
    """Re-listen the stream sockets of an asyncio server with `backlog` (listen(2) on a listening
    socket changes its backlog in place); returns how many sockets were widened."""
    widened = 0
    for sock in getattr(server, "sockets", None) or ():
        if sock.type != socket.SOCK_STREAM:
            continue
        listener = socket.socket(sock.family, sock.type, fileno=os.dup(sock.fileno()))
        try:
            listener.listen(backlog)
            widened += 1
        finally:
            listener.close()  # the duplicate descriptor only: the server's socket stays open
    return widened


def install() -> None:
    """Make mitmproxy's TCP listeners listen with BACKLOG (idempotent)."""
    listen = mode_servers.AsyncioServerInstance.listen
    if getattr(listen, _INSTALLED, False):
        return

    async def listen_with_backlog(self: Any, host: str, port: int) -> Any:
        servers = await listen(self, host, port)
        for server in servers:
            if isinstance(server, asyncio.Server):
                widen(server)
        return servers

    setattr(listen_with_backlog, _INSTALLED, True)
    mode_servers.AsyncioServerInstance.listen = listen_with_backlog  # type: ignore[method-assign]
