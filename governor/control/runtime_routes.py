"""The control plane's endpoints over the runtime: sessions, approvals, nonces, records.

  GET  /v1/sessions                   a page of session views (`?after=`, `?limit=`)
  GET  /v1/sessions/{id}              one session's view (an ended one from the session book)
  GET  /v1/sessions/{id}/record       its signed record (`?nonce=`: bound to a nonce issued here)
  POST /v1/sessions/{id}/end          end it and return its final record
  GET  /v1/approvals                  the steps held for a reviewer, each with its agent, session label and
                                      what approve, reject and the timeout do (`?reviewer=NAME`: NAME
                                      is reviewing; `reviewers` lists who is, control/review_cards.py)
  POST /v1/approvals/{id}             a reviewer's answer (reviewer token, always)
  POST /v1/nonces                     issue a nonce, or register the caller's own

Reads, nonces, records and end take the control token when one is set (a reviewer
token too); every handler reads or asks the runtime, never the store or the policy.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any

import orjson
from aiohttp import web

from governor.control.context import ControlContext
from governor.control.guard import Refusal, page_query
from governor.control.nonces import ExpiredNonce, MalformedNonce, NonceError, ReusedNonce, TooManyNonces
from governor.control.review_cards import Presence, cards
from governor.control.replies import (
    bearer_refusal, checked_body, error, jsonable, ok, operator_refusal, unknown_session,
)
from governor.control.sessions_api import caught_up, with_entry
from governor.evidence.errors import EvidenceError
from governor.evidence.witnessing import NotWitnessed
from governor.runtime.edit import EditRefused
from governor.runtime.shared_proofs import ProofInvalid, ProofNotLogged, ProofPending
from governor.runtime.shared_records import NotFinal, RecordStoreDamaged, RecordUnavailable, RecordUnreadable

log = logging.getLogger("governor.control")

MAX_REVIEWER_LENGTH = 200
MAX_REASON_LENGTH = 500  # the policy records at most this much of a reviewer's note

NONCE_STATUS = {ReusedNonce: 409, ExpiredNonce: 410, MalformedNonce: 400, TooManyNonces: 503}


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class RuntimeRoutes:
    def __init__(self, context: ControlContext) -> None:
        self.runtime = context.runtime
        self.operators = context.operators
        self.reviewers = context.reviewers
        self.nonces = context.nonces
        self.book = context.sessions
        self.presence = Presence()  # who is reviewing now (the console polls with ?reviewer=)

    def _operator_refusal(self, request: web.Request) -> web.Response | None:
        return operator_refusal(request, self.operators, self.reviewers)

    def _reviewer_refusal(self, request: web.Request) -> web.Response | None:
        reviewers = self.reviewers
        if not reviewers:
            return error(403, "approvals_disabled",
                         "no reviewer token is configured, so no approval can be answered here; set "
                         "GOVERNOR_REVIEWER_TOKENS or a reviewer token file and restart the governor")
        return bearer_refusal(request, reviewers, realm="governor-reviewers",
                              required="answering an approval requires `Authorization: Bearer <reviewer token>`",
                              invalid="the bearer token is not a reviewer token")

    async def list_sessions(self, request: web.Request) -> web.Response:
        """A page of sessions sorted by id: `?limit=` (default 100, at most 1000) after the
        cursor `?after=` (the previous page's `next`); `next` is null on the last page."""
        if refusal := self._operator_refusal(request):
            return refusal
        try:
            after, limit = page_query(request.query)
        except Refusal as refusal:
            return error(refusal.status, refusal.code, refusal.message)
        views = await self.runtime.sessions(after=after, limit=limit + 1)
        more = len(views) > limit
        views = views[:limit]
        book = self.book
        await caught_up(book)  # who opened those other replicas opened just now
        views = [with_entry(view, book) for view in views]  # who opened it, its label and nonce
        page = {"sessions": views, "next": views[-1]["session"] if more else None, "limit": limit}
        # orjson: a page of 1,000 views is ~1.3 MB, which json.dumps takes ~50 ms to write on the loop
        return web.Response(body=orjson.dumps(page, default=jsonable), content_type="application/json")

    async def get_session(self, request: web.Request) -> web.Response:
        if refusal := self._operator_refusal(request):
            return refusal
        session = request.match_info["session"]
        view = await self.runtime.session_view(session)
        book = self.book
        if view is None:
            entry = book.get(session) if book is not None else None
            if entry is None or entry.ended_at is None:  # (one running is the runtime's to show)
                return unknown_session(session)
            return ok({**entry.view(), "state": "ended"})  # ended before this process started
        return ok(with_entry(view, book))

    async def list_approvals(self, request: web.Request) -> web.Response:
        if refusal := self._operator_refusal(request):
            return refusal
        self.presence.note(request.query.get("reviewer"))
        return ok({"approvals": cards(self.runtime.approvals(), self.runtime, self.book),
                   "reviewers": self.presence.now_reviewing()})

    async def answer_approval(self, request: web.Request) -> web.Response:
        body, refusal = await checked_body(request, self._reviewer_refusal(request))
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
        runtime = self.runtime
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

    async def issue_nonce(self, request: web.Request) -> web.Response:
        body, refusal = await checked_body(request, self._operator_refusal(request), optional=True)
        if refusal:
            return refusal
        nonces = self.nonces
        own = body.get("nonce")
        try:
            if own is None:
                value, expires_at = nonces.issue()
            elif isinstance(own, str):
                value, expires_at = own, nonces.register(own)
            else:
                return error(400, "nonce_malformed", '"nonce" must be a string')
        except NonceError as exc:
            return error(NONCE_STATUS.get(type(exc), 400), exc.code, str(exc))
        return ok({"nonce": value, "expires_at": iso(expires_at), "ttl_seconds": nonces.ttl}, status=201,
                  headers={"WWW-Authenticate": f'ADL nonce="{value}"', "Cache-Control": "no-store"})

    async def get_record(self, request: web.Request) -> web.Response:
        if refusal := self._operator_refusal(request):
            return refusal
        runtime = self.runtime
        session = request.match_info["session"]
        if wants_proof(request):
            return await self._with_proof(session)
        shared = getattr(runtime, "shared_records", None)
        if shared is not None:  # replicas share sessions: the record every replica serves
            return await self._shared_record(shared, session, request.query.get("nonce"))
        # a session that ended before this process started is served from its ended journal
        earlier = None if runtime.has_session(session) else getattr(runtime, "ended_record", None)
        if earlier is None and not runtime.has_session(session):
            return unknown_session(session)
        nonce = request.query.get("nonce")
        if nonce is not None:
            try:
                self.nonces.consume(nonce)
            except NonceError as exc:
                return error(NONCE_STATUS.get(type(exc), 400), exc.code, str(exc))
        try:
            record = runtime.record(session, nonce) if earlier is None else await asyncio.to_thread(earlier, session, nonce)
        except KeyError:
            return unknown_session(session)
        except EvidenceError as exc:  # its journal is damaged: say so rather than that it does not exist
            return error(500, "record_unreadable", f"the journal of session {session!r} cannot be read: {exc}")
        if record is None:
            return unknown_session(session)
        return ok(record, headers={"Cache-Control": "no-store"})

    async def _shared_record(self, shared: Any, session: str, nonce: str | None) -> web.Response:
        """A shared session's record (runtime/shared_records.py): an ended one's is the final
        record written once, the same bytes on every replica; an open one's is interim, over
        every replica's events so far; after the store lost its data, this replica's own copy
        (`local`). `Governor-Record` says which."""
        try:
            if not await shared.known(session):
                return unknown_session(session)
            if nonce is not None:
                try:
                    self.nonces.consume(nonce)
                except NonceError as exc:
                    return error(NONCE_STATUS.get(type(exc), 400), exc.code, str(exc))
            record, kind = await shared.record(session, nonce)
        except KeyError:
            return unknown_session(session)
        except (RecordUnavailable, RecordUnreadable, EvidenceError, RecordStoreDamaged) as exc:
            return shared_record_refusal(session, exc)
        return ok(record, headers={"Cache-Control": "no-store", "Governor-Record": kind})

    async def end_session(self, request: web.Request) -> web.Response:
        if refusal := self._operator_refusal(request):
            return refusal
        session = request.match_info["session"]
        runtime = self.runtime
        end = getattr(runtime, "end_session_by_principal", None) or runtime.end_session
        try:
            record = await end(session)
        except KeyError:
            return unknown_session(session)
        log.info("session %s ended through the control plane", session)
        if wants_proof(request):
            return await self._with_proof(session)
        return ok(record)

    async def _with_proof(self, session: str) -> web.Response:
        """The final record as logged, with its C2SP tlog-proof (docs/transparency-log.md)."""
        shared = getattr(self.runtime, "shared_records", None)
        if shared is not None:  # replicas share sessions: any of them serves the proof
            answer = await self._shared_proof(shared, session)
            if answer is not None:
                return answer  # (else gone from the store: this replica's own records, below)
        prove = getattr(self.runtime, "final_record_with_proof", None)
        if prove is None or getattr(self.runtime, "transparency_log", None) is None:
            return error(404, "no_log", "this governor keeps no transparency log, so it has no proofs (--log off)")
        try:
            record, proof = await prove(session)
        except KeyError:
            if self.runtime.has_session(session):
                return error(409, "session_running", f"session {session!r} has not ended: only a final record "
                             "is logged, so only a final record has a proof (end it first)")
            return unknown_session(session)
        except NotWitnessed as exc:  # fail closed: no proof without the witnesses' quorum
            return error(503, "not_witnessed", f"no proof of session {session!r}: {exc}")
        except LookupError as exc:
            return error(404, "not_logged", f"the final record of session {session!r} is not in the log: {exc}")
        return ok({"record": record, "tlog_proof": proof.decode("utf-8")}, headers={"Cache-Control": "no-store"})

    async def _shared_proof(self, shared: Any, session: str) -> web.Response | None:
        """A shared session's final record with its proof (runtime/shared_proofs.py): made by
        the replica whose log holds the record, published in the store for the others, which
        check it before serving it. None: the store holds no such session (never one, or past
        retention: the replica that logged it still has it in its records)."""
        try:
            record, proof = await shared.proved(session)
        except KeyError:
            return None
        except NotFinal as exc:
            if exc.kind == "local":
                return error(409, "record_not_final", f"the shared store lost its data, so the final record of "
                             f"session {session!r} cannot be read from it; this replica's own copy is not a final "
                             "record and has no proof")
            return error(409, "session_running", f"session {session!r} has not ended: only a final record "
                         "is logged, so only a final record has a proof (end it first)")
        except (RecordUnavailable, RecordUnreadable, EvidenceError, RecordStoreDamaged) as exc:
            return shared_record_refusal(session, exc)
        except ProofPending as exc:
            return error(503, "proof_pending", f"the proof of session {session!r} is not published yet: {exc}",
                         headers={"Retry-After": "2"})
        except ProofNotLogged as exc:
            return error(404, "not_logged", f"the final record of session {session!r} is not in a log: {exc}")
        except ProofInvalid as exc:
            log.error("session %s: %s", session, exc)
            return error(500, "proof_invalid", f"no proof of session {session!r} is served: {exc}")
        except NotWitnessed as exc:  # fail closed: no proof without the witnesses' quorum
            return error(503, "not_witnessed", f"no proof of session {session!r}: {exc}")
        except LookupError as exc:  # (this replica's log: the record is not in it)
            return error(404, "not_logged", f"the final record of session {session!r} is not in the log: {exc}")
        return ok({"record": record, "tlog_proof": proof.decode("utf-8")}, headers={"Cache-Control": "no-store"})


def shared_record_refusal(session: str, exc: Exception) -> web.Response:
    """The answer when a shared session's record cannot be read (runtime/shared_records.py's
    errors): the store down (retryable), its chain, state or written record damaged, a damaged
    counter. One mapping for the record, its proof and the console's verification."""
    if isinstance(exc, RecordUnavailable):
        return error(503, "store_unavailable", f"the record of session {session!r} cannot be read from the "
                     f"shared store now: {exc}", headers={"Retry-After": "1"})
    if isinstance(exc, RecordStoreDamaged):
        return error(500, "store_damaged", f"the record of session {session!r} cannot be served: the shared store "
                     f"holds damaged data: {exc}")
    return error(500, "record_unreadable", f"the journal of session {session!r} cannot be read: {exc}")


def wants_proof(request: web.Request) -> bool:
    return request.query.get("proof", "").lower() in ("1", "true", "yes")


def add_routes(app: web.Application, context: ControlContext) -> None:
    routes = RuntimeRoutes(context)
    app.router.add_get("/v1/sessions", routes.list_sessions)
    app.router.add_get("/v1/sessions/{session}", routes.get_session)
    app.router.add_get("/v1/sessions/{session}/record", routes.get_record)
    app.router.add_post("/v1/sessions/{session}/end", routes.end_session)
    app.router.add_get("/v1/approvals", routes.list_approvals)
    app.router.add_post("/v1/approvals/{approval}", routes.answer_approval)
    app.router.add_post("/v1/nonces", routes.issue_nonce)
