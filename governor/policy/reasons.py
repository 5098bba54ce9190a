"""What a client is told of a decision: the machine-readable `governor` object that goes with a
refusal in every wire format (the adapters render it) and that the control plane shows.

Part of the decision point's room because it reads nothing but a Decision: the adapters
that render it and the runtime that hands it out both import it from here.
"""

from __future__ import annotations

from typing import Any

from governor.policy.steps import Action, Decision

# Keys of Decision.details that clients and the record's readers care about.
_OBJECT_KEYS = ("dimension", "scope", "observed", "projected", "limit", "limit_name", "persona",
                "tool", "peer", "rule", "matched_rule", "reason", "approval_id", "expires_at", "halt_cause",
                "model", "unit", "loop", "repeats_in_window", "window", "threshold", "call_used", "call_reserved", "final",
                "fit_floor", "fit_room", "retryable", "retry_after", "rate_limit")


def _plain_number(value: Any) -> Any:
    # 20000.0 tokens read better as 20000; costs keep their fraction
    return int(value) if isinstance(value, float) and value.is_integer() else value


def governor_object(decision: Decision, session: str) -> dict[str, Any]:
    """The machine-readable reason a client gets with a refusal (and the control plane shows)."""
    obj: dict[str, Any] = {
        "session": session,
        "cause": decision.cause,
        "action": decision.action.value,
        "enforced": decision.enforced,
        "fail_closed": decision.fail_closed,
    }
    details = decision.details or {}
    for key in _OBJECT_KEYS:
        if details.get(key) is not None:
            obj[key] = _plain_number(details[key])
    if decision.approval is not None:
        obj["approval_id"] = decision.approval.id
        obj["expires_at"] = decision.approval.expires_at
    if decision.fallback_message and decision.action in (Action.FALLBACK, Action.HALT, Action.CONTINUE):
        obj["message"] = decision.fallback_message
    return obj
