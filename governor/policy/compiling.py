"""Compile the pinned passport's governed members into Limits, once per session.

Everything `decide` needs is worked out here so a decision is lookups and arithmetic:
budget meters per persona, pattern matchers, tool sets, trigger predicates, the §6
degradation map. A member the governor cannot apply (a `**` in a host pattern, a
non-numeric cap, an unknown degradation action) raises LimitsError naming it: the
passport is refused rather than half-enforced.
"""

from __future__ import annotations

from typing import Any, Mapping

from governor.common.canonical import digest_of
from governor.policy import degradation as _degradation
from governor.policy import passport_members as members
from governor.policy.limits import (COST, SENSITIVITY, SESSION_COST, TOKENS, WALL_CLOCK, Limits, LimitsError, Meter,
                                    PolicyConfig)
from governor.policy.limits_summary import summarize
from governor.policy.pricing import PricingTable
from governor.policy.steps import CounterKey, Tier


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
    permissions = members.mapping(document.get("permissions"), "permissions")
    resource_limits = members.mapping(permissions.get("resource_limits"), "permissions.resource_limits")
    runtime = members.mapping(document.get("runtime"), "runtime")
    invocation = members.mapping(runtime.get("tool_invocation"), "runtime.tool_invocation")
    oversight = members.mapping(document.get("human_oversight"), "human_oversight")

    try:
        degradation_map = _degradation.compile_degradation(runtime)
        loop = members.mapping(invocation.get("loop_detection"), "runtime.tool_invocation.loop_detection")
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
        loop_window = members.positive(window, "runtime.tool_invocation.loop_detection.window", integer=True)
        if loop_window < 2:  # type: ignore[operator]
            raise LimitsError("runtime.tool_invocation.loop_detection.window: must be >= 2")

    budget = members.budget_caps(resource_limits.get("budget"), "permissions.resource_limits.budget")
    parent_tools, confirm_tools, tool_sensitivity, tool_categories = members.tool_sets(document.get("tools"))
    personas = members.personas(permissions.get("sub_agents"), parent_tools, config.warn_fraction)
    triggers, free_text = members.triggers(oversight)
    baseline = members.baseline(document.get("anomaly_baseline"))

    warn = config.warn_fraction
    meters: dict[str | None, tuple[Meter, ...]] = {None: members.meters(budget, None, (TOKENS, COST), True, warn)}
    clock_meters: dict[str | None, tuple[Meter, ...]] = {None: members.meters(budget, None, (WALL_CLOCK,), True, warn)}
    for persona in personas.values():
        meters[persona.name] = meters[None] + persona.meters
        clock_meters[persona.name] = persona.clock_meters

    cost_governed = (
        any(m.cap is not None for ms in meters.values() for m in ms if m.dimension == COST)
        or any(t.cost_usd_over is not None for t in triggers)
        or (baseline is not None and (baseline.cost_max is not None or baseline.cost_min is not None))
    )
    max_duration = members.positive(resource_limits.get("max_duration_sec"), "permissions.resource_limits.max_duration_sec")
    clock_checked = max_duration is not None or any(
        m.cap is not None for ms in clock_meters.values() for m in ms
    )

    tool_max = members.positive(invocation.get("max_concurrent"), "runtime.tool_invocation.max_concurrent", integer=True)
    if invocation.get("parallel") is False:
        tool_max = 1

    sensitivity = members.mapping(document.get("data_classification"), "data_classification").get("sensitivity")
    security = members.mapping(document.get("security"), "security")
    scopes = members.mapping(security.get("authentication"), "security.authentication").get("scopes") or []
    response_minutes = oversight.get("response_time_minutes", config.default_response_time_minutes)
    response_minutes = members.positive(response_minutes, "human_oversight.response_time_minutes")

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
        max_iterations=members.positive(invocation.get("max_iterations"), "runtime.tool_invocation.max_iterations", integer=True),  # type: ignore[arg-type]
        max_tool_calls=members.positive(
            invocation.get("max_tool_calls_per_session"), "runtime.tool_invocation.max_tool_calls_per_session", integer=True
        ),  # type: ignore[arg-type]
        max_concurrent=members.positive(resource_limits.get("max_concurrent"), "permissions.resource_limits.max_concurrent", integer=True),  # type: ignore[arg-type]
        tool_max_concurrent=tool_max,  # type: ignore[arg-type]
        loop_window=loop_window,  # type: ignore[arg-type]
        loop_on_detected=on_detected,
        parent_tools=parent_tools,
        personas=personas,
        delegation=members.delegation(permissions.get("delegation")),
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
    object.__setattr__(limits, "summary", summarize(limits, budget, oversight))
    return limits


def _digest(document: Mapping[str, Any]) -> str:
    try:
        return digest_of(document)
    except (TypeError, ValueError) as exc:
        raise LimitsError(f"passport document is not JSON (cannot canonicalize it): {exc}") from exc
