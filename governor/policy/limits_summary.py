"""The declared limits in force, as plain JSON: an enforcement record's `limits` member."""

from __future__ import annotations

from typing import Any, Mapping

from governor.policy.feed_rates import monitored
from governor.policy.limits import Limits


def summarize(limits: Limits, budget: Mapping[tuple[str, str], float], oversight: Mapping[str, Any]) -> dict[str, Any]:
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
