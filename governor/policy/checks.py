"""The checks several step kinds share: counted limits (iterations, concurrency, tool
calls), the wall clock, the §2 budget projection of tokens and cost against every
declared cap, the session-level cost triggers and the §7 cost ceiling, and the counter
charges an admitted step reserves.

Each check fires its cause through a `Run` (governor.policy.run) and returns the Decision
that stops the step, or None to go on. Separate from the step handlers (model_steps,
tool_steps, sub_agent_steps) because each of those runs a different subset of them.
"""

from __future__ import annotations

from typing import Any, Mapping

from governor.policy import anomaly
from governor.policy.limits import COST, SESSION_COST, TOKENS, WALL_CLOCK, Limits, Meter
from governor.policy.steps import (
    ON_ANOMALY, ON_BUDGET_EXHAUSTED, ON_ITERATION_LIMIT, ON_SUB_AGENT_DENIED, CounterCharge, Decision,
    UsageReport
)
from governor.policy.run import Run
from governor.policy.state import SessionState


def persona_denied(run: Run, persona_name: str, reason: str, **detail: Any) -> Decision | None:
    detail = {"persona": persona_name, "reason": reason, **detail}
    return run.fire(ON_SUB_AGENT_DENIED, detail, run.limits.enforce_hard)


def count_check(run: Run, limit_name: str, observed: int, limit: int | None) -> Decision | None:
    if limit is not None and observed + 1 > limit:
        detail = {"limit_name": limit_name, "observed": observed, "projected": observed + 1, "limit": limit}
        return run.fire(ON_ITERATION_LIMIT, detail, run.limits.enforce_hard)
    return None



def live_clock_meters(limits: Limits, state: SessionState) -> tuple[Meter, ...]:
    """The wall-clock meters a step of this session counts against: the agent's, and those of
    each persona with a live instance."""
    meters: tuple[Meter, ...] = limits.clock_meters[None]
    for name, live in state.personas_live.items():
        if live > 0:
            meters = meters + limits.clock_meters.get(name, ())
    return meters

def clock_check(run: Run, settle: bool, check: bool = True) -> tuple[Decision | None, tuple[CounterCharge, ...], list[tuple[str, str, float]]]:
    """Wall-clock: max_duration_sec and the wall_clock_sec caps, projected to `now`."""
    limits, state, now = run.limits, run.state, run.now
    if not settle and not limits.clock_checked:
        return None, (), []
    elapsed_since = max(0.0, now - (state.wall_clock_at if state.wall_clock_at is not None else state.started_at))
    meters = live_clock_meters(limits, state)
    charges: tuple[CounterCharge, ...] = ()
    if settle:  # elapsed time is consumption that happened: committed whatever is decided
        charges = tuple(CounterCharge(m.scope, WALL_CLOCK, elapsed_since, None, m.persona) for m in meters)
        run.settles, run.charges = True, charges
    warnings: list[tuple[str, str, float]] = []
    if not check or not limits.clock_checked:
        return None, charges, warnings
    enforce = limits.enforce_hard
    if limits.max_duration_sec is not None:
        duration = now - state.started_at
        if duration > limits.max_duration_sec:
            detail = {
                "dimension": WALL_CLOCK, "scope": "per_session", "limit_name": "max_duration_sec",
                "observed": duration, "limit": limits.max_duration_sec,
            }
            return run.fire(ON_BUDGET_EXHAUSTED, detail, enforce), charges, warnings
    counters = state.counters
    for m in meters:
        if m.cap is None:
            continue
        current = counters.get(m.key, 0.0)
        projected = current + elapsed_since
        if projected > m.cap:
            detail = {"dimension": WALL_CLOCK, "scope": m.scope, "observed": current, "projected": projected, "limit": m.cap}
            if m.persona is not None:
                detail["budget_share"] = m.persona
            return run.fire(ON_BUDGET_EXHAUSTED, detail, enforce), charges, warnings
        if m.warn_at is not None and projected >= m.warn_at:
            _warn(run, m, projected, warnings)
    return None, charges, warnings


def _warn(run: Run, meter: Meter, projected: float, warnings: list[tuple[str, str, float]]) -> None:
    """Once per (dimension, scope) of the parent's caps: advance() remembers it in the state."""
    if (meter.dimension, meter.scope) not in run.state.warned:
        warnings.append((meter.dimension, meter.scope, round(projected / meter.cap, 4)))  # type: ignore[operator]


def budget_check(
    run: Run, meters: tuple[Meter, ...], tokens: int, cost: float | None, reserved: Mapping[Any, float] | None, model: str,
    extra: Mapping[str, Any] | None = None,
) -> tuple[Decision | None, list[tuple[str, str, float]]]:
    """§2 projection of tokens and cost against every declared cap (`extra`: more detail for
    an exhaustion, e.g. the output fitting that could not fit the call)."""
    counters = run.state.counters
    enforce = run.limits.enforce_hard
    warnings: list[tuple[str, str, float]] = []
    for m in meters:
        cap = m.cap
        if cap is None:
            continue
        held = reserved.get(m.key, 0.0) if reserved else 0.0
        current = counters.get(m.key, 0.0) - held
        amount = tokens if m.dimension == TOKENS else cost
        if amount is None:  # unpriced model (or modality): unknown cost counts as unbounded
            detail = {"dimension": COST, "scope": m.scope, **_unpriced(run, model), "observed": current, "limit": cap}
            return run.fire(ON_BUDGET_EXHAUSTED, detail, enforce), warnings
        projected = current + amount
        # usage within its reservation was admitted already; only an overshoot is news
        if projected > cap and amount > held:
            detail = {"dimension": m.dimension, "scope": m.scope, "observed": current, "projected": projected, "limit": cap}
            if m.dimension == COST:  # the price charged names its source (genai-prices and its version, an override)
                detail["price_source"] = run.limits.pricing.source_of(model)
            if m.persona is not None:  # the persona's own budget_share, not the parent's aggregate
                detail["budget_share"] = m.persona
            if type(run.step) is UsageReport:
                detail["actual"] = True
                detail["final"] = run.step.final  # type: ignore[attr-defined]
                # the call's own figures: what it used (so far, mid-stream) and what it had reserved;
                # `observed` is then the rest of the session, `projected` the session's use with it
                detail["call_used"] = amount
                detail["call_reserved"] = held
            if extra:
                detail.update(extra)
            return run.fire(ON_BUDGET_EXHAUSTED, detail, enforce), warnings
        if m.warn_at is not None and projected >= m.warn_at:
            _warn(run, m, projected, warnings)
    if cost is None and run.limits.cost_governed:
        # cost is governed elsewhere (an oversight trigger, the anomaly cost range)
        detail = {"dimension": COST, "scope": "per_session", **_unpriced(run, model)}
        return run.fire(ON_BUDGET_EXHAUSTED, detail, enforce), warnings
    return None, warnings


def _unpriced(run: Run, model: str) -> dict[str, Any]:
    """Why a step has no cost: its model has no price (`unpriced_model`), or a unit it
    consumes (an image size, audio seconds: ModelCall.units) has none (`unpriced_unit`)."""
    unit = run.limits.pricing.unpriced_unit(model, getattr(run.step, "units", ()))
    if unit is not None:
        return {"reason": "unpriced_unit", "model": model, "unit": unit}
    return {"reason": "unpriced_model", "model": model}


def projected_session_cost(run: Run, cost: float | None, reserved: Mapping[Any, float] | None) -> float:
    held = reserved.get(SESSION_COST, 0.0) if reserved else 0.0
    return run.state.counters.get(SESSION_COST, 0.0) - held + (cost or 0.0)


def cost_checks(run: Run, session_cost: float) -> Decision | None:
    """Session-level oversight triggers (cost only) and the §7 cost ceiling."""
    limits = run.limits
    for trigger in limits.triggers:
        if (
            trigger.session_level
            and trigger.cost_usd_over is not None
            and session_cost > trigger.cost_usd_over
            and trigger.name not in run.state.released_triggers
        ):
            detail = {"cost_usd": session_cost, "cost_usd_over": trigger.cost_usd_over}
            decision = run.trigger(trigger.name, trigger.description, detail)
            if decision is not None:
                return decision
    baseline = limits.baseline
    if baseline is not None and baseline.cost_max is not None:
        deviation = anomaly.cost_deviation(baseline, run.state, session_cost, at_end=False)
        if deviation is not None:
            return run.fire(ON_ANOMALY, {"deviations": [deviation]}, limits.enforce_anomaly)
    return None


new_tuple = tuple.__new__  # CounterCharge(...) without the NamedTuple's Python-level __new__


def charges_for(run: Run, meters: tuple[Meter, ...], tokens: int, cost: float | None, capped: bool) -> tuple[CounterCharge, ...]:
    capped = capped and run.limits.enforce_hard and not run.budget_open
    out = []
    for m in meters:
        amount = tokens if m.dimension == TOKENS else cost
        if amount is not None:  # fields in CounterCharge's order: scope, dimension, amount, cap, persona
            out.append(new_tuple(CounterCharge, (m.scope, m.dimension, amount, m.cap if capped else None, m.persona)))
    return tuple(out)
