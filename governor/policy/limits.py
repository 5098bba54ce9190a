"""Limits: the pinned passport's governed members as `decide` reads them, once per session.

Everything `decide` needs is worked out ahead (`governor.policy.compiling.compile_limits`)
so a decision is lookups and arithmetic: budget meters per persona, pattern matchers, tool
sets, trigger predicates, the §6 degradation map. This module holds those values and the
counters a step draws on; `passport_members.py` reads each member, `limits_summary.py` says
what is in force.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from governor.policy import degradation as _degradation
from governor.policy import patterns
from governor.policy.pricing import PricingTable
from governor.policy.steps import (
    CounterKey,
    Delegation,
    ModelCall,
    PersonaSpawn,
    SessionEnd,
    Step,
    Tick,
    Tier,
    ToolCall,
    UsageReport,
)

PER_SESSION = "per_session"
PER_DAY = "per_day"
SCOPES = (PER_SESSION, PER_DAY)
TOKENS = "tokens"
COST = "cost_usd"
WALL_CLOCK = "wall_clock_sec"
DIMENSIONS = (TOKENS, COST, WALL_CLOCK)

SENSITIVITY = {"public": 0, "internal": 1, "confidential": 2, "restricted": 3}
CATEGORIES = frozenset({"pii", "phi", "financial", "credentials", "intellectual_property", "regulatory"})

SESSION_COST: CounterKey = (PER_SESSION, None, COST)


class LimitsError(ValueError):
    """A governed passport member the governor cannot enforce as declared."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The governor's own settings (not the passport's): documented defaults."""

    warn_fraction: float = 0.8  # one-time warning when usage crosses this share of a cap
    loop_threshold: int = 3  # a tool call is a loop when it would be this occurrence in the window
    default_loop_window: int = 10  # loop_detection declared without a window
    default_response_time_minutes: int = 15  # §5 timeout when human_oversight does not say
    anomaly_min_calls: int = 20  # tool calls seen before a share deviation can be material
    anomaly_alpha: float = 0.01  # two-sided significance for a share deviation
    anomaly_screen_z: float = 2.0  # |z| below this skips the exact test (it cannot reach alpha)

    def __post_init__(self) -> None:
        if not 0.0 < self.warn_fraction <= 1.0:
            raise ValueError("warn_fraction must be in (0, 1]")
        if self.loop_threshold < 2 or self.default_loop_window < 2:
            raise ValueError("loop_threshold and default_loop_window must be >= 2")
        if self.default_response_time_minutes < 1:
            raise ValueError("default_response_time_minutes must be >= 1")
        if self.anomaly_min_calls < 1 or not 0.0 < self.anomaly_alpha < 1.0:
            raise ValueError("anomaly_min_calls must be >= 1 and anomaly_alpha in (0, 1)")


@dataclass(frozen=True, slots=True)
class Meter:
    """One budget counter a step draws on, with its declared cap (None: tracked only)."""

    scope: str
    persona: str | None
    dimension: str
    cap: float | None
    key: CounterKey
    warn_at: float | None = None  # the parent's warning threshold (cap * warn_fraction)


@dataclass(frozen=True, slots=True)
class Persona:
    name: str
    rule: str  # "permissions.sub_agents[i]"
    tools: frozenset[str]  # already intersected with the parent's tools
    max_parallel: int | None
    meters: tuple[Meter, ...]  # budget_share caps on tokens / cost_usd
    clock_meters: tuple[Meter, ...]  # budget_share caps on wall_clock_sec


@dataclass(frozen=True, slots=True)
class DelegationPolicy:
    identities: patterns.PatternSet
    max_depth: int | None
    scopes_subset: bool
    budget_subset: bool


@dataclass(frozen=True, slots=True)
class Trigger:
    name: str  # "human_oversight.triggers[i]"
    description: str
    cost_usd_over: float | None
    classification_at_least: int | None
    tool: str | None
    path: patterns.Pattern | None

    @property
    def session_level(self) -> bool:
        """Only the session's cost is tested: once approved it stays released for the session."""
        return self.classification_at_least is None and self.tool is None and self.path is None

    @property
    def step_predicates(self) -> bool:
        return not self.session_level


@dataclass(frozen=True, slots=True)
class Baseline:
    expected_tools: frozenset[str] | None
    shares: tuple[tuple[str, float], ...]
    cost_min: float | None
    cost_max: float | None
    data_classes: frozenset[str] | None


@dataclass(frozen=True, slots=True)
class Limits:
    tier: Tier
    config: PolicyConfig
    pricing: PricingTable
    passport_digest: str
    passport_id: str | None
    degradation: Mapping[str, _degradation.Resolution]
    # §2
    meters: Mapping[str | None, tuple[Meter, ...]]  # persona (None: parent only) -> token/cost meters
    clock_meters: Mapping[str | None, tuple[Meter, ...]]
    cost_governed: bool
    max_duration_sec: float | None
    clock_checked: bool  # a wall-clock cap or max_duration_sec is declared
    # §3
    max_iterations: int | None
    max_tool_calls: int | None
    max_concurrent: int | None
    tool_max_concurrent: int | None
    loop_window: int | None
    loop_on_detected: _degradation.Resolution | None
    # §4
    parent_tools: frozenset[str]
    personas: Mapping[str, Persona]
    delegation: DelegationPolicy | None
    own_scopes: frozenset[str]
    own_budget: Mapping[tuple[str, str], float]  # (dimension, scope) -> cap
    # §5
    confirm_tools: frozenset[str]
    triggers: tuple[Trigger, ...]
    free_text_triggers: tuple[str, ...]
    monitor_only: bool
    response_time_sec: float
    agent_sensitivity: int | None
    tool_sensitivity: Mapping[str, int]
    tool_categories: Mapping[str, frozenset[str]]
    # §7
    baseline: Baseline | None
    # what the tier enforces
    enforce_hard: bool  # §2-§4, §6 and session integrity: R2, R3
    enforce_oversight: bool  # §5: R2, R3 (§5 "At R2 it MUST pause on a fired trigger")
    enforce_anomaly: bool  # §7: R3
    summary: Mapping[str, Any] = field(default_factory=dict)
    # §5 intervention_model plan_editing: a reviewer may approve an edited step
    plan_editing: bool = False
    _keys: Mapping[Any, tuple[CounterKey, ...]] = field(default_factory=dict)

    def within_reservation(self, step: UsageReport, cost: float | None | object = ...) -> bool:
        """A usage report whose every metered amount (tokens, priced cost) is within what its
        admission reserved. It can cross no cap, warning threshold or cost trigger that the
        admission's projection did not already check (the counters held the reservation
        since): a final one is settled without reading the counters (one store read less per
        call), and after a halt such usage is still delivered (it was admitted and paid for).
        `cost`: the report's price when the caller has it already."""
        if not step.reserved:
            return False
        if cost is ...:  # not priced by the caller yet
            cost = self.pricing.cost(step.model, step.input_tokens, step.output_tokens, step.cached_input_tokens,
                                     step.units)
        if cost is None:
            return False
        tokens = step.input_tokens + step.output_tokens
        reserved = {(c.scope, c.persona, c.dimension): c.amount for c in step.reserved}
        for meter in self.meters.get(step.persona, self.meters[None]):
            held = reserved.get(meter.key)
            if held is None or (tokens if meter.dimension == TOKENS else cost) > held:
                return False
        return True

    def resolution(self, cause: str) -> _degradation.Resolution:
        return _degradation.resolve(cause, self.degradation)

    def counter_keys(self, step: Step) -> tuple[CounterKey, ...]:
        """The counters the runtime must snapshot into SessionState.counters before deciding `step`."""
        kind = type(step)
        if kind is UsageReport and step.final and self.within_reservation(step):  # type: ignore[union-attr,arg-type]
            return ()
        if kind is ModelCall or kind is UsageReport:
            return self._keys.get(("model", step.persona), self._keys[("model", None)])
        if kind is ToolCall or kind is Delegation:
            return self._keys["tool"]
        if kind is PersonaSpawn:
            return self._keys[("model", None)]
        if kind is Tick or kind is SessionEnd:
            return self._keys["clock"]
        return ()
