"""Control plane endpoints of the statistical envelope (policy/envelope.py, #32 item 7):

  GET  /v1/envelope          the agent's envelope: the standing deviation, the baseline, the
                             current window (read access)
  POST /v1/envelope/reset    clear the agent's sticky deviation: the control token only (the
                             principal), never a reviewer token (403 reviewer_cannot_reset);
                             body {"by": "who resets it"}; recorded in the audit journal
                             (cause on_governor_envelope_reset) as "<by> as principal"
"""

from __future__ import annotations

import logging

from aiohttp import web

from governor.control.auth import bearer
from governor.control.context import ControlContext
from governor.control.replies import bearer_refusal, error, json_body, ok, operator_refusal

log = logging.getLogger("governor.control")

MAX_BY = 200


class EnvelopeRoutes:
    def __init__(self, context: ControlContext) -> None:
        self.runtime = context.runtime
        self.operators = context.operators
        self.reviewers = context.reviewers

    def _watch(self) -> object | None:
        return getattr(self.runtime, "envelope", None)

    async def show(self, request: web.Request) -> web.Response:
        if refusal := operator_refusal(request, self.operators, self.reviewers):
            return refusal
        watch = self._watch()
        if watch is None:
            return error(501, "envelope_unavailable", "this governor keeps no statistical envelope")
        try:
            view = await watch.view()  # type: ignore[attr-defined]
        except Exception:
            log.exception("the envelope could not be read")
            return error(503, "envelope_unreadable", "the envelope could not be read from the store; see the log")
        return ok(view, headers={"Cache-Control": "no-store"})

    async def reset(self, request: web.Request) -> web.Response:
        if not self.operators:
            return error(403, "principal_token_not_configured",
                         "resetting the envelope needs the control token, and none is configured: `governor run` "
                         "writes one to <data-dir>/control-token, or set GOVERNOR_CONTROL_TOKEN")
        token = bearer(request.headers.get("Authorization"))
        if token is not None and token not in self.operators and token in self.reviewers:
            return error(403, "reviewer_cannot_reset", "a reviewer token answers held steps; the envelope's "
                         "deviation is reset only by the principal (the control token)")
        if refusal := bearer_refusal(request, self.operators, required="this needs `Authorization: Bearer <control token>`",
                                     invalid="the bearer token is not the control token"):
            return refusal
        body, refusal = await json_body(request)
        if refusal:
            return refusal
        unknown = set(body) - {"by"}
        if unknown:
            return error(400, "bad_request", f"unknown members {', '.join(sorted(unknown))}; expected by")
        by = body.get("by")
        if not isinstance(by, str) or not by.strip() or len(by) > MAX_BY or not by.isprintable():
            return error(400, "bad_by", f'"by" must name who resets the envelope (printable text of 1-{MAX_BY} characters)')
        watch = self._watch()
        if watch is None:
            return error(501, "envelope_unavailable", "this governor keeps no statistical envelope")
        try:
            result = await watch.reset(f"{by.strip()} as principal")  # type: ignore[attr-defined]
        except Exception:
            log.exception("the envelope could not be reset")
            return error(503, "envelope_not_reset", "the envelope could not be reset in the store; nothing was "
                         "reset; see the log")
        log.info("the envelope of agent %s reset by %s as principal", result["agent"], by.strip())
        return ok(result)


def add_routes(app: web.Application, context: ControlContext) -> None:
    routes = EnvelopeRoutes(context)
    app.router.add_get("/v1/envelope", routes.show)
    app.router.add_post("/v1/envelope/reset", routes.reset)
