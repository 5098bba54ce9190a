"""R3 feeds (#32 item 1): at R3 the events of §2 (budget boundaries), §3 (loops and limits), §4
(spawns and delegations) and §5 (trigger firings) feed the anomaly substrate, each with its own
test statistic (policy/feed_rates.py), and a record at R3 says what was monitored. Pure
decision-point tests; tests/test_feeds_proxy.py drives one feed through the real proxy."""

from __future__ import annotations

import pytest

from governor.policy import ON_ANOMALY, Action, ModelCall, PersonaSpawn, PersonaExit, PolicyConfig, SessionState, Tier, ToolCall
from governor.policy.feed_rates import FEEDS, MIN_EVENTS
from governor.policy.stats import binomial_upper_p
from tests.test_policy_support import Driver, budget, passport, tools, with_runtime

CONTINUE_LOOPS = with_runtime(passport(tools=tools("search", "fetch")), tool_invocation={"loop_detection": {"window": 10}},
                              degradation={"on_iteration_limit": {"action": "continue"}})


def _anomalies(driver: Driver) -> list[dict]:
    return [d for _, _, decision in driver.log for e in decision.events if e["cause"] == ON_ANOMALY
            for d in e["detail"]["deviations"]]


def test_r3_repeated_loops_are_a_material_iteration_feed_once():
    driver = Driver(CONTINUE_LOOPS, tier=Tier.R3)
    outcomes = [driver.run(ToolCall("search", {"q": "same"})) for _ in range(6)]
    # calls 3, 4, 5 are loops (continue declared); the third loop event in 5 actions is material
    assert [o.action for o in outcomes[:4]] == [Action.PERMIT, Action.PERMIT, Action.CONTINUE, Action.CONTINUE]
    stopped = outcomes[4]
    assert stopped.halts and stopped.cause == ON_ANOMALY and stopped.fail_closed  # on_anomaly undeclared: halt
    (deviation,) = stopped.event["detail"]["deviations"]
    assert deviation["key"] == "feed:iteration" and deviation["section"] == "§3" and deviation["events"] == 3
    assert deviation["actions"] == 5 and deviation["p_value"] == binomial_upper_p(3, 5, FEEDS["iteration"][2])
    assert [e["cause"] for e in stopped.events] == ["on_iteration_limit", ON_ANOMALY]  # the loop, then the anomaly
    assert driver.state.feeds == {"iteration": 3} and "feed:iteration" in driver.state.deviations


def test_below_r3_nothing_is_fed():
    for tier in (Tier.R1, Tier.R2):
        driver = Driver(CONTINUE_LOOPS, tier=tier)
        for _ in range(8):
            driver.run(ToolCall("search", {"q": "same"}))
        assert driver.state.feeds == {} and not _anomalies(driver), tier


def test_r3_a_declared_continue_records_the_feed_deviation_and_goes_on():
    doc = with_runtime(CONTINUE_LOOPS, degradation={"on_iteration_limit": {"action": "continue"},
                                                    "on_anomaly": {"action": "continue"}})
    driver = Driver(doc, tier=Tier.R3)
    decisions = [driver.run(ToolCall("search", {"q": "same"})) for _ in range(8)]
    assert not any(d.blocks for d in decisions)
    assert [d["key"] for d in _anomalies(driver)] == ["feed:iteration"]  # recorded once per session


def test_r3_a_spawn_storm_is_a_material_agents_feed():
    doc = passport(tools=tools("search"), permissions={"sub_agents": [{"name": "helper", "max_parallel": 50}]})
    driver = Driver(doc, tier=Tier.R3)
    spawns = []
    for _ in range(4):
        spawns.append(driver.run(PersonaSpawn("helper")))
        driver.run(PersonaExit("helper"))
    # 4 spawns in 4 actions at an expected 0.25: P = 0.0039 < 0.01; at 3: 0.0156, not yet
    assert not any(s.blocks for s in spawns[:3]) and spawns[3].cause == ON_ANOMALY
    assert spawns[3].event["detail"]["deviations"][0]["key"] == "feed:agents"


def test_r3_trigger_firings_are_the_oversight_feed():
    doc = passport(tools=tools("search", "write_file"), profiles=["urn:adl:profile:governance:1.0"],
                   human_oversight={"triggers": [{"when": {"tool": "write_file"}}], "intervention_model": "monitor_only"})
    driver = Driver(doc, tier=Tier.R3)
    fired = [driver.run(ToolCall("write_file", {"i": i})) for i in range(3)]
    assert fired[2].cause == ON_ANOMALY and fired[2].event["detail"]["deviations"][0]["feed"] == "oversight"
    assert driver.state.feeds["oversight"] == MIN_EVENTS


def test_r3_a_cost_boundary_beyond_the_declared_baseline_is_material_at_once():
    doc = with_runtime(passport(tools=tools("search"), profiles=["urn:adl:profile:governance:1.0"],
                                anomaly_baseline={"cost_per_session_usd": {"max": 0.01}},
                                **budget(cost_usd={"per_session": 1.0})),
                       degradation={"on_anomaly": {"action": "continue"}})
    driver = Driver(doc, tier=Tier.R3, config=PolicyConfig(warn_fraction=0.5))
    driver.run(ModelCall("gpt-4o", 100_000, 10_000))  # $0.35 projected: over the baseline, under the warning
    warned = driver.run(ModelCall("gpt-4o", 100_000, 10_000))  # $0.70: the cost warning at 50 %
    keys = [d["key"] for e in warned.events if e["cause"] == ON_ANOMALY for d in e["detail"]["deviations"]]
    assert "feed:budget:beyond_baseline" in keys
    beyond = next(d for e in warned.events if e["cause"] == ON_ANOMALY for d in e["detail"]["deviations"]
                  if d["key"] == "feed:budget:beyond_baseline")
    assert beyond["baseline"] == "cost_per_session_usd.max" and beyond["limit"] == 0.01 and beyond["observed"] > 0.01


def test_the_r3_record_lists_what_was_monitored():
    r3 = Driver(CONTINUE_LOOPS, tier=Tier.R3).limits.summary["anomaly_monitoring"]
    assert set(r3["feeds"]) == {"budget", "iteration", "agents", "oversight"}
    assert [r3["feeds"][f]["section"] for f in ("budget", "iteration", "agents", "oversight")] == ["§2", "§3", "§4", "§5"]
    assert "anomaly_monitoring" not in Driver(CONTINUE_LOOPS, tier=Tier.R2).limits.summary


@pytest.mark.parametrize("feeds", [{}, {"iteration": 2, "agents": 7}])
def test_the_feed_counts_survive_persistence_and_an_older_state_loads(feeds):
    state = SessionState.start("s", 1.0).evolve(feeds=feeds)
    assert SessionState.from_dict(state.to_dict()).feeds == feeds
    older = state.to_dict()
    older.pop("feeds")  # persisted before the feeds existed
    assert SessionState.from_dict(older).feeds == {}


def test_hostile_a_forged_feed_count_in_persisted_state_is_refused():
    data = SessionState.start("s", 1.0).to_dict()
    data["feeds"] = {"iteration": "many"}
    with pytest.raises(ValueError):
        SessionState.from_dict(data)


def test_the_upper_tail_matches_the_exact_sum():
    import math
    for k, n, p in [(3, 5, 0.02), (4, 4, 0.25), (10, 300, 0.05), (0, 3, 0.5), (5, 3, 0.5)]:
        exact = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1)) if k <= n else 0.0
        assert binomial_upper_p(k, n, p) == pytest.approx(exact, rel=1e-9, abs=1e-15)
    assert binomial_upper_p(60, 1000, 0.05) == pytest.approx(0.0844, abs=0.01)  # the normal approximation
