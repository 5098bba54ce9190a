"""The listen backlog of the governor's listeners (the proxy's, the control plane's): room in
the kernel's accept queue for a burst of connections that arrives while the event loop is busy.

asyncio listens with a backlog of 100, aiohttp's TCPSite with 128. A burst past it overflows
the accept queue: the handshakes past it are dropped (the client retries after a second), and
one completed with a SYN cookie the kernel no longer honours is reset, so the client sees its
connection broken before the governor ever accepted it. With a wide backlog the kernel queues
the burst instead; each listener's own connection cap still bounds what it serves.
"""

BACKLOG = 65535  # listen(2) silently caps it at net.core.somaxconn

__all__ = ["BACKLOG"]
