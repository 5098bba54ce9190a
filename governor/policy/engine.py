"""The decision point: `decide` and `advance`, pure functions of their arguments.

decide(limits, state, step, now) -> Decision
    No I/O, no clock reads, no randomness: approval ids are derived from the session,
    the step's seq and its digest. Any internal failure is caught and becomes a
    recorded on_governor_error decision, resolved through §6 (halt unless declared):
    the governor fails closed, it never raises.

advance(limits, state, step, decision, now) -> SessionState
    The session's bookkeeping after the runtime applied `decision`.

quiet_model_call(limits, state, step, counters, now) -> (Decision, SessionState) | None
    Both, for the usual model call (one that fires nothing and warns of nothing), in one
    short pass: how the runtime admits it. None sends the call to `decide`.
    quiet_settlement(limits, state, report) does the same for the usual end of a model call.

Checks run in a fixed order per step and stop at the first cause whose resolved action
stops the step (halt, pause, fallback). A cause resolved to an explicit `continue`, or
only observed (R1; §7 below R3), is recorded and checking goes on, so one step can
record several events (`Decision.events`).

Budget projection (§2), the contract with the store:
  * `state.counters` holds, for every key in `limits.counter_keys(step)`, the store's
    current use including outstanding reservations (missing keys read as 0).
  * A model call is budget-exhausted when counter + expected consumption > cap for any
    declared cap (parent aggregate per_session / per_day, and the persona's
    budget_share when declared). Expected consumption: expected input + output tokens,
    priced by the pricing table. A call with an `output_floor` is first fitted: its output
    lowered to what the caps leave, not below the floor (governor.policy.fitting).
  * When it is admitted, `Decision.charges` are the reservations, one per counter with
    its cap; the store applies them atomically. If the store finds a cap would be
    exceeded (a concurrent step got there first), the runtime re-reads the counters
    and calls `decide` again: the projection then reports budget-exhausted.
  * A usage report carries the admission's charges as `reserved`; the projection is
    counter - reserved + actual. A final report's charges are the actual use with no
    cap and `settles=True`: the runtime releases the reservation and commits them
    whatever the decision, since the consumption happened. If the actual use crossed a
    cap the boundary is still recorded and resolved. A running (final=False) total
    crossing a cap is budget-exhausted so the proxy can cut the stream.
  * Wall-clock is charged on Tick and SessionEnd (elapsed since the last charge,
    settled like usage) and projected on every admission.
  * Charges are never negative: the only decrease is the store releasing a
    reservation (UsageReport.reserved, or a step that did not go ahead).

Where the pieces live (this module keeps the door and the dispatcher; split to stay short):
  governor.policy.digests          step digests, loop signatures, approval ids, events
  governor.policy.run              one step's evaluation: a fired cause resolved through §6
  governor.policy.checks           counted limits, the wall clock, budget projection, charges
  governor.policy.quiet            the per-request fast paths (quiet_model_call, settlement)
  governor.policy.model_steps      model calls and usage reports
  governor.policy.tool_steps       tool calls and tool errors
  governor.policy.sub_agent_steps  persona spawns and exits, delegations
  governor.policy.approval_steps   a reviewer's answer, an approval's timeout
  governor.policy.transition       advance(): the state after a decision
  governor.policy.budget_warnings  §2 warnings as recorded events (on_governor_budget_warning)
  governor.policy.feeds            R3: §2-§5 events fed to the anomaly substrate (feed_rates.py)
"""

from __future__ import annotations

import math
from typing import Any, Callable

from governor.policy import degradation as _degradation
from governor.policy import anomaly, feeds
from governor.policy.limits import SESSION_COST, Limits
from governor.policy.state import SessionState
from governor.policy.steps import (
    ON_ANOMALY, ON_GOVERNOR_ERROR, ON_SESSION_INTEGRITY, PERMIT, Action, ApprovalExpired,
    ApprovalGranted, ApprovalRejected, CounterCharge, Decision, Delegation, EnvelopeDeviation, ModelCall,
    PassportPresented, PersonaExit, PersonaSpawn, SessionEnd, Step, StepDone, Tick, ToolCall, ToolError,
    UsageReport
)
from governor.policy.digests import STEP_KINDS, approval_id, enforcement_event, loop_signature, step_digest
from governor.policy import envelope
from governor.policy.run import Run
from governor.policy.checks import charges_for, clock_check
from governor.policy.quiet import quiet_model_call, quiet_settlement, settlement
from governor.policy.model_steps import decide_model_call, decide_usage
from governor.policy.tool_steps import decide_tool_call, decide_tool_error
from governor.policy.sub_agent_steps import decide_delegation, decide_persona_exit, decide_persona_spawn
from governor.policy.approval_steps import (
    decide_approval_expired, decide_approval_granted, decide_approval_rejected
)
from governor.policy.transition import advance

# the door: what outside code imports from here, wherever each piece now lives
__all__ = [
    "advance",
    "decide",
    "governor_error",
    "store_unreachable",
    "counter_damaged",
    "quiet_model_call",
    "quiet_settlement",
    "settlement",
    "step_digest",
    "loop_signature",
    "approval_id",
    "STEP_KINDS",
]


def _tick(run: Run, step: Tick) -> Decision:
    d, _, warnings = clock_check(run, settle=True)
    return d or run.finish(warnings=tuple(warnings))


def _session_end(run: Run, step: SessionEnd) -> Decision:
    clock_check(run, settle=True, check=False)  # the last interval settles; nothing left to stop
    baseline = run.limits.baseline
    if baseline is not None and baseline.cost_min is not None:
        deviation = anomaly.cost_deviation(baseline, run.state, run.state.counters.get(SESSION_COST, 0.0), at_end=True)
        if deviation is not None:
            deviation["at_session_end"] = True
            if (d := run.fire(ON_ANOMALY, {"deviations": [deviation]}, run.limits.enforce_anomaly)) is not None:
                return d
    return run.finish()


def _passport_presented(run: Run, step: PassportPresented) -> Decision:
    if step.digest == run.limits.passport_digest:
        return PERMIT
    # §1.3 anti-swap: never adopt the new limits; a session-integrity fault through §6, at every
    # tier (the Security Considerations give this fail-closed rule no tier exemption: R1 too)
    detail = {"reason": "passport_changed", "pinned_digest": run.limits.passport_digest, "presented_digest": step.digest}
    return run.fire(ON_SESSION_INTEGRITY, detail, True) or run.finish()


def _envelope_deviation(run: Run, step: EnvelopeDeviation) -> Decision:
    """The agent's envelope deviation (policy/envelope.py), recorded once in this session."""
    run.release(step.approval_id)
    deviation = step.deviation
    detail: dict[str, Any] = {"deviations": envelope.recorded_deviations(deviation), "across_sessions": True,
                              "envelope": {"id": deviation["id"], "agent": deviation.get("agent")}}
    return run.fire(ON_ANOMALY, detail, run.limits.enforce_anomaly) or run.finish()


def _nothing(run: Run, step: Step) -> Decision:
    return PERMIT


_HANDLERS: dict[type, Callable[[Run, Any], Decision]] = {
    ModelCall: decide_model_call,
    UsageReport: decide_usage,
    ToolCall: decide_tool_call,
    PersonaSpawn: decide_persona_spawn,
    PersonaExit: decide_persona_exit,
    StepDone: _nothing,
    Delegation: decide_delegation,
    ToolError: decide_tool_error,
    Tick: _tick,
    SessionEnd: _session_end,
    PassportPresented: _passport_presented,
    ApprovalGranted: decide_approval_granted,
    ApprovalRejected: decide_approval_rejected,
    ApprovalExpired: decide_approval_expired,
    EnvelopeDeviation: _envelope_deviation,
}


def _after_halt(limits: Limits, state: SessionState, step: Step, now: float) -> Decision:
    """A halted session permits nothing new; consumption that already happened still settles.

    A model call admitted before the halt still delivers its answer while its usage stays
    within what was reserved for it: those tokens fitted every cap and are already paid,
    and withholding them would stop nothing. Beyond its reservation it is cut.
    """
    charges: tuple[CounterCharge, ...] = ()
    kind = type(step)
    delivered = False
    if kind is UsageReport:
        cost = limits.pricing.cost(step.model, step.input_tokens, step.output_tokens, step.cached_input_tokens,  # type: ignore[union-attr]
                                    step.units)  # type: ignore[union-attr]
        delivered = limits.within_reservation(step, cost)  # type: ignore[arg-type]
        if step.final:  # type: ignore[union-attr]
            meters = limits.meters.get(step.persona, limits.meters[None])  # type: ignore[union-attr]
            run = Run(limits, state, step, now)
            charges = charges_for(run, meters, step.input_tokens + step.output_tokens, cost, False)  # type: ignore[union-attr]
    elif kind is Tick or kind is SessionEnd:
        _, charges, _ = clock_check(Run(limits, state, step, now), settle=True)
    if delivered:
        return Decision(details={"halted": True, "halt_cause": state.halt_cause, "admitted_before_halt": True},
                        charges=charges, settles=bool(charges))
    return Decision(
        action=Action.HALT,
        cause=state.halt_cause,
        details={"halted": True, "halt_cause": state.halt_cause, "step": STEP_KINDS.get(kind, kind.__name__)},
        charges=charges,
        settles=bool(charges),
    )


def governor_error(limits: Limits, state: SessionState, step: Any, exc: BaseException) -> Decision:
    """The governor could not decide: recorded, and resolved through §6 (halt unless declared)."""
    resolution = limits.degradation.get(ON_GOVERNOR_ERROR, _degradation.FAIL_CLOSED)
    action = resolution.action if resolution.action is not Action.PAUSE else Action.HALT
    detail: dict[str, Any] = {
        "step": STEP_KINDS.get(type(step), type(step).__name__),
        "error": f"{type(exc).__name__}: {exc}"[:500],
        "fail_closed": resolution.fail_closed or resolution.action is Action.PAUSE,
    }
    enforced = limits.enforce_hard
    if not enforced:
        detail.update(observed_only=True, would=action.value, overridden_cause=ON_GOVERNOR_ERROR)
        return Decision(action=action, enforced=False, cause=ON_GOVERNOR_ERROR, details=detail,
                        event=enforcement_event(ON_GOVERNOR_ERROR, Action.CONTINUE.value, detail))
    if action is Action.CONTINUE:
        detail["overridden_cause"] = ON_GOVERNOR_ERROR
    return Decision(
        action=action,
        cause=ON_GOVERNOR_ERROR,
        fail_closed=detail["fail_closed"],
        details=detail,
        event=enforcement_event(ON_GOVERNOR_ERROR, action.value, detail),
        fallback_value=resolution.value if action is Action.FALLBACK else None,
        fallback_message=resolution.message,
    )


_governor_error = governor_error  # the name governor.runtime imported first


def store_unreachable(limits: Limits, state: SessionState, step: Any, error: str, retry_after: float) -> Decision:
    """The state store could not be reached (or answered too late): transient, not a loss.
    Under the default fail-closed resolution of on_governor_error the step is refused as
    retryable (deny, not halt: the session goes on once the store answers again), its
    event recorded; a Tick refused so is not recorded (the next one tries again). A declared
    non-halting resolution (continue, fallback) and observe-only tiers resolve as any
    governor error does."""
    return _store_refusal(limits, state, step, ConnectionError(error), {
        "error": f"StoreUnavailable: {error}"[:500], "retryable": True, "retry_after": max(1, math.ceil(retry_after)),
        "reason": "the state store is unreachable: the step is refused, retry after a short wait"})


def counter_damaged(limits: Limits, state: SessionState, step: Any, exc: BaseException) -> Decision:
    """A counter the step reads holds something that is not a count (a budget counter or a
    rate limit's window counter edited in the store; `exc` the store's CounterDamaged, with the
    `key` and what it holds, `found`): damage to that key, not a loss. As for an unreachable
    store, the step is refused and recorded and the session goes on, but not retryable:
    waiting does not mend it; an operator deleting or correcting the key does, and the next
    step is then served (docs/reference/stores.md says why it does not halt)."""
    key = str(getattr(exc, "key", "?"))[:200]
    return _store_refusal(limits, state, step, exc, {
        "error": f"{type(exc).__name__}: {exc}"[:500], "retryable": False, "counter": key,
        "found": str(getattr(exc, "found", "?"))[:64],
        "reason": f"the counter {key} in the state store is not a count: the step is refused until an operator "
                  "deletes or corrects it"})


def _store_refusal(limits: Limits, state: SessionState, step: Any, exc: BaseException,
                   what: dict[str, Any]) -> Decision:
    """A step the store could not count (store_unreachable, counter_damaged): refused under the
    default fail-closed resolution of on_governor_error, the session going on; a declared
    non-halting resolution and observe-only tiers resolve as any governor error does."""
    resolution = limits.degradation.get(ON_GOVERNOR_ERROR, _degradation.FAIL_CLOSED)
    if not limits.enforce_hard or resolution.action not in (Action.HALT, Action.PAUSE):
        return governor_error(limits, state, step, exc)
    detail: dict[str, Any] = {"step": STEP_KINDS.get(type(step), type(step).__name__), "error": what.pop("error"),
                              "fail_closed": True, **what, "refused_step": "not_executed"}
    # recorded as §6's fallback (the refusal stands in for the step, the session goes on), not
    # `continue`: nothing failed open
    event = None if type(step) is Tick else enforcement_event(ON_GOVERNOR_ERROR, Action.FALLBACK.value, detail)
    return Decision(action=Action.DENY, cause=ON_GOVERNOR_ERROR, fail_closed=True, details=detail, event=event)


def decide(limits: Limits, state: SessionState, step: Step, now: float) -> Decision:
    """The PDP's decision for `step` at time `now` (seconds since the epoch)."""
    try:
        if state.halted:
            return _after_halt(limits, state, step, now)
        decision = _HANDLERS[type(step)](Run(limits, state, step, now), step)
        if limits.enforce_anomaly:  # R3: the step's §2-§5 events feed the anomaly substrate
            return feeds.monitor(limits, state, step, decision, now)
        return decision
    except Exception as exc:  # fail closed, and say why, rather than crash the proxy
        return governor_error(limits, state, step, exc)
