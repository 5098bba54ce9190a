"""The per-request fast paths: `quiet_model_call` (decide() and advance() for the usual
model call, one that fires nothing and warns of nothing) and `settlement` /
`quiet_settlement` (the usual end of a model call, within what it reserved).

This is how the runtime admits and settles most model calls, so each is one short pass
with no general `Run`. Kept apart from the general checks (governor.policy.checks),
whose order each path follows and whose results the property tests hold them equal to.
"""

from __future__ import annotations

from typing import Any, Mapping

from governor.policy.limits import SESSION_COST, TOKENS, Limits, Meter
from governor.policy.tools import step_tools
from governor.policy.state import SessionState
from governor.policy.steps import CounterCharge, Decision, ModelCall, UsageReport, permitted
from governor.policy.checks import live_clock_meters, new_tuple
from governor.policy.anomaly import usage_unbelieved


def quiet_model_call(limits: Limits, state: SessionState, step: ModelCall, counters: Mapping[Any, float],
                     now: float) -> tuple[Decision, SessionState] | None:
    """decide() and advance() for the usual model call, without the general run: one that
    fires no cause and gives no warning, so that its decision is a plain permit with its
    charges. `counters` is the store's snapshot of `limits.counter_keys(step)`.

    Returns (decide(limits, s, step, now), advance(limits, s, step, decision, now)) for
    s = state.with_counters(counters), exactly; None when that call would fire or warn, or
    is not the usual one (a persona's, a released one, in a halted session, reserving
    nothing): decide() answers those. The checks are decide_model_call's, in its order; each one
    that would record something gives None instead (the property tests hold the two equal)."""
    if state.halted or step.persona is not None or step.approval_id is not None:
        return None
    if limits.max_concurrent is not None and state.in_flight + 1 > limits.max_concurrent:
        return None
    if limits.max_iterations is not None and state.iterations + 1 > limits.max_iterations:
        return None
    warned = state.warned
    if limits.clock_checked:  # clock_check(settle=False)
        elapsed_since = max(0.0, now - (state.wall_clock_at if state.wall_clock_at is not None else state.started_at))
        meters = live_clock_meters(limits, state)
        if limits.max_duration_sec is not None and now - state.started_at > limits.max_duration_sec:
            return None
        for m in meters:
            if m.cap is None:
                continue
            projected = counters.get(m.key, 0.0) + elapsed_since
            if projected > m.cap or (m.warn_at is not None and projected >= m.warn_at
                                     and (m.dimension, m.scope) not in warned):
                return None
    tokens = step.expected_input_tokens + step.expected_output_tokens
    cost = limits.pricing.cost(step.model, step.expected_input_tokens, step.expected_output_tokens, 0, step.units)
    meters = limits.meters[None]
    for m in meters:  # budget_check, with nothing reserved
        cap = m.cap
        if cap is None:
            continue
        amount = tokens if m.dimension == TOKENS else cost
        if amount is None:
            return None
        projected = counters.get(m.key, 0.0) + amount
        if (projected > cap and amount > 0.0) or (m.warn_at is not None and projected >= m.warn_at
                                                  and (m.dimension, m.scope) not in warned):
            return None
    if cost is None and limits.cost_governed:
        return None
    if limits.triggers or limits.baseline is not None:  # cost_checks
        session_cost = counters.get(SESSION_COST, 0.0) + (cost or 0.0)
        for trigger in limits.triggers:
            if (trigger.session_level and trigger.cost_usd_over is not None and session_cost > trigger.cost_usd_over
                    and trigger.name not in state.released_triggers):
                return None
        baseline = limits.baseline
        if (baseline is not None and baseline.cost_max is not None and session_cost > baseline.cost_max
                and "cost_above_max" not in state.deviations):
            return None
    charges = model_call_charges(limits, meters, tokens, cost)
    if not charges:
        return None
    decision = permitted(charges, step_tools(limits, None), (), {}, False)
    return decision, state.evolve(counters=counters, seq=state.seq + 1, iterations=state.iterations + 1,
                                  in_flight=state.in_flight + 1)


def quiet_charges(limits: Limits, state: SessionState, step: ModelCall, now: float) -> tuple[CounterCharge, ...]:
    """The charges of quiet_model_call's permit for `step`, whenever it gives one: they depend
    on the step and the limits only (not on the counters), so the runtime reserves them in
    the same store operation that reads the counters (Store.reserve_within), and releases
    them when quiet_model_call then gives None. Empty when quiet_model_call gives None
    whatever the counters (its checks that read no counter: a halted session, a persona's or
    a released call, the concurrency, iteration and duration caps), so nothing is reserved
    for a call the session's state alone refuses."""
    if state.halted or step.persona is not None or step.approval_id is not None:
        return ()
    if limits.max_concurrent is not None and state.in_flight + 1 > limits.max_concurrent:
        return ()
    if limits.max_iterations is not None and state.iterations + 1 > limits.max_iterations:
        return ()
    if limits.clock_checked and limits.max_duration_sec is not None and now - state.started_at > limits.max_duration_sec:
        return ()
    tokens = step.expected_input_tokens + step.expected_output_tokens
    cost = limits.pricing.cost(step.model, step.expected_input_tokens, step.expected_output_tokens, 0, step.units)
    return model_call_charges(limits, limits.meters[None], tokens, cost)


def model_call_charges(limits: Limits, meters: tuple[Meter, ...], tokens: int,
                       cost: float | None) -> tuple[CounterCharge, ...]:
    """quiet_charges once its checks passed, on the step's `meters`, tokens and cost (also
    quiet_model_call_bounds', which has them already)."""
    capped = limits.enforce_hard
    # a list comprehension, not a generator: inlined since Python 3.12 (no frame of its own)
    return tuple([new_tuple(CounterCharge, (m.scope, m.dimension, tokens if m.dimension == TOKENS else cost,
                                             m.cap if capped else None, m.persona))
                  for m in meters if (tokens if m.dimension == TOKENS else cost) is not None])


def settlement(limits: Limits, state: SessionState, step: UsageReport) -> Decision | None:
    """The decision for a final usage report within what its admission reserved (every
    metered amount, priced: Limits.within_reservation) in a session not halted: settle the
    actual usage and fire nothing. The admission's projection already checked every cap,
    warning level and cost trigger such usage can reach (its reservation has been in the
    counters since), so no counter is read. None for any other report.

    decide() answers such a report with this; the runtime also calls it alone, to settle a
    model call without a full decision round (LocalSteps.settle, governor.runtime.local_steps)."""
    if state.halted or not step.final or usage_unbelieved(step):  # the latter is recorded (decide_usage)
        return None
    return settle_within_reservation(limits, step, report_cost(limits, step))


def quiet_settlement(limits: Limits, state: SessionState, step: UsageReport) -> tuple[Decision, SessionState] | None:
    """settlement() with advance()'s next state for it, in one short pass: for such a report
    advance() only counts the step and, when the report ends its call, frees its slot."""
    decision = settlement(limits, state, step)
    if decision is None:
        return None
    if step.ends_call:
        return decision, state.evolve(seq=state.seq + 1, in_flight=max(0, state.in_flight - 1))
    return decision, state.evolve(seq=state.seq + 1)


def report_cost(limits: Limits, step: UsageReport) -> float | None:
    return limits.pricing.cost(step.model, step.input_tokens, step.output_tokens, step.cached_input_tokens, step.units)


def settle_within_reservation(limits: Limits, step: UsageReport, cost: float | None) -> Decision | None:
    """settlement() for a final report in a session not halted, priced at `cost`."""
    if not limits.within_reservation(step, cost):
        return None
    meters = limits.meters.get(step.persona, limits.meters[None])
    tokens = step.input_tokens + step.output_tokens
    charges = tuple([new_tuple(CounterCharge, (m.scope, m.dimension, tokens if m.dimension == TOKENS else cost, None,
                                                m.persona)) for m in meters])  # settled: no caps
    return permitted(charges, None, (), {}, True)
