"""Slow and many clients: deadlines for client connections and a cap on how many are open.

mitmproxy closes a connection only after `tcp_timeout` (600 s) without *any* activity,
so a client that sends a byte every few seconds, or one that sends half a request line
and waits, holds its socket (a file descriptor) forever; 1,100 of them exhausted the
process's descriptors and `/healthz` and honest clients timed out (issue 20, finding 4).
This addon adds what mitmproxy lacks (docs/operations.md):

- header deadline: a new connection must complete its first request's headers within
  `client_header_timeout` (for a CONNECT tunnel: the CONNECT, the TLS handshake and the
  first inner request's headers), however slowly the bytes dribble in;
- body deadline: a request's body must be complete `client_body_timeout` after its headers;
- idle deadline: a keep-alive connection with no request in flight is closed
  `client_idle_timeout` after its last response;
- a cap: at most `max_client_connections` client connections at once (default: what
  the descriptor limit leaves after headroom for upstream sockets, the control plane,
  journals and the state store). A connection over the cap first evicts the connection
  that has waited longest without a request in flight (a half-open or idle one); when
  every connection has a request in flight, the newcomer is refused (closed at once).

The hooks are O(1) dictionary moves; one sweep a second closes what is past its
deadline, in deadline order, touching only those. A connection is closed the way
mitmproxy's own inactivity timeout closes it (its handler task is cancelled).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any

from governor.proxy.coalescing import coalesce_writes

log = logging.getLogger("governor.proxy")

DEFAULT_HEADER_TIMEOUT = 30.0
DEFAULT_BODY_TIMEOUT = 120.0
DEFAULT_IDLE_TIMEOUT = 60.0
SWEEP_INTERVAL = 0.5
RESERVED_FDS_MIN = 128  # control plane, journals, the store, the CA and key files, logs


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_connections: int = 0  # 0: derived from the file-descriptor limit (default_cap)


def default_cap(soft_limit: int | None = None) -> int:
    """Client connections that fit the descriptor limit: each may hold one upstream socket
    too, and an eighth of the limit (at least RESERVED_FDS_MIN) stays for everything else."""
    if soft_limit is None:
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_limit == resource.RLIM_INFINITY or soft_limit <= 0:
        soft_limit = 1 << 20
    reserve = max(RESERVED_FDS_MIN, soft_limit // 8)
    return max(16, (soft_limit - reserve) // 2)


class _Conn:
    __slots__ = ("client", "busy")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.busy: set[str] = set()  # flows (and websocket/tcp streams) in flight


class ConnectionGuard:
    """The mitmproxy addon: two cheap hooks per request (requestheaders, response)."""

    def __init__(self, limits: ConnectionLimits = ConnectionLimits(), *, clock=time.monotonic) -> None:
        self.limits = limits
        self.cap = limits.max_connections or default_cap()
        self.clock = clock
        self._conns: dict[str, _Conn] = {}
        # client id -> since; insertion order is deadline order within each (one timeout each)
        self._unserved: dict[str, float] = {}  # no complete request headers yet
        self._idle: dict[str, float] = {}  # served, nothing in flight
        self._bodies: dict[str, tuple[Any, float]] = {}  # flow id -> (flow, since its headers)
        self._task: asyncio.Task | None = None
        self._proxyserver: Any = None
        self.closed = {"header_timeout": 0, "body_timeout": 0, "idle_timeout": 0, "evicted": 0, "refused": 0,
                       "shutdown": 0}
        self.shutting_down = False  # close_all() ran: a newcomer is refused

    # --- lifecycle -----------------------------------------------------------------------

    def running(self) -> None:
        from mitmproxy import ctx

        self._proxyserver = ctx.master.addons.get("proxyserver")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sweep_forever(), name="governor connection guard")

    def done(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def busy_connections(self) -> int:
        """Client connections with a request (or a WebSocket, a tunnel) in flight: what a drain waits for."""
        return sum(1 for conn in self._conns.values() if conn.busy)

    # --- hooks ---------------------------------------------------------------------------

    def close_all(self) -> int:
        """A graceful stop, before the master's: every client connection closed as a deadline
        closes one (its handler ends, not cancelled mid-await: no traceback per connection),
        and newcomers refused from now on. Returns how many were closed."""
        self.shutting_down = True
        return sum(self._close(client_id, "shutdown") for client_id in list(self._conns))

    def client_connected(self, client: Any) -> None:
        if self.shutting_down:
            client.error = "the governor is shutting down"
            return
        if len(self._conns) >= self.cap and not self._evict_one():
            self.closed["refused"] += 1
            client.error = f"over the governor's cap of {self.cap} client connections, all of them busy"
            log.warning("refused a client connection from %s: %d connections open, all busy",
                        client.peername, len(self._conns))
            return
        self._conns[client.id] = _Conn(client)
        self._unserved[client.id] = self.clock()
        handler = self._handler(client.id)
        io = handler.transports.get(handler.client) if handler is not None else None
        coalesce_writes(getattr(io, "writer", None))  # one write to the agent per loop turn

    def client_disconnected(self, client: Any) -> None:
        conn = self._conns.pop(client.id, None)
        self._unserved.pop(client.id, None)
        self._idle.pop(client.id, None)
        if conn is not None:
            for flow_id in conn.busy:
                self._bodies.pop(flow_id, None)

    def http_connect(self, flow: Any) -> None:
        # a tunnel: the TLS handshake and the first inner request's headers are still due
        # within the header deadline, counted from now
        client_id = flow.client_conn.id
        if client_id in self._unserved:
            self._unserved.pop(client_id)
            self._unserved[client_id] = self.clock()

    def requestheaders(self, flow: Any) -> None:
        conn = self._conns.get(flow.client_conn.id)
        if conn is None:
            return
        if not conn.busy:
            self._unserved.pop(conn.client.id, None)
            self._idle.pop(conn.client.id, None)
        conn.busy.add(flow.id)
        self._bodies[flow.id] = (flow, self.clock())

    def response(self, flow: Any) -> None:
        self._bodies.pop(flow.id, None)  # answered before its body was read (a refusal at the headers)
        self._finished(flow.client_conn.id, flow.id)

    def error(self, flow: Any) -> None:
        self._bodies.pop(flow.id, None)
        self._finished(flow.client_conn.id, flow.id)

    def websocket_start(self, flow: Any) -> None:
        self._started(flow.client_conn.id, "ws:" + flow.id)

    def websocket_end(self, flow: Any) -> None:
        self._finished(flow.client_conn.id, "ws:" + flow.id)

    def tcp_start(self, flow: Any) -> None:
        self._started(flow.client_conn.id, "tcp:" + flow.id)

    def tcp_end(self, flow: Any) -> None:
        self._finished(flow.client_conn.id, "tcp:" + flow.id)

    def tcp_error(self, flow: Any) -> None:
        self._finished(flow.client_conn.id, "tcp:" + flow.id)

    def _started(self, client_id: str, key: str) -> None:
        conn = self._conns.get(client_id)
        if conn is not None:
            self._unserved.pop(client_id, None)
            self._idle.pop(client_id, None)
            conn.busy.add(key)

    def _finished(self, client_id: str, key: str) -> None:
        conn = self._conns.get(client_id)
        if conn is None or key not in conn.busy:
            return
        conn.busy.discard(key)
        if not conn.busy:
            self._idle[client_id] = self.clock()

    # --- deadlines -----------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            try:
                self.sweep()
            except Exception:  # the guard must outlive any one odd connection
                log.exception("connection sweep failed")

    def sweep(self) -> None:
        now = self.clock()
        self._expire(self._unserved, now - self.limits.header_timeout, "header_timeout")
        self._expire(self._idle, now - self.limits.idle_timeout, "idle_timeout")
        cutoff = now - self.limits.body_timeout
        while self._bodies:
            flow_id, (flow, since) = next(iter(self._bodies.items()))
            if since > cutoff:
                break
            del self._bodies[flow_id]
            if getattr(flow.request, "timestamp_end", None) is not None:
                continue  # its body arrived (read here rather than in a request hook: one hook less per request)
            if self._close(flow.client_conn.id, "body_timeout"):
                log.info("closed a client connection: request body incomplete %gs after its headers",
                         self.limits.body_timeout)

    def _expire(self, waiting: dict[str, float], cutoff: float, why: str) -> None:
        while waiting:
            client_id, since = next(iter(waiting.items()))
            if since > cutoff:
                return
            del waiting[client_id]
            if self._sending(client_id):  # still writing a response out: give it another period
                waiting[client_id] = self.clock()
                continue
            self._close(client_id, why)

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest with nothing in flight, if any."""
        for _ in range(len(self._unserved) + len(self._idle)):
            first = next(iter(self._unserved.items()), None)
            idle = next(iter(self._idle.items()), None)
            if first is None and idle is None:
                return False
            waiting = self._unserved if idle is None or (first is not None and first[1] <= idle[1]) else self._idle
            client_id = (first if waiting is self._unserved else idle)[0]
            del waiting[client_id]
            if self._sending(client_id):
                waiting[client_id] = self.clock()
                continue
            if self._close(client_id, "evicted"):
                return True
        return False

    def _handler(self, client_id: str) -> Any:
        connections = getattr(self._proxyserver, "connections", None)
        return connections.get(client_id) if connections is not None else None

    def _sending(self, client_id: str) -> bool:
        handler = self._handler(client_id)
        io = handler.transports.get(handler.client) if handler is not None else None
        transport = getattr(getattr(io, "writer", None), "transport", None)
        try:
            return bool(transport is not None and transport.get_write_buffer_size())
        except Exception:  # a transport that cannot say: not sending
            return False

    def _close(self, client_id: str, why: str) -> bool:
        conn = self._conns.pop(client_id, None)
        if conn is None:
            return False
        for flow_id in conn.busy:
            self._bodies.pop(flow_id, None)
        self._unserved.pop(client_id, None)
        self._idle.pop(client_id, None)
        self.closed[why] += 1
        handler = self._handler(client_id)
        io = handler.transports.get(handler.client) if handler is not None else None
        if io is not None and io.handler is not None:
            io.handler.cancel(why)
        elif io is not None and io.writer is not None:
            io.writer.close()
        log.debug("closed client connection %s (%s)", getattr(conn.client, "peername", client_id), why)
        return True
