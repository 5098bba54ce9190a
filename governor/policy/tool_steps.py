"""The decisions for a tool call and a tool error: the tool surface granted to the agent
or its persona (§8.1, §4.1), counted limits, loop detection (§3.4), tools that require
confirmation and the oversight triggers on tools, paths and data classification (§5),
and the anomaly baseline for tools (§7).

Also `tool_data_classes`, the data classes a call touches, which the state transition
(governor.policy.transition) accumulates for the session.
"""

from __future__ import annotations

from typing import Any

from governor.policy import anomaly
from governor.policy.limits import SENSITIVITY, SESSION_COST, Limits
from governor.policy.steps import (
    ON_ANOMALY, ON_ITERATION_LIMIT, ON_TOOL_DENIED, ON_TOOL_ERROR, Decision, ToolCall, ToolError
)
from governor.policy.digests import loop_signature
from governor.policy.run import Run
from governor.policy.checks import clock_check, count_check, persona_denied


def _step_level(limits: Limits, step: ToolCall) -> int | None:
    """The step's sensitivity: the highest of what the step says and what its tool declares;
    unknown, the agent's own declared sensitivity (fail closed)."""
    level = SENSITIVITY.get(step.sensitivity) if step.sensitivity else None
    for data_class in step.data_classes:
        found = SENSITIVITY.get(data_class)
        if found is not None and (level is None or found > level):
            level = found
    declared = limits.tool_sensitivity.get(step.tool)
    if declared is not None and (level is None or declared > level):
        level = declared
    return limits.agent_sensitivity if level is None else level


def tool_data_classes(limits: Limits, step: ToolCall) -> frozenset[str]:
    declared = limits.tool_categories.get(step.tool)
    classes = frozenset(c for c in step.data_classes if c not in SENSITIVITY)
    return classes | declared if declared else classes


def decide_tool_call(run: Run, step: ToolCall) -> Decision:
    limits, state = run.limits, run.state
    enforce = limits.enforce_hard
    run.release(step.approval_id)
    tool = step.tool
    if step.origin == "agent" and state.announced and state.announced.get(loop_signature(tool, step.arguments)):
        # the execution of a call a model response announced and the governor admitted then
        return run.finish(details={"tool": tool, "announced": True})
    if step.persona is not None:
        persona = limits.personas.get(step.persona)
        if persona is None:
            if (d := persona_denied(run, step.persona, "undeclared_persona", tool=tool, matched_rule=None)) is not None:
                return d
        elif tool not in persona.tools:
            d = persona_denied(
                run, step.persona, "tool_not_granted", tool=tool, matched_rule=persona.rule, allowed_tools=sorted(persona.tools)
            )
            if d is not None:
                return d
    elif limits.parent_tools and tool not in limits.parent_tools:
        # the agent's own declared tool surface (Core §8.1); a passport without tools[] names none
        detail = {"tool": tool, "reason": "tool_not_declared", "declared_tools": sorted(limits.parent_tools)}
        if (d := run.fire(ON_TOOL_DENIED, detail, enforce)) is not None:
            return d
    if (d := count_check(run, "max_concurrent", state.in_flight, limits.max_concurrent)) is not None:
        return d
    if (d := count_check(run, "tool_invocation.max_concurrent", state.tools_in_flight, limits.tool_max_concurrent)) is not None:
        return d
    if (d := count_check(run, "max_tool_calls_per_session", state.tool_calls, limits.max_tool_calls)) is not None:
        return d
    if limits.loop_window is not None:
        signature = loop_signature(tool, step.arguments)
        repeats = state.recent_tools.count(signature)
        needed = min(limits.config.loop_threshold - 1, limits.loop_window)
        if repeats >= needed:
            detail = {
                "tool": tool, "signature": signature, "repeats_in_window": repeats,
                "window": limits.loop_window, "threshold": needed + 1, "loop": True,
            }
            first = limits.loop_on_detected  # §3.4: on_detected, else on_iteration_limit, else halt
            if (d := run.fire(ON_ITERATION_LIMIT, detail, enforce, first)) is not None:
                return d
    d, _, warnings = clock_check(run, settle=False)
    if d is not None:
        return d
    if tool in limits.confirm_tools:
        detail = {"tool": tool, "requires_confirmation": True}
        if (d := run.trigger(f"tools.{tool}.requires_confirmation", f"{tool} requires confirmation", detail)) is not None:
            return d
    if limits.triggers:
        level = None
        cost = state.counters.get(SESSION_COST, 0.0)
        for trigger in limits.triggers:
            if trigger.session_level and trigger.name in state.released_triggers:
                continue
            if trigger.tool is not None and trigger.tool != tool:
                continue
            if trigger.cost_usd_over is not None and not cost > trigger.cost_usd_over:
                continue
            if trigger.path is not None and (step.target_path is None or not trigger.path.matches(step.target_path)):
                continue
            if trigger.classification_at_least is not None:
                level = _step_level(limits, step) if level is None else level
                if level is None or level < trigger.classification_at_least:
                    continue
            detail = {"tool": tool}
            if step.target_path is not None:
                detail["target_path"] = step.target_path
            if (d := run.trigger(trigger.name, trigger.description, detail)) is not None:
                return d
    if limits.baseline is not None:
        deviations = anomaly.tool_deviations(limits.baseline, limits.config, state, tool, tool_data_classes(limits, step))
        if deviations:
            if (d := run.fire(ON_ANOMALY, {"tool": tool, "deviations": deviations}, limits.enforce_anomaly)) is not None:
                return d
    return run.finish(warnings=tuple(warnings))


def decide_tool_error(run: Run, step: ToolError) -> Decision:
    detail: dict[str, Any] = {"tool": step.tool}
    if step.message:
        detail["message"] = step.message[:500]
    if step.persona is not None:
        detail["persona"] = step.persona
    return run.fire(ON_TOOL_ERROR, detail, run.limits.enforce_hard) or run.finish()
