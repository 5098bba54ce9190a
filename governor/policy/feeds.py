"""R3: the events of §2-§5 feed the anomaly substrate (§2, §3, §4 and §5 each say "at R3 ...
feed the anomaly substrate (§7)"). The feeds, their rates and the materiality rule are in
`feed_rates.py`; this is the monitor, run by `decide` after a step's own checks, at R3 only.

Pure: the counts live in `SessionState.feeds` (advanced by `advance` through `count`), so a
replay gives the same verdicts. O(events of the step) per step, nothing for a step that
produced no feed event (a plain model call takes the quiet path and never gets here). A
material feed is a §7 deviation (`on_anomaly`, key `feed:<name>`, recorded once per
session), resolved through §6 like any other.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from governor.policy import stats
from governor.policy.budget_warnings import ON_GOVERNOR_BUDGET_WARNING
from governor.policy.feed_rates import FEEDS, MIN_EVENTS
from governor.policy.limits import SESSION_COST, Limits
from governor.policy.run import Run
from governor.policy.state import SessionState
from governor.policy.steps import (
    ON_ANOMALY, ON_BUDGET_EXHAUSTED, ON_ITERATION_LIMIT, ON_OVERSIGHT_TRIGGER, Decision, Delegation,
    PersonaSpawn, Step
)

_BY_CAUSE = {ON_BUDGET_EXHAUSTED: "budget", ON_GOVERNOR_BUDGET_WARNING: "budget", ON_ITERATION_LIMIT: "iteration"}


def count(step: Step, decision: Decision) -> dict[str, int]:
    """The feed events `step` produced under `decision`: {feed: how many}."""
    found: dict[str, int] = {}
    kind = type(step)
    if kind is PersonaSpawn or kind is Delegation:  # a spawn or delegation pattern, admitted or not
        found["agents"] = 1
    for event in decision.events:
        cause = event["cause"]
        feed = _BY_CAUSE.get(cause)
        if feed is None and cause == ON_OVERSIGHT_TRIGGER and "review" not in event["detail"]:
            feed = "oversight"  # a firing, not a reviewer's answer recorded under the same cause
        if feed is not None:
            found[feed] = found.get(feed, 0) + 1
    return found


def advanced(state: SessionState, found: Mapping[str, int]) -> dict[str, int]:
    feeds = dict(state.feeds)
    for name, k in found.items():
        feeds[name] = feeds.get(name, 0) + k
    return feeds


def _actions(state: SessionState) -> int:
    return state.iterations + state.tool_calls + state.feeds.get("agents", 0) + 1


def _beyond_baseline(limits: Limits, decision: Decision) -> dict[str, Any] | None:
    """A per-session cost boundary beyond the declared cost_per_session_usd.max."""
    baseline = limits.baseline
    if baseline is None or baseline.cost_max is None:
        return None
    for event in decision.events:
        detail = event["detail"]
        if _BY_CAUSE.get(event["cause"]) == "budget" and detail.get("dimension") == "cost_usd" \
                and detail.get("scope") == "per_session":
            observed = detail.get("projected", detail.get("observed"))
            if isinstance(observed, (int, float)) and observed > baseline.cost_max:
                return {"key": "feed:budget:beyond_baseline", "kind": "feed_baseline", "feed": "budget",
                        "section": "§2", "baseline": "cost_per_session_usd.max", "limit": baseline.cost_max,
                        "observed": observed, "boundary": event["cause"]}
    return None


def deviations(limits: Limits, state: SessionState, step: Step, decision: Decision) -> list[dict[str, Any]]:
    """The feed deviations this step makes material (not yet recorded in the session)."""
    found = count(step, decision)
    if not found:
        return []
    material: list[dict[str, Any]] = []
    beyond = _beyond_baseline(limits, decision)
    if beyond is not None and beyond["key"] not in state.deviations:
        material.append(beyond)
    n = _actions(state)
    alpha = limits.config.anomaly_alpha
    for name in found:
        key = "feed:" + name
        k = state.feeds.get(name, 0) + found[name]
        if k < MIN_EVENTS or key in state.deviations:
            continue
        section, _, rate = FEEDS[name]
        trials = max(n, k)
        p_value = stats.binomial_upper_p(k, trials, rate)
        if p_value < alpha:
            material.append({"key": key, "kind": "feed_rate", "feed": name, "section": section, "events": k,
                             "actions": trials, "expected_rate": rate, "observed_rate": round(k / trials, 6),
                             "p_value": p_value, "alpha": alpha, "baseline": "governor_default"})
    return material


def monitor(limits: Limits, state: SessionState, step: Step, decision: Decision, now: float) -> Decision:
    """`decision`, with the §6 resolution of any feed deviation it makes material folded in."""
    if decision.halts:
        return decision  # nothing more can follow; the events are counted by advance
    found = deviations(limits, state, step, decision)
    if not found:
        return decision
    run = Run(limits, state, step, now)
    cost = state.counters.get(SESSION_COST)
    detail: dict[str, Any] = {"deviations": found, "feeds": {**state.feeds, **{
        d["feed"]: d["events"] for d in found if "events" in d}}}
    if cost is not None:
        detail["session_cost"] = cost
    stop = run.fire(ON_ANOMALY, detail, limits.enforce_anomaly)
    if stop is None:  # a declared continue: recorded before the step's own event
        added = tuple(run.events)
        if decision.event is None:
            return dataclasses.replace(decision, event=added[-1], prior_events=(*decision.prior_events, *added[:-1]))
        return dataclasses.replace(decision, prior_events=(*decision.prior_events, *added))
    if decision.blocks and not stop.halts:
        # already held or refused, and the deviation would only hold or refuse it: not recorded
        # yet (its count only grows), so the next feed event of the session resolves it
        return decision
    # the deviation stops the step: a blocked step's own outcome never took effect
    own = decision.prior_events if decision.blocks else decision.events
    return dataclasses.replace(stop, prior_events=(*own, *stop.prior_events),
                               charges=decision.charges if decision.settles else (), settles=decision.settles)


__all__ = ["count", "advanced", "deviations", "monitor"]
