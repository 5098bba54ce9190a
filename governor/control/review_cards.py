"""What a reviewer needs beside a held step (#33 item 6): whose agent and which session (its
label), what Approve, Reject and the review's timeout will each do, and who else is looking.

`GET /v1/approvals?reviewer=NAME` (the console polls it so) notes NAME as reviewing now; the
answer lists the names seen in the last PRESENCE_SECONDS. Names are the reviewers' own words,
bounded in length and number, and the page shows them as text.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from governor.policy.steps import ON_OVERSIGHT_TIMEOUT, Action

PRESENCE_SECONDS = 10.0
MAX_REVIEWERS = 32  # names remembered at once: a page polling with new names cannot grow the table
MAX_NAME = 200

ON_APPROVE = "the held step runs once, exactly as shown (the approval is bound to its digest); the session goes on"
ON_APPROVE_EDITED = "the held step runs once, as shown or as you edit it; the session goes on"
ON_REJECT = "the step is refused and never runs; the agent is told it was rejected; the session goes on"
ON_TIMEOUT = {
    Action.HALT: "the step never runs and the session halts ({cause}): it stays halted; a principal opens a new one",
    Action.CONTINUE: "the step never runs; the session goes on ({cause}: continue)",
    Action.PAUSE: "the step is put up for review again ({cause}: pause)",
    Action.DENY: "the step is refused and never runs; the session goes on ({cause}: deny)",
}


def timeout_consequence(limits: Any) -> str:
    """What the passport's degradation does when a review times out (halt, fail closed, by default)."""
    try:
        action = limits.resolution(ON_OVERSIGHT_TIMEOUT).action
    except Exception:  # noqa: BLE001 (a runtime without limits: the fail-closed default applies)
        action = Action.HALT
    text = ON_TIMEOUT.get(action, "{cause}: " + getattr(action, "value", str(action)) + "; the step never runs")
    return text.format(cause=ON_OVERSIGHT_TIMEOUT)


class Presence:
    """Reviewers seen polling the approvals recently (a bounded table, oldest dropped first)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.seen: dict[str, float] = {}

    def note(self, name: str | None) -> None:
        if not name:
            return
        name = name.strip()[:MAX_NAME]
        if not name or not name.isprintable():
            return
        self.seen.pop(name, None)
        self.seen[name] = self.clock()
        while len(self.seen) > MAX_REVIEWERS:
            self.seen.pop(next(iter(self.seen)))

    def now_reviewing(self) -> list[str]:
        horizon = self.clock() - PRESENCE_SECONDS
        for name in [name for name, at in self.seen.items() if at < horizon]:
            del self.seen[name]
        return sorted(self.seen)


def cards(approvals: list[dict[str, Any]], runtime: Any, book: Any) -> list[dict[str, Any]]:
    """Each pending approval's view with its agent, its session's label and the consequences."""
    agent = getattr(runtime, "agent_id", None)
    timeout = timeout_consequence(getattr(runtime, "limits", None))
    out = []
    for view in approvals:
        entry = book.get(view.get("session")) if book is not None else None
        out.append({**view, "agent": agent, "session_label": getattr(entry, "label", None),
                    "on_approve": ON_APPROVE_EDITED if view.get("plan_editing") else ON_APPROVE,
                    "on_reject": ON_REJECT, "on_timeout": timeout})
    return out
