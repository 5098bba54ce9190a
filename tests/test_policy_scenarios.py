"""Whole-session scenarios: anti-swap (§1.3), governor faults, official examples, persistence."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from governor.common.canonical import digest_of
from governor.policy import (
    ON_GOVERNOR_ERROR,
    ON_SESSION_INTEGRITY,
    Action,
    ApprovalExpired,
    Delegation,
    ModelCall,
    PassportPresented,
    PersonaSpawn,
    SessionEnd,
    SessionState,
    Tick,
    Tier,
    ToolCall,
    ToolError,
    compile_limits,
)
from tests.conftest import shared_path
from tests.test_policy_support import PRICING, T0, Driver, full_passport, passport, tools, with_runtime


# --- §1.3 anti-swap ------------------------------------------------------------------


def test_s1_3_passport_swap_is_a_session_integrity_fault_that_fails_closed():
    doc = passport()
    driver = Driver(doc)
    assert driver.limits.passport_digest == digest_of(doc)
    assert driver.run(PassportPresented(digest_of(doc))).action is Action.PERMIT
    swapped = dict(doc, version="1.0.1")
    decision = driver.run(PassportPresented(digest_of(swapped)))
    assert decision.halts and decision.cause == ON_SESSION_INTEGRITY and decision.fail_closed
    assert decision.details["pinned_digest"] == digest_of(doc)
    assert decision.details["presented_digest"] == digest_of(swapped)
    assert driver.run(ModelCall("gpt-4o", 1, 1)).halts  # the new limits are never adopted


def test_non_json_document_is_refused_with_a_reason():
    import datetime

    from governor.policy import LimitsError

    with pytest.raises(LimitsError, match="not JSON"):
        compile_limits(passport(issued=datetime.datetime(2026, 1, 1)), tier=Tier.R2, pricing=PRICING)


def test_s1_3_pinned_digest_can_be_given_by_the_passport_room():
    limits = compile_limits(passport(), tier=Tier.R2, pricing=PRICING, passport_digest="pinned-elsewhere")
    assert limits.passport_digest == "pinned-elsewhere"


# --- fail closed on the governor's own faults -----------------------------------------


def test_governor_error_is_recorded_and_fails_closed():
    driver = Driver(with_runtime(passport(tools=tools("search")), tool_invocation={"loop_detection": {"window": 3}}))
    decision = driver.run(ToolCall("search", {"not json": object()}))
    assert decision.halts and decision.cause == ON_GOVERNOR_ERROR and decision.fail_closed
    assert decision.event["action"] == "halt" and "error" in decision.event["detail"]
    json.dumps(decision.event)


def test_unknown_step_type_is_a_governor_error_not_a_crash():
    decision = Driver(passport()).run("not a step")  # type: ignore[arg-type]
    assert decision.halts and decision.cause == ON_GOVERNOR_ERROR


def test_governor_error_at_r1_is_observed_only():
    decision = Driver(passport(), tier=Tier.R1).run("not a step")  # type: ignore[arg-type]
    assert not decision.blocks and decision.event["action"] == "continue"


# --- the official examples -------------------------------------------------------------


def _official(name: str) -> dict[str, Any]:
    return json.loads(shared_path("adl", "governance-examples", name).read_text())


def test_official_tier3_example_compiles_and_governs():
    document = _official("compliance-agent-tier3.json")
    driver = Driver(document, tier=Tier.R3)
    limits = driver.limits
    assert limits.confirm_tools == {"generate_risk_report"}
    assert limits.free_text_triggers and len(limits.triggers) == 1
    assert limits.response_time_sec == 30 * 60 and limits.max_duration_sec == 3600
    assert limits.summary["anomaly_baseline"] is True
    # requires_confirmation is always on
    assert driver.run(ToolCall("generate_risk_report", {"report_type": "annual"})).action is Action.PAUSE
    # scan_portfolio is declared but not in the baseline's expected tools: on_anomaly, undeclared -> halt
    anomalous = driver.run(ToolCall("scan_portfolio", {"scope": "full"}))
    assert anomalous.halts and anomalous.details["deviations"][0]["key"] == "unexpected_tool:scan_portfolio"


def test_official_tier2_example_compiles():
    limits = Driver(_official("compliance-agent.json")).limits
    assert limits.own_scopes == {"compliance:read", "compliance:write"}
    assert limits.free_text_triggers and not limits.triggers


@pytest.mark.parametrize("name", ["minimal.yaml", "production.yaml", "with-tools.yaml"])
def test_official_core_examples_compile(name):
    import yaml

    document = yaml.safe_load(shared_path("adl", "examples", name).read_text())
    limits = compile_limits(document, tier=Tier.R2, pricing=PRICING)
    assert limits.summary["tier"] == "R2"


# --- persistence ---------------------------------------------------------------------


def test_session_state_round_trips_through_json():
    driver = Driver(full_passport(), tier=Tier.R3)
    driver.counters[("per_session", None, "cost_usd")] = 1.0
    driver.run(PersonaSpawn("researcher"))
    driver.call("gpt-4o", 100, 100, persona="researcher")
    driver.run(ToolCall("search", {"q": "x"}, data_classes=("pii",)))
    driver.run(ToolCall("send_email", {"to": "x"}))  # paused: a pending approval
    driver.run(Tick(), now=T0 + 5)
    state = driver.state
    assert state.approvals and state.personas_live and state.recent_tools and state.tool_counts
    assert state.iterations == 1 and state.wall_clock_at == T0 + 5
    restored = SessionState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state


def test_limits_summary_is_plain_json():
    summary = Driver(full_passport()).limits.summary
    assert json.loads(json.dumps(summary)) == summary
    assert summary["budget"]["tokens"] == {"per_day": 50_000_000.0, "per_session": 5_000_000.0}
    assert summary["delegation"]["deny"] == ["https://partners.example/agents/evil"]


# --- a catalogue of every event kind (for the record-schema conformance test) --------------


def every_event_scenario() -> Iterator[dict[str, Any]]:
    """Drive scenarios that fire every cause and every action, at every tier."""
    for tier in (Tier.R1, Tier.R2, Tier.R3):
        for declared in (None, "halt", "pause", "fallback", "continue"):
            degradation = {}
            if declared:
                degradation = {cause: {"action": declared, "value": {"v": 1}, "message": "m", "notify": True}
                               for cause in ("on_budget_exhausted", "on_iteration_limit", "on_sub_agent_denied",
                                             "on_delegation_denied", "on_tool_error", "on_anomaly",
                                             "on_governor_session_integrity", "on_oversight_timeout")}
            doc = with_runtime(full_passport(), degradation=degradation)
            steps = [
                ModelCall("gpt-4o", 10, 10, persona="nobody"),
                ToolCall("write_file", {}, persona="researcher"),
                PersonaSpawn("nobody"),
                Delegation("https://partners.example/agents/evil", passport(), True, 1),
                ToolError("search", "boom"),
                ToolCall("delete_everything", {}),
                PassportPresented("swapped"),
                ToolCall("send_email", {"to": "x"}),
                ModelCall("unpriced-model", 1, 1),
                "not a step",
            ]
            for step in steps:
                driver = Driver(doc, tier=tier)
                driver.counters[("per_session", None, "tokens")] = 4_999_990.0
                decision = driver.run(step)  # type: ignore[arg-type]
                yield from decision.events
                if decision.approval is not None and not decision.approval.monitor_only:
                    expired = driver.run(ApprovalExpired(decision.approval.id), now=decision.approval.expires_at + 1)
                    yield from expired.events
            driver = Driver(doc, tier=tier)
            for i in range(3):
                yield from driver.run(ToolCall("search", {"same": True})).events
            yield from Driver(doc, tier=tier).run(SessionEnd()).events


def test_catalogue_fires_every_cause():
    causes = {event["cause"] for event in every_event_scenario()}
    assert {"on_budget_exhausted", "on_iteration_limit", "on_sub_agent_denied", "on_delegation_denied",
            "on_oversight_timeout", "on_tool_error", "on_anomaly", ON_SESSION_INTEGRITY,
            "on_governor_oversight_trigger", ON_GOVERNOR_ERROR} <= causes
