"""The statistical envelope's pure module (policy/envelope.py): Welford against a direct
computation, the rate spike, the concentration test, cold start and clock skew."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.policy.envelope import (
    EnvelopeConfig, EnvelopeState, Welford, feed, judge, recorded_deviations, deviation_of, session_key
)

CONFIG = EnvelopeConfig(window_sec=60.0, k=4.0, min_windows=5, concentration_share=0.9, concentration_min_calls=20)
values = st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=0, max_size=60)


def welford_of(xs: list[float]) -> Welford:
    w = Welford()
    for x in xs:
        w = w.add(x)
    return w


@given(values)
@settings(max_examples=300, deadline=None)
def test_welford_matches_a_direct_computation(xs: list[float]) -> None:
    w = welford_of(xs)
    assert w.n == len(xs)
    if xs:
        assert w.mean == pytest.approx(statistics.fmean(xs), rel=1e-9, abs=1e-6)
    if len(xs) > 1:
        assert w.variance == pytest.approx(statistics.variance(xs), rel=1e-7, abs=1e-3)
    else:
        assert w.variance == 0.0


@given(values, values)
@settings(max_examples=300, deadline=None)
def test_merging_two_welfords_is_the_welford_of_both(xs: list[float], ys: list[float]) -> None:
    merged = welford_of(xs).merge(welford_of(ys))
    direct = welford_of(xs + ys)
    assert merged.n == direct.n
    assert merged.mean == pytest.approx(direct.mean, rel=1e-9, abs=1e-6)
    assert merged.m2 == pytest.approx(direct.m2, rel=1e-7, abs=1e-2)


def run_windows(per_window: list[dict[str, float]], tools: list[dict[str, int]] | None = None,
                config: EnvelopeConfig = CONFIG) -> tuple[EnvelopeState, list[list[dict]]]:
    """Feed one count set per window, then one step of the next window; the verdicts per close."""
    state = EnvelopeState()
    verdicts = []
    for i, counts in enumerate(per_window + [{}]):
        calls = tools[i] if tools and i < len(tools) else {}
        state, closed = feed(config, state, i * config.window_sec + 1.0, counts, calls)
        if closed is not None:
            verdicts.append(judge(config, closed))
    return state, verdicts


def test_calm_windows_then_a_burst_is_a_rate_spike_with_its_statistic_window_and_baseline() -> None:
    calm = [{"requests": 10 + (i % 3)} for i in range(8)]
    state, verdicts = run_windows(calm + [{"requests": 60}])
    assert all(v == [] for v in verdicts[:-1])
    [spike] = verdicts[-1]
    assert spike["kind"] == "envelope_rate_spike" and spike["metric"] == "requests"
    assert spike["observed"] == 60 and spike["window"]["index"] == 8 and spike["window"]["window_sec"] == 60.0
    baseline = statistics.fmean(c["requests"] for c in calm)
    assert spike["baseline"]["windows"] == 8 and spike["baseline"]["mean"] == pytest.approx(baseline)
    assert spike["baseline"]["sd"] == pytest.approx(statistics.stdev(c["requests"] for c in calm))
    assert spike["statistic"] > spike["k"] == 4.0 and spike["bound"] < 60
    assert state.closed_windows == 9  # the deviant window is folded in too


def test_a_window_within_k_sd_is_not_a_spike_and_the_sd_floor_spares_a_regular_agent() -> None:
    _, verdicts = run_windows([{"requests": 10}] * 8 + [{"requests": 14}])  # sd 0: floored at 1 request
    assert verdicts[-1] == []
    _, verdicts = run_windows([{"requests": 10}] * 8 + [{"requests": 15}])
    assert [d["metric"] for d in verdicts[-1]] == ["requests"]


def test_cold_start_gives_no_verdict_before_min_windows() -> None:
    _, verdicts = run_windows([{"requests": 5}] * 4 + [{"requests": 500}])
    assert verdicts[-1] == []  # only 4 windows closed before it: no verdict
    _, verdicts = run_windows([{"requests": 5}] * 5 + [{"requests": 500}])
    assert verdicts[-1] and verdicts[-1][0]["baseline"]["windows"] == 5


def test_idle_windows_are_not_folded() -> None:
    state = EnvelopeState()
    for i in (0, 1, 50, 51):  # a long idle stretch between 1 and 50
        state, _ = feed(CONFIG, state, i * 60.0 + 5, {"requests": 3}, {})
    state, _ = feed(CONFIG, state, 52 * 60.0, {}, {})
    assert state.stats["requests"].n == 4 and state.stats["requests"].mean == 3


def test_clock_skew_never_reopens_a_closed_window() -> None:
    state, _ = feed(CONFIG, EnvelopeState(), 600.0, {"requests": 1}, {})
    state, closed = feed(CONFIG, state, 661.0, {"requests": 1}, {})  # window 11: window 10 closes
    assert closed is not None and closed.index == 10 and closed.counts == {"requests": 1}
    state, closed = feed(CONFIG, state, 30.0, {"requests": 5}, {})  # a timestamp of window 0
    assert closed is None and state.window == 11 and state.counts == {"requests": 6}
    assert state.stats["requests"].n == 1 and state.stats["requests"].mean == 1  # window 10 untouched


def test_one_tool_taking_over_a_window_is_a_concentration() -> None:
    calm_tools = [{"search": 10, "read": 10}] * 6
    burst = {"delete": 19, "read": 1}
    per_window = [{"tool_calls": 20}] * 6 + [{"tool_calls": 20}]
    _, verdicts = run_windows(per_window, calm_tools + [burst, {}])
    [found] = verdicts[-1]
    assert found["kind"] == "envelope_concentration" and found["tool"] == "delete"
    assert found["statistic"] == 0.95 and found["bound"] == 0.9 and found["calls"] == 20
    assert found["baseline"]["share"] == 0.0


def test_an_agent_that_always_uses_one_tool_is_not_concentrating() -> None:
    per_window = [{"tool_calls": 20}] * 7
    _, verdicts = run_windows(per_window, [{"search": 20}] * 7 + [{}])
    assert verdicts[-1] == []


def test_a_concentration_needs_enough_calls() -> None:
    per_window = [{"tool_calls": 20}] * 6 + [{"tool_calls": 10}]
    _, verdicts = run_windows(per_window, [{"search": 10, "read": 10}] * 6 + [{"delete": 10}, {}])
    assert verdicts[-1] == []


def test_the_sticky_deviation_names_one_session_key_per_deviation() -> None:
    _, verdicts = run_windows([{"requests": 10}] * 6 + [{"requests": 90}])
    closed_index = 6
    from governor.policy.envelope import ClosedWindow
    deviation = deviation_of("agent-x", ClosedWindow(closed_index, {}, {}, {}, {}), verdicts[-1])
    listed = recorded_deviations(deviation)
    assert listed[0]["key"] == session_key(deviation) == "envelope@agent-x@6"
    assert deviation["deviations"][0]["key"] == "envelope:rate:requests"  # the book's copy is unchanged


@pytest.mark.parametrize("bad", [dict(window_sec=0), dict(k=-1), dict(min_windows=1), dict(concentration_share=1.0)])
def test_a_bad_configuration_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        EnvelopeConfig(**bad)


def test_the_state_round_trips_through_json() -> None:
    state, _ = run_windows([{"requests": 3, "tokens": 100.5}] * 3, [{"a": 2}] * 3 + [{}])
    again = EnvelopeState.from_json(state.to_json())
    assert again == state and math.isclose(again.stats["tokens"].mean, 100.5)
