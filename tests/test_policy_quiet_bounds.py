"""quiet_model_call_bounds (governor.policy.quiet_bounds: what a shared session's one-round-trip
admission sends the store) agrees with quiet_model_call for every counters and state drawn at
the edges of what the decision checks: the bounds hold exactly when quiet_model_call permits,
and then its permit and next state are the ones given."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings

from governor.policy import quiet_model_call
from governor.policy.quiet_bounds import quiet_model_call_bounds, within
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
