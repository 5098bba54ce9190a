"""Runtime §3: iteration and tool-call limits, loop detection."""

from __future__ import annotations

from dataclasses import replace

import hashlib

import pytest

from governor.common.canonical import canonicalize
from governor.policy import (
    ApprovalGranted,
    ON_ITERATION_LIMIT,
    Action,
    ModelCall,
    PolicyConfig,
    StepDone,
    Tier,
    ToolCall,
)
from governor.policy.engine import loop_signature
from governor.policy.signature import canonical_bytes
from tests.test_policy_support import Driver, passport, tools, with_runtime


def _doc(**invocation):
    return with_runtime(passport(tools=tools("search", "fetch")), tool_invocation=invocation)


def test_s3_each_model_call_is_one_iteration_and_max_iterations_is_projected():
    driver = Driver(_doc(max_iterations=2))
    assert driver.call("gpt-4o", 1, 1)[0].action is Action.PERMIT
    assert driver.call("gpt-4o", 1, 1)[0].action is Action.PERMIT
    assert driver.state.iterations == 2
    third = driver.run(ModelCall("gpt-4o", 1, 1))
    assert third.halts and third.cause == ON_ITERATION_LIMIT
    assert third.details == {**third.details, "limit_name": "max_iterations", "observed": 2, "projected": 3, "limit": 2}


def test_s3_tool_calls_do_not_count_as_iterations():
    driver = Driver(_doc(max_iterations=1))
    for i in range(5):
        assert driver.run(ToolCall("search", {"q": i})).action is Action.PERMIT
    assert driver.state.iterations == 0 and driver.state.tool_calls == 5


def test_s3_max_tool_calls_per_session():
    driver = Driver(_doc(max_tool_calls_per_session=3))
    for i in range(3):
        driver.run(ToolCall("search", {"q": i}))
        driver.run(StepDone("tool"))
    decision = driver.run(ToolCall("search", {"q": 99}))
    assert decision.halts and decision.details["limit_name"] == "max_tool_calls_per_session"
    assert decision.details["projected"] == 4


def test_s3_hard_limit_resolves_on_iteration_limit():
    doc = with_runtime(_doc(max_tool_calls_per_session=1), degradation={"on_iteration_limit": {"action": "fallback", "value": "stop"}})
    driver = Driver(doc)
    driver.run(ToolCall("search", {}))
    decision = driver.run(ToolCall("search", {"q": 1}))
    assert decision.action is Action.FALLBACK and decision.fallback_value == "stop"
    assert driver.state.tool_calls == 1  # the substituted step did not count


def test_s3_loop_is_the_third_occurrence_within_the_window():
    driver = Driver(_doc(loop_detection={"window": 5}))
    assert driver.run(ToolCall("search", {"q": "same"})).action is Action.PERMIT
    assert driver.run(ToolCall("search", {"q": "same"})).action is Action.PERMIT  # 2nd: not yet
    decision = driver.run(ToolCall("search", {"q": "same"}))  # 3rd within 5: a loop
    assert decision.halts and decision.cause == ON_ITERATION_LIMIT and decision.fail_closed
    assert decision.details["loop"] is True and decision.details["repeats_in_window"] == 2
    assert decision.details["signature"] == loop_signature("search", {"q": "same"})


def test_s3_loop_signature_is_tool_plus_sha256_of_jcs_arguments():
    arguments = {"b": [1, 2, {"z": None, "a": True}], "a": "é\n"}
    assert canonical_bytes(arguments) == canonicalize(arguments)
    assert loop_signature("search", arguments) == "search#" + hashlib.sha256(canonicalize(arguments)).hexdigest()
    # key order does not matter (JCS), values and tool do
    assert loop_signature("search", {"a": 1, "b": 2}) == loop_signature("search", {"b": 2, "a": 1})
    assert loop_signature("search", {"a": 1}) != loop_signature("search", {"a": 2})
    assert loop_signature("search", {"a": 1}) != loop_signature("fetch", {"a": 1})
    # 1.0 and 1 are the same JSON number
    assert loop_signature("search", {"a": 1.0}) == loop_signature("search", {"a": 1})


def test_s3_equivalent_arguments_in_another_key_order_are_a_loop():
    driver = Driver(_doc(loop_detection={"window": 3}))
    driver.run(ToolCall("search", {"q": "x", "n": 1}))
    driver.run(ToolCall("search", {"n": 1, "q": "x"}))
    assert driver.run(ToolCall("search", {"q": "x", "n": 1.0})).cause == ON_ITERATION_LIMIT


def test_s3_repeats_outside_the_window_are_not_a_loop():
    driver = Driver(_doc(loop_detection={"window": 2}))
    driver.run(ToolCall("search", {"q": "same"}))
    driver.run(ToolCall("fetch", {"u": 1}))
    driver.run(ToolCall("search", {"q": "same"}))
    driver.run(ToolCall("fetch", {"u": 2}))
    # the window holds the last 2 calls: one "same" in it, so this is only the 2nd occurrence
    assert driver.run(ToolCall("search", {"q": "same"})).action is Action.PERMIT


def test_s3_window_of_two_detects_three_in_a_row():
    driver = Driver(_doc(loop_detection={"window": 2}))
    driver.run(ToolCall("search", {"q": "same"}))
    driver.run(ToolCall("search", {"q": "same"}))
    assert driver.run(ToolCall("search", {"q": "same"})).cause == ON_ITERATION_LIMIT


def test_s3_threshold_is_configurable():
    driver = Driver(_doc(loop_detection={"window": 10}), config=PolicyConfig(loop_threshold=2))
    driver.run(ToolCall("search", {"q": "same"}))
    assert driver.run(ToolCall("search", {"q": "same"})).cause == ON_ITERATION_LIMIT


def test_s3_loop_detection_resolves_on_detected_first():
    doc = with_runtime(
        _doc(loop_detection={"window": 5, "on_detected": {"action": "fallback", "value": "loop!"}}),
        degradation={"on_iteration_limit": {"action": "continue"}},
    )
    driver = Driver(doc)
    for _ in range(2):
        driver.run(ToolCall("search", {"q": "same"}))
    decision = driver.run(ToolCall("search", {"q": "same"}))
    assert decision.action is Action.FALLBACK and decision.fallback_value == "loop!"
    assert decision.event["detail"]["declared_by"] == "runtime.tool_invocation.loop_detection.on_detected"


def test_s3_loop_falls_back_to_on_iteration_limit():
    doc = with_runtime(_doc(loop_detection={"window": 5}), degradation={"on_iteration_limit": {"action": "continue"}})
    driver = Driver(doc)
    for _ in range(2):
        driver.run(ToolCall("search", {"q": "same"}))
    decision = driver.run(ToolCall("search", {"q": "same"}))
    assert decision.action is Action.CONTINUE and decision.event["detail"]["overridden_cause"] == ON_ITERATION_LIMIT
    assert decision.event["detail"]["loop"] is True


def test_s3_on_detected_accepts_a_bare_action_string():
    driver = Driver(_doc(loop_detection={"window": 5, "on_detected": "pause"}))
    for _ in range(2):
        driver.run(ToolCall("search", {"q": "same"}))
    decision = driver.run(ToolCall("search", {"q": "same"}))
    assert decision.action is Action.PAUSE and decision.approval is not None


def test_s3_hard_limit_ignores_on_detected():
    doc = _doc(max_tool_calls_per_session=1, loop_detection={"window": 5, "on_detected": {"action": "continue"}})
    driver = Driver(doc)
    driver.run(ToolCall("search", {}))
    assert driver.run(ToolCall("fetch", {})).halts


def test_s3_r1_counts_and_flags_loops_without_blocking():
    driver = Driver(_doc(loop_detection={"window": 5}, max_tool_calls_per_session=2), tier=Tier.R1)
    decisions = [driver.run(ToolCall("search", {"q": "same"})) for _ in range(4)]
    assert not any(d.blocks for d in decisions)
    assert driver.state.tool_calls == 4
    third = decisions[2].events
    assert [e["detail"].get("limit_name") or "loop" for e in third] == ["max_tool_calls_per_session", "loop"]
    assert all(e["detail"]["observed_only"] and e["action"] == "continue" for e in third)


def test_s3_non_json_arguments_fail_closed_as_a_governor_error():
    driver = Driver(_doc(loop_detection={"window": 5}))
    decision = driver.run(ToolCall("search", {"q": float("nan")}))
    assert decision.halts and decision.cause == "on_governor_error" and decision.fail_closed
    assert "ValueError" in decision.details["error"] or "Error" in decision.details["error"]


@pytest.mark.parametrize("bad", [{"window": 1}, {"window": "5"}])
def test_s3_bad_window_refuses_the_passport(bad):
    from governor.policy import LimitsError

    with pytest.raises(LimitsError, match="loop_detection.window"):
        Driver(_doc(loop_detection=bad))


def test_s3_loop_window_defaults_when_omitted():
    assert Driver(_doc(loop_detection={})).limits.loop_window == PolicyConfig().default_loop_window


# --- tool calls a model response announced (ToolCall.origin) ---------------------------


def test_s3_an_announced_tool_call_is_counted_once_when_the_agent_executes_it():
    driver = Driver(with_runtime(passport(tools=tools("search")), tool_invocation={"max_tool_calls_per_session": 2}))
    announced = driver.run(ToolCall(tool="search", arguments={"q": "a"}, origin="model"))
    assert not announced.blocks and driver.state.tool_calls == 1 and driver.state.in_flight == 0
    executed = driver.run(ToolCall(tool="search", arguments={"q": "a"}))  # the agent runs it via MCP
    assert not executed.blocks and executed.details.get("announced") is True
    assert driver.state.tool_calls == 1 and driver.state.in_flight == 1 and driver.state.announced == {}
    # a second execution of the same call is a new call: counted (2 of 2), then the cap fires
    assert not driver.run(ToolCall(tool="search", arguments={"q": "a"})).blocks
    assert driver.state.tool_calls == 2
    assert driver.run(ToolCall(tool="search", arguments={"q": "b"})).cause == ON_ITERATION_LIMIT


def test_s5_an_announced_call_approved_once_is_not_reviewed_again_when_executed():
    driver = Driver(passport(tools=tools("delete_note", delete_note={"requires_confirmation": True})))
    step = ToolCall(tool="delete_note", arguments={"path": "/n/x"}, origin="model")
    paused = driver.run(step)
    assert paused.action is Action.PAUSE
    driver.run(ApprovalGranted(paused.approval.id, "lead"))
    assert not driver.run(replace(step, approval_id=paused.approval.id)).blocks  # the model's response goes out
    executed = driver.run(ToolCall(tool="delete_note", arguments={"path": "/n/x"}))  # the agent's MCP call
    assert not executed.blocks and executed.details.get("announced") is True
    # other arguments are another call: reviewed afresh
    assert driver.run(ToolCall(tool="delete_note", arguments={"path": "/n/y"})).action is Action.PAUSE


def test_s3_announced_calls_survive_state_persistence():
    driver = Driver(passport(tools=tools("search")))
    driver.run(ToolCall(tool="search", arguments={"q": "a"}, origin="model"))
    restored = type(driver.state).from_dict(driver.state.to_dict())
    assert restored == driver.state and restored.announced
