"""The identity a principal binds to a session it opens (governor.sessions.identity): the
members of `POST /v1/sessions` that bind it, and `POST /v1/sessions/{id}/delegation`, the
signed token a principal elsewhere opens a child session with.

  POST /v1/sessions/{id}/delegation   a delegation token for children of session {id}
                                      (control token, always): 201 {"delegation", "expires_at",
                                      "lineage", "depth"}
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from governor.control.replies import error, ok
from governor.policy.causes import ON_GOVERNOR_IDENTITY
from governor.sessions.identity import (Identity, IdentityError, bind, mint_delegation,
                                        verify_delegation)

log = logging.getLogger("governor.control")

IDENTITY_MEMBERS = {"persona", "instance", "parent", "delegation"}


class Identities:
    """Binding identities for the session book's routes, over the runtime (its passport's
    personas and digest, its key and id) and the book."""

    def __init__(self, runtime: Any, book: Any) -> None:
        self.runtime = runtime
        self.book = book

    def _limits(self) -> Any:
        return getattr(self.runtime, "limits", None)

    def _parent(self, session: str) -> Identity:
        entry = self.book.get(session) if self.book is not None else None
        if entry is None or entry.by != "principal":
            raise IdentityError(f"parent {session!r} is not a session a principal opened on this governor")
        if entry.ended_at is not None:
            raise IdentityError(f"parent {session!r} has ended")
        return entry.identity or Identity()

    def bind(self, body: dict[str, Any]) -> Identity | None:
        """The identity `body` binds (IdentityError: why it cannot)."""
        if not IDENTITY_MEMBERS & body.keys():
            return None
        limits = self._limits()
        runtime = self.runtime
        key = getattr(runtime, "key", None)
        if limits is None or key is None:
            raise IdentityError("this governor binds no identity (no passport pinned)")
        delegation = limits.delegation
        return bind(body, personas=limits.personas, parent_of=self._parent, digest=limits.passport_digest,
                    verify_delegation=lambda token: verify_delegation(token, key.public_key(), runtime.governor_id,
                                                                      runtime.clock()),
                    max_depth=delegation.max_depth if delegation is not None else None)

    async def record(self, session: str, identity: Identity | None) -> None:
        """The bound identity, the session record's first event (before the agent has its token)."""
        if identity is None:
            return
        audit = getattr(self.runtime, "audit", None)
        if audit is not None:
            await audit.record_identity(session, identity.view())

    async def delegation(self, request: web.Request, refusal: Any) -> web.Response:
        if refused := refusal(request, reviewers_too=False):
            return refused
        session = request.match_info["session"]
        try:
            identity = self._parent(session)
        except IdentityError as exc:
            return error(404, "unknown_session", str(exc))
        limits, runtime = self._limits(), self.runtime
        lineage = identity.child_lineage(session, limits.passport_digest)
        now = runtime.clock()
        token = mint_delegation(runtime.key, runtime.governor_id, lineage, now)
        log.info("session %s: a delegation token issued (depth %d)", session, len(lineage))
        return ok({"delegation": token, "expires_at": now + 3600, "depth": len(lineage),
                   "lineage": Identity(lineage=lineage).view()["lineage"], "cause": ON_GOVERNOR_IDENTITY},
                  status=201, headers={"Cache-Control": "no-store"})
