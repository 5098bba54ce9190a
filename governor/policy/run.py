"""One evaluation of one step: `Run`, the causes fired while a step is checked and the
Decision they add up to.

§6 lives here: a fired cause is resolved through the passport's degradation table (halt,
pause, fallback, an explicit continue, or observed only below R3), a fired oversight
trigger pauses for review (§5), and a step released by a granted approval skips the
causes its reviewers released. Separate from the per-step checks, which only say *what*
fired, so that every step kind resolves a cause the same way.
"""

from __future__ import annotations

from typing import Any, Mapping

from governor.common.timefmt import iso_utc
from governor.policy import degradation as _degradation
from governor.policy.limits import Limits
from governor.policy.state import GRANTED, PENDING, SessionState
from governor.policy.steps import (
    ON_BUDGET_EXHAUSTED, ON_OVERSIGHT_TRIGGER, PERMIT, Action, ApprovalRequest, CounterCharge, Decision,
    Step, permitted
)
from governor.policy.budget_warnings import warning_events
from governor.policy.digests import STEP_KINDS, approval_id, enforcement_event, step_digest

# How many steps of one session may wait for a reviewer at once. Past it a step that needs
# review is denied, not held: an agent sending thousands of distinct steps that need review
# would otherwise grow the held steps (and the proxy's holds) without bound and bury the
# reviews that matter in the reviewer's queue and the webhook queues.
MAX_PENDING_REVIEWS = 64


class Run:
    """The causes fired while one step is checked, and the decision they add up to."""

    __slots__ = (
        "limits", "state", "step", "now", "kind", "bypass", "released_by", "events",
        "observed", "continued", "monitor", "budget_open", "charges", "settles",
    )

    def __init__(self, limits: Limits, state: SessionState, step: Step, now: float):
        self.limits = limits
        self.state = state
        self.step = step
        self.now = now
        self.kind = STEP_KINDS[type(step)]
        self.bypass: frozenset[str] = frozenset()  # causes reviewers released this exact step from
        self.released_by: str | None = None
        self.events: list[dict[str, Any]] = []
        self.observed: tuple[Action, str, dict[str, Any]] | None = None
        self.continued: tuple[str, dict[str, Any]] | None = None
        self.monitor: ApprovalRequest | None = None
        self.budget_open = False  # a budget cause was overridden: charges carry no caps
        self.charges: tuple[CounterCharge, ...] = ()
        self.settles = False

    def release(self, approval_ref: str | None) -> None:
        """A step carrying a granted approval for exactly this step skips the cause that paused it."""
        if approval_ref is None:
            return
        approval = self.state.approvals.get(approval_ref)
        digest_value = step_digest(self.step)
        if approval is not None and approval.status == GRANTED and approval.step_digest == digest_value:
            # every review already granted for this exact step counts: a step held by one
            # cause, approved, then held by another is not asked about the first again
            self.bypass = frozenset(a.cause for a in self.state.approvals.values()
                                    if a.status == GRANTED and a.step_digest == digest_value)
            self.released_by = approval_ref
            if ON_BUDGET_EXHAUSTED in self.bypass:
                self.budget_open = True

    def fire(self, cause: str, detail: dict[str, Any], enforce: bool, first: _degradation.Resolution | None = None) -> Decision | None:
        """§6 for a fired cause: a Decision that stops the step, or None to go on checking."""
        if cause in self.bypass:
            return None
        resolution = first if first is not None else self.limits.degradation.get(cause, _degradation.FAIL_CLOSED)
        detail["step"] = self.kind
        persona = getattr(self.step, "persona", None)
        if persona is not None:  # §8.3: attribute the conduct to the persona that produced it
            detail.setdefault("persona", persona)
        detail["fail_closed"] = resolution.fail_closed
        if resolution.declared_by is not None:
            detail["declared_by"] = resolution.declared_by
        if resolution.notify:
            detail["notify"] = True
        if cause == ON_BUDGET_EXHAUSTED and (not enforce or resolution.action is Action.CONTINUE):
            self.budget_open = True
        if not enforce:
            # R1 (and §7 below R3): record what would apply; the step goes ahead
            self.observe_only(resolution.action, cause, detail)
            return None
        action = resolution.action
        if action is Action.CONTINUE:
            detail["overridden_cause"] = cause  # §6: every continue recorded with what it overrode
            self.events.append(enforcement_event(cause, Action.CONTINUE.value, detail))
            self.continued = (cause, detail)
            return None
        if action is Action.PAUSE:
            return self.pause(cause, resolution.message or cause, detail, cause)
        if action is Action.FALLBACK:
            if resolution.message is not None:
                detail["message"] = resolution.message
            return self.stop(Action.FALLBACK, cause, detail, fallback_value=resolution.value, fallback_message=resolution.message)
        if resolution.message is not None:  # the passport's words for this halt reach the client
            detail["message"] = resolution.message
        return self.stop(Action.HALT, cause, detail, fail_closed=resolution.fail_closed,
                         fallback_message=resolution.message)

    def observe_only(self, would: Action, cause: str, detail: dict[str, Any]) -> None:
        """Record what would apply (`would`, for `cause`) and let the step go ahead."""
        detail["observed_only"] = True
        detail["would"] = would.value
        detail["overridden_cause"] = cause
        self.events.append(enforcement_event(cause, Action.CONTINUE.value, detail))
        if self.observed is None:
            self.observed = (would, cause, detail)

    def trigger(self, name: str, reason: str, detail: dict[str, Any]) -> Decision | None:
        """§5: a fired oversight trigger pauses (observed at R1, recorded only under monitor_only;
        a requires_confirmation tool pauses at every tier and under monitor_only too)."""
        if ON_OVERSIGHT_TRIGGER in self.bypass:
            return None
        limits = self.limits
        detail["step"] = self.kind
        detail["trigger"] = name
        detail["fail_closed"] = False
        if not limits.enforce_oversight and not detail.get("requires_confirmation"):
            # R1 observes a Governance Profile trigger; a requires_confirmation tool is Core's
            # always-on trigger, held "regardless" (§5): it pauses at every tier
            self.observe_only(Action.PAUSE, ON_OVERSIGHT_TRIGGER, detail)
            return None
        if limits.monitor_only and not detail.get("requires_confirmation"):
            # monitor_only does not gate (§5.4); the firing is recorded and reviewers told
            detail["monitor_only"] = True
            detail["overridden_cause"] = ON_OVERSIGHT_TRIGGER
            digest_value = step_digest(self.step)
            self.monitor = ApprovalRequest(
                approval_id(self.state.session, self.state.seq, digest_value), reason, digest_value,
                self.now + limits.response_time_sec, name, monitor_only=True,
            )
            self.events.append(enforcement_event(ON_OVERSIGHT_TRIGGER, Action.CONTINUE.value, detail))
            self.continued = (ON_OVERSIGHT_TRIGGER, detail)
            return None
        return self.pause(ON_OVERSIGHT_TRIGGER, reason, detail, name)

    def pause(self, cause: str, reason: str, detail: dict[str, Any], trigger: str) -> Decision:
        # counted only here, when a step would wait (pauses are rare; approvals are few)
        waiting = sum(1 for approval in self.state.approvals.values() if approval.status == PENDING)
        if waiting >= MAX_PENDING_REVIEWS:  # denied, not held: the session goes on
            detail.update(reason=reason, pending_reviews=waiting, max_pending_reviews=MAX_PENDING_REVIEWS,
                          message=f"{waiting} steps of this session already wait for a reviewer; "
                                  "this one is refused rather than held")
            # recorded as §6's fallback (the record has no "deny"), as a rejected approval is
            return Decision(action=Action.DENY, cause=cause, details=detail,
                            event=enforcement_event(cause, Action.FALLBACK.value, detail),
                            prior_events=tuple(self.events), charges=self.charges if self.settles else (),
                            settles=self.settles)
        digest_value = step_digest(self.step)
        request = ApprovalRequest(
            approval_id(self.state.session, self.state.seq, digest_value),
            reason,
            digest_value,
            self.now + self.limits.response_time_sec,
            trigger,
        )
        detail.update(approval_id=request.id, step_digest=digest_value, expires_at=iso_utc(request.expires_at), reason=reason)
        detail.setdefault("trigger", trigger)
        return self.stop(Action.PAUSE, cause, detail, approval=request)

    def stop(self, action: Action, cause: str, detail: dict[str, Any], **extra: Any) -> Decision:
        return Decision(
            action=action,
            cause=cause,
            details=detail,
            event=enforcement_event(cause, action.value, detail),
            prior_events=tuple(self.events),
            charges=self.charges if self.settles else (),
            settles=self.settles,
            **extra,
        )

    def finish(
        self,
        charges: tuple[CounterCharge, ...] = (),
        allowed_tools: frozenset[str] | None = None,
        warnings: tuple[tuple[str, str, float], ...] = (),
        details: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Nothing stopped the step: PERMIT, or CONTINUE / observed-only with the events."""
        if self.settles:
            charges = self.charges
        if self.released_by is not None:
            details = {**(details or {}), "released_by": self.released_by}
        warned = warning_events(self.limits, self.kind, warnings) if warnings else ()
        if not self.events:
            if warned:  # §2: a budget warning is recorded; the step goes ahead as permitted
                return Decision(charges=charges, allowed_tools=allowed_tools, warnings=warnings,
                                details=details or {}, settles=self.settles, event=warned[-1],
                                prior_events=warned[:-1])
            if not charges and allowed_tools is None and not warnings and not details and not self.settles:
                return PERMIT
            return permitted(charges, allowed_tools, warnings, details or {}, self.settles)
        if self.continued is not None:
            cause, detail = self.continued
            action, enforced = Action.CONTINUE, True
        else:
            action, cause, detail = self.observed  # type: ignore[misc]
            enforced = False
        if details:
            detail = {**details, **detail}
        return Decision(
            action=action,
            enforced=enforced,
            cause=cause,
            fail_closed=bool(detail.get("fail_closed")) and not enforced,
            details=detail,
            event=self.events[-1],
            prior_events=(*warned, *self.events[:-1]),
            charges=charges,
            allowed_tools=allowed_tools,
            warnings=warnings,
            approval=self.monitor,
            settles=self.settles,
        )
