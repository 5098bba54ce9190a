"""Compile the pinned passport's governed members into Limits, once per session.

Everything `decide` needs is worked out here so a decision is lookups and arithmetic:
budget meters per persona, pattern matchers, tool sets, trigger predicates, the §6
degradation map. A member the governor cannot apply (a `**` in a host pattern, a
non-numeric cap, an unknown degradation action) raises LimitsError naming it: the
passport is refused rather than half-enforced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from governor.policy.feed_rates import monitored
from governor.policy import degradation as _degradation
from governor.common.canonical import digest_of
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


# --- compilation -----------------------------------------------------------------------


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise LimitsError(f"{where}: must be an object")
    return value


def _positive(value: Any, where: str, integer: bool = False) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LimitsError(f"{where}: must be a positive number, got {value!r}")
    if integer:
        if value != int(value):
            raise LimitsError(f"{where}: must be an integer, got {value!r}")
        return int(value)
    return float(value)


def budget_caps(budget: Any, where: str) -> dict[tuple[str, str], float]:
    caps: dict[tuple[str, str], float] = {}
    for dimension, scopes in _mapping(budget, where).items():
        if dimension == "extensions":
            continue
        if dimension not in DIMENSIONS:
            raise LimitsError(f"{where}: unknown budget dimension {dimension!r}")
        for scope, cap in _mapping(scopes, f"{where}.{dimension}").items():
            if scope == "extensions":
                continue
            if scope not in SCOPES:
                raise LimitsError(f"{where}.{dimension}: unknown scope {scope!r}")
            caps[(dimension, scope)] = _positive(cap, f"{where}.{dimension}.{scope}")  # type: ignore[assignment]
    return caps


def _meters(
    caps: Mapping[tuple[str, str], float], persona: str | None, dimensions: tuple[str, ...], all_scopes: bool, warn_fraction: float
) -> tuple[Meter, ...]:
    out = []
    for dimension in dimensions:
        for scope in SCOPES:
            cap = caps.get((dimension, scope))
            if cap is None and not all_scopes:
                continue
            warn_at = cap * warn_fraction if cap is not None and persona is None else None
            out.append(Meter(scope, persona, dimension, cap, (scope, persona, dimension), warn_at))
    return tuple(out)


def _tool_sets(tools: Any) -> tuple[frozenset[str], frozenset[str], dict[str, int], dict[str, frozenset[str]]]:
    if tools is None:
        return frozenset(), frozenset(), {}, {}
    if not isinstance(tools, list):
        raise LimitsError("tools: must be an array")
    names, confirm, sensitivity, categories = set(), set(), {}, {}
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            raise LimitsError(f"tools[{index}]: must be an object with a name")
        name = tool["name"]
        names.add(name)
        if tool.get("requires_confirmation") is True:
            confirm.add(name)
        classification = tool.get("data_classification")
        if isinstance(classification, Mapping):
            level = SENSITIVITY.get(classification.get("sensitivity"))  # type: ignore[arg-type]
            if level is not None:
                sensitivity[name] = level
            cats = classification.get("categories")
            if isinstance(cats, list):
                categories[name] = frozenset(c for c in cats if isinstance(c, str))
    return frozenset(names), frozenset(confirm), sensitivity, categories


def _personas(sub_agents: Any, parent_tools: frozenset[str], warn_fraction: float) -> dict[str, Persona]:
    if sub_agents is None:
        return {}
    if not isinstance(sub_agents, list):
        raise LimitsError("permissions.sub_agents: must be an array")
    personas: dict[str, Persona] = {}
    for index, entry in enumerate(sub_agents):
        where = f"permissions.sub_agents[{index}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise LimitsError(f"{where}: must be an object with a name")
        name = entry["name"]
        if name in personas:
            raise LimitsError(f"{where}: duplicate persona name {name!r}")
        declared = entry.get("tools")
        if declared is not None and (not isinstance(declared, list) or not all(isinstance(t, str) for t in declared)):
            raise LimitsError(f"{where}.tools: must be an array of tool names")
        # §4.1: the persona's subset (or the parent's tools), never a tool the parent lacks
        tools = (frozenset(declared) if declared is not None else parent_tools) & parent_tools
        caps = budget_caps(entry.get("budget_share"), f"{where}.budget_share")
        personas[name] = Persona(
            name,
            where,
            tools,
            _positive(entry.get("max_parallel"), f"{where}.max_parallel", integer=True),  # type: ignore[arg-type]
            _meters(caps, name, (TOKENS, COST), False, warn_fraction),
            _meters(caps, name, (WALL_CLOCK,), False, warn_fraction),
        )
    return personas


def _delegation(member: Any) -> DelegationPolicy | None:
    if member is None:
        return None
    member = _mapping(member, "permissions.delegation")
    for key in ("match", "deny"):
        value = member.get(key, [])
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise LimitsError(f"permissions.delegation.{key}: must be an array of identifier patterns")
    try:
        identities = patterns.pattern_set(member.get("match", []), member.get("deny", []), patterns.compile_identifier)
    except patterns.PatternError as exc:
        raise LimitsError(f"permissions.delegation: {exc}") from exc
    attenuation = _mapping(member.get("attenuation"), "permissions.delegation.attenuation")
    return DelegationPolicy(
        identities,
        _positive(member.get("max_depth"), "permissions.delegation.max_depth", integer=True),  # type: ignore[arg-type]
        attenuation.get("scopes_subset") is True,
        attenuation.get("budget_subset") is True,
    )


def _triggers(oversight: Mapping[str, Any]) -> tuple[tuple[Trigger, ...], tuple[str, ...]]:
    triggers, free_text = [], []
    raw = oversight.get("triggers", [])
    if not isinstance(raw, list):
        raise LimitsError("human_oversight.triggers: must be an array")
    for index, entry in enumerate(raw):
        where = f"human_oversight.triggers[{index}]"
        if isinstance(entry, str):
            free_text.append(entry)
            continue
        when = _mapping(entry, where).get("when")
        if not isinstance(when, Mapping) or not when:
            raise LimitsError(f"{where}.when: must be an object with at least one predicate")
        unknown = set(when) - {"cost_usd_over", "data_classification_at_least", "tool", "path_matches"}
        if unknown:
            # an unknown predicate cannot be evaluated: refuse rather than ignore it
            raise LimitsError(f"{where}.when: unknown predicate(s) {sorted(unknown)}")
        level = when.get("data_classification_at_least")
        if level is not None and level not in SENSITIVITY:
            raise LimitsError(f"{where}.when.data_classification_at_least: unknown level {level!r}")
        tool = when.get("tool")
        if tool is not None and not isinstance(tool, str):
            raise LimitsError(f"{where}.when.tool: must be a tool name")
        path = when.get("path_matches")
        try:
            compiled_path = patterns.compile_path(path) if path is not None else None
        except patterns.PatternError as exc:
            raise LimitsError(f"{where}.when.path_matches: {exc}") from exc
        description = entry.get("description")
        triggers.append(
            Trigger(
                where,
                description if isinstance(description, str) else where,
                _positive(when.get("cost_usd_over"), f"{where}.when.cost_usd_over"),  # type: ignore[arg-type]
                SENSITIVITY[level] if level is not None else None,
                tool,
                compiled_path,
            )
        )
    return tuple(triggers), tuple(free_text)


def _baseline(member: Any) -> Baseline | None:
    if member is None:
        return None
    member = _mapping(member, "anomaly_baseline")
    expected, shares = None, []
    if "expected_tools" in member:
        entries = member["expected_tools"]
        if not isinstance(entries, list):
            raise LimitsError("anomaly_baseline.expected_tools: must be an array")
        names = set()
        for index, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                raise LimitsError(f"anomaly_baseline.expected_tools[{index}]: must be an object with a name")
            names.add(entry["name"])
            share = entry.get("share")
            if share is not None:
                if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
                    raise LimitsError(f"anomaly_baseline.expected_tools[{index}].share: must be a number in [0, 1]")
                shares.append((entry["name"], float(share)))
        expected = frozenset(names)
    cost = _mapping(member.get("cost_per_session_usd"), "anomaly_baseline.cost_per_session_usd")
    bounds = []
    for key in ("min", "max"):
        value = cost.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise LimitsError(f"anomaly_baseline.cost_per_session_usd.{key}: must be a non-negative number")
        bounds.append(None if value is None else float(value))
    classes = member.get("data_classes")
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        raise LimitsError("anomaly_baseline.data_classes: must be an array of data classes")
    return Baseline(expected, tuple(shares), bounds[0], bounds[1], None if classes is None else frozenset(classes))


def compile_limits(
    document: Mapping[str, Any],
    *,
    tier: Tier,
    pricing: PricingTable,
    config: PolicyConfig | None = None,
    passport_digest: str | None = None,
) -> Limits:
    """The pinned passport's §2-§7 members, ready for `decide`.

    `passport_digest` is the §1.3 pin (what a PassportPresented step is compared
    with); it defaults to base64url(SHA-256(JCS(document))).
    """
    config = config or PolicyConfig()
    tier = Tier(tier)
    if not isinstance(document, Mapping):
        raise LimitsError("passport document must be an object")
    permissions = _mapping(document.get("permissions"), "permissions")
    resource_limits = _mapping(permissions.get("resource_limits"), "permissions.resource_limits")
    runtime = _mapping(document.get("runtime"), "runtime")
    invocation = _mapping(runtime.get("tool_invocation"), "runtime.tool_invocation")
    oversight = _mapping(document.get("human_oversight"), "human_oversight")

    try:
        degradation_map = _degradation.compile_degradation(runtime)
        loop = _mapping(invocation.get("loop_detection"), "runtime.tool_invocation.loop_detection")
        on_detected = (
            _degradation.response(loop["on_detected"], "runtime.tool_invocation.loop_detection.on_detected")
            if loop.get("on_detected") is not None
            else None
        )
    except _degradation.DegradationError as exc:
        raise LimitsError(str(exc)) from exc
    loop_window = None
    if "loop_detection" in invocation:
        window = loop.get("window", config.default_loop_window)
        loop_window = _positive(window, "runtime.tool_invocation.loop_detection.window", integer=True)
        if loop_window < 2:  # type: ignore[operator]
            raise LimitsError("runtime.tool_invocation.loop_detection.window: must be >= 2")

    budget = budget_caps(resource_limits.get("budget"), "permissions.resource_limits.budget")
    parent_tools, confirm_tools, tool_sensitivity, tool_categories = _tool_sets(document.get("tools"))
    personas = _personas(permissions.get("sub_agents"), parent_tools, config.warn_fraction)
    triggers, free_text = _triggers(oversight)
    baseline = _baseline(document.get("anomaly_baseline"))

    warn = config.warn_fraction
    meters: dict[str | None, tuple[Meter, ...]] = {None: _meters(budget, None, (TOKENS, COST), True, warn)}
    clock_meters: dict[str | None, tuple[Meter, ...]] = {None: _meters(budget, None, (WALL_CLOCK,), True, warn)}
    for persona in personas.values():
        meters[persona.name] = meters[None] + persona.meters
        clock_meters[persona.name] = persona.clock_meters

    cost_governed = (
        any(m.cap is not None for ms in meters.values() for m in ms if m.dimension == COST)
        or any(t.cost_usd_over is not None for t in triggers)
        or (baseline is not None and (baseline.cost_max is not None or baseline.cost_min is not None))
    )
    max_duration = _positive(resource_limits.get("max_duration_sec"), "permissions.resource_limits.max_duration_sec")
    clock_checked = max_duration is not None or any(
        m.cap is not None for ms in clock_meters.values() for m in ms
    )

    tool_max = _positive(invocation.get("max_concurrent"), "runtime.tool_invocation.max_concurrent", integer=True)
    if invocation.get("parallel") is False:
        tool_max = 1

    sensitivity = _mapping(document.get("data_classification"), "data_classification").get("sensitivity")
    security = _mapping(document.get("security"), "security")
    scopes = _mapping(security.get("authentication"), "security.authentication").get("scopes") or []
    response_minutes = oversight.get("response_time_minutes", config.default_response_time_minutes)
    response_minutes = _positive(response_minutes, "human_oversight.response_time_minutes")

    clock_keys = tuple(m.key for ms in clock_meters.values() for m in ms)
    keys: dict[Any, tuple[CounterKey, ...]] = {
        ("model", name): tuple(m.key for m in ms) + (clock_keys if clock_checked else ())
        for name, ms in meters.items()
    }
    keys["tool"] = ((SESSION_COST,) if cost_governed else ()) + (clock_keys if clock_checked else ())
    keys["clock"] = clock_keys + (SESSION_COST,)

    enforce = tier is not Tier.R1
    limits = Limits(
        tier=tier,
        config=config,
        pricing=pricing,
        passport_digest=passport_digest or _digest(document),
        passport_id=document.get("id") if isinstance(document.get("id"), str) else None,
        degradation=degradation_map,
        meters=meters,
        clock_meters=clock_meters,
        cost_governed=cost_governed,
        max_duration_sec=max_duration,  # type: ignore[arg-type]
        clock_checked=clock_checked,
        max_iterations=_positive(invocation.get("max_iterations"), "runtime.tool_invocation.max_iterations", integer=True),  # type: ignore[arg-type]
        max_tool_calls=_positive(
            invocation.get("max_tool_calls_per_session"), "runtime.tool_invocation.max_tool_calls_per_session", integer=True
        ),  # type: ignore[arg-type]
        max_concurrent=_positive(resource_limits.get("max_concurrent"), "permissions.resource_limits.max_concurrent", integer=True),  # type: ignore[arg-type]
        tool_max_concurrent=tool_max,  # type: ignore[arg-type]
        loop_window=loop_window,  # type: ignore[arg-type]
        loop_on_detected=on_detected,
        parent_tools=parent_tools,
        personas=personas,
        delegation=_delegation(permissions.get("delegation")),
        own_scopes=frozenset(s for s in scopes if isinstance(s, str)),
        own_budget={k: v for k, v in budget.items()},
        confirm_tools=confirm_tools,
        triggers=triggers,
        free_text_triggers=free_text,
        monitor_only=oversight.get("intervention_model") == "monitor_only",
        plan_editing=oversight.get("intervention_model") == "plan_editing",
        response_time_sec=float(response_minutes) * 60.0,  # type: ignore[arg-type]
        agent_sensitivity=SENSITIVITY.get(sensitivity) if isinstance(sensitivity, str) else None,
        tool_sensitivity=tool_sensitivity,
        tool_categories=tool_categories,
        baseline=baseline,
        enforce_hard=enforce,
        enforce_oversight=enforce,
        enforce_anomaly=tier is Tier.R3,
        _keys=keys,
    )
    object.__setattr__(limits, "summary", _summary(limits, budget, oversight))
    return limits


def _digest(document: Mapping[str, Any]) -> str:
    try:
        return digest_of(document)
    except (TypeError, ValueError) as exc:
        raise LimitsError(f"passport document is not JSON (cannot canonicalize it): {exc}") from exc


def _summary(limits: Limits, budget: Mapping[tuple[str, str], float], oversight: Mapping[str, Any]) -> dict[str, Any]:
    """The declared limits in force, as plain JSON: an enforcement record's `limits` member."""
    summary: dict[str, Any] = {"tier": limits.tier.value}
    if budget:
        caps: dict[str, dict[str, float]] = {}
        for (dimension, scope), cap in sorted(budget.items()):
            caps.setdefault(dimension, {})[scope] = cap
        summary["budget"] = caps
    for key, value in (
        ("max_duration_sec", limits.max_duration_sec),
        ("max_concurrent", limits.max_concurrent),
        ("max_iterations", limits.max_iterations),
        ("max_tool_calls_per_session", limits.max_tool_calls),
        ("tool_max_concurrent", limits.tool_max_concurrent),
    ):
        if value is not None:
            summary[key] = value
    if limits.loop_window is not None:
        summary["loop_detection"] = {"window": limits.loop_window, "threshold": limits.config.loop_threshold}
    if limits.personas:
        summary["sub_agents"] = {
            p.name: {"tools": sorted(p.tools), **({"max_parallel": p.max_parallel} if p.max_parallel else {})}
            for p in limits.personas.values()
        }
    if limits.delegation is not None:
        summary["delegation"] = {
            "match": [p.text for p in limits.delegation.identities.allow],
            "deny": [p.text for p in limits.delegation.identities.deny],
            **({"max_depth": limits.delegation.max_depth} if limits.delegation.max_depth else {}),
            "scopes_subset": limits.delegation.scopes_subset,
            "budget_subset": limits.delegation.budget_subset,
        }
    if limits.confirm_tools or limits.triggers or limits.free_text_triggers:
        summary["oversight"] = {
            "requires_confirmation": sorted(limits.confirm_tools),
            "structured_triggers": [t.name for t in limits.triggers],
            # free text cannot be evaluated mechanically: listed, never fired (an R1 signal only)
            "free_text_triggers": {"count": len(limits.free_text_triggers), "evaluated": False},
            "response_time_minutes": limits.response_time_sec / 60.0,
            "intervention_model": oversight.get("intervention_model", "approve_reject"),
        }
    if limits.degradation:
        summary["degradation"] = {cause: r.action.value for cause, r in sorted(limits.degradation.items())}
    if limits.baseline is not None:
        summary["anomaly_baseline"] = True
    if limits.enforce_anomaly:  # R3: what the anomaly substrate monitored (policy/feed_rates.py)
        summary["anomaly_monitoring"] = monitored(limits.baseline is not None)
    default = limits.pricing.default
    summary["cost_model"] = {"unpriced_models": f"priced at {default.source or 'default'}" if default is not None
                             else "refused where cost is governed"}
    if limits.pricing.sources:  # where the prices come from: genai-prices and its version, the overrides' digests
        summary["cost_model"]["sources"] = dict(limits.pricing.sources)
    return summary
