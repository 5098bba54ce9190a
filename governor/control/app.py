"""The control plane: health, metrics, sessions, approvals, nonces and records over HTTP.

A thin aiohttp shell over `RuntimeAPI`: every handler reads or asks the runtime,
never the store or the policy directly. It listens on its own port (loopback by
default), apart from the proxy, and refuses requests that came through the proxy
(see `origin`), so the governed agent cannot answer its own pause.

Access:
  /healthz, /readyz, /metrics           open (probes and scrapers carry no token)
  /v1/* reads, nonces, records, end     open, or the control token when one is set
                                        (a reviewer token is accepted too)
  POST /v1/approvals/{id}               a reviewer token, always; none configured:
                                        every answer is refused. {"decision", "reviewer",
                                        "edited_arguments"?}: plan editing (runtime/edit.py)
  GET  /, /console/                     the reviewer console (reviewer_console)
  POST /v1/sessions                     the control token, always (sessions_api)
  POST /v1/locks/{id}/lift              a reviewer or the control token, always
  POST /v1/store/acknowledge            the control token, always (store_ack)
Every request, before any of that (`guard`): its Host must name this control plane
(421), a browser's cross-origin request is refused (403), and a POST body must be JSON
(415); bodies nested deeper than 64 levels are a 400.
Errors are JSON: {"error": {"code": "...", "message": "..."}}.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import json
import logging
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Collection, Sequence

import orjson
from aiohttp import web

from governor.control.auth import TokenSet, bearer
from governor.control.guard import ControlGuard, Refusal, json_object, page_query
from governor.control.nonces import (
    ExpiredNonce, MalformedNonce, MemoryNonces, NonceError, NonceIssuer, ReusedNonce, TooManyNonces,
)
from governor.control.origin import ProxyOrigin
from governor.control.access_log import ACCESS_LOGGER, ControlAccessLogger
from governor.control.sessions_api import SESSIONS, add_routes, with_entry
from governor.evidence.errors import EvidenceError
from governor.metrics import CONTENT_TYPE, Metrics
from governor.runtime.api import RuntimeAPI
from governor.runtime.edit import EditRefused

log = logging.getLogger("governor.control")

MAX_BODY = 64 * 1024
MAX_REVIEWER_LENGTH = 200
MAX_REASON_LENGTH = 500  # the policy records at most this much of a reviewer's note

RUNTIME = web.AppKey("runtime", object)
REVIEWERS = web.AppKey("reviewers", TokenSet)
OPERATORS = web.AppKey("operators", TokenSet)  # empty: reads are open
NONCES = web.AppKey("nonces", object)
METRICS = web.AppKey("metrics", Metrics)
ORIGIN = web.AppKey("origin", ProxyOrigin)
READY_TIMEOUT = web.AppKey("ready_timeout", float)
GUARD = web.AppKey("guard", ControlGuard)

_NONCE_STATUS = {ReusedNonce: 409, ExpiredNonce: 410, MalformedNonce: 400, TooManyNonces: 503}


# --- responses -------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(data: Any) -> str:
    return json.dumps(data, default=_jsonable, ensure_ascii=False)


def ok(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(data, status=status, headers=headers, dumps=_dumps)


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# --- middleware ------------------------------------------------------------------------


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Refuse proxied requests, foreign Hosts, browsers' cross-origin and non-JSON writes
    (see `guard`); turn every failure into a JSON error, never a traceback."""
    origin = request.app[ORIGIN]
    peer = request.transport.get_extra_info("peername") if request.transport else None
    reason = origin.through_proxy(request.headers, peer)
    if reason is not None:
        log.warning("refused %s %s: %s", request.method, request.path, reason)
        return error(403, "through_proxy",
                     f"the control plane does not accept requests relayed by the governor's proxy ({reason}); "
                     "a governed agent cannot act on its own session")
    try:
        request.app[GUARD].check(request.method, request.path, request.headers, request.body_exists)
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


# --- access ----------------------------------------------------------------------------


def bearer_refusal(request: web.Request, *accepted: Collection[str], required: str, invalid: str,
                   realm: str = "governor") -> web.Response | None:
    """None when the request's bearer token is in one of `accepted`, else the 401 that says
    what is `required` (no token) or that the token is `invalid`: the check every guarded
    endpoint makes (each decides itself what a missing configuration means)."""
    token = bearer(request.headers.get("Authorization"))
    if token is None:
        return error(401, "token_required", required, headers={"WWW-Authenticate": f'Bearer realm="{realm}"'})
    if any(token in tokens for tokens in accepted):
        return None
    return error(401, "token_invalid", invalid,
                 headers={"WWW-Authenticate": f'Bearer realm="{realm}", error="invalid_token"'})


def _operator_refusal(request: web.Request) -> web.Response | None:
    operators = request.app[OPERATORS]
    if not operators:
        return None
    return bearer_refusal(request, operators, request.app[REVIEWERS],
                          required="this control plane requires `Authorization: Bearer <control token>`",
                          invalid="the bearer token is not a control or reviewer token")


def _reviewer_refusal(request: web.Request) -> web.Response | None:
    reviewers = request.app[REVIEWERS]
    if not reviewers:
        return error(403, "approvals_disabled",
                     "no reviewer token is configured, so no approval can be answered here; set "
                     "GOVERNOR_REVIEWER_TOKENS or a reviewer token file and restart the governor")
    return bearer_refusal(request, reviewers, realm="governor-reviewers",
                          required="answering an approval requires `Authorization: Bearer <reviewer token>`",
                          invalid="the bearer token is not a reviewer token")


async def checked_body(request: web.Request, refusal: web.Response | None, *,
                       optional: bool = False) -> tuple[dict[str, Any] | None, web.Response | None]:
    """An endpoint's preamble: its access check's `refusal` when there is one, else the
    request's JSON object body (or why it is refused)."""
    if refusal is not None:
        return None, refusal
    return await _json_body(request, optional=optional)


async def _json_body(request: web.Request, *, optional: bool = False) -> tuple[dict[str, Any] | None, web.Response | None]:
    raw = await request.read()
    if not raw.strip():
        if optional:
            return {}, None
        return None, error(400, "body_required", "a JSON object body is required")
    try:
        return json_object(raw), None
    except Refusal as refusal:  # not JSON, not an object, nested too deep: a clear 400
        return None, error(refusal.status, refusal.code, refusal.message)


# --- handlers --------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return ok({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    check = getattr(runtime, "ready", None)
    if check is None:
        return ok({"ready": False, "reason": "the runtime does not report readiness"}, status=503)
    try:
        result = check()
        if inspect.isawaitable(result):
            result = await asyncio.wait_for(result, request.app[READY_TIMEOUT])
    except asyncio.TimeoutError:
        return ok({"ready": False, "reason": f"readiness check took over {request.app[READY_TIMEOUT]:g}s"}, status=503)
    except Exception as exc:  # the runtime's check failed: not ready, and say why
        return ok({"ready": False, "reason": f"readiness check failed: {exc}"}, status=503)
    body = dict(result) if isinstance(result, dict) else {"ready": bool(result)}
    return ok(body, status=200 if body.get("ready") else 503)


async def metrics_endpoint(request: web.Request) -> web.Response:
    registry = request.app[METRICS]
    registry.set_pending_approvals(len(request.app[RUNTIME].approvals()))
    return web.Response(body=registry.exposition(), headers={"Content-Type": CONTENT_TYPE})


async def list_sessions(request: web.Request) -> web.Response:
    """A page of sessions sorted by id: `?limit=` (default 100, at most 1000) after the
    cursor `?after=` (the previous page's `next`); `next` is null on the last page."""
    if refusal := _operator_refusal(request):
        return refusal
    try:
        after, limit = page_query(request.query)
    except Refusal as refusal:
        return error(refusal.status, refusal.code, refusal.message)
    views = await request.app[RUNTIME].sessions(after=after, limit=limit + 1)
    more = len(views) > limit
    views = views[:limit]
    book = request.app[SESSIONS]
    views = [with_entry(view, book) for view in views]  # who opened it, its label and nonce
    page = {"sessions": views, "next": views[-1]["session"] if more else None, "limit": limit}
    # orjson: a page of 1,000 views is ~1.3 MB, which json.dumps takes ~50 ms to write on the loop
    return web.Response(body=orjson.dumps(page, default=_jsonable), content_type="application/json")


def _unknown_session(session: str) -> web.Response:
    return error(404, "unknown_session", f"no session {session!r} on this governor")


async def get_session(request: web.Request) -> web.Response:
    if refusal := _operator_refusal(request):
        return refusal
    session = request.match_info["session"]
    view = await request.app[RUNTIME].session_view(session)
    book = request.app[SESSIONS]
    if view is None:
        entry = book.get(session) if book is not None else None
        if entry is None or entry.ended_at is None:  # (one running is the runtime's to show)
            return _unknown_session(session)
        return ok({**entry.view(), "state": "ended"})  # ended before this process started
    return ok(with_entry(view, book))


async def list_approvals(request: web.Request) -> web.Response:
    if refusal := _operator_refusal(request):
        return refusal
    return ok({"approvals": request.app[RUNTIME].approvals()})


async def answer_approval(request: web.Request) -> web.Response:
    body, refusal = await checked_body(request, _reviewer_refusal(request))
    if refusal:
        return refusal
    decision = body.get("decision")
    if decision not in ("approve", "reject"):
        return error(400, "bad_decision", f'"decision" must be "approve" or "reject", not {decision!r}')
    reviewer = body.get("reviewer")
    if not isinstance(reviewer, str) or not reviewer.strip() or len(reviewer) > MAX_REVIEWER_LENGTH \
            or not reviewer.isprintable():
        return error(400, "bad_reviewer",
                     f'"reviewer" must name who answers: printable text of 1-{MAX_REVIEWER_LENGTH} characters')
    note = body.get("reason", "")
    if not isinstance(note, str) or len(note) > MAX_REASON_LENGTH or not all(c.isprintable() or c in "\n\t" for c in note):
        return error(400, "bad_reason", f'"reason" must be text of at most {MAX_REASON_LENGTH} characters')
    edited = body.get("edited_arguments")  # plan editing (governor.runtime.edit)
    if edited is not None and (decision != "approve" or not isinstance(edited, dict)):
        return error(400, "bad_edited_arguments",
                     '"edited_arguments" is a JSON object of tool arguments, and goes with "decision": "approve"')
    approval_id = request.match_info["approval"]
    runtime = request.app[RUNTIME]
    extra: dict[str, Any] = {"reason": note.strip()} if note.strip() else {}  # (scripted test runtimes take no reason)
    if edited is not None:
        extra["edited_arguments"] = edited
    try:
        result = await runtime.resolve_approval(approval_id, decision == "approve", reviewer.strip(), **extra)
    except KeyError:
        answered = getattr(runtime, "answered_approval", None)
        earlier = answered(approval_id) if answered is not None else None
        if earlier is not None:
            by = f" by {earlier['reviewer']}" if earlier.get("reviewer") else ""
            return error(409, "approval_answered", f"approval {approval_id!r} is no longer pending: {earlier['status']}{by}")
        return error(404, "approval_not_pending",
                     f"approval {approval_id!r} is unknown, already answered or timed out")
    except EditRefused as refused:  # the approval stays pending: approve or reject it as it is
        return error(409, refused.code, refused.message)
    log.info("approval %s %sd%s by %s", approval_id, decision, " with edited arguments" if edited is not None else "",
             reviewer.strip())
    return ok(result)


async def issue_nonce(request: web.Request) -> web.Response:
    body, refusal = await checked_body(request, _operator_refusal(request), optional=True)
    if refusal:
        return refusal
    nonces: NonceIssuer = request.app[NONCES]
    own = body.get("nonce")
    try:
        if own is None:
            value, expires_at = nonces.issue()
        elif isinstance(own, str):
            value, expires_at = own, nonces.register(own)
        else:
            return error(400, "nonce_malformed", '"nonce" must be a string')
    except NonceError as exc:
        return error(_NONCE_STATUS.get(type(exc), 400), exc.code, str(exc))
    return ok({"nonce": value, "expires_at": iso(expires_at), "ttl_seconds": nonces.ttl}, status=201,
              headers={"WWW-Authenticate": f'ADL nonce="{value}"', "Cache-Control": "no-store"})


async def get_record(request: web.Request) -> web.Response:
    if refusal := _operator_refusal(request):
        return refusal
    runtime = request.app[RUNTIME]
    session = request.match_info["session"]
    # a session that ended before this process started is served from its ended journal
    earlier = None if runtime.has_session(session) else getattr(runtime, "ended_record", None)
    if earlier is None and not runtime.has_session(session):
        return _unknown_session(session)
    nonce = request.query.get("nonce")
    if nonce is not None:
        try:
            request.app[NONCES].consume(nonce)
        except NonceError as exc:
            return error(_NONCE_STATUS.get(type(exc), 400), exc.code, str(exc))
    try:
        record = runtime.record(session, nonce) if earlier is None else await asyncio.to_thread(earlier, session, nonce)
    except KeyError:
        return _unknown_session(session)
    except EvidenceError as exc:  # its journal is damaged: say so rather than that it does not exist
        return error(500, "record_unreadable", f"the journal of session {session!r} cannot be read: {exc}")
    if record is None:
        return _unknown_session(session)
    return ok(record, headers={"Cache-Control": "no-store"})


async def end_session(request: web.Request) -> web.Response:
    if refusal := _operator_refusal(request):
        return refusal
    session = request.match_info["session"]
    runtime = request.app[RUNTIME]
    end = getattr(runtime, "end_session_by_principal", None) or runtime.end_session
    try:
        record = await end(session)
    except KeyError:
        return _unknown_session(session)
    log.info("session %s ended through the control plane", session)
    return ok(record)


# --- assembly --------------------------------------------------------------------------


def create_app(runtime: RuntimeAPI, *, reviewer_tokens: Sequence[str] = (), control_token: str | None = None,
               nonces: NonceIssuer | None = None, nonce_ttl: float = 300.0, metrics: Metrics | None = None,
               origin: ProxyOrigin | None = None, ready_timeout: float = 5.0,
               control_hosts: Sequence[str] = (), sessions: Any = None) -> web.Application:
    """The control plane application.

    `origin` is shared with the proxy addon (it reports its upstream sockets there);
    `nonces` defaults to an in-process issuer with `nonce_ttl`; `control_hosts` are
    the names besides localhost and the listen address that the Host header may carry
    ("*": any).
    """
    app = web.Application(middlewares=[_guard], client_max_size=MAX_BODY)
    app[RUNTIME] = runtime
    app[REVIEWERS] = TokenSet(reviewer_tokens)
    app[OPERATORS] = TokenSet([control_token] if control_token else [])
    app[NONCES] = nonces if nonces is not None else MemoryNonces(nonce_ttl)
    app[METRICS] = metrics if metrics is not None else Metrics()
    app[ORIGIN] = origin if origin is not None else ProxyOrigin()
    app[READY_TIMEOUT] = float(ready_timeout)
    app[SESSIONS] = sessions if sessions is not None else getattr(runtime, "session_book", None)
    app[GUARD] = ControlGuard(control_hosts)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/v1/sessions", list_sessions)
    app.router.add_get("/v1/sessions/{session}", get_session)
    app.router.add_get("/v1/sessions/{session}/record", get_record)
    app.router.add_post("/v1/sessions/{session}/end", end_session)
    app.router.add_get("/v1/approvals", list_approvals)
    app.router.add_post("/v1/approvals/{approval}", answer_approval)
    app.router.add_post("/v1/nonces", issue_nonce)
    add_routes(app)
    from governor.control import personas  # imports this module: added here, not at the top

    personas.add_routes(app)

    from governor.control.store_ack import acknowledge_store  # imports this module too

    app.router.add_post("/v1/store/acknowledge", acknowledge_store)

    from governor.control import reviewer_console  # the page and its reads (imports this module too)

    reviewer_console.add_routes(app)
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
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    addresses = list(runner.addresses)
    await asyncio.to_thread(app[ORIGIN].listening, addresses)
    await asyncio.to_thread(app[GUARD].listening, addresses)
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
