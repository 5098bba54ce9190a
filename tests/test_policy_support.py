"""Shared helpers for the policy tests: passports as plain dicts, and a session driver.

The driver plays the runtime's part of the contract with a dict for a store: it
snapshots exactly `limits.counter_keys(step)` into the state, reserves a decision's
charges atomically against their caps (refusing like the store would), settles
usage, and advances the state. It is deliberately small; the real store and runtime
are other rooms.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

from governor.runtime.prices import price_book
from governor.policy import (
    Decision,
    ModelCall,
    PolicyConfig,
    SessionState,
    StepDone,
    Tier,
    UsageReport,
    advance,
    compile_limits,
    decide,
    load_pricing,
)

REPO = Path(__file__).resolve().parent.parent
PRICING = price_book()
T0 = 1_760_000_000.0  # a fixed "now"


def passport(**members: Any) -> dict[str, Any]:
    """A minimal valid-looking ADL passport plus the given top-level members."""
    document: dict[str, Any] = {
        "adl_spec": "0.4.0",
        "name": "Test Agent",
        "description": "An agent for tests",
        "version": "1.0.0",
        "id": "https://agents.example/agents/test",
        "data_classification": {"sensitivity": "internal"},
    }
    document.update(copy.deepcopy(members))
    return document


def tools(*names: str, **flags: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": n, "description": f"the {n} tool", **flags.get(n, {})} for n in names]


def budget(**dims: dict[str, float]) -> dict[str, Any]:
    return {"permissions": {"resource_limits": {"budget": dims}}}


def full_passport() -> dict[str, Any]:
    """Declares every member the decision point governs."""
    return passport(
        tools=tools(
            "search", "read_file", "write_file", "send_email",
            send_email={"requires_confirmation": True},
            read_file={"data_classification": {"sensitivity": "confidential", "categories": ["pii"]}},
        ),
        permissions={
            "resource_limits": {
                "max_concurrent": 8,
                "max_duration_sec": 3600,
                "budget": {
                    "tokens": {"per_session": 5_000_000, "per_day": 50_000_000},
                    "cost_usd": {"per_session": 500.0, "per_day": 5000.0},
                    "wall_clock_sec": {"per_session": 3600, "per_day": 36000},
                },
            },
            "sub_agents": [
                {"name": "researcher", "tools": ["search", "read_file"], "max_parallel": 2,
                 "budget_share": {"tokens": {"per_session": 1_000_000}, "cost_usd": {"per_session": 100.0}}},
                {"name": "writer", "max_parallel": 1},
            ],
            "delegation": {
                "match": ["https://partners.example/agents/*"],
                "deny": ["https://partners.example/agents/evil"],
                "max_depth": 2,
                "attenuation": {"scopes_subset": True, "budget_subset": True},
            },
        },
        security={"authentication": {"type": "oauth2", "scopes": ["read", "write"]}},
        runtime={
            "tool_invocation": {
                "parallel": True, "max_concurrent": 4, "max_iterations": 1_000_000,
                "max_tool_calls_per_session": 1_000_000,
                "loop_detection": {"window": 10, "on_detected": {"action": "pause"}},
            },
            "error_handling": {"on_tool_error": "continue", "fallback_behavior": {"action": "return_error"}},
            "degradation": {
                "on_budget_exhausted": {"action": "halt"},
                "on_anomaly": {"action": "pause"},
                "on_tool_error": {"action": "continue"},
            },
        },
        profiles=["urn:adl:profile:governance:1.0"],
        human_oversight={
            "level": "on_exception",
            "triggers": [
                "a free-text trigger",
                {"description": "big spend", "when": {"cost_usd_over": 400}},
                {"description": "secrets", "when": {"path_matches": "/secrets/**", "data_classification_at_least": "confidential"}},
            ],
            "response_time_minutes": 30,
            "intervention_model": "approve_reject",
        },
        anomaly_baseline={
            "expected_tools": [{"name": "search", "share": 0.5}, {"name": "read_file", "share": 0.3},
                               {"name": "write_file", "share": 0.2}, {"name": "send_email"}],
            "cost_per_session_usd": {"min": 0.0, "max": 450.0},
            "data_classes": ["pii", "financial"],
        },
    )


class StoreRefused(Exception):
    """The fake store found a cap would be exceeded (a race with another step)."""


class Driver:
    """Runs steps through decide/advance the way the runtime does."""

    def __init__(self, document: dict[str, Any], tier: Tier = Tier.R2, *, config: PolicyConfig | None = None,
                 pricing=PRICING, session: str = "sess-1", now: float = T0, counters: dict | None = None):
        self.limits = compile_limits(document, tier=tier, pricing=pricing, config=config or PolicyConfig())
        self.state = SessionState.start(session, now)
        self.now = now
        self.counters: dict = {} if counters is None else counters  # shared dict = shared store
        self.log: list[tuple[Any, float, Decision]] = []

    def snapshot(self, step) -> SessionState:
        return self.state.with_counters({k: self.counters.get(k, 0.0) for k in self.limits.counter_keys(step)})

    def decide(self, step, now: float | None = None) -> Decision:
        """Decide without applying (peek)."""
        return decide(self.limits, self.snapshot(step), step, self.now if now is None else now)

    def run(self, step, now: float | None = None) -> Decision:
        now = self.now if now is None else now
        state = self.snapshot(step)
        decision = decide(self.limits, state, step, now)
        self.apply(step, decision)
        self.state = advance(self.limits, state, step, decision, now)
        self.log.append((step, now, decision))
        return decision

    def apply(self, step, decision: Decision) -> None:
        for charge in decision.charges:
            assert charge.amount >= 0, charge
        if decision.settles:
            for charge in getattr(step, "reserved", ()):
                key = (charge.scope, charge.persona, charge.dimension)
                self.counters[key] = self.counters.get(key, 0.0) - charge.amount
            for charge in decision.charges:
                assert charge.cap is None, "settled consumption is never capped"
                key = (charge.scope, charge.persona, charge.dimension)
                self.counters[key] = self.counters.get(key, 0.0) + charge.amount
            return
        if decision.blocks:
            return
        for charge in decision.charges:
            key = (charge.scope, charge.persona, charge.dimension)
            if charge.cap is not None and self.counters.get(key, 0.0) + charge.amount > charge.cap:
                raise StoreRefused(key)
        for charge in decision.charges:
            key = (charge.scope, charge.persona, charge.dimension)
            self.counters[key] = self.counters.get(key, 0.0) + charge.amount

    def call(self, model: str, input_tokens: int, output_tokens: int, *, actual: tuple[int, int] | None = None,
             persona: str | None = None, now: float | None = None) -> tuple[Decision, Decision | None]:
        """A model call, its final usage report and its StepDone, as the runtime sends them."""
        admitted = self.run(ModelCall(model, input_tokens, output_tokens, persona=persona), now)
        if admitted.blocks:
            return admitted, None
        used_in, used_out = actual or (input_tokens, output_tokens)
        usage = self.run(UsageReport(model, used_in, used_out, persona=persona, reserved=admitted.charges), now)
        self.run(StepDone("model", persona), now)
        return admitted, usage

    def events(self) -> list[dict[str, Any]]:
        return [event for _, _, decision in self.log for event in decision.events]


def with_runtime(document: dict[str, Any], **runtime: Any) -> dict[str, Any]:
    document = copy.deepcopy(document)
    document.setdefault("runtime", {}).update(runtime)
    return document


def at(state: SessionState, **changes: Any) -> SessionState:
    return replace(state, **changes)


def test_driver_snapshots_only_declared_keys_and_settles_usage():
    driver = Driver(passport(**budget(tokens={"per_session": 10_000})))
    admitted, usage = driver.call("gpt-4o", 1000, 500, actual=(900, 100))
    assert admitted.action.value == "permit" and usage is not None and usage.settles
    # the reservation (1500) was replaced by the actual use (1000)
    assert driver.counters[("per_session", None, "tokens")] == 1000
    assert driver.state.in_flight == 0 and driver.state.iterations == 1
