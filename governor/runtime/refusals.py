"""The decisions the runtime makes itself, without the decision point: the refusal of a
step in a session that has ended, and the fail-closed refusal when the governor could
not decide or record a step (journal or store unusable), which nothing else can answer.

Apart from governor.runtime.core so that the runtime's collaborators (approvals, records)
can refuse the same way without importing the Runtime class.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from governor.policy import Action, Decision, Step, counter_damaged, store_unreachable
from governor.policy.limits import Limits
from governor.policy.state import SessionState
from governor.sessions.entries import HOW_TO_OPEN
from governor.policy.steps import ON_GOVERNOR_ERROR
from governor.store import CounterDamaged, StoreIntegrityError, StoreUnavailable

if TYPE_CHECKING:
    from governor.runtime.session import LiveSession


def ended_refusal(live: LiveSession) -> Decision:
    return Decision(action=Action.HALT, cause=live.state.halt_cause or "session_ended",
                    details={"reason": "the session has ended; " + HOW_TO_OPEN,
                             "halt_cause": live.state.halt_cause})


def transient(exc: BaseException) -> bool:
    """A store that is unreachable or slow, not one that lost its data: the step is refused
    as retryable and the session goes on (a loss fails closed until acknowledged)."""
    return isinstance(exc, StoreUnavailable) and not isinstance(exc, StoreIntegrityError)


def store_refusal(limits: Limits, state: SessionState, step: Step, exc: BaseException) -> Decision | None:
    """The refusal of a step the store could not count, after which the session goes on: an
    unreachable store (retryable: it goes on once the store answers) or a counter that is not
    a count (not retryable: it goes on once an operator deletes or corrects the key). The one
    route of both from a budget's reservation and a rate limit's window to the record. None
    for anything else (a store that lost its data, an internal error: a governor error)."""
    if isinstance(exc, CounterDamaged):
        return counter_damaged(limits, state, step, exc)
    if transient(exc):
        return store_unreachable(limits, state, step, str(exc), exc.retry_after)  # type: ignore[attr-defined]
    return None


def unrecorded_failure(step: Step, exc: BaseException) -> Decision:
    """Fail closed when not even the journal can be trusted: refuse, say why (as retryable
    when the store is only unreachable: nothing was halted)."""
    if transient(exc):
        seconds = max(1, math.ceil(exc.retry_after))  # type: ignore[attr-defined]
        return Decision(action=Action.DENY, cause=ON_GOVERNOR_ERROR, fail_closed=True,
                        details={"reason": f"the state store is unreachable: {exc}"[:500], "retryable": True,
                                 "retry_after": seconds, "step": type(step).__name__})
    if isinstance(exc, CounterDamaged):  # one key's damage: refused until it is mended, nothing halted
        return Decision(action=Action.DENY, cause=ON_GOVERNOR_ERROR, fail_closed=True,
                        details={"reason": f"a counter in the state store is not a count: {exc}"[:500],
                                 "retryable": False, "step": type(step).__name__})
    return Decision(action=Action.HALT, cause=ON_GOVERNOR_ERROR, fail_closed=True,
                    details={"reason": f"governor could not decide or record this step: {type(exc).__name__}: {exc}"[:500],
                             "step": type(step).__name__})


