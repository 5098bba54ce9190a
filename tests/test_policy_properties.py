"""Properties of the decision point over random sessions (hypothesis).

* deterministic: the same steps at the same times give identical decisions and states;
* replayable: re-running the recorded (step, now) pairs reproduces every event, also
  when the state is persisted (to_dict/from_dict through JSON) between steps;
* charges are never negative; settled charges carry no cap; counters only go down
  by releasing a reservation;
* a halt is absorbing; R1 never blocks; every event fits the record's vocabulary.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from governor.canonical import digest_of
from governor.policy import (
    Action,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRejected,
    Decision,
    Delegation,
    ModelCall,
    PassportPresented,
    PersonaExit,
    PersonaSpawn,
    SessionEnd,
    SessionState,
    StepDone,
    Tick,
    Tier,
    ToolCall,
    ToolError,
    UsageReport,
    advance,
    decide,
    settlement,
)
from tests.test_policy_support import T0, Driver, full_passport, passport


def _document() -> dict[str, Any]:
    document = full_passport()
    limits = document["permissions"]["resource_limits"]
    limits["budget"] = {
        "tokens": {"per_session": 400_000, "per_day": 900_000},
        "cost_usd": {"per_session": 3.0, "per_day": 10.0},
        "wall_clock_sec": {"per_session": 1800},
    }
    limits["max_concurrent"] = 4
    document["runtime"]["tool_invocation"].update(max_iterations=25, max_tool_calls_per_session=30)
    document["runtime"]["degradation"] = {
        "on_budget_exhausted": {"action": "continue"},
        "on_iteration_limit": {"action": "fallback", "value": "enough"},
        "on_anomaly": {"action": "continue"},
        "on_tool_error": {"action": "continue"},
        "on_sub_agent_denied": {"action": "fallback"},
        "on_oversight_timeout": {"action": "continue"},
        "on_delegation_denied": {"action": "fallback"},
    }
    document["human_oversight"]["triggers"][1]["when"]["cost_usd_over"] = 2.0
    return document


DOCUMENT = _document()
PINNED = digest_of(DOCUMENT)
PEER = passport(id="https://partners.example/agents/helper", security={"authentication": {"scopes": ["read"]}})

personas = st.sampled_from([None, None, None, "researcher", "writer", "ghost"])
tool_names = st.sampled_from(["search", "search", "read_file", "write_file", "send_email", "unlisted"])
arguments = st.sampled_from([{}, {"q": "a"}, {"q": "a"}, {"q": "b"}, {"n": 1, "deep": {"x": [1, 2]}}])
models = st.sampled_from(["gpt-4o", "gpt-4o-mini-2024-07-18", "claude-sonnet-4-20250514", "unpriced-x"])

actions = st.one_of(
    st.builds(lambda m, i, o, p: ("model", ModelCall(m, i, o, persona=p)), models,
              st.integers(0, 120_000), st.integers(0, 30_000), personas),
    st.builds(lambda i, o, c, f: ("usage", i, o, c, f), st.integers(0, 150_000), st.integers(0, 40_000),
              st.integers(0, 50_000), st.booleans()),
    st.builds(lambda t, a, path, dc, p: ("step", ToolCall(t, a, target_path=path, data_classes=dc, persona=p)),
              tool_names, arguments, st.sampled_from([None, "/secrets/k", "/data/x"]),
              st.sampled_from([(), ("pii",), ("phi", "restricted")]), personas),
    st.builds(lambda p: ("step", PersonaSpawn(p)), st.sampled_from(["researcher", "writer", "ghost"])),
    st.builds(lambda p: ("step", PersonaExit(p)), st.sampled_from(["researcher", "writer"])),
    st.builds(lambda k: ("step", StepDone(k)), st.sampled_from(["model", "tool"])),
    st.builds(lambda peer, ok, depth: ("step", Delegation(peer, PEER if ok else None, ok, depth)),
              st.sampled_from(["https://partners.example/agents/helper", "https://partners.example/agents/evil",
                               "https://other.example/x"]), st.booleans(), st.integers(1, 3)),
    st.builds(lambda t: ("step", ToolError(t, "failed")), tool_names),
    st.just(("step", Tick())),
    st.sampled_from([("step", PassportPresented(PINNED))] * 4 + [("step", PassportPresented("swapped"))]),
    st.builds(lambda i, who: ("grant", i, who), st.integers(0, 3), st.sampled_from(["alice", "bob"])),
    st.builds(lambda i, who: ("grant", i, who), st.integers(0, 3), st.sampled_from(["alice", "bob"])),
    st.builds(lambda i: ("release", i), st.integers(0, 3)),
    st.builds(lambda i: ("reject", i), st.integers(0, 3)),
    st.builds(lambda i: ("expire", i), st.integers(0, 3)),
    st.builds(lambda i: ("release", i), st.integers(0, 3)),
)
sessions = st.lists(st.tuples(actions, st.floats(0, 90, allow_nan=False)), min_size=1, max_size=40)
tiers = st.sampled_from([Tier.R1, Tier.R2, Tier.R3])


class Recorder(Driver):
    """A driver that turns symbolic actions into concrete steps and checks invariants as it goes."""

    def __init__(self, tier: Tier):
        super().__init__(copy.deepcopy(DOCUMENT), tier=tier)
        self.last_admission: ModelCall | None = None
        self.last_charges: tuple = ()
        self.held: dict[str, Any] = {}

    def concrete(self, action: tuple) -> Any:
        kind = action[0]
        if kind in ("model", "step"):
            return action[1]
        if kind == "usage":
            _, used_in, used_out, cached, final = action
            call = self.last_admission or ModelCall("gpt-4o", 0, 0)
            return UsageReport(call.model, used_in, used_out, cached, persona=call.persona, final=final,
                               reserved=self.last_charges)
        by_status: dict[str, list[str]] = {}
        for approval in self.state.approvals.values():
            by_status.setdefault(approval.status, []).append(approval.id)
        wanted = by_status.get("granted" if kind == "release" else "pending", [])
        if not wanted:  # nothing to answer yet: ask for something that needs an answer
            return ToolCall("send_email", {"to": action[1]})
        ref = sorted(wanted)[action[1] % len(wanted)]
        if kind == "grant":
            return ApprovalGranted(ref, action[2])
        if kind == "reject":
            return ApprovalRejected(ref, "carol")
        if kind == "expire":
            return ApprovalExpired(ref)
        return replace(self.held[ref], approval_id=ref)

    def play(self, action: tuple, now: float) -> Decision:
        step = self.concrete(action)
        before = dict(self.counters)
        was_halted = self.state.halted
        halt_cause = self.state.halt_cause
        decision = self.run(step, now)
        self.check(step, decision, before, was_halted, halt_cause)
        if isinstance(step, ModelCall) and not decision.blocks:
            self.last_admission, self.last_charges = step, decision.charges
        if decision.approval is not None and not decision.approval.monitor_only:
            original = self.held.get(getattr(step, "approval_id", None) or "", step)
            self.held[decision.approval.id] = step if not isinstance(step, ApprovalExpired) else original
            if isinstance(step, ApprovalExpired):
                self.held[decision.approval.id] = self.held.get(step.approval_id, step)
        return decision

    def check(self, step, decision: Decision, before: dict, was_halted: bool, halt_cause: str | None) -> None:
        for charge in decision.charges:
            assert charge.amount >= 0
            if decision.settles:
                assert charge.cap is None
        released = {}
        if decision.settles:
            for charge in getattr(step, "reserved", ()):
                key = (charge.scope, charge.persona, charge.dimension)
                released[key] = released.get(key, 0.0) + charge.amount
        for key, value in before.items():
            assert self.counters.get(key, 0.0) >= value - released.get(key, 0.0) - 1e-9, key
        if was_halted and decision.details.get("admitted_before_halt"):
            # usage of a call admitted before the halt, within its reservation: delivered
            assert isinstance(step, UsageReport) and not decision.blocks and decision.event is None
            assert self.limits.within_reservation(step)
        elif was_halted:
            assert decision.halts and decision.cause == halt_cause and decision.event is None
        if self.limits.tier is Tier.R1 and not isinstance(step, (ApprovalGranted, ApprovalRejected, ApprovalExpired)):
            assert not decision.blocks
        for event in decision.events:
            assert re.fullmatch(r"on_[a-z0-9_]+", event["cause"])
            assert event["action"] in ("halt", "pause", "fallback", "continue")
            json.dumps(event, allow_nan=False)
        if decision.enforced and decision.action is Action.CONTINUE and decision.event is not None:
            assert any("overridden_cause" in e["detail"] for e in decision.events)


def _play(tier: Tier, session: list) -> Recorder:
    recorder = Recorder(tier)
    now = T0
    for action, dt in session:
        now += dt
        recorder.play(action, now)
    recorder.run(SessionEnd(), now + 1)
    return recorder


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiers, sessions)
def test_decisions_are_deterministic(tier, session):
    first, second = _play(tier, session), _play(tier, session)
    assert [d for _, _, d in first.log] == [d for _, _, d in second.log]
    assert first.state == second.state and first.counters == second.counters


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiers, sessions)
def test_replay_from_recorded_steps_reproduces_the_events(tier, session):
    original = _play(tier, session)
    replayed = Driver(copy.deepcopy(DOCUMENT), tier=tier)
    for step, now, _ in original.log:
        # persist and restore the state between steps, as a store would
        replayed.state = SessionState.from_dict(json.loads(json.dumps(replayed.state.to_dict())))
        replayed.run(step, now)
    assert replayed.events() == original.events()
    assert replayed.state == original.state


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiers, sessions)
def test_decide_is_pure(tier, session):
    recorder = Recorder(tier)
    now = T0
    for action, dt in session:
        now += dt
        step = recorder.concrete(action)
        state = recorder.snapshot(step)
        frozen = json.dumps(state.to_dict(), sort_keys=True)
        first = decide(recorder.limits, state, step, now)
        assert decide(recorder.limits, state, step, now) == first
        assert json.dumps(state.to_dict(), sort_keys=True) == frozen
        advance(recorder.limits, state, step, first, now)
        assert json.dumps(state.to_dict(), sort_keys=True) == frozen
        recorder.play(action, now)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiers, sessions, st.integers(0, 150_000), st.integers(0, 40_000))
def test_a_report_that_ends_its_call_is_the_report_then_step_done(tier, session, used_in, used_out):
    """UsageReport.ends_call folds the StepDone("model") that follows a final report into
    the report's own step: the same decision, counters and state (one step fewer)."""
    merged, pair = _play(tier, session), _play(tier, session)
    now = pair.log[-1][1] + 1
    call = merged.last_admission or ModelCall("gpt-4o", 0, 0)
    report = UsageReport(call.model, used_in, used_out, persona=call.persona, reserved=merged.last_charges)
    one = merged.run(replace(report, ends_call=True), now)
    two = pair.run(report, now)
    pair.run(StepDone("model"), now)
    assert one == two
    assert merged.counters == pair.counters
    # (SessionState.counters is only the last snapshot copied in before deciding, not bookkeeping)
    assert replace(merged.state, counters={}) == replace(pair.state, seq=pair.state.seq - 1, counters={})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiers, sessions, st.integers(0, 3_000), st.integers(0, 3_000), st.integers(0, 3_000), st.booleans())
def test_settlement_is_what_decide_answers_a_final_report_within_its_reservation(
        tier, session, used_in, used_out, cached, ends_call):
    """The runtime settles such a report with `settlement` alone (no full decision round):
    it must be exactly decide()'s decision, and be offered for no other report."""
    recorder = Recorder(tier)
    now = T0
    for action, dt in session:
        now += dt
        recorder.play(action, now)
    call = recorder.last_admission or ModelCall("gpt-4o", 0, 0)
    report = UsageReport(call.model, used_in, used_out, cached, persona=call.persona,
                         reserved=recorder.last_charges, ends_call=ends_call)
    state = recorder.snapshot(report)
    settled = settlement(recorder.limits, state, report)
    within = not state.halted and bool(report.reserved) and recorder.limits.within_reservation(report)
    event(f"within its reservation: {within}")
    assert (settled is not None) == within
    if settled is not None:
        assert settled == decide(recorder.limits, state, report, now + 1)
        assert settled.settles and not settled.blocks and not settled.events
    assert settlement(recorder.limits, state, replace(report, final=False)) is None
