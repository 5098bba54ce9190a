"""quiet_model_call_bounds (governor.policy.quiet_bounds: what a shared session's one-round-trip
admission sends the store) agrees with quiet_model_call for every counters and state drawn at
the edges of what the decision checks: the bounds hold exactly when quiet_model_call permits,
and then its permit and next state are the ones given."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from governor.policy import quiet_model_call
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
