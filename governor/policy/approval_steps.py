"""The decisions for a reviewer's answer to a held step (§5): a grant, a rejection, an
edited grant under plan_editing (§5.4), and the timeout when nobody answered in time
(§5.3, on_oversight_timeout).

The pause that asks for the review is `Run.pause` (governor.policy.run); this is its
other half, and the state transition (governor.policy.transition) records its outcome.
"""

from __future__ import annotations

from typing import Any

from governor.common.timefmt import iso_utc
from governor.policy import degradation as _degradation
from governor.policy.state import PENDING, Approval
from governor.policy.steps import (
    ON_OVERSIGHT_TIMEOUT, Action, ApprovalExpired, ApprovalGranted, ApprovalRejected, ApprovalRequest,
    Decision
)
from governor.policy.digests import approval_id, enforcement_event
from governor.policy.run import Run


def _unknown_approval(approval_ref: str, approval: Approval | None) -> Decision:
    # The runtime checks before asking; an unknown or answered approval releases nothing.
    return Decision(
        action=Action.DENY,
        details={"approval_id": approval_ref, "reason": "unknown approval" if approval is None else f"approval already {approval.status}"},
    )


def _approval_detail(run: Run, approval: Approval, review: str) -> dict[str, Any]:
    return {
        "step": run.kind, "review": review, "approval_id": approval.id, "step_digest": approval.step_digest,
        "trigger": approval.trigger, "fail_closed": False,
    }


def _timeout(run: Run, approval: Approval, late_reviewer: str | None = None) -> Decision:
    """§5.3: nobody answered in time. The held step never runs unreviewed."""
    detail = _approval_detail(run, approval, "expired")
    detail["paused_cause"] = approval.cause
    if late_reviewer is not None:
        detail["late_reviewer"] = late_reviewer
    resolution = run.limits.degradation.get(ON_OVERSIGHT_TIMEOUT, _degradation.FAIL_CLOSED)
    detail["fail_closed"] = resolution.fail_closed
    if resolution.declared_by is not None:
        detail["declared_by"] = resolution.declared_by
    action = resolution.action
    if not run.limits.enforce_hard:
        # R1 held the step only because §5 forbids running it unreviewed: it is not run, the
        # session goes on, and what R2 would do about the timeout is recorded (R1 observes)
        detail.update(observed_only=True, would=action.value, overridden_cause=ON_OVERSIGHT_TIMEOUT,
                      held_step="not_executed")
        return Decision(
            action=Action.DENY, cause=ON_OVERSIGHT_TIMEOUT, details=detail,
            event=enforcement_event(ON_OVERSIGHT_TIMEOUT, Action.CONTINUE.value, detail),
        )
    if action is Action.PAUSE:  # escalate again: a fresh review of the same step
        request = ApprovalRequest(
            approval_id(run.state.session, run.state.seq, approval.step_digest),
            resolution.message or "oversight timed out; review again",
            approval.step_digest,
            run.now + run.limits.response_time_sec,
            approval.trigger,
        )
        detail.update(approval_id=request.id, previous_approval_id=approval.id,
                      expires_at=iso_utc(request.expires_at))
        return run.stop(Action.PAUSE, ON_OVERSIGHT_TIMEOUT, detail, approval=request)
    if action is Action.CONTINUE:  # the session goes on; the held step does not
        detail["overridden_cause"] = ON_OVERSIGHT_TIMEOUT
        detail["held_step"] = "not_executed"
        return Decision(
            action=Action.DENY, cause=ON_OVERSIGHT_TIMEOUT, details=detail,
            event=enforcement_event(ON_OVERSIGHT_TIMEOUT, Action.CONTINUE.value, detail),
        )
    if action is Action.FALLBACK:
        return run.stop(Action.FALLBACK, ON_OVERSIGHT_TIMEOUT, detail, fallback_value=resolution.value, fallback_message=resolution.message)
    return run.stop(Action.HALT, ON_OVERSIGHT_TIMEOUT, detail, fail_closed=resolution.fail_closed)


def decide_approval_granted(run: Run, step: ApprovalGranted) -> Decision:
    approval = run.state.approvals.get(step.approval_id)
    if approval is None or approval.status != PENDING:
        return _unknown_approval(step.approval_id, approval)
    if run.now > approval.expires_at:
        return _timeout(run, approval, late_reviewer=step.reviewer)
    if step.edited_digest is not None and not run.limits.plan_editing:
        # §5.4: edits are part of the plan_editing intervention model only
        return Decision(action=Action.DENY, details={
            "approval_id": step.approval_id, "reason": "the passport's intervention_model is not plan_editing"})
    detail = _answered_detail(run, approval, "approved", step.reviewer, step.reason)
    detail["overridden_cause"] = approval.cause  # the paused cause, released by a human
    if step.edited_digest is not None:  # both digests recorded: what the agent asked, what was approved
        detail.update(edited=True, original_step_digest=approval.step_digest, step_digest=step.edited_digest)
    return Decision(
        action=Action.CONTINUE, cause=approval.cause, details=detail,
        # recorded as the pause it closes (review: approved), not `continue`: no response was overridden
        event=enforcement_event(approval.cause, Action.PAUSE.value, detail),
    )


def _answered_detail(run: Run, approval: Approval, outcome: str, reviewer: str, reason: str) -> dict[str, Any]:
    """The event detail of a reviewer's answer: the approval's, who answered, their note."""
    detail = _approval_detail(run, approval, outcome)
    detail["reviewer"] = reviewer
    if reason:
        detail["reason"] = reason[:500]
    return detail


def decide_approval_rejected(run: Run, step: ApprovalRejected) -> Decision:
    approval = run.state.approvals.get(step.approval_id)
    if approval is None or approval.status != PENDING:
        return _unknown_approval(step.approval_id, approval)
    detail = _answered_detail(run, approval, "rejected", step.reviewer, step.reason)
    # The record's action vocabulary has no "deny": the held step is replaced by the
    # rejection and the session goes on, which is §6's fallback.
    return Decision(
        action=Action.DENY, cause=approval.cause, details=detail,
        event=enforcement_event(approval.cause, Action.FALLBACK.value, detail),
    )


def decide_approval_expired(run: Run, step: ApprovalExpired) -> Decision:
    approval = run.state.approvals.get(step.approval_id)
    if approval is None or approval.status != PENDING:
        return _unknown_approval(step.approval_id, approval)
    return _timeout(run, approval)
