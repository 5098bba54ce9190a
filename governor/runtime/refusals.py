"""The decisions the runtime makes itself, without the decision point: the refusal of a
step in a session that has ended, and the fail-closed refusal when the governor could
not decide or record a step (journal or store unusable), which nothing else can answer.

Apart from governor.runtime.core so that the runtime's collaborators (approvals, records)
can refuse the same way without importing the Runtime class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from governor.policy import Action, Decision, Step
from governor.sessions.book import HOW_TO_OPEN
from governor.policy.steps import ON_GOVERNOR_ERROR

if TYPE_CHECKING:
    from governor.runtime.session import LiveSession


def ended_refusal(live: LiveSession) -> Decision:
    return Decision(action=Action.HALT, cause=live.state.halt_cause or "session_ended",
                    details={"reason": "the session has ended; " + HOW_TO_OPEN,
                             "halt_cause": live.state.halt_cause})


def unrecorded_failure(step: Step, exc: BaseException) -> Decision:
    """Fail closed when not even the journal can be trusted: refuse, say why."""
    return Decision(action=Action.HALT, cause=ON_GOVERNOR_ERROR, fail_closed=True,
                    details={"reason": f"governor could not decide or record this step: {type(exc).__name__}: {exc}"[:500],
                             "step": type(step).__name__})


