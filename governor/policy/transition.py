"""`advance`: the session's state after the runtime applied a decision to a step.

Counts what went ahead (iterations, tool calls, in-flight slots, persona instances,
announced tool calls, the loop window), remembers warnings given and anomalies seen, counts
the R3 feeds (governor.policy.feeds),
opens and closes approvals, and frees the slots of steps that ended. Separate from the
decisions (governor.policy.engine) because it never decides: it only books what the
runtime did with a decision.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from governor.policy import feeds
from governor.policy.limits import Limits
from governor.policy.state import EXPIRED, GRANTED, PENDING, REJECTED, USED, Approval, SessionState
from governor.policy.steps import (
    ON_ANOMALY, ON_OVERSIGHT_TRIGGER, Action, ApprovalExpired, ApprovalGranted, ApprovalRejected,
    Decision, Delegation, ModelCall, PersonaExit, PersonaSpawn, SessionEnd, Step, StepDone, Tick, ToolCall,
    UsageReport
)
from governor.policy.digests import loop_signature
from governor.policy.tool_steps import tool_data_classes


def _deviation_keys(decision: Decision) -> frozenset[str]:
    keys = set()
    for event in decision.events:
        if event["cause"] == ON_ANOMALY:
            for deviation in event["detail"].get("deviations", ()):
                keys.add(deviation["key"])
    return frozenset(keys)


def advance(limits: Limits, state: SessionState, step: Step, decision: Decision, now: float) -> SessionState:
    """The session's state after the runtime applied `decision` to `step`."""
    changes: dict[str, Any] = {"seq": state.seq + 1}
    kind = type(step)
    if decision.settles and (kind is Tick or kind is SessionEnd):
        changes["wall_clock_at"] = now
    if kind is SessionEnd:
        changes["ended"] = True
    if state.halted:
        # nothing goes ahead any more, but steps admitted before the halt still finish:
        # their in-flight slots are freed so the session can be seen idle and end
        if _frees(step):
            changes.update(_freed(state, step))
        return state.evolve(**changes)
    if decision.halts:
        changes["halted"] = True
        changes["halt_cause"] = decision.cause
    if decision.warnings:
        changes["warned"] = state.warned | {(d, s) for d, s, _ in decision.warnings}
    if limits.enforce_anomaly and (decision.event is not None or kind is PersonaSpawn or kind is Delegation):
        found = feeds.count(step, decision)  # R3: the §2-§5 events this step fed the substrate
        if found:
            changes["feeds"] = feeds.advanced(state, found)
    if decision.event is not None:
        keys = _deviation_keys(decision)
        if keys:
            changes["deviations"] = state.deviations | keys
    approvals = None
    request = decision.approval
    if decision.enforced and decision.action is Action.PAUSE and request is not None and not request.monitor_only:
        approvals = dict(state.approvals)
        approvals[request.id] = Approval(request.id, request.step_digest, decision.cause or ON_OVERSIGHT_TRIGGER,
                                         request.trigger, request.expires_at)
    if kind is ApprovalGranted or kind is ApprovalRejected or kind is ApprovalExpired:
        approval = state.approvals.get(step.approval_id)  # type: ignore[union-attr]
        review = decision.details.get("review")
        if approval is not None and approval.status == PENDING and review is not None:
            status = {"approved": GRANTED, "rejected": REJECTED, "expired": EXPIRED}[review]
            approvals = dict(state.approvals) if approvals is None else approvals
            approvals[approval.id] = replace(approval, status=status, reviewer=getattr(step, "reviewer", None))
            if status == GRANTED and getattr(step, "edited_digest", None) is not None:
                # plan editing: the grant releases the edited step, not the one the agent sent
                approvals[approval.id] = replace(approvals[approval.id], step_digest=step.edited_digest)
            if status == GRANTED:
                trigger = next((t for t in limits.triggers if t.name == approval.trigger), None)
                if trigger is not None and trigger.session_level:
                    changes["released_triggers"] = state.released_triggers | {trigger.name}
    goes_ahead = not decision.blocks
    if goes_ahead:
        approval_ref = getattr(step, "approval_id", None)
        released = decision.details.get("released_by")
        if approval_ref is not None and released == approval_ref and kind not in (ApprovalGranted, ApprovalRejected, ApprovalExpired):
            # the step went ahead: every grant for it is used up (each releases it once)
            approvals = dict(state.approvals) if approvals is None else approvals
            released_digest = approvals[approval_ref].step_digest
            for ref, granted in approvals.items():
                if granted.status == GRANTED and granted.step_digest == released_digest:
                    approvals[ref] = replace(granted, status=USED)
        if kind is ModelCall:
            changes["iterations"] = state.iterations + 1
            changes["in_flight"] = state.in_flight + 1
        elif kind is ToolCall and decision.details.get("announced"):
            # executing an announced call: now in flight, already counted and gated
            signature = loop_signature(step.tool, step.arguments)  # type: ignore[union-attr]
            announced = dict(state.announced)
            if announced.get(signature, 0) > 1:
                announced[signature] -= 1
            else:
                announced.pop(signature, None)
            changes["announced"] = announced
            changes["in_flight"] = state.in_flight + 1
            changes["tools_in_flight"] = state.tools_in_flight + 1
        elif kind is ToolCall:
            tool = step.tool  # type: ignore[union-attr]
            changes["tool_calls"] = state.tool_calls + 1
            if step.origin == "model":  # type: ignore[union-attr]
                # runs at the agent, outside the governor's view: counted, not in flight here
                signature = loop_signature(tool, step.arguments)  # type: ignore[union-attr]
                announced = dict(state.announced)
                announced[signature] = announced.get(signature, 0) + 1
                changes["announced"] = announced
            else:
                changes["in_flight"] = state.in_flight + 1
                changes["tools_in_flight"] = state.tools_in_flight + 1
            counts = dict(state.tool_counts)
            counts[tool] = counts.get(tool, 0) + 1
            changes["tool_counts"] = counts
            classes = tool_data_classes(limits, step)  # type: ignore[arg-type]
            if not classes <= state.data_classes:
                changes["data_classes"] = state.data_classes | classes
            if limits.loop_window is not None:
                window = state.recent_tools + (loop_signature(tool, step.arguments),)  # type: ignore[union-attr]
                changes["recent_tools"] = window[-limits.loop_window:]
        elif kind is PersonaSpawn:
            live = dict(state.personas_live)
            live[step.persona] = live.get(step.persona, 0) + 1  # type: ignore[union-attr]
            changes["personas_live"] = live
    if _frees(step):
        changes.update(_freed(state, step))
    if approvals is not None:
        changes["approvals"] = approvals
    return state.evolve(**changes)


def _frees(step: Any) -> bool:
    kind = type(step)
    return kind is StepDone or kind is PersonaExit or (kind is UsageReport and step.ends_call)


def _freed(state: SessionState, step: Any) -> dict[str, Any]:
    """The in-flight bookkeeping of a StepDone, a PersonaExit or a report that ends its call."""
    if type(step) is PersonaExit:
        live = dict(state.personas_live)
        remaining = live.get(step.persona, 0) - 1
        if remaining > 0:
            live[step.persona] = remaining
        else:
            live.pop(step.persona, None)
        return {"personas_live": live}
    changes: dict[str, Any] = {"in_flight": max(0, state.in_flight - 1)}
    if type(step) is StepDone and step.kind == "tool":
        changes["tools_in_flight"] = max(0, state.tools_in_flight - 1)
    return changes
