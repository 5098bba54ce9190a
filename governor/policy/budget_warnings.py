"""§2 budget warnings as recorded events: once per (dimension, scope) of the parent's caps per
session, when the projected use first reaches `PolicyConfig.warn_fraction` of the cap.

The check that finds a warning is `governor.policy.checks` (`_warn`); `advance` remembers it
in `SessionState.warned`, so each is given once. This module turns the warnings a step
produced into enforcement events for the signed record, at every tier (a boundary is
recorded "regardless of tier", §2 step 5). The record's action vocabulary has only halt,
pause, fallback and continue: a warning stops nothing, so it is recorded as `continue` with
`detail.warning: true` and no `overridden_cause` (nothing was overridden).
"""

from __future__ import annotations

from typing import Any

from governor.policy.digests import enforcement_event
from governor.policy.limits import Limits
from governor.policy.causes import ON_GOVERNOR_BUDGET_WARNING



def warning_events(limits: Limits, kind: str, warnings: tuple[tuple[str, str, float], ...]) -> tuple[dict[str, Any], ...]:
    """One event per warning (dimension, scope, fraction of the cap projected)."""
    events = []
    for dimension, scope, fraction in warnings:
        detail: dict[str, Any] = {"step": kind, "warning": True, "dimension": dimension, "scope": scope,
                                  "fraction": fraction, "threshold": limits.config.warn_fraction}
        for meter in (*limits.meters[None], *limits.clock_meters[None]):
            if meter.dimension == dimension and meter.scope == scope and meter.cap is not None:
                detail["limit"] = meter.cap
                detail["observed"] = round(fraction * meter.cap, 6)
                break
        events.append(enforcement_event(ON_GOVERNOR_BUDGET_WARNING, "continue", detail))
    return tuple(events)


__all__ = ["ON_GOVERNOR_BUDGET_WARNING", "warning_events"]
