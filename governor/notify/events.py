"""The notification events, as plain dicts: {"event", "text", "data"}. Pure: the runtime's
hooks call these with what it already holds (no store read, no clock read here), and the
notifier adds the delivery's id, time and governor.

`text` is a one-line summary that chat tools show as the message (Slack- and
Mattermost-style incoming webhooks read a top-level "text"); `data` is for programs.
Agent-controlled strings (tool names, arguments, session names) are cut short and never
trusted as markup by this side: a receiver rendering `text` as markdown should escape it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

APPROVAL_PENDING = "approval.pending"
SESSION_HALTED = "session.halted"
AGENT_LOCKED = "agent.locked"
BUDGET_THRESHOLD = "budget.threshold"
EVENTS = (APPROVAL_PENDING, SESSION_HALTED, AGENT_LOCKED, BUDGET_THRESHOLD)  # the metric's label values

MAX_SHOWN = 200  # characters of an agent-controlled string in `text`


def _short(value: Any) -> str:
    text = "" if value is None else str(value)
    text = "".join(c if c.isprintable() else " " for c in text)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 1] + "…"


def approval_pending(agent: str, session: str, approval_id: str, *, tool: str | None, arguments: Any,
                     persona: str | None, reason: str, trigger: str, expires_at: str) -> dict[str, Any]:
    what = f"tool {_short(tool)}" if tool else "a model call"
    return {
        "event": APPROVAL_PENDING,
        "text": f"Review waiting: {what} in session {_short(session)} of {_short(agent)} ({_short(reason)}); "
                f"answer by {expires_at}: governor approvals show {approval_id}",
        "data": {"agent": agent, "session": session, "approval_id": approval_id, "tool": tool,
                 "arguments": dict(arguments) if isinstance(arguments, Mapping) else arguments, "persona": persona, "reason": reason, "trigger": trigger,
                 "expires_at": expires_at},
    }


def held_step(agent: str, session: str, request: Any, step: Any) -> dict[str, Any]:
    """approval_pending of the runtime's own objects: an ApprovalRequest and the held Step."""
    from governor.evidence import iso_utc

    return approval_pending(agent, session, request.id, tool=getattr(step, "tool", None),
                            arguments=getattr(step, "arguments", None), persona=getattr(step, "persona", None),
                            reason=request.reason, trigger=request.trigger, expires_at=iso_utc(request.expires_at))


def session_halted(agent: str, session: str, cause: str | None) -> dict[str, Any]:
    return {
        "event": SESSION_HALTED,
        "text": f"Session {_short(session)} of {_short(agent)} HALTED ({cause}); it stays halted: open a new session",
        "data": {"agent": agent, "session": session, "cause": cause},
    }


def agent_locked(agent: str, session: str, lock_id: str, cause: str | None) -> dict[str, Any]:
    return {
        "event": AGENT_LOCKED,
        "text": f"Agent {_short(agent)} LOCKED by {cause} in session {_short(session)}: every session is refused "
                f"until a principal lifts it: governor locks lift {lock_id} --by NAME",
        "data": {"agent": agent, "session": session, "lock_id": lock_id, "cause": cause},
    }


def budget_threshold(agent: str, session: str, warnings: Iterable[tuple[str, str, float]]) -> dict[str, Any]:
    crossed = [{"dimension": d, "scope": s, "fraction": f} for d, s, f in warnings]
    parts = ", ".join(f"{c['dimension']} {c['scope']} at {c['fraction']:.0%}" for c in crossed)
    return {
        "event": BUDGET_THRESHOLD,
        "text": f"Budget warning in session {_short(session)} of {_short(agent)}: {parts} of its cap",
        "data": {"agent": agent, "session": session, "thresholds": crossed},
    }
