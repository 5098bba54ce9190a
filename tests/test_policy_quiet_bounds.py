"""quiet_model_call_bounds (governor.policy.quiet_bounds: what a shared session's one-round-trip
admission sends the store) agrees with quiet_model_call for every counters and state drawn at
the edges of what the decision checks: the bounds hold exactly when quiet_model_call permits,
and then its permit and next state are the ones given."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from governor.policy import quiet_charges, quiet_model_call
from governor.policy.checks import live_clock_meters
from governor.policy.limits import SESSION_COST, TOKENS
from governor.policy.quiet_bounds import Bound, quiet_model_call_bounds, tightest, within
from tests.test_policy_properties import model_calls_at_the_edges


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_calls_at_the_edges())
def test_the_bounds_hold_exactly_when_the_call_is_quiet(drawn):
    limits, state, step, counters, now = drawn
    quiet = quiet_model_call(limits, state, step, counters, now)
    bounded = quiet_model_call_bounds(limits, state, step, now)
    event(f"quiet: {quiet is not None}, bounded: {bounded is not None}")
    if bounded is None:
        assert quiet is None
        return
    bounds, decision, next_state = bounded
    assert within(bounds, counters) == (quiet is not None)
    if quiet is not None:
        assert quiet == (decision, next_state.evolve(counters=counters))
    keys = set(limits.counter_keys(step))
    assert all(bound.key in keys for bound in bounds)  # the store reads each in the step's snapshot


_KEYS = [("per_session", None, "tokens"), ("per_day", None, "tokens"), ("per_session", None, "cost_usd")]
_EDGES = st.sampled_from([0.0, 1.0, 99.5, 100.0, 100.5, 1e12, float("inf"), float("nan"), -1.0, 5e-324])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.builds(Bound, st.sampled_from(_KEYS), _EDGES, _EDGES, st.booleans()), max_size=12),
       st.dictionaries(st.sampled_from(_KEYS), _EDGES))
def test_the_tightest_bounds_hold_exactly_when_all_the_bounds_do(bounds, counters):
    """`tightest` (what the store's script is sent: one bound per counter and addend) holds
    exactly when every bound it merged does, for any limits and counters, NaN and infinities
    included; it never sends more bounds than it was given."""
    merged = tightest(list(bounds))
    assert within(merged, counters) == within(tuple(bounds), counters)
    assert len(merged) <= len(bounds) and set(merged) <= set(bounds)


def _bounds_one_by_one(limits, state, step, now):
    """Every bound quiet_model_call_bounds' checks give, in their order, unmerged (how it built
    them before merging as it goes): `tightest` of these is what it must give."""
    bounds, warned = [], state.warned
    if limits.clock_checked:
        elapsed_since = max(0.0, now - (state.wall_clock_at if state.wall_clock_at is not None else state.started_at))
        for m in live_clock_meters(limits, state):
            if m.cap is not None:
                bounds.append(Bound(m.key, elapsed_since, m.cap, False))
                if m.warn_at is not None and (m.dimension, m.scope) not in warned:
                    bounds.append(Bound(m.key, elapsed_since, m.warn_at, True))
    tokens = step.expected_input_tokens + step.expected_output_tokens
    cost = limits.pricing.cost(step.model, step.expected_input_tokens, step.expected_output_tokens, 0, step.units)
    for m in limits.meters[None]:
        if m.cap is not None:
            amount = tokens if m.dimension == TOKENS else cost
            if amount > 0.0:
                bounds.append(Bound(m.key, amount, m.cap, False))
            if m.warn_at is not None and (m.dimension, m.scope) not in warned:
                bounds.append(Bound(m.key, amount, m.warn_at, True))
    for trigger in limits.triggers:
        if (trigger.session_level and trigger.cost_usd_over is not None
                and trigger.name not in state.released_triggers):
            bounds.append(Bound(SESSION_COST, cost or 0.0, trigger.cost_usd_over, False))
    baseline = limits.baseline
    if baseline is not None and baseline.cost_max is not None and "cost_above_max" not in state.deviations:
        bounds.append(Bound(SESSION_COST, cost or 0.0, baseline.cost_max, False))
    return bounds


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_calls_at_the_edges())
def test_the_bounds_merged_as_they_are_found_are_the_tightest_of_all_of_them(drawn):
    """quiet_model_call_bounds merges its bounds as it finds them: the same bounds, in the same
    order, as `tightest` of all of them (what the store's script is sent does not change), and
    the same permit as quiet_charges gives."""
    limits, state, step, _counters, now = drawn
    bounded = quiet_model_call_bounds(limits, state, step, now)
    assume(bounded is not None)  # (no bounds to compare: hypothesis draws others instead)
    bounds, decision, _next_state = bounded
    assert bounds == tightest(_bounds_one_by_one(limits, state, step, now))
    assert all(type(bound) is Bound for bound in bounds)
    assert decision.charges == quiet_charges(limits, state, step, now)
