"""The decision point's side of measured usage (issue #29 item 5): a final usage report whose
output was raised to the governor's count, or that carried no usage, is never settled quietly;
it records an on_anomaly deviation saying which figure was charged; an under-report beyond the
tolerance acts at R3 (observed only below), a missing usage is recorded and never enforced;
honest reports (the count within the tolerance, or not measured) settle as before."""

from __future__ import annotations

import pytest

from governor.policy import Action, ModelCall, Tier, UsageReport
from governor.policy.anomaly import USAGE_TOLERANCE_RATIO, USAGE_TOLERANCE_TOKENS, usage_unbelieved
from governor.policy.quiet import settlement
from tests.test_policy_support import Driver, budget, passport

TOKENS_S = ("per_session", None, "tokens")


def deviations(decision) -> list[dict]:
    return [d for event in decision.events if event["cause"] == "on_anomaly" for d in event["detail"]["deviations"]]


def measured(reserved, reported: int | None, counted: int, input_tokens: int = 100) -> UsageReport:
    output = counted if reported is None else max(reported, counted)
    return UsageReport("gpt-4o", input_tokens, output, reserved=reserved,
                       reported_output_tokens=reported, counted_output_tokens=counted)


@pytest.mark.parametrize("tier", [Tier.R2, Tier.R3])
def test_an_honest_measured_report_settles_quietly(tier):
    driver = Driver(passport(**budget(tokens={"per_session": 10_000})), tier=tier)
    admitted = driver.run(ModelCall("gpt-4o", 100, 500))
    report = measured(admitted.charges, reported=300, counted=200)
    assert not usage_unbelieved(report)
    assert settlement(driver.limits, driver.state, report) is not None  # the quiet path takes it
    decision = driver.run(report)
    assert decision.action is Action.PERMIT and not decision.events
    assert driver.counters[TOKENS_S] == 400


def test_the_tolerance_is_the_larger_of_its_tokens_and_its_ratio():
    small = measured((), reported=10, counted=10 + USAGE_TOLERANCE_TOKENS)
    assert not usage_unbelieved(small)
    assert usage_unbelieved(measured((), reported=10, counted=11 + USAGE_TOLERANCE_TOKENS))
    big = 10_000
    slack = int(big * USAGE_TOLERANCE_RATIO)
    assert not usage_unbelieved(measured((), reported=big, counted=big + slack))
    assert usage_unbelieved(measured((), reported=big, counted=big + slack + 1))
    # not measured (MCP, embeddings' old path, a running figure): never an anomaly
    assert not usage_unbelieved(UsageReport("gpt-4o", 1, 2))
    assert not usage_unbelieved(UsageReport("gpt-4o", 1, 2, final=False, counted_output_tokens=99))


def test_an_under_report_is_charged_the_count_and_acts_at_r3():
    driver = Driver(passport(**budget(tokens={"per_session": 10_000})), tier=Tier.R3)
    admitted = driver.run(ModelCall("gpt-4o", 100, 500))
    report = measured(admitted.charges, reported=2, counted=400)
    assert settlement(driver.limits, driver.state, report) is None  # never the quiet path
    decision = driver.run(report)
    [deviation] = deviations(decision)
    assert deviation["kind"] == "usage_below_count" and deviation["charged"] == "governor_count"
    assert (deviation["reported_output_tokens"], deviation["counted_output_tokens"],
            deviation["charged_output_tokens"]) == (2, 400, 400)
    assert decision.enforced and decision.blocks  # on_anomaly's response (fail closed here), enforced
    assert decision.settles and driver.counters[TOKENS_S] == 500  # charged all the same: it was spent


def test_an_under_report_below_r3_is_recorded_as_observed():
    driver = Driver(passport(**budget(tokens={"per_session": 10_000})), tier=Tier.R2)
    admitted = driver.run(ModelCall("gpt-4o", 100, 500))
    decision = driver.run(measured(admitted.charges, reported=2, counted=400))
    assert not decision.enforced and not decision.blocks  # what would apply, recorded; nothing done
    [event] = [e for e in decision.events if e["cause"] == "on_anomaly"]
    assert event["detail"]["observed_only"] is True
    assert driver.counters[TOKENS_S] == 500


@pytest.mark.parametrize("tier", [Tier.R2, Tier.R3])
def test_a_missing_usage_is_recorded_and_never_enforced(tier):
    driver = Driver(passport(**budget(tokens={"per_session": 10_000})), tier=tier)
    admitted = driver.run(ModelCall("gpt-4o", 100, 500))
    decision = driver.run(measured(admitted.charges, reported=None, counted=250))
    assert not decision.enforced and not decision.blocks
    [deviation] = deviations(decision)
    assert deviation["kind"] == "usage_missing" and deviation["reported_output_tokens"] is None
    assert driver.counters[TOKENS_S] == 350
