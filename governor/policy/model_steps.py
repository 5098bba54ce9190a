"""The decisions for a model call and for its usage reports (§2: budgets; §3: iterations
and concurrency; the output fitting of governor.policy.fitting).

A model call is projected at its expected consumption and reserves it; a usage report
settles what the call actually used against that reservation. The usual cases take the
fast paths of governor.policy.quiet; these are the general ones, which record what fires.
"""

from __future__ import annotations

from governor.policy import anomaly, fitting
from governor.policy.tools import step_tools
from governor.policy.steps import ON_ANOMALY, Decision, ModelCall, UsageReport
from governor.policy.run import Run
from governor.policy.checks import (
    budget_check, charges_for, clock_check, cost_checks, count_check, persona_denied,
    projected_session_cost
)
from governor.policy.quiet import report_cost, settle_within_reservation


def decide_model_call(run: Run, step: ModelCall) -> Decision:
    limits, state = run.limits, run.state
    run.release(step.approval_id)
    allowed = step_tools(limits, step.persona)  # what the call may be offered (policy.tools)
    if step.persona is not None and step.persona not in limits.personas:
        if (d := persona_denied(run, step.persona, "undeclared_persona", matched_rule=None)) is not None:
            return d
    if (d := count_check(run, "max_concurrent", state.in_flight, limits.max_concurrent)) is not None:
        return d
    if (d := count_check(run, "max_iterations", state.iterations, limits.max_iterations)) is not None:
        return d
    d, _, clock_warnings = clock_check(run, settle=False)
    if d is not None:
        return d
    tokens = step.expected_input_tokens + step.expected_output_tokens
    cost = limits.pricing.cost(step.model, step.expected_input_tokens, step.expected_output_tokens, 0, step.units)
    meters = limits.meters.get(step.persona, limits.meters[None])
    # an output limit that does not fit is lowered to what does (or projected at the floor)
    fit = fitting.fit_output(limits, state.counters, meters, step, run.budget_open) \
        if step.output_floor is not None else None
    if fit is not None:
        tokens, cost = fit.tokens, fit.cost
    d, warnings = budget_check(run, meters, tokens, cost, None, step.model,
                          fit.refusal_detail() if fit is not None and fit.below_floor else None)
    if d is not None:
        return d
    if (limits.triggers or limits.baseline is not None) and (d := cost_checks(run, projected_session_cost(run, cost, None))) is not None:
        return d
    warnings.extend(clock_warnings)
    decision = run.finish(charges_for(run, meters, tokens, cost, True), allowed, tuple(warnings))
    return decision if fit is None else fitting.recorded(decision, fit, run.kind, step.persona)


def decide_usage(run: Run, step: UsageReport) -> Decision:
    limits = run.limits
    cost = report_cost(limits, step)
    # (a halted session is answered by decide() before any handler)
    deviation = anomaly.usage_deviation(step) if step.final else None
    if deviation is None and step.final and (settled := settle_within_reservation(limits, step, cost)) is not None:
        return settled  # nothing the admission did not check: settle only
    meters = limits.meters.get(step.persona, limits.meters[None])
    tokens = step.input_tokens + step.output_tokens
    if step.final:
        run.settles = True
        run.charges = charges_for(run, meters, tokens, cost, False)
    reserved = {(c.scope, c.persona, c.dimension): c.amount for c in step.reserved} if step.reserved else None
    if deviation is not None:
        # measured, not believed: the record says the governor's count was charged; a report
        # below the count acts at R3 (§7), a missing one is recorded only (it is charged the count)
        enforce = limits.enforce_anomaly and deviation["kind"] == "usage_below_count"
        if (d := run.fire(ON_ANOMALY, {"deviations": [deviation]}, enforce)) is not None:
            return d
    d, warnings = budget_check(run, meters, tokens, cost, reserved, step.model)
    if d is not None:
        return d
    if (limits.triggers or limits.baseline is not None) and (d := cost_checks(run, projected_session_cost(run, cost, reserved))) is not None:
        return d
    return run.finish(warnings=tuple(warnings))
