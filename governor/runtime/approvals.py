"""The runtime's side of oversight (§5): holding a paused step, waiting for its review,
answering it (approve, reject, plan-editing edit), expiring it, and the views of what
waits.

`Approvals` owns the held steps' waiting and waking; it is handed the live-session table
and the runtime's step path (`apply`, `admit`) in its constructor. The decision about a
review is the policy's (governor.policy.approval_steps); this holds the waiting request
and wakes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from governor.policy import (
    Action,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRejected,
    Decision,
    Step,
    ToolCall,
    step_digest,
)
from governor.runtime.api import Admission, admission_for
from governor.runtime.edit import EditRefused, editable, edited_step
from governor.runtime.session import HeldStep, LiveSession
from governor.policy.state import PENDING
from governor.evidence import iso_utc
from governor.notify import events as notify
from governor.runtime.refusals import unrecorded_failure
from governor.runtime.settings import RuntimeSettings

log = logging.getLogger("governor.runtime")

if TYPE_CHECKING:
    from governor.runtime.metrics import Metrics

# the runtime's full decision round for a step of a live session, its lock held (Runtime._apply)
Apply = Callable[[LiveSession, Step, Any], Awaitable[tuple[Decision, Any]]]


class Approvals:
    """Held steps and their reviews, over the runtime's live sessions."""

    def __init__(self, *, sessions: dict[str, LiveSession], metrics: Metrics, clock: Callable[[], float],
                 agent_id: str, settings: RuntimeSettings, apply: Apply,
                 admit: Callable[[str, Step], Awaitable[Admission]], holds: Any = None) -> None:
        self.sessions = sessions
        self.holds = holds  # governor.runtime.shared_holds.SharedHolds: reviewers on any replica
        self.metrics = metrics
        self.clock = clock
        self.agent_id = agent_id
        self.settings = settings  # its notifier: the runtime's, as it is now
        self.apply = apply
        self.admit = admit

    def hold(self, live: LiveSession, step: Step, decision: Decision) -> None:
        request = decision.approval
        assert request is not None
        live.pending[request.id] = HeldStep(
            step=step, expires_at=request.expires_at, answer=asyncio.get_running_loop().create_future(),
            reason=request.reason, trigger=request.trigger, held_at=self.clock(),
        )
        if self.holds is not None:
            view = next(v for v in self.views_of(live) if v["id"] == request.id)
            self.holds.publish({**view, "expires_at_epoch": request.expires_at})
        self.settings.notifier.emit(notify.held_step(self.agent_id, live.id, request, step))  # webhooks: a review waits
        self.pending_metrics()
        live.restate(self.metrics)

    async def await_approval(self, session: str, approval_id: str) -> Admission:
        edited: dict[str, Any] | None = None  # plan editing: the arguments the reviewer approved
        while True:
            live = self.sessions.get(session)
            pending = live.pending.get(approval_id) if live is not None else None
            if live is None or pending is None:
                decision = unrecorded_failure(ToolCall(tool="?"), LookupError(f"no pending approval {approval_id!r}"))
                return admission_for(session, decision, None)
            timeout = max(0.0, pending.expires_at - self.clock())
            try:
                if self.holds is None:
                    approved, answered = await asyncio.wait_for(asyncio.shield(pending.answer), timeout)
                else:  # the answer may come through another replica
                    approved, answered = await self.holds.wait(  # type: ignore[assignment]
                        pending, approval_id, timeout,
                        lambda granted, admission: self.answer(live, approval_id, granted, admission,  # type: ignore[arg-type]
                                                               "approved" if granted else "rejected"), session)
            except TimeoutError:
                answered = await self.expire(live, approval_id)
                approved = False
            if approved:
                if pending.edited:  # (an edited step is a ToolCall)
                    edited = dict(pending.step.arguments)  # type: ignore[attr-defined]
                answered = await self.admit(session, dataclasses.replace(pending.step, approval_id=approval_id))
            decision = answered.decision
            if not (decision.enforced and decision.action is Action.PAUSE and decision.approval is not None):
                if edited is not None and not decision.blocks:
                    answered.edited_arguments = edited
                return answered
            # released from one pause into another (a second trigger, an anomaly, a declared
            # re-review on timeout): the request stays held for that review too
            approval_id = decision.approval.id

    async def expire(self, live: LiveSession, approval_id: str) -> Admission:
        """§5.3: nobody answered in time; resolve on_oversight_timeout (halt by default)."""
        async with live.lock:
            pending = live.pending.get(approval_id)
            if pending is not None and pending.answer.done():  # answered while we waited for the lock
                approved, answered = pending.answer.result()
                return answered if not approved else admission_for(live.id, Decision(), None)
            decision, _ = await self.apply(live, ApprovalExpired(approval_id), None)
            admission = admission_for(live.id, decision, None)
            self.answer(live, approval_id, False, admission, "expired")
        if decision.enforced and decision.action is Action.PAUSE and decision.approval is not None and pending is not None:
            self.hold(live, pending.step, decision)  # declared pause: a fresh review of the same step
        return admission

    def answer(self, live: LiveSession, approval_id: str, approved: bool, admission: Admission | None,
               outcome: str) -> None:
        pending = live.pending.pop(approval_id, None)
        if pending is not None and self.holds is not None:
            self.holds.withdraw(approval_id)
        if pending is not None and not pending.answer.done():
            pending.answer.set_result((approved, admission))
        if pending is not None:
            self.metrics.approval_resolved(outcome, self.clock() - pending.held_at)
        self.pending_metrics()
        live.restate(self.metrics)

    def pending_metrics(self) -> None:
        """The pending-approval gauges, on a hold or an answer (not per request)."""
        held = [p.held_at for s in self.sessions.values() for p in s.pending.values()]
        self.metrics.set_pending_approvals(len(held), oldest_held_at=min(held, default=None))

    async def resolve_approval(self, approval_id: str, approve: bool, reviewer: str, reason: str = "",
                               edited_arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """Answer a pending approval, with the reviewer's note `reason`; `edited_arguments`
        (plan editing, approve only) approves the held step with those arguments instead.
        Raises KeyError (not pending) or governor.runtime.edit.EditRefused (an edit the passport or
        the step does not allow)."""
        live = next((s for s in self.sessions.values() if approval_id in s.pending), None)
        if live is None and self.holds is not None:  # held on another replica
            return await self.holds.resolve(approval_id, approve, reviewer, reason, edited_arguments)
        if live is None:
            raise KeyError(approval_id)
        async with live.lock:
            pending = live.pending.get(approval_id)
            approval = live.state.approvals.get(approval_id)
            if pending is None or pending.answer.done() or approval is None or approval.status != PENDING:
                raise KeyError(approval_id)
            edited = None
            if edited_arguments is not None:
                if not approve:
                    raise EditRefused("edit_needs_approve", "edited arguments go with an approval, not a rejection")
                edited = edited_step(live.limits, pending.step, edited_arguments)
            if approve:
                step = ApprovalGranted(approval_id, reviewer, reason,
                                       edited_digest=step_digest(edited) if edited is not None else None)
            else:
                step = ApprovalRejected(approval_id, reviewer, reason)
            decision, _ = await self.apply(live, step, None)
            admission = admission_for(live.id, decision, None)
            # approved: the waiting request re-admits the held step, released by its digest
            granted = approve and decision.action is Action.CONTINUE
            if granted and edited is not None:  # the held request goes on as the reviewer edited it
                pending.step, pending.edited = edited, True
            self.answer(live, approval_id, granted, None if granted else admission,
                        "approved" if approve else "rejected")
        review = decision.details.get("review", "approved" if approve else "rejected")
        answer = {"id": approval_id, "session": live.id, "decision": "approve" if approve else "reject",
                  "reviewer": reviewer, "outcome": review, "governor": admission.governor_object,
                  "edited": edited is not None}
        if edited is not None:
            answer.update(original_step_digest=decision.details.get("original_step_digest"),
                          step_digest=decision.details.get("step_digest"))
        return answer

    def answered_approval(self, approval_id: str) -> dict[str, Any] | None:
        """How an approval that is no longer pending ended ({"status", "reviewer"}), or None
        when no live session knows it. A walk over sessions: for the control plane's error
        answer only, never per request."""
        for live in self.sessions.values():
            approval = live.state.approvals.get(approval_id)
            if approval is not None and approval_id not in live.pending:
                return {"status": approval.status, "reviewer": approval.reviewer, "session": live.id}
        return None

    def pending_views(self) -> list[dict[str, Any]]:
        """Every held step waiting for its review, as the control plane lists them."""
        here = [view for live in self.sessions.values() if live.pending for view in self.views_of(live)]
        if self.holds is None:
            return here
        known = {view["id"] for view in here}
        try:  # the steps other replicas hold
            elsewhere = [view for view in self.holds.listed() if view.get("id") not in known]
        except Exception:
            log.exception("the held steps of other replicas could not be listed")
            elsewhere = []
        return here + [{k: v for k, v in view.items() if k != "expires_at_epoch"} for view in elsewhere]

    def views_of(self, live: LiveSession) -> list[dict[str, Any]]:
        """The held steps of one session (its control-plane view lists them)."""
        out = []
        for approval_id, pending in live.pending.items():
            approval = live.state.approvals.get(approval_id)
            out.append({
                "id": approval_id, "session": live.id, "reason": pending.reason, "trigger": pending.trigger,
                "tool": getattr(pending.step, "tool", None),
                "arguments": dict(getattr(pending.step, "arguments", {}) or {}),
                "persona": getattr(pending.step, "persona", None),
                "step_digest": approval.step_digest if approval else None,
                "expires_at": iso_utc(pending.expires_at),
                "plan_editing": editable(live.limits, pending.step),
            })
        return out
