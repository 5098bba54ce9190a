"""Control plane endpoints of the session book: principals open sessions and lift locks.

  POST /v1/sessions               open a session (control token, always): 201
                                  {"session", "token", "label", "nonce", "opened_at", "header", "identity"};
                                  persona, instance, parent, delegation bind who it acts as
                                  (governor.control.identities)
  POST /v1/sessions/{id}/delegation   a signed delegation token for its children
  GET  /v1/locks                  the locks, in force or lifted (read access)
  POST /v1/locks/{id}/lift        lift a lock (the control token, i.e. the principal, or a
                                  lock-lifter token: the operator role named for it; never a
                                  reviewer token); body {"by": "who lifts it"}, recorded as
                                  "<by> as principal" or "<by> as lock_lifter"
  GET  /v1/audit/record           the governor's audit journal, freshly signed (read access)

"Always": unlike reads, these need a configured token; with none they are refused (403),
since on a control plane without tokens anyone who reaches it (the agent too, on the
same host) would be the principal.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from governor.control.context import ControlContext
from governor.control.identities import IDENTITY_MEMBERS, Identities
from governor.control.nonces import NonceError, check_format
from governor.control.auth import bearer
from governor.control.replies import bearer_refusal, error, json_body, ok, operator_refusal

log = logging.getLogger("governor.control")

MAX_TEXT = 200


def _text(body: dict[str, Any], key: str) -> tuple[str | None, str | None]:
    value = body.get(key)
    if value is None:
        return None, None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT or not value.isprintable():
        return None, f'"{key}" must be printable text of 1-{MAX_TEXT} characters'
    return value.strip(), None


class SessionBookRoutes:
    """The endpoints above, over the runtime and the session book of a `ControlContext`."""

    def __init__(self, context: ControlContext) -> None:
        self.runtime = context.runtime
        self.operators = context.operators
        self.reviewers = context.reviewers
        self.book = context.sessions
        self.lock_lifters = context.lock_lifters
        self.identities = Identities(self.runtime, self.book)  # persona and lineage bound at open

    def _lifter(self, request: web.Request) -> tuple[str | None, web.Response | None]:
        """The role lifting a lock (the absorbing barrier): "principal" (the control token, the
        party that runs the governor's sessions) or "lock_lifter" (the operator role named for
        it). A reviewer answers held steps and cannot lift a lock: 403, not a silent success."""
        operators, lifters = self.operators, self.lock_lifters
        if not operators and not lifters:
            return None, error(403, "principal_token_not_configured",
                               "lifting a lock needs the control token or a lock-lifter token, and none is "
                               "configured: `governor run` writes one to <data-dir>/control-token")
        token = bearer(request.headers.get("Authorization"))
        if token is not None:
            if token in operators:
                return "principal", None
            if token in lifters:
                return "lock_lifter", None
            if token in self.reviewers:
                return None, error(403, "reviewer_cannot_lift",
                                   "a reviewer token answers held steps; a lock is lifted only by the principal "
                                   "(the control token) or a lock-lifter token (--lock-lifter-tokens)")
        return None, bearer_refusal(request, operators, lifters,
                                    required="this needs `Authorization: Bearer <control or lock-lifter token>`",
                                    invalid="the bearer token is not the control token or a lock-lifter token")

    def _principal_refusal(self, request: web.Request, *, reviewers_too: bool) -> web.Response | None:
        operators = self.operators
        reviewers = self.reviewers
        what = "a control or reviewer token" if reviewers_too else "the control token"
        if not operators and not (reviewers_too and reviewers):
            return error(403, "principal_token_not_configured",
                         f"this needs {what}, and none is configured: `governor run` writes one to "
                         "<data-dir>/control-token, or set GOVERNOR_CONTROL_TOKEN")
        return bearer_refusal(request, operators, *([reviewers] if reviewers_too else []),
                              required=f"this needs `Authorization: Bearer <{what}>`", invalid=f"the bearer token is not {what}")

    async def open_session(self, request: web.Request) -> web.Response:
        if refusal := self._principal_refusal(request, reviewers_too=False):
            return refusal
        book = self.book
        if book is None:
            return error(501, "sessions_unavailable", "this governor has no session book")
        body, refusal = await json_body(request, optional=True)
        if refusal:
            return refusal
        unknown = set(body) - {"label", "nonce"} - IDENTITY_MEMBERS
        if unknown:
            return error(400, "bad_request", f"unknown members {', '.join(sorted(unknown))}; expected label, nonce, "
                         "persona, instance, parent, delegation")
        try:
            identity = self.identities.bind(body)
        except ValueError as exc:  # IdentityError: what cannot be bound, said
            return error(400, "bad_identity", str(exc))
        label, problem = _text(body, "label")
        if problem:
            return error(400, "bad_label", problem)
        nonce = body.get("nonce")
        if nonce is not None:
            try:
                if not isinstance(nonce, str):
                    raise NonceError('"nonce" must be a string')
                check_format(nonce)
            except NonceError as exc:
                return error(400, "nonce_malformed", str(exc))
        entry, token = book.open(label=label, nonce=nonce, identity=identity)
        start = getattr(self.runtime, "open_session", None)
        if start is not None:  # the session starts now: journaled, listed, idle-timed from here
            try:
                await start(entry.id)
                await self.identities.record(entry.id, identity)
            except Exception:
                log.exception("session %s could not be started", entry.id)
                book.ended(entry.id, None)  # its token is refused: nothing can be recorded for it
                return error(503, "session_not_started", "the governor could not start the session's journal; "
                             "see its log")
        log.info("session %s opened by a principal%s", entry.id, f" ({label})" if label else "")
        view = entry.view()
        view.update({"token": token, "header": {"ADL-Session": token}, "locked": book.locked})
        return ok(view, status=201, headers={"Cache-Control": "no-store",
                                             "Location": f"/v1/sessions/{entry.id}"})

    async def delegation(self, request: web.Request) -> web.Response:
        return await self.identities.delegation(request, self._principal_refusal)

    async def list_locks(self, request: web.Request) -> web.Response:
        if refusal := operator_refusal(request, self.operators, self.reviewers):
            return refusal
        book = self.book
        await caught_up(book)
        return ok({"locks": book.locks_view() if book is not None else [], "locked": bool(book and book.locked)})

    async def lift_lock(self, request: web.Request) -> web.Response:
        role, refusal = self._lifter(request)
        if refusal:
            return refusal
        book = self.book
        await caught_up(book)  # a lock another replica made a moment ago is lifted here too
        lock_id = request.match_info["lock"]
        if book is None or lock_id not in book.locks:
            return error(404, "unknown_lock", f"no lock {lock_id!r} on this governor")
        body, refusal = await json_body(request)
        if refusal:
            return refusal
        by, problem = _text(body, "by")
        if problem or by is None:
            return error(400, "bad_by", problem or '"by" must name who lifts the lock')
        try:
            lock = await book.lift(lock_id, f"{by} as {role}")  # the record names the role that lifted it
        except ValueError as exc:
            return error(409, "lock_lifted", str(exc))
        return ok({**lock.view(), "locked": book.locked})

    async def audit_record(self, request: web.Request) -> web.Response:
        if refusal := operator_refusal(request, self.operators, self.reviewers):
            return refusal
        sign = getattr(self.runtime, "audit_record", None)
        record = sign() if sign is not None else None
        if record is None:
            return error(404, "no_audit_record", "the governor's audit journal holds no event yet")
        return ok(record, headers={"Cache-Control": "no-store"})


async def caught_up(book: Any) -> None:
    """A book shared by replicas reads the others' new entries (opens, locks, lifts) now, so a
    control-plane read shows what another replica did a moment ago (one store read, off the
    loop: governor.sessions.shared_log)."""
    shared = getattr(book, "shared", None)
    if shared is not None:
        await shared.read_now()


def with_entry(view: dict[str, Any], book: Any) -> dict[str, Any]:
    """A runtime's session view with who opened it, its label and nonce (from the book)."""
    entry = book.get(view.get("session")) if book is not None else None
    if entry is not None:
        view.update({"opened_by": entry.by, "label": entry.label, "nonce": entry.nonce,
                     "identity": entry.identity.view() if entry.identity is not None else None})
    return view


def add_routes(app: web.Application, context: ControlContext) -> None:
    routes = SessionBookRoutes(context)
    app.router.add_post("/v1/sessions", routes.open_session)
    app.router.add_post("/v1/sessions/{session}/delegation", routes.delegation)
    app.router.add_get("/v1/locks", routes.list_locks)
    app.router.add_post("/v1/locks/{lock}/lift", routes.lift_lock)
    app.router.add_get("/v1/audit/record", routes.audit_record)
