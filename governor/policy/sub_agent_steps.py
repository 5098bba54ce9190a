"""The decisions for the agents that act beside the governed one: a persona instance's
spawn and exit (§4.1) and a delegation to a peer agent (§4.2, admitted by
governor.policy.peers).

Kept together because both record the sub-agent that went ahead (on_governor_sub_agent_spawned,
on_governor_delegation_admitted) as well as the one that was refused.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from governor.policy import peers
from governor.policy.limits import COST, SESSION_COST, TOKENS
from governor.policy.steps import (
    ON_DELEGATION_ADMITTED, ON_DELEGATION_DENIED, ON_SUB_AGENT_ENDED, ON_SUB_AGENT_SPAWNED, Action,
    Decision, Delegation, PersonaExit, PersonaSpawn
)
from governor.policy.digests import enforcement_event
from governor.policy.run import Run
from governor.policy.checks import clock_check, persona_denied


def decide_persona_spawn(run: Run, step: PersonaSpawn) -> Decision:
    limits, state = run.limits, run.state
    run.release(step.approval_id)
    persona = limits.personas.get(step.persona)
    live = state.personas_live.get(step.persona, 0)
    if persona is None:
        decision = persona_denied(run, step.persona, "undeclared_persona", matched_rule=None) or run.finish()
        return _went_ahead(decision, ON_SUB_AGENT_SPAWNED, run, {"persona": step.persona, "matched_rule": None,
                                                                 **_instance(step, live + 1, None)})
    if persona.max_parallel is not None and live + 1 > persona.max_parallel:
        d = persona_denied(
            run, step.persona, "max_parallel", matched_rule=persona.rule, observed=live, limit=persona.max_parallel
        )
        if d is not None:
            return d
    total = sum(state.personas_live.values())
    if limits.max_concurrent is not None and total + 1 > limits.max_concurrent:
        d = persona_denied(
            run, step.persona, "max_concurrent", matched_rule=persona.rule, observed=total, limit=limits.max_concurrent
        )
        if d is not None:
            return d
    counters = state.counters
    details = {
        "persona": step.persona,
        "matched_rule": persona.rule,
        "draw_down": {  # the parent's aggregate use the persona starts from (§4.1.5)
            TOKENS: counters.get(("per_session", None, TOKENS), 0.0),
            COST: counters.get(SESSION_COST, 0.0),
        },
    }
    decision = run.finish(allowed_tools=persona.tools, details=details)
    return _went_ahead(decision, ON_SUB_AGENT_SPAWNED, run, {**details, **_instance(step, live + 1, persona.max_parallel)})


def decide_delegation(run: Run, step: Delegation) -> Decision:
    limits = run.limits
    run.release(step.approval_id)
    reason, detail = peers.admit_peer(limits.delegation, limits.own_scopes, limits.own_budget, step)
    if reason is not None:
        detail["reason"] = reason
        if (d := run.fire(ON_DELEGATION_DENIED, detail, limits.enforce_hard)) is not None:
            return d
        return run.finish()
    d, _, _ = clock_check(run, settle=False)
    if step.persona is not None:
        detail["persona"] = step.persona
    return d or _went_ahead(run.finish(details=detail), ON_DELEGATION_ADMITTED, run, dict(detail))


def _instance(step: PersonaSpawn | PersonaExit, live: int, max_parallel: int | None) -> dict[str, Any]:
    detail: dict[str, Any] = {"live": live}
    if step.instance is not None:
        detail["instance"] = step.instance
    if max_parallel is not None:
        detail["max_parallel"] = max_parallel
    return detail


def _went_ahead(decision: Decision, cause: str, run: Run, detail: dict[str, Any]) -> Decision:
    """§4.1.5 / §4.2.5: a spawn or delegation that goes ahead is recorded too, after any event
    its checks recorded (an observed or continued denial), as `continue` overriding nothing."""
    if decision.blocks:
        return decision
    detail.update(decision="permit", step=run.kind)
    return replace(decision, event=enforcement_event(cause, Action.CONTINUE.value, detail), prior_events=decision.events)


def decide_persona_exit(run: Run, step: PersonaExit) -> Decision:
    """The instance's slot is freed by advance(); the end is recorded beside its spawn."""
    remaining = max(0, run.state.personas_live.get(step.persona, 0) - 1)
    detail = {"persona": step.persona, **_instance(step, remaining, None), "step": run.kind}
    if step.reason is not None:
        detail["reason"] = step.reason
    if step.lived_sec is not None:
        detail["lived_sec"] = round(step.lived_sec, 3)
    return Decision(event=enforcement_event(ON_SUB_AGENT_ENDED, Action.CONTINUE.value, detail))
