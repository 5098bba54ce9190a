"""Runtime §7: deviations from the declared anomaly_baseline, and when they are material.

Materiality (what R3 acts on), each deviation recorded once per session:

unexpected_tool   a tool call outside expected_tools: material at the first call.
data_class        a data class (category) outside data_classes touched by a tool call,
                  from the step or the tool's declared data_classification: material at
                  once.
tool_share        a tool's observed share of the session's tool calls deviates from its
                  declared share: material once at least `anomaly_min_calls` (20) calls
                  were seen and a two-sided binomial test rejects the declared share at
                  `anomaly_alpha` (0.01); exact test up to 400 calls, normal
                  approximation beyond. A declared share of 0 (or 1) is contradicted by a
                  single call (or a single other call): material at once.
cost_above_max    the session's cost (the §2 per-session cost counter, projected for a
                  model call, actual for a usage report) exceeds cost_per_session_usd.max:
                  material at once, before the spending step is admitted.
cost_below_min    only knowable when the session ends: checked on SessionEnd.
usage_missing     a model call's answer carried no usage: charged the governor's own count
                  of the output it relayed and the admission's expected input. Material at
                  the first such answer.
usage_below_count a model call's reported output is below the governor's count of what it
                  relayed (a lower bound on an honest tokenizer's count) by more than the
                  tolerance (USAGE_TOLERANCE_TOKENS, or USAGE_TOLERANCE_RATIO of the
                  report): the provider, or a relay, under-reports. Material at the first.
Both are charged the larger figure whatever their materiality; the event says which was used.
"""

from __future__ import annotations

from typing import Any

from governor.policy import stats
from governor.policy.limits import Baseline, PolicyConfig
from governor.policy.state import SessionState
from governor.policy.steps import UsageReport

# how far the governor's count may exceed a provider's output figure before the report is an
# anomaly: the count is a lower bound, so any excess is an under-report; the slack keeps a
# provider that counts a few tokens of framing its own way from being flagged
USAGE_TOLERANCE_TOKENS = 8
USAGE_TOLERANCE_RATIO = 0.05


def tool_deviations(
    baseline: Baseline, config: PolicyConfig, state: SessionState, tool: str, classes: frozenset[str]
) -> list[dict[str, Any]]:
    """Not-yet-recorded deviations this tool call would make (it counted in)."""
    seen = state.deviations
    found: list[dict[str, Any]] = []
    if baseline.expected_tools is not None and tool not in baseline.expected_tools:
        key = "unexpected_tool:" + tool
        if key not in seen:
            found.append({"key": key, "kind": "unexpected_tool", "tool": tool})
    if baseline.data_classes is not None and classes:
        for data_class in sorted(classes - baseline.data_classes):
            key = "data_class:" + data_class
            if key not in seen:
                found.append({"key": key, "kind": "data_class", "data_class": data_class})
    if baseline.shares:
        calls = state.tool_calls + 1
        counts = state.tool_counts
        for name, share in baseline.shares:
            key = "tool_share:" + name
            if key in seen:
                continue
            hits = counts.get(name, 0) + (name == tool)
            if share <= 0.0 or share >= 1.0:
                material = hits > 0 if share <= 0.0 else hits < calls
                p_value = 0.0
            elif calls < config.anomaly_min_calls or stats.z_score(hits, calls, share) < config.anomaly_screen_z:
                continue
            else:
                p_value = stats.binomial_two_sided_p(hits, calls, share)
                material = p_value < config.anomaly_alpha
            if material:
                found.append({
                    "key": key,
                    "kind": "tool_share",
                    "tool": name,
                    "declared_share": share,
                    "observed_share": round(hits / calls, 6),
                    "calls": calls,
                    "p_value": p_value,
                })
    return found


def cost_deviation(baseline: Baseline, state: SessionState, session_cost: float, at_end: bool) -> dict[str, Any] | None:
    if not at_end:
        if baseline.cost_max is not None and session_cost > baseline.cost_max and "cost_above_max" not in state.deviations:
            return {"key": "cost_above_max", "kind": "cost", "observed": session_cost, "limit": baseline.cost_max}
        return None
    if baseline.cost_min is not None and session_cost < baseline.cost_min and "cost_below_min" not in state.deviations:
        return {"key": "cost_below_min", "kind": "cost", "observed": session_cost, "limit": baseline.cost_min}
    return None


def usage_unbelieved(step: UsageReport) -> bool:
    """A final report whose output figure is not the provider's own, or disagrees with the
    governor's count beyond the tolerance (a cheap test: the quiet settlement asks it too)."""
    counted = step.counted_output_tokens
    if counted is None or not step.final:
        return False
    reported = step.reported_output_tokens
    return reported is None or counted > reported + max(USAGE_TOLERANCE_TOKENS, int(reported * USAGE_TOLERANCE_RATIO))


def usage_deviation(step: UsageReport) -> dict[str, Any] | None:
    """The §7 deviation a final usage report makes (usage_missing / usage_below_count), or None.
    Fired for every such report (the record says for each call which figure was charged);
    `key` names its kind, so the session's deviations stay two at most."""
    if not usage_unbelieved(step):
        return None
    reported = step.reported_output_tokens
    kind = "usage_missing" if reported is None else "usage_below_count"
    return {"key": kind, "kind": kind, "model": step.model, "reported_output_tokens": reported,
            "counted_output_tokens": step.counted_output_tokens, "charged_output_tokens": step.output_tokens,
            "charged_input_tokens": step.input_tokens, "charged": "governor_count",
            "tolerance": {"tokens": USAGE_TOLERANCE_TOKENS, "ratio": USAGE_TOLERANCE_RATIO}}
