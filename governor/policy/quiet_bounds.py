"""`quiet_model_call`, split for a store that checks the counters itself: what the usual
model call's quiet permit needs of the counters, as bounds, with the permit and the next
state it gives when they hold. Sessions shared by replicas are admitted this way
(governor.runtime.shared_fast): the replica decides on the state it last saw, and one store
script checks these bounds against the counters as they stand, reserves, and saves the
state, atomically.

Each bound is (counter key, addend, limit, strict): it holds when counter + addend <= limit
(< limit when strict), in IEEE doubles, as quiet_model_call computes it. For any counters,
quiet_model_call(limits, state, step, counters, now) is the permit and the state given here
(with `counters` as the state's snapshot) exactly when every bound holds, and None otherwise
(tests/test_policy_quiet_bounds.py holds the two equal)."""

from __future__ import annotations

from typing import Any, NamedTuple

from governor.policy.limits import SESSION_COST, TOKENS, Limits
from governor.policy.checks import live_clock_meters, new_tuple
from governor.policy.quiet import model_call_charges
from governor.policy.state import SessionState
from governor.policy.steps import CounterKey, Decision, ModelCall, permitted
from governor.policy.tools import step_tools


class Bound(NamedTuple):
    key: CounterKey
    addend: float
    limit: float
    strict: bool


def quiet_model_call_bounds(limits: Limits, state: SessionState, step: ModelCall,
                            now: float) -> tuple[tuple[Bound, ...], Decision, SessionState] | None:
    """(bounds, the permit, the next state but its counters) of quiet_model_call for `step`;
    None when it gives None whatever the counters. The next state keeps `state`'s counters
    (the caller puts the snapshot the store read in it).

    The bounds are `tightest` of those the checks give, in their order, merged as they are
    found (`keep`): this runs on every shared-session admission."""
    if state.halted or step.persona is not None or step.approval_id is not None:
        return None
    if limits.max_concurrent is not None and state.in_flight + 1 > limits.max_concurrent:
        return None
    if limits.max_iterations is not None and state.iterations + 1 > limits.max_iterations:
        return None
    kept: dict[CounterKey, tuple] = {}
    other: list[tuple] = []
    warned = state.warned
    if limits.clock_checked:
        elapsed_since = max(0.0, now - (state.wall_clock_at if state.wall_clock_at is not None else state.started_at))
        meters = live_clock_meters(limits, state)
        if limits.max_duration_sec is not None and now - state.started_at > limits.max_duration_sec:
            return None
        for m in meters:
            cap = m.cap
            if cap is None:
                continue
            key = m.key
            if key in kept:
                keep(kept, other, key, elapsed_since, cap, False)
            else:  # keep()'s first case (a counter not bounded yet), without the call
                kept[key] = (key, elapsed_since, cap, False)
            if m.warn_at is not None and (m.dimension, m.scope) not in warned:
                keep(kept, other, key, elapsed_since, m.warn_at, True)
    tokens = step.expected_input_tokens + step.expected_output_tokens
    cost = limits.pricing.cost(step.model, step.expected_input_tokens, step.expected_output_tokens, 0, step.units)
    meters = limits.meters[None]
    for m in meters:
        if m.cap is None:
            continue
        amount: Any = tokens if m.dimension == TOKENS else cost
        if amount is None:
            return None
        key = m.key
        if amount > 0.0:
            if key in kept:
                keep(kept, other, key, amount, m.cap, False)
            else:
                kept[key] = (key, amount, m.cap, False)
        if m.warn_at is not None and (m.dimension, m.scope) not in warned:
            keep(kept, other, key, amount, m.warn_at, True)
    if cost is None and limits.cost_governed:
        return None
    if limits.triggers or limits.baseline is not None:
        added = cost or 0.0
        for trigger in limits.triggers:
            if (trigger.session_level and trigger.cost_usd_over is not None
                    and trigger.name not in state.released_triggers):
                keep(kept, other, SESSION_COST, added, trigger.cost_usd_over, False)
        baseline = limits.baseline
        if baseline is not None and baseline.cost_max is not None and "cost_above_max" not in state.deviations:
            keep(kept, other, SESSION_COST, added, baseline.cost_max, False)
    # quiet_charges, whose checks were all made above, on the tokens and cost found above
    charges = model_call_charges(limits, meters, tokens, cost)
    if not charges:
        return None
    decision = permitted(charges, step_tools(limits, None), (), {}, False)
    # Bound(...) without the NamedTuple's Python-level __new__
    bounds = tuple([new_tuple(Bound, bound) for bound in kept.values()])
    if other:
        bounds += tuple([new_tuple(Bound, bound) for bound in other])
    return bounds, decision, state.evolve(seq=state.seq + 1, iterations=state.iterations + 1,
                                          in_flight=state.in_flight + 1)


def keep(kept: dict[CounterKey, tuple], other: list[tuple], key: CounterKey, addend: float, limit: float,
         strict: bool) -> None:
    """Adds the bound (key, addend, limit, strict) to `kept` (the tightest one per counter so
    far) or, when it cannot be merged with the one there, to `other` (`tightest`'s rule)."""
    have = kept.get(key)
    if have is None:
        kept[key] = (key, addend, limit, strict)
    elif have[1] == addend and limit == limit and have[2] == have[2]:  # (NaN != NaN)
        if limit < have[2] or (limit == have[2] and strict):
            kept[key] = (key, addend, limit, strict)
    else:
        other.append((key, addend, limit, strict))


def tightest(bounds: list[Bound]) -> tuple[Bound, ...]:
    """The bounds with those on one counter and one addend merged into the tightest of them:
    they test the same sum, so they all hold exactly when it does (the lower limit; at one
    limit, the strict one). A cap, its warning level and a cost trigger on one counter are
    then one bound: the store's script gets 4 arguments for each (the bench passport's call,
    14 bounds, became 6). A bound with another addend, or a limit that is not a number, is
    kept as it is. quiet_model_call_bounds merges by this rule (`keep`) as it goes."""
    kept: dict[CounterKey, tuple] = {}
    other: list[tuple] = []
    for key, addend, limit, strict in bounds:
        keep(kept, other, key, addend, limit, strict)
    return tuple([new_tuple(Bound, bound) for bound in (*kept.values(), *other)])


def within(bounds: tuple[Bound, ...], counters: dict[CounterKey, float]) -> bool:
    """Whether every bound holds for `counters` (what the store's script checks)."""
    for key, addend, limit, strict in bounds:
        value = counters.get(key, 0.0) + addend
        if value >= limit if strict else value > limit:
            return False
    return True


__all__ = ["Bound", "keep", "quiet_model_call_bounds", "tightest", "within"]
