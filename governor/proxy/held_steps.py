"""A request's steps admitted, where one may be held for a reviewer at the request itself
(§5: an MCP `tools/call` of a tool that requires confirmation, an oversight trigger on a
model call; docs/oversight.md).

Nothing has gone upstream while such a step waits. Its review runs in a Hold
(governor.proxy.holds, unshared) apart from any connection; its outcome is the request's
admissions (`Admitted`), which exactly one identical request takes and goes upstream with:
the one still waiting when the review ends, or the client's retry afterwards. The retries
meanwhile attach to the hold: no second step, no second approval, no upstream call.

`HeldSteps` is the collaborator the admission addon (governor.proxy.admission) admits a
request's steps through; the answers' addon serves the answers held for a reviewer through
it too (`serve`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

from mitmproxy import http

from governor.adapters.base import Adapter, Exchange
from governor.policy.steps import Step
from governor.proxy import holds
from governor.proxy.refusing import Refuser, as_response, governor_error_object
from governor.proxy.runtime_calls import RuntimeCalls, paused
from governor.runtime.api import Admission
from governor.sessions.entries import halted_reason

log = logging.getLogger("governor.proxy")


@dataclass
class Admitted:
    """A request's admissions, in order (a persona activity first, then its steps: `steps[i]`
    is `admissions[first + i]`); `refused` the one that refused it (every ticket released)."""

    admissions: list[Admission] = field(default_factory=list)
    first: int = 0
    refused: Admission | None = None


class HeldSteps:
    """A request's steps admitted, one of them maybe held for its reviewer in a Hold."""

    def __init__(self, calls: RuntimeCalls, holds_: holds.Holds, refuser: Refuser) -> None:
        self.calls = calls
        self.holds = holds_
        self.refuser = refuser

    async def admit(self, session: str, steps: Sequence[Step], start: int, admitted: Admitted,
                    *, inline: bool) -> Admission | None:
        """Admit `steps` from `start` into `admitted`. A refusal releases every ticket and is
        `admitted.refused`. A pause is reviewed right here when `inline`; otherwise the paused
        admission is returned (not in `admitted`) for the caller to hold."""
        for index in range(start, len(steps)):
            step = steps[index]
            admission = await self.calls.runtime.admit(session, step)
            if paused(admission):
                if not inline:
                    return admission
                admission = await self.calls.reviewed(session, step, admission)
            admitted.admissions.append(admission)
            if admission.decision.blocks:
                await self.release(session, admitted, "refused")
                admitted.refused = admission
                return None
        return None

    async def release(self, session: str, admitted: Admitted, error: str) -> None:
        for admission in admitted.admissions:
            await self.calls.release(session, admission.ticket, error=error)

    def hold(self, flow: http.HTTPFlow, exchange: Exchange, content: bytes, steps: Sequence[Step],
             admitted: Admitted, admission: Admission) -> holds.Hold:
        """Hold the request's step `steps[len(admitted.admissions) - admitted.first]` (paused:
        `admission`) for its reviewer; the hold's outcome is the request's `Admitted`, the
        remaining steps admitted after the approval (a further pause reviewed there)."""
        session = exchange.session
        index = len(admitted.admissions) - admitted.first

        async def review() -> Admitted:
            answered = await self.calls.reviewed(session, steps[index], admission)
            admitted.admissions.append(answered)
            if answered.decision.blocks:
                await self.release(session, admitted, "refused")
                admitted.refused = answered
                return admitted
            await self.admit(session, steps, index + 1, admitted, inline=True)
            return admitted

        def forget(outcome: Admitted) -> None:  # approved, and nobody came back for it
            if outcome.refused is None:
                self.calls.tasks.spawn(self.release(session, outcome, "the approved request never came back"))

        request = flow.request
        key = holds.request_key(session, exchange.persona, request.method, request.host, request.port, request.path,
                                holds.identity(exchange, content))
        approval = admission.decision.approval
        assert approval is not None
        return self.holds.start(key, session, approval.id, admission.governor_object.get("expires_at"), review(),
                               shared=False, forget=forget)

    async def attend(self, flow: http.HTTPFlow, held: holds.Hold, adapter: Adapter,
                     exchange: Exchange) -> tuple[str, Admitted | None]:
        """Wait at a step held at the request (governor.proxy.holds.Holds.attend), answering
        429 review_pending (a JSON-RPC error for MCP) past this connection's hold time; an
        approved step taken once its session halted is refused. "pending": answered here."""
        session = exchange.session
        verdict, outcome = await self.holds.attend(
            flow, held, lambda h, retry_after: holds.pending_response(adapter, exchange, session, h, retry_after),
            holds.DEFAULT_CLIENT_TIMEOUT.get(adapter.name))
        if verdict == "take" and outcome is not None and outcome.refused is None:
            # approved, maybe minutes ago: a session halted (or ended) since sends nothing upstream
            halted = getattr(self.calls.runtime, "halted", None)
            cause = halted(session) if halted is not None else None
            if cause is not None:
                await self.release(session, outcome, "session halted")
                halt_object = {"cause": cause, "action": "halt", "reason": halted_reason(cause), "session": session,
                               "approval_id": held.approval_id}
                reply = adapter.error_response(403, f"governor: session halted ({cause})", halt_object, exchange)
                flow.response = http.Response.make(reply.status, reply.body, {**reply.headers, holds.ACTION_HEADER: "halt"})
                return "pending", None  # answered here
        return verdict, outcome

    async def admit_request(self, flow: http.HTTPFlow, adapter: Adapter, exchange: Exchange, activity: Any,
                            admitted: list[Admission], content: bytes,
                            held: holds.Hold | None) -> tuple[list[Step], Admitted] | None:
        """A request's steps and their admissions, or None when `flow` was answered here (a
        refusal, review_pending, a failed review). `held`: the unshared hold of the identical
        request, which this one attends (taking it, it skips admission: counted once).
        `admitted` is the caller's list of what to release if governing fails half-way."""
        session = exchange.session
        taken: Admitted | None = None
        if held is not None:  # a retry of a request held at one of its steps
            verdict, taken = await self.attend(flow, held, adapter, exchange)
            if verdict == "pending":
                return None
            if verdict == "take" and taken is None:
                self.refuser.fail_closed(flow, session, "the review could not be completed")
                return None
        if taken is None:  # a new step
            taken = Admitted(admitted)  # the same list: released if governing fails half-way
            if activity is not None:  # the persona instance first: its first request spawns it
                taken.admissions.append(await self.calls.admit(session, activity))
                if taken.admissions[0].decision.blocks:
                    await self.release(session, taken, "refused")
                    taken.refused = taken.admissions[0]
            taken.first = len(taken.admissions)
            steps = await adapter.steps(exchange) if taken.refused is None else []
            if taken.refused is None:
                paused_at = await self.admit(session, steps, 0, taken, inline=False)
                if paused_at is not None:  # held for a reviewer, apart from this connection
                    taken.admissions = list(admitted)  # the hold's now (released when nobody takes them)
                    admitted.clear()
                    new_hold = self.hold(flow, exchange, content, steps, taken, paused_at)
                    verdict, taken = await self.attend(flow, new_hold, adapter, exchange)
                    if verdict != "take" or taken is None:
                        if verdict == "take":
                            self.refuser.fail_closed(flow, session, "the review could not be completed")
                        return None
                    admitted.extend(taken.admissions)  # ours now: released if governing fails from here
        else:
            admitted.extend(taken.admissions)  # ours now: released if governing fails from here
            steps = await adapter.steps(exchange)  # this exchange's state, as the held one's
        if taken.refused is not None:
            admitted.clear()
            self.refuser.refuse(flow, adapter, taken.refused, session, exchange)
            return None
        return steps, taken

    async def serve(self, flow: http.HTTPFlow, held: holds.Hold, adapter: Adapter, exchange: Exchange) -> bool:
        """Answer `flow` from a hold of an answer; False when it has nothing to answer with
        (a stream's)."""
        session = exchange.session
        served = await self.holds.serve(
            flow, held, lambda hold, retry_after: holds.pending_response(adapter, exchange, session, hold, retry_after),
            lambda: as_response(adapter.error_response(503, "governor: the review could not be completed",
                                                       governor_error_object(session), exchange), "deny"))
        if served == "gone":
            return False
        log.info("governor: %s %s in session %s: %s for approval %s", flow.request.method, flow.request.pretty_url,
                 session, "review outcome" if served == "answer" else "review pending (429)", held.approval_id)
        return True
