"""Runtime §7: anomaly detection against the declared baseline."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from governor.policy import ON_ANOMALY, Action, ModelCall, PolicyConfig, SessionEnd, StepDone, Tier, ToolCall, UsageReport
from governor.policy.stats import EXACT_MAX_N, binomial_two_sided_p, z_score
from tests.test_policy_support import Driver, passport, tools, with_runtime


def _baseline(tier=Tier.R3, degradation=None, **baseline):
    doc = passport(
        tools=tools("search", "read_file", "write_file", "delete_file"),
        profiles=["urn:adl:profile:governance:1.0"],
        anomaly_baseline=baseline,
    )
    if degradation:
        doc = with_runtime(doc, degradation=degradation)
    return Driver(doc, tier=tier)


def _tool(driver, name, i=0, **kw):
    decision = driver.run(ToolCall(name, {"i": i}, **kw))
    driver.run(StepDone("tool"))
    return decision


def test_s7_tool_outside_expected_tools_is_material_at_once():
    driver = _baseline(expected_tools=[{"name": "search"}])
    assert _tool(driver, "search").action is Action.PERMIT
    decision = _tool(driver, "delete_file")
    assert decision.halts and decision.cause == ON_ANOMALY and decision.fail_closed
    assert decision.details["deviations"] == [{"key": "unexpected_tool:delete_file", "kind": "unexpected_tool", "tool": "delete_file"}]


def test_s7_data_class_outside_baseline_is_material():
    driver = _baseline(data_classes=["financial"])
    assert _tool(driver, "search", data_classes=("financial", "internal")).action is Action.PERMIT
    decision = _tool(driver, "search", 1, data_classes=("phi",))
    assert decision.cause == ON_ANOMALY and decision.details["deviations"][0]["data_class"] == "phi"


def test_s7_tools_declared_classification_counts_as_touched():
    doc = passport(tools=tools("read_file", read_file={"data_classification": {"sensitivity": "internal", "categories": ["pii"]}}),
                   anomaly_baseline={"data_classes": ["financial"]})
    decision = Driver(doc, tier=Tier.R3).run(ToolCall("read_file", {}))
    assert decision.details["deviations"][0]["key"] == "data_class:pii"


def test_s7_recorded_once_per_distinct_deviation():
    driver = _baseline(expected_tools=[{"name": "search"}], degradation={"on_anomaly": {"action": "continue"}})
    first = _tool(driver, "write_file")
    assert first.action is Action.CONTINUE and first.event["detail"]["overridden_cause"] == ON_ANOMALY
    assert _tool(driver, "write_file", 1).event is None  # the same deviation: not again
    other = _tool(driver, "delete_file")
    assert other.event["detail"]["deviations"][0]["tool"] == "delete_file"  # a new one is recorded
    assert driver.state.deviations == {"unexpected_tool:write_file", "unexpected_tool:delete_file"}
    assert driver.state.tool_counts == {"write_file": 2, "delete_file": 1}


def test_s7_share_deviation_needs_enough_calls_and_significance():
    driver = _baseline(
        expected_tools=[{"name": "search", "share": 0.5}, {"name": "read_file", "share": 0.5}],
        degradation={"on_anomaly": {"action": "continue"}},
    )
    # 19 calls all to search: wildly off, but below the minimum sample of 20
    for i in range(19):
        assert _tool(driver, "search", i).event is None
    decision = _tool(driver, "search", 19)  # the 20th: all 20 on a declared 0.5 share
    deviations = decision.event["detail"]["deviations"]
    assert {d["key"] for d in deviations} == {"tool_share:search", "tool_share:read_file"}
    search = next(d for d in deviations if d["tool"] == "search")
    assert search["calls"] == 20 and search["observed_share"] == 1.0
    assert search["p_value"] == pytest.approx(2 * 0.5**20)


def test_s7_share_within_chance_is_not_material():
    driver = _baseline(expected_tools=[{"name": "search", "share": 0.5}, {"name": "read_file", "share": 0.5}])
    for i in range(60):  # 36/60 = 0.6 search: p ~ 0.15, not material at 0.01
        decision = _tool(driver, "search" if i % 5 < 3 else "read_file", i)
        assert decision.event is None, decision.event
    assert not driver.state.deviations


def test_s7_zero_share_is_contradicted_by_one_call():
    driver = _baseline(expected_tools=[{"name": "search", "share": 1.0}, {"name": "read_file", "share": 0}])
    decision = _tool(driver, "read_file")
    assert {d["key"] for d in decision.details["deviations"]} == {"tool_share:search", "tool_share:read_file"}


def test_s7_cost_above_max_is_material_before_spending():
    driver = _baseline(cost_per_session_usd={"max": 1.0})
    driver.counters[("per_session", None, "cost_usd")] = 0.99
    decision = driver.run(ModelCall("gpt-4o", 10_000, 0))
    assert decision.halts and decision.details["deviations"][0]["key"] == "cost_above_max"


def test_s7_actual_usage_above_max_is_material():
    driver = _baseline(cost_per_session_usd={"max": 1.0}, degradation={"on_anomaly": {"action": "continue"}})
    admitted = driver.run(ModelCall("gpt-4o", 1000, 1000))
    usage = driver.run(UsageReport("gpt-4o", 1000, 200_000, reserved=admitted.charges))  # $2+
    assert usage.event["cause"] == ON_ANOMALY and usage.event["detail"]["deviations"][0]["observed"] > 1.0


def test_s7_cost_below_min_is_checked_at_session_end():
    driver = _baseline(cost_per_session_usd={"min": 0.5}, degradation={"on_anomaly": {"action": "continue"}})
    driver.call("gpt-4o", 100, 100)
    end = driver.run(SessionEnd())
    deviation = end.event["detail"]["deviations"][0]
    assert deviation["key"] == "cost_below_min" and deviation["at_session_end"] is True


def test_s7_resolves_on_anomaly_pause_escalates_to_oversight():
    driver = _baseline(expected_tools=[{"name": "search"}], degradation={"on_anomaly": {"action": "pause"}})
    decision = _tool(driver, "delete_file")
    assert decision.action is Action.PAUSE and decision.approval.trigger == ON_ANOMALY
    assert "unexpected_tool:delete_file" in driver.state.deviations  # recorded at the pause


@pytest.mark.parametrize("tier", [Tier.R1, Tier.R2])
def test_s7_below_r3_deviations_are_recorded_not_acted_on(tier):
    driver = _baseline(tier=tier, expected_tools=[{"name": "search"}])
    decision = _tool(driver, "delete_file")
    assert not decision.blocks and decision.event["detail"]["observed_only"] is True
    assert decision.event["detail"]["would"] == "halt"
    assert driver.state.tool_calls == 1 and not driver.state.halted


def test_s7_min_calls_is_configurable():
    doc = passport(tools=tools("search", "read_file"),
                   anomaly_baseline={"expected_tools": [{"name": "search", "share": 0.1}, {"name": "read_file"}]})
    driver = Driver(doc, tier=Tier.R3, config=PolicyConfig(anomaly_min_calls=5))
    decisions = [_tool(driver, "search", i) for i in range(5)]
    assert decisions[-1].cause == ON_ANOMALY and all(d.event is None for d in decisions[:-1])


# --- the statistics ------------------------------------------------------------------


def _exact(k: int, n: int, p: Fraction) -> float:
    pmf = [math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)]
    return float(min(1, sum(x for x in pmf if x <= pmf[k] * Fraction(10**7 + 1, 10**7))))


@pytest.mark.parametrize("k, n, p", [(3, 20, "1/2"), (7, 20, "1/2"), (0, 30, "3/10"), (12, 25, "1/5"), (40, 100, "1/2"), (1, 50, "1/10")])
def test_binomial_test_matches_exact_arithmetic(k, n, p):
    assert binomial_two_sided_p(k, n, float(Fraction(p))) == pytest.approx(_exact(k, n, Fraction(p)), rel=1e-9)


def test_binomial_known_value():
    # R: binom.test(3, 20, 0.5)$p.value == 0.002576828
    assert binomial_two_sided_p(3, 20, 0.5) == pytest.approx(0.002576828, rel=1e-6)


def test_normal_approximation_above_exact_range_is_close():
    n = EXACT_MAX_N + 100
    for k in (200, 230, 250, 270):
        approx = binomial_two_sided_p(k, n, 0.5)
        assert approx == pytest.approx(_exact(k, n, Fraction(1, 2)), abs=2e-3)


def test_the_z_screen_never_hides_a_material_deviation():
    """Wherever |z| < 2 the exact p-value is >= 0.01: skipping the exact test loses nothing."""
    for n in range(20, 201, 9):
        for share in (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.97):
            for k in range(n + 1):
                if z_score(k, n, share) < 2.0:
                    assert binomial_two_sided_p(k, n, share) >= 0.01, (k, n, share)
