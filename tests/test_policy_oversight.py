"""Runtime §5: oversight triggers, approvals, rejections and timeouts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from governor.common.canonical import digest_of
from governor.policy import (
    ON_BUDGET_EXHAUSTED,
    ON_OVERSIGHT_TIMEOUT,
    ON_OVERSIGHT_TRIGGER,
    Action,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRejected,
    LimitsError,
    ModelCall,
    SessionState,
    Tier,
    ToolCall,
    UsageReport,
    decide,
    step_digest,
)
from tests.test_policy_support import T0, Driver, passport, tools, with_runtime

CONFIRM = passport(tools=tools("search", "send_email", send_email={"requires_confirmation": True}))


def _overseen(*triggers, **oversight):
    return passport(
        tools=tools("search", "read_file", "write_file",
                    read_file={"data_classification": {"sensitivity": "confidential"}}),
        human_oversight={"triggers": list(triggers), **oversight},
    )


def test_s5_requires_confirmation_pauses_without_a_governance_profile():
    driver = Driver(CONFIRM)
    step = ToolCall("send_email", {"to": "a@example.com"})
    decision = driver.run(step)
    assert decision.action is Action.PAUSE and decision.blocks and decision.cause == ON_OVERSIGHT_TRIGGER
    request = decision.approval
    assert request.step_digest == digest_of({"tool": "send_email", "arguments": {"to": "a@example.com"}})
    assert request.trigger == "tools.send_email.requires_confirmation"
    assert request.expires_at == T0 + 15 * 60  # documented default response time
    assert decision.event["action"] == "pause" and decision.event["detail"]["approval_id"] == request.id
    assert driver.state.approvals[request.id].status == "pending"
    assert driver.state.tool_calls == 0  # held, not executed


def test_s5_requires_confirmation_gates_even_under_monitor_only():
    doc = passport(tools=CONFIRM["tools"], human_oversight={"triggers": ["x"], "intervention_model": "monitor_only"})
    assert Driver(doc).run(ToolCall("send_email", {})).action is Action.PAUSE


def test_s5_requires_confirmation_gates_at_r2():
    assert Driver(CONFIRM, tier=Tier.R2).run(ToolCall("send_email", {})).action is Action.PAUSE


def test_s5_approval_releases_only_the_named_step_once():
    driver = Driver(CONFIRM)
    step = ToolCall("send_email", {"to": "a@example.com"})
    request = driver.run(step).approval
    granted = driver.run(ApprovalGranted(request.id, "alice"), now=T0 + 60)
    assert granted.event["cause"] == ON_OVERSIGHT_TRIGGER and granted.event["detail"]["reviewer"] == "alice"
    assert granted.event["detail"]["review"] == "approved" and granted.event["action"] == "pause"
    # another step naming the approval is not released: it pauses afresh
    other = driver.run(ToolCall("send_email", {"to": "b@example.com"}, approval_id=request.id))
    assert other.action is Action.PAUSE and other.approval.id != request.id
    # the exact step is released, once
    released = driver.run(ToolCall("send_email", {"to": "a@example.com"}, approval_id=request.id))
    assert released.action is Action.PERMIT and released.details["released_by"] == request.id
    assert driver.state.approvals[request.id].status == "used"
    again = driver.run(ToolCall("send_email", {"to": "a@example.com"}, approval_id=request.id))
    assert again.action is Action.PAUSE


def test_s5_approval_ids_are_deterministic():
    driver_a, driver_b = Driver(CONFIRM), Driver(CONFIRM)
    step = ToolCall("send_email", {"to": "x"})
    assert driver_a.run(step).approval.id == driver_b.run(step).approval.id
    other_session = Driver(CONFIRM, session="another")
    assert other_session.run(step).approval.id != driver_a.log[0][2].approval.id


def test_s5_rejection_denies_the_step_and_records_the_reviewer():
    driver = Driver(CONFIRM)
    request = driver.run(ToolCall("send_email", {"to": "x"})).approval
    rejected = driver.run(ApprovalRejected(request.id, "bob", "not today"))
    assert rejected.action is Action.DENY and rejected.blocks and not rejected.halts
    assert rejected.event["action"] == "fallback"  # the record has no "deny": the step is replaced
    assert rejected.event["detail"] == {**rejected.event["detail"], "review": "rejected", "reviewer": "bob", "reason": "not today"}
    assert driver.state.approvals[request.id].status == "rejected"
    assert not driver.state.halted
    assert driver.run(ToolCall("send_email", {"to": "x"}, approval_id=request.id)).action is Action.PAUSE


def test_s5_timeout_resolves_on_oversight_timeout_halt_by_default():
    driver = Driver(CONFIRM)
    request = driver.run(ToolCall("send_email", {})).approval
    expired = driver.run(ApprovalExpired(request.id), now=request.expires_at + 1)
    assert expired.halts and expired.cause == ON_OVERSIGHT_TIMEOUT and expired.fail_closed
    assert expired.event["detail"]["review"] == "expired"
    assert driver.state.halted and driver.state.approvals[request.id].status == "expired"


def test_s5_timeout_declared_continue_never_runs_the_held_step():
    doc = with_runtime(CONFIRM, degradation={"on_oversight_timeout": {"action": "continue"}})
    driver = Driver(doc)
    request = driver.run(ToolCall("send_email", {})).approval
    expired = driver.run(ApprovalExpired(request.id), now=request.expires_at + 1)
    assert expired.action is Action.DENY and expired.blocks  # the held step stays refused
    assert expired.event["action"] == "continue"  # the session goes on
    assert expired.event["detail"]["overridden_cause"] == ON_OVERSIGHT_TIMEOUT
    assert not driver.state.halted
    assert driver.run(ToolCall("send_email", {}, approval_id=request.id)).action is Action.PAUSE


def test_s5_timeout_declared_pause_asks_again():
    doc = with_runtime(CONFIRM, degradation={"on_oversight_timeout": {"action": "pause"}})
    driver = Driver(doc)
    first = driver.run(ToolCall("send_email", {})).approval
    again = driver.run(ApprovalExpired(first.id), now=first.expires_at + 1)
    assert again.action is Action.PAUSE and again.approval.id != first.id
    assert again.approval.step_digest == first.step_digest
    assert driver.state.approvals[again.approval.id].status == "pending"


def test_s5_an_approval_after_the_deadline_is_a_timeout():
    driver = Driver(CONFIRM)
    request = driver.run(ToolCall("send_email", {})).approval
    late = driver.run(ApprovalGranted(request.id, "carol"), now=request.expires_at + 5)
    assert late.halts and late.cause == ON_OVERSIGHT_TIMEOUT
    assert late.event["detail"]["late_reviewer"] == "carol"


def test_s5_unknown_or_answered_approvals_release_nothing():
    driver = Driver(CONFIRM)
    assert driver.run(ApprovalGranted("apr_nope", "x")).action is Action.DENY
    request = driver.run(ToolCall("send_email", {})).approval
    driver.run(ApprovalGranted(request.id, "alice"))
    twice = driver.run(ApprovalRejected(request.id, "mallory"))
    assert twice.action is Action.DENY and twice.event is None
    assert driver.state.approvals[request.id].status == "granted"


def test_s5_response_time_minutes_sets_the_deadline():
    doc = passport(tools=CONFIRM["tools"], human_oversight={"triggers": ["x"], "response_time_minutes": 30})
    assert Driver(doc).run(ToolCall("send_email", {})).approval.expires_at == T0 + 1800


def test_s5_structured_trigger_fires_only_when_all_predicates_hold():
    doc = _overseen({"description": "writes under /etc", "when": {"tool": "write_file", "path_matches": "/etc/**"}})
    driver = Driver(doc)
    assert driver.run(ToolCall("write_file", {}, target_path="/tmp/x")).action is Action.PERMIT
    assert driver.run(ToolCall("read_file", {}, target_path="/etc/passwd")).action is Action.PERMIT
    fired = driver.run(ToolCall("write_file", {"p": 1}, target_path="/etc/hosts"))
    assert fired.action is Action.PAUSE and fired.approval.reason == "writes under /etc"
    assert fired.event["detail"]["trigger"] == "human_oversight.triggers[0]"


def test_s5_path_matches_uses_path_patterns_and_normalises():
    driver = Driver(_overseen({"when": {"path_matches": "/secrets/*"}}))
    assert driver.run(ToolCall("read_file", {}, target_path="/secrets/a/b")).action is Action.PERMIT  # * stops at /
    assert driver.run(ToolCall("read_file", {}, target_path="/data/../secrets/key")).action is Action.PAUSE
    assert driver.run(ToolCall("read_file", {"n": 2})).action is Action.PERMIT  # no path: predicate false


def test_s5_data_classification_at_least():
    driver = Driver(_overseen({"when": {"data_classification_at_least": "confidential"}}))
    assert driver.run(ToolCall("search", {}, sensitivity="internal")).action is Action.PERMIT
    assert driver.run(ToolCall("search", {"q": 1}, sensitivity="restricted")).action is Action.PAUSE
    assert driver.run(ToolCall("search", {"q": 2}, data_classes=("pii", "confidential"))).action is Action.PAUSE
    # the tool's own declared classification counts
    assert driver.run(ToolCall("read_file", {})).action is Action.PAUSE


def test_s5_unknown_step_classification_is_the_agents_own():
    doc = _overseen({"when": {"data_classification_at_least": "internal"}})  # the agent is "internal"
    assert Driver(doc).run(ToolCall("search", {})).action is Action.PAUSE


def test_s5_cost_usd_over_against_the_session_cost_counter():
    driver = Driver(_overseen({"description": "spend", "when": {"cost_usd_over": 1.0}}))
    driver.counters[("per_session", None, "cost_usd")] = 0.99
    assert driver.run(ToolCall("search", {})).action is Action.PERMIT
    # a model call is judged on its projected cost
    decision = driver.run(ModelCall("gpt-4o", 10_000, 0))  # +$0.025
    assert decision.action is Action.PAUSE and decision.event["detail"]["cost_usd"] == pytest.approx(1.015)


def test_s5_session_level_trigger_stays_released_once_approved():
    driver = Driver(_overseen({"when": {"cost_usd_over": 1.0}}))
    driver.counters[("per_session", None, "cost_usd")] = 2.0
    request = driver.run(ToolCall("search", {})).approval
    driver.run(ApprovalGranted(request.id, "alice"))
    assert driver.run(ToolCall("search", {}, approval_id=request.id)).action is Action.PERMIT
    assert driver.run(ToolCall("search", {"q": "later"})).action is Action.PERMIT  # no reviewer spam
    assert "human_oversight.triggers[0]" in driver.state.released_triggers


def test_s5_monitor_only_records_without_gating():
    doc = _overseen({"when": {"tool": "write_file"}}, intervention_model="monitor_only")
    driver = Driver(doc)
    decision = driver.run(ToolCall("write_file", {}))
    assert decision.action is Action.CONTINUE and not decision.blocks
    assert decision.event["cause"] == ON_OVERSIGHT_TRIGGER and decision.event["detail"]["monitor_only"] is True
    assert decision.approval is not None and decision.approval.monitor_only
    assert driver.state.tool_calls == 1 and not driver.state.approvals


def test_s5_r1_records_trigger_evaluations_without_pausing():
    driver = Driver(_overseen({"when": {"tool": "write_file"}}), tier=Tier.R1)
    decision = driver.run(ToolCall("write_file", {}))
    assert not decision.blocks and decision.approval is None
    assert decision.event["detail"]["would"] == "pause" and decision.event["detail"]["observed_only"]


def test_s5_r1_holds_a_requires_confirmation_tool_for_a_human():
    # §5: "MUST NOT invoke it autonomously, regardless": Core's always-on trigger binds R1 too
    driver = Driver(CONFIRM, tier=Tier.R1)
    step = ToolCall("send_email", {"to": "a@example.com"})
    paused = driver.run(step)
    assert paused.action is Action.PAUSE and paused.blocks and paused.cause == ON_OVERSIGHT_TRIGGER
    assert paused.event["action"] == "pause" and "observed_only" not in paused.event["detail"]
    driver.run(ApprovalGranted(paused.approval.id, "alice"))
    assert driver.run(replace(step, approval_id=paused.approval.id)).action is Action.PERMIT
    # everything else stays observed at R1: a second confirmation, unanswered, is not run, and
    # the timeout's halt is recorded as what R2 would do, the session going on
    second = driver.run(ToolCall("send_email", {"to": "b@example.com"}))
    expired = driver.run(ApprovalExpired(second.approval.id), now=second.approval.expires_at + 1)
    assert expired.action is Action.DENY and expired.blocks and not driver.state.halted
    assert expired.event["action"] == "continue" and expired.event["detail"]["would"] == "halt"
    assert expired.event["detail"]["held_step"] == "not_executed" and expired.event["detail"]["observed_only"]


def test_s5_r1_a_monitor_only_trigger_is_still_observed_but_confirmation_holds():
    doc = _overseen({"when": {"tool": "write_file"}}, intervention_model="monitor_only")
    doc["tools"].append({"name": "send_email", "description": "d", "requires_confirmation": True})
    driver = Driver(doc, tier=Tier.R1)
    assert not driver.run(ToolCall("write_file", {})).blocks
    assert driver.run(ToolCall("send_email", {})).action is Action.PAUSE


def test_s5_free_text_triggers_are_listed_never_fired():
    doc = _overseen("the agent seems confused", {"when": {"tool": "write_file"}})
    driver = Driver(doc)
    assert driver.limits.summary["oversight"]["free_text_triggers"] == {"count": 1, "evaluated": False}
    assert driver.run(ToolCall("search", {})).action is Action.PERMIT


def test_s5_pause_from_a_degradation_is_released_by_approval():
    doc = with_runtime(passport(**{"permissions": {"resource_limits": {"budget": {"tokens": {"per_session": 100}}}}}),
                       degradation={"on_budget_exhausted": {"action": "pause"}})
    driver = Driver(doc)
    step = ModelCall("gpt-4o", 80, 80)
    paused = driver.run(step)
    assert paused.action is Action.PAUSE and paused.approval.step_digest == step_digest(step)
    driver.run(ApprovalGranted(paused.approval.id, "alice"))
    released = driver.run(ModelCall("gpt-4o", 80, 80, approval_id=paused.approval.id))
    assert released.action is Action.PERMIT
    assert all(c.cap is None for c in released.charges)  # the human released it past the cap
    # its usage, within what the released admission reserved, is not paused again...
    usage = driver.run(UsageReport("gpt-4o", 80, 80, reserved=released.charges))
    assert usage.action is Action.PERMIT and usage.settles
    assert driver.counters[("per_session", None, "tokens")] == 160
    # ...but the next step meets the cap again
    assert driver.run(ModelCall("gpt-4o", 1, 1)).cause == ON_BUDGET_EXHAUSTED


@pytest.mark.parametrize(
    "trigger, message",
    [
        ({"when": {}}, "at least one predicate"),
        ({"when": {"tool_name": "x"}}, "unknown predicate"),
        ({"when": {"data_classification_at_least": "secret"}}, "unknown level"),
        ({"when": {"path_matches": "/a**"}}, "whole segment"),
        ({"when": {"cost_usd_over": -1}}, "positive number"),
    ],
)
def test_s5_unevaluable_trigger_refuses_the_passport(trigger, message):
    with pytest.raises(LimitsError, match=message):
        Driver(_overseen(trigger))


def test_s5_decide_does_not_mutate_the_state():
    driver = Driver(CONFIRM)
    state = SessionState.start("s", T0)
    before = state.to_dict()
    decide(driver.limits, state, ToolCall("send_email", {}), T0)
    assert state.to_dict() == before


def test_s5_a_step_held_twice_is_not_asked_about_a_cause_already_approved():
    # confirmation, then (R3) an anomaly: two reviews of the same step, never the first one again
    from dataclasses import replace as _replace

    from governor.policy import ApprovalGranted, Tier, ToolCall
    from tests.test_policy_support import Driver, passport, tools

    document = passport(tools=tools("send_email", send_email={"requires_confirmation": True}),
                        anomaly_baseline={"expected_tools": [{"name": "search", "share": 1.0}]})
    document["runtime"] = {"degradation": {"on_anomaly": {"action": "pause"}}}
    driver = Driver(document, tier=Tier.R3)
    step = ToolCall(tool="send_email", arguments={"to": "a"})
    causes = []
    for _ in range(4):
        decision = driver.run(step)
        if decision.approval is None:
            break
        causes.append(decision.cause)
        driver.run(ApprovalGranted(decision.approval.id, "lead"))
        step = _replace(step, approval_id=decision.approval.id)
    assert causes == ["on_governor_oversight_trigger", "on_anomaly"] and not decision.blocks
    # both grants are used up: the same step again is reviewed afresh
    assert driver.run(_replace(step, approval_id=None)).cause == "on_governor_oversight_trigger"
