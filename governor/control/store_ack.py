"""POST /v1/store/acknowledge: an operator accepts that the state store lost its data.

A store that detects the loss of what it wrote (a Redis emptied by FLUSHALL, failed over to
an empty replica, restarted without persistence) refuses every step until then: budgets
would otherwise start again from zero unnoticed. Acknowledging adopts the store as it now
stands (its counters were lost; they count from what it holds). For Redis, one
acknowledgement on any replica's control plane clears the loss for every replica on that
Redis (it writes an acknowledged fence the others adopt).

Always needs the control token (a reviewer token is not enough; without a control token
configured the endpoint refuses), and a JSON object body (`{"reason": "..."}`, logged).
"""

from __future__ import annotations

import logging

from aiohttp import web

from governor.control.context import ControlContext
from governor.control.replies import bearer_refusal, checked_body, error, ok

log = logging.getLogger("governor.control")

MAX_REASON = 500


class StoreAcknowledgement:
    """The endpoint, over the runtime and the control token of a `ControlContext`."""

    def __init__(self, context: ControlContext) -> None:
        self.runtime = context.runtime
        self.operators = context.operators

    async def acknowledge_store(self, request: web.Request) -> web.Response:
        operators = self.operators
        if not operators:
            return error(403, "acknowledgement_disabled",
                         "acknowledging a store's data loss needs the control token, and none is configured "
                         "(GOVERNOR_CONTROL_TOKEN); restart the governor with one")
        needed = "acknowledging a store's data loss requires `Authorization: Bearer <control token>`"
        body, refusal = await checked_body(request, bearer_refusal(request, operators, required=needed, invalid=needed))
        if refusal:
            return refusal
        assert body is not None
        reason = body.get("reason", "")
        if not isinstance(reason, str) or len(reason) > MAX_REASON:
            return error(400, "bad_reason", f'"reason" must be a string of at most {MAX_REASON} characters')
        acknowledge = getattr(self.runtime, "acknowledge_store", None)
        if acknowledge is None:
            return error(501, "not_supported", "this runtime has no store to acknowledge")
        result = await acknowledge()
        log.warning("store acknowledged through the control plane (%s): %s", reason or "no reason given", result)
        return ok(result)


def add_routes(app: web.Application, context: ControlContext) -> None:
    app.router.add_post("/v1/store/acknowledge", StoreAcknowledgement(context).acknowledge_store)
