"""The control plane: health, metrics, sessions, approvals, nonces and records over HTTP.

A thin aiohttp shell over `RuntimeAPI`: every handler reads or asks the runtime,
never the store or the policy directly. It listens on its own port (loopback by
default), apart from the proxy, and refuses requests that came through the proxy
(see `origin`), so the governed agent cannot answer its own pause.

`create_app(context)` assembles it: the guard middleware, then each route module's
`add_routes(app, context)` (probes, runtime_routes, sessions_api, personas, store_ack,
reviewer_console, log_routes, envelope_routes), which keeps what it needs of the `ControlContext`; `start_control`
serves it.

Access:
  /healthz, /readyz, /metrics           open (probes and scrapers carry no token)
  /v1/* reads, nonces, records, end     open, or the control token when one is set
                                        (a reviewer token is accepted too)
  POST /v1/approvals/{id}               a reviewer token, always; none configured:
                                        every answer is refused. {"decision", "reviewer",
                                        "edited_arguments"?}: plan editing (governor.runtime.edit)
  GET  /, /console/                     the reviewer console (reviewer_console)
  POST /v1/sessions                     the control token, always (sessions_api)
  POST /v1/locks/{id}/lift              the control token or a lock-lifter token, always
                                        (a reviewer token: 403; sessions_api)
  POST /v1/store/acknowledge            the control token, always (store_ack)
  GET  /log/checkpoint, /log/tile/...   open (a log is for third parties), or the control
                                        token with --log-access token (log_routes)
Every request, before any of that (`guard`): its Host must name this control plane
(421), a browser's cross-origin request is refused (403), and a POST body must be JSON
(415); bodies nested deeper than 64 levels are a 400.
Errors are JSON: {"error": {"code": "...", "message": "..."}}.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from aiohttp import web

from governor.common.listening import BACKLOG
from governor.control import envelope_routes, log_routes, personas, probes, reviewer_console, runtime_routes, sessions_api, store_ack
from governor.control.access_log import ACCESS_LOGGER, ControlAccessLogger
from governor.control.context import ControlContext
from governor.control.guard import ControlGuard, Refusal
from governor.control.origin import ProxyOrigin
from governor.control.replies import error

log = logging.getLogger("governor.control")

MAX_BODY = 64 * 1024

CONTEXT = web.AppKey("control_context", ControlContext)  # start_control reads its origin and guard


# --- middleware ------------------------------------------------------------------------


def guard_middleware(origin: ProxyOrigin, guard: ControlGuard) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware every request passes first, over this app's `origin` and `guard`."""

    @web.middleware
    async def guarded(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        """Refuse proxied requests, foreign Hosts, browsers' cross-origin and non-JSON writes
        (see `guard`); turn every failure into a JSON error, never a traceback."""
        peer = request.transport.get_extra_info("peername") if request.transport else None
        reason = origin.through_proxy(request.headers, peer)
        if reason is not None:
            log.warning("refused %s %s: %s", request.method, request.path, reason)
            return error(403, "through_proxy",
                         f"the control plane does not accept requests relayed by the governor's proxy ({reason}); "
                         "a governed agent cannot act on its own session")
        try:
            guard.check(request.method, request.path, request.headers, request.body_exists)
        except Refusal as refusal:
            log.warning("refused %s %s: %s", request.method, request.path, refusal.message)
            return error(refusal.status, refusal.code, refusal.message)
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error(exc.status, exc.reason.lower().replace(" ", "_"), exc.text or exc.reason,
                         headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"})
        except Exception:
            log.exception("control plane error on %s %s", request.method, request.path)
            return error(500, "internal_error", "the governor failed to handle this request; see its log")

    return guarded


# --- assembly --------------------------------------------------------------------------


def create_app(context: ControlContext) -> web.Application:
    """The control plane application over `context` (see `ControlContext.build` for the
    defaults of what a caller does not give)."""
    app = web.Application(middlewares=[guard_middleware(context.origin, context.guard)], client_max_size=MAX_BODY)
    app[CONTEXT] = context
    probes.add_routes(app, context)
    runtime_routes.add_routes(app, context)
    sessions_api.add_routes(app, context)
    personas.add_routes(app, context)
    store_ack.add_routes(app, context)
    reviewer_console.add_routes(app, context)
    log_routes.add_routes(app, context)
    envelope_routes.add_routes(app, context)
    return app


CONTROL_KEEPALIVE = 15.0
CONTROL_MAX_CONNECTIONS = 64


async def start_control(app: web.Application, host: str = "127.0.0.1", port: int = 8081, *,
                        keepalive_timeout: float = CONTROL_KEEPALIVE,
                        max_connections: int = CONTROL_MAX_CONNECTIONS) -> web.AppRunner:
    """Serve `app` on host:port (port 0: any free port); returns the runner (`await runner.cleanup()`).

    The bound addresses are handed to the app's ProxyOrigin so the proxy can refuse
    to connect to them. `keepalive_timeout` closes a connection that has not completed a
    request that long after it opened or after its last response: half-sent and
    dribbled requests included (aiohttp does not move it for partial data). Over
    `max_connections` open connections (see `cap_connections`), the oldest idle one is closed.
    """
    runner = web.AppRunner(app, keepalive_timeout=keepalive_timeout, access_log_class=ControlAccessLogger,
                           access_log=logging.getLogger(ACCESS_LOGGER))
    await runner.setup()
    cap_connections(runner.server, max_connections)
    site = web.TCPSite(runner, host, port, backlog=BACKLOG)  # a burst queued, not reset (governor.common.listening)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    addresses = list(runner.addresses)
    context = app[CONTEXT]
    await asyncio.to_thread(context.origin.listening, addresses)
    await asyncio.to_thread(context.guard.listening, addresses)
    return runner


def cap_connections(server: Any, cap: int) -> None:
    """At most `cap` connections to the control plane: its sockets share the process's
    descriptors with the proxy, journals and the store. A connection over the cap closes the
    oldest one with no request in progress (idle or still sending its headers), else itself."""
    made = server.connection_made

    def connection_made(handler: Any, transport: Any) -> None:
        made(handler, transport)
        if len(server.connections) <= cap:
            return
        for other in server.connections:  # oldest first
            if other is not handler and not getattr(other, "_request_in_progress", True):
                other.force_close()
                return
        log.warning("control plane: %d connections, all busy; refused one", cap)
        handler.force_close()

    server.connection_made = connection_made


def control_url(runner: web.AppRunner) -> str:
    """http://host:port of a started control plane (the first bound address)."""
    host, port = runner.addresses[0][:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"
