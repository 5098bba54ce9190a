"""Runtime §6: resolve a fired cause to its declared response, fail closed otherwise."""

from __future__ import annotations

import json

import jsonschema
import pytest

from governor.policy.degradation import FAIL_CLOSED, DegradationError, Resolution, compile_degradation, resolve
from governor.policy import (
    ON_BUDGET_EXHAUSTED,
    ON_TOOL_ERROR,
    Action,
    LimitsError,
    ModelCall,
    Tier,
    ToolCall,
    ToolError,
    compile_limits,
)
from tests.conftest import shared_path
from tests.test_policy_support import PRICING, Driver, budget, passport, tools, with_runtime


def test_s6_fail_closed_when_undeclared():
    resolution = resolve(ON_BUDGET_EXHAUSTED, compile_degradation({}))
    assert resolution.action is Action.HALT and resolution.fail_closed and resolution.declared_by is None
    # end to end: a cap with no declared response halts the session, recorded as fail-closed
    driver = Driver(passport(**budget(tokens={"per_session": 100})))
    decision = driver.run(ModelCall("gpt-4o", 80, 80))
    assert decision.action is Action.HALT and decision.halts and decision.fail_closed
    assert decision.event == {"cause": ON_BUDGET_EXHAUSTED, "action": "halt", "detail": decision.details}
    assert decision.event["detail"]["fail_closed"] is True
    assert driver.state.halted


@pytest.mark.parametrize("action", ["halt", "pause", "fallback", "continue"])
def test_s6_declared_response_applies(action):
    declared = {"action": action, "value": {"text": "budget spent"}, "message": "over budget"}
    doc = with_runtime(passport(**budget(tokens={"per_session": 100})), degradation={"on_budget_exhausted": declared})
    decision = Driver(doc).run(ModelCall("gpt-4o", 80, 80))
    assert decision.action is Action(action)
    assert decision.event["action"] == action
    assert decision.event["detail"]["fail_closed"] is False
    assert decision.event["detail"]["declared_by"] == "runtime.degradation.on_budget_exhausted"
    if action == "fallback":
        assert decision.fallback_value == {"text": "budget spent"} and decision.fallback_message == "over budget"
        assert decision.blocks and not decision.halts
    if action == "pause":
        assert decision.approval is not None and decision.blocks
    if action == "halt":
        assert decision.halts and not decision.fail_closed


def test_s6_continue_recorded_with_overridden_cause():
    doc = with_runtime(passport(**budget(tokens={"per_session": 100})),
                       degradation={"on_budget_exhausted": {"action": "continue"}})
    driver = Driver(doc)
    decision = driver.run(ModelCall("gpt-4o", 80, 80))
    assert decision.action is Action.CONTINUE and not decision.blocks
    assert decision.event["action"] == "continue"
    assert decision.event["detail"]["overridden_cause"] == ON_BUDGET_EXHAUSTED
    # a fail-open continue must not leave caps on the reservation, or the store refuses it
    assert decision.charges and all(c.cap is None for c in decision.charges)
    assert driver.counters[("per_session", None, "tokens")] == 160


def test_s6_every_continue_is_recorded_even_several_in_one_step():
    doc = with_runtime(
        passport(tools=tools("search"), **budget(tokens={"per_session": 100})),
        degradation={"on_budget_exhausted": {"action": "continue"}, "on_iteration_limit": {"action": "continue"}},
        tool_invocation={"max_iterations": 1},
    )
    driver = Driver(doc)
    driver.call("gpt-4o", 10, 10)
    decision = driver.run(ModelCall("gpt-4o", 80, 80))
    causes = [(e["cause"], e["action"], e["detail"]["overridden_cause"]) for e in decision.events]
    assert causes == [("on_iteration_limit", "continue", "on_iteration_limit"),
                      ("on_budget_exhausted", "continue", "on_budget_exhausted")]


def test_s6_r1_records_would_apply_without_altering_execution():
    driver = Driver(passport(**budget(tokens={"per_session": 100})), tier=Tier.R1)
    decision = driver.run(ModelCall("gpt-4o", 80, 80))
    assert not decision.enforced and not decision.blocks and not decision.halts
    assert decision.action is Action.HALT  # what would have applied
    assert decision.event["action"] == "continue"
    assert decision.event["detail"] == {**decision.event["detail"], "observed_only": True, "would": "halt", "fail_closed": True}
    assert all(c.cap is None for c in decision.charges)  # R1 never lets the store refuse either
    assert not driver.state.halted


@pytest.mark.parametrize(
    "error_handling, expected",
    [
        ({"on_tool_error": "abort"}, (Action.HALT, None)),
        ({"on_tool_error": "abort", "fallback_behavior": {"action": "use_default", "default": 1}}, (Action.HALT, None)),
        ({"fallback_behavior": {"action": "return_error"}}, (Action.CONTINUE, None)),
        ({"fallback_behavior": {"action": "use_default", "default": {"rows": []}, "message": "no data"}},
         (Action.FALLBACK, {"rows": []})),
        ({"fallback_behavior": {"action": "skip"}}, (Action.FALLBACK, None)),
        ({"on_tool_error": "continue"}, (Action.CONTINUE, None)),
        ({"on_tool_error": "retry", "max_retries": 2}, (Action.CONTINUE, None)),
        ({"max_retries": 2}, (Action.HALT, None)),  # nothing about the response: fail closed
    ],
)
def test_s6_fallback_behavior_is_the_on_tool_error_cause(error_handling, expected):
    compiled = compile_degradation({"error_handling": error_handling})
    resolution = resolve(ON_TOOL_ERROR, compiled)
    assert (resolution.action, resolution.value) == expected
    decision = Driver(with_runtime(passport(tools=tools("search")), error_handling=error_handling)).run(ToolError("search", "boom"))
    assert decision.action is expected[0]
    assert decision.event["cause"] == ON_TOOL_ERROR and decision.event["detail"]["tool"] == "search"


def test_s6_degradation_on_tool_error_wins_over_error_handling():
    compiled = compile_degradation({
        "error_handling": {"on_tool_error": "abort"},
        "degradation": {"on_tool_error": {"action": "fallback", "value": "n/a"}},
    })
    assert compiled[ON_TOOL_ERROR] == Resolution(Action.FALLBACK, "n/a", None, False, False, "runtime.degradation.on_tool_error")


def test_s6_loop_on_detected_takes_precedence_via_first():
    first = Resolution(Action.PAUSE, declared_by="runtime.tool_invocation.loop_detection.on_detected")
    assert resolve("on_iteration_limit", {"on_iteration_limit": Resolution(Action.CONTINUE)}, first=first) is first
    assert resolve("on_iteration_limit", {}) is FAIL_CLOSED


@pytest.mark.parametrize(
    "runtime, message",
    [
        ({"degradation": {"on_budget_exhausted": {"action": "explode"}}}, "action must be one of"),
        ({"degradation": {"budget": {"action": "halt"}}}, "is not a cause"),
        ({"degradation": {"on_anomaly": 3}}, "expected an object"),
        ({"degradation": {"on_anomaly": {"action": "halt", "message": 5}}}, "message: must be a string"),
        ({"error_handling": {"fallback_behavior": {"action": "shrug"}}}, "return_error, use_default or skip"),
        ({"error_handling": {"on_tool_error": "panic"}}, "abort, continue or retry"),
    ],
)
def test_s6_undeclarable_response_refuses_the_passport(runtime, message):
    with pytest.raises(DegradationError, match=message):
        compile_degradation(runtime)
    with pytest.raises(LimitsError, match=message):
        compile_limits(passport(runtime=runtime), tier=Tier.R2, pricing=PRICING)


def test_s6_declared_response_for_an_unlisted_cause_applies():
    # the map is open (^on_[a-z0-9_]+$): the governor's own causes can be declared too
    doc = with_runtime(passport(), degradation={"on_governor_session_integrity": {"action": "continue"}})
    from governor.policy import PassportPresented

    decision = Driver(doc).run(PassportPresented("not-the-pinned-digest"))
    assert decision.action is Action.CONTINUE and decision.event["detail"]["overridden_cause"] == "on_governor_session_integrity"


def _record_event_schema() -> dict:
    schema = json.loads(shared_path("adl", "schemas", "schema-enforcement-record.json").read_text())
    return schema["properties"]["events"]["items"]


def test_s6_events_conform_to_the_official_record_schema():
    """Every event the PDP emits, across every cause and tier, fits an events[] item."""
    item_schema = _record_event_schema()
    from tests.test_policy_scenarios import every_event_scenario

    seen_causes, seen_actions = set(), set()
    for event in every_event_scenario():
        record_event = {"seq": 0, "at": "2026-01-01T00:00:00Z", "prev_hash": "x", **event}
        jsonschema.validate(record_event, item_schema)
        json.dumps(event, allow_nan=False)  # JSON-clean, so JCS-able
        seen_causes.add(event["cause"])
        seen_actions.add(event["action"])
    assert seen_actions == {"halt", "pause", "fallback", "continue"}
    assert {"on_budget_exhausted", "on_iteration_limit", "on_sub_agent_denied", "on_delegation_denied",
            "on_oversight_timeout", "on_tool_error", "on_anomaly", "on_governor_session_integrity",
            "on_governor_oversight_trigger", "on_governor_error"} <= seen_causes


def test_s6_after_halt_nothing_is_permitted():
    driver = Driver(with_runtime(passport(tools=tools("search")), tool_invocation={"max_iterations": 1}))
    driver.call("gpt-4o", 10, 10)
    halted = driver.run(ModelCall("gpt-4o", 10, 10))
    assert halted.halts and halted.cause == "on_iteration_limit"
    for step in (ModelCall("gpt-4o", 1, 1), ToolCall("search", {"q": "x"}), ToolError("search")):
        later = driver.run(step)
        assert later.halts and later.cause == "on_iteration_limit"
        assert later.details["halted"] is True and later.details["halt_cause"] == "on_iteration_limit"
        assert later.event is None  # the halt was recorded once, when it happened
