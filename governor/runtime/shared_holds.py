"""Held steps of sessions shared by replicas (docs/reference/shared-sessions.md, "Holds").

A paused step is held by the replica whose request carries it (the request waits there).
What a reviewer needs is in the store: the held step's view (listed by every replica's
/v1/approvals), and, once answered through any replica, the answer. The answer itself is a
decision round like any other (ApprovalGranted / ApprovalRejected on the session's shared
state, its events chained), taken on the replica the reviewer reached; it is then written
once (SET NX) where the holding replica, which polls every POLL_SEC while its request waits,
finds it and releases or refuses the request. An approval no longer pending in the shared
state (answered, expired) is not answered twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from governor.policy import Action, ApprovalGranted, ApprovalRejected, Decision
from governor.policy.state import PENDING
from governor.runtime.api import Admission, admission_for
from governor.runtime.edit import EditRefused
from governor.runtime.session import HeldStep, LiveSession
from governor.store import StoreError

if TYPE_CHECKING:
    from governor.runtime.shared import Round, SharedSteps

log = logging.getLogger("governor.runtime")

POLL_SEC = 0.2  # how often a replica holding a step looks for an answer given elsewhere
ANSWER_TTL_SEC = 3600.0  # an answer is kept this long past the hold's expiry (then the key expires)


class SharedHolds:
    def __init__(self, *, steps: SharedSteps, round_here: Round, open_session: Callable[[str], Awaitable[LiveSession]],
                 clock: Callable[[], float]) -> None:
        self.steps = steps
        self.sessions = steps.sessions  # governor.store.redis_sessions.RedisSessions
        self.round_here = round_here
        self.open_session = open_session
        self.clock = clock

    # --- on the replica that holds the step --------------------------------------------------

    def publish(self, view: dict[str, Any]) -> None:
        """List a held step for every replica's reviewers (on the loop: holds are rare)."""
        try:
            self.sessions.publish_hold(view["id"], view)
        except StoreError:  # reviewers of this replica still see it; others do not
            log.exception("session %s: held step %s could not be listed for other replicas", view.get("session"),
                          view.get("id"))

    def withdraw(self, approval_id: str) -> None:
        """Unlist a held step that was answered, expired or ended (on the loop: holds are rare)."""
        try:
            self.sessions.withdraw_hold(approval_id)
        except StoreError:
            log.warning("held step %s could not be unlisted (it is answered: answering it again is refused)",
                        approval_id)

    async def wait(self, pending: HeldStep, approval_id: str, timeout: float,
                   released: Callable[[bool, Admission | None], None], session: str) -> tuple[bool, Admission | None]:
        """The held step's answer: given here (its future), or through another replica (the store,
        polled); TimeoutError past `timeout`."""
        deadline = self.clock() + timeout
        while True:
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise TimeoutError
            try:
                return await asyncio.wait_for(asyncio.shield(pending.answer), min(POLL_SEC, remaining))
            except TimeoutError:
                pass
            try:
                answer = await asyncio.to_thread(self.sessions.held_answer, approval_id)
            except StoreError:
                continue  # not known yet: the hold waits on (its expiry still applies)
            if answer is not None and not pending.answer.done():
                granted = bool(answer["granted"])
                admission = None if granted else admission_for(session, decision_of(answer), None)
                released(granted, admission)
            if pending.answer.done():
                return pending.answer.result()

    # --- on the replica a reviewer reached -----------------------------------------------------

    def listed(self) -> list[dict[str, Any]]:
        return self.sessions.holds()

    async def resolve(self, approval_id: str, approve: bool, reviewer: str, reason: str,
                      edited_arguments: dict[str, Any] | None) -> dict[str, Any]:
        """Answer a step another replica holds. KeyError: not pending (anywhere)."""
        held = await asyncio.to_thread(self.sessions.hold, approval_id)
        if held is None:
            raise KeyError(approval_id)
        if edited_arguments is not None:
            raise EditRefused("edit_on_holding_replica", "an edited step is approved through the replica that holds "
                              f"it ({held.get('replica', 'another replica')}); approve or reject it as it is here")
        live = await self.open_session(held["session"])
        step = ApprovalGranted(approval_id, reviewer, reason) if approve else ApprovalRejected(approval_id, reviewer,
                                                                                                 reason)

        async def pending_round(live: LiveSession, step: Any, ticket: Any) -> tuple[Decision, Any]:
            approval = live.state.approvals.get(approval_id)  # the shared state, as the round read it
            if approval is None or approval.status != PENDING:
                raise KeyError(approval_id)
            return await self.round_here(live, step, ticket)

        async with live.lock:
            decision, _ = await self.steps.apply(live, step, None, pending_round)
        granted = approve and decision.action is Action.CONTINUE
        answer = {"granted": granted, **decision_fields(decision)}
        ttl = max(0.0, float(held.get("expires_at_epoch", 0)) - self.clock()) + ANSWER_TTL_SEC
        await asyncio.to_thread(self.sessions.answer_held, approval_id, answer, ttl)
        await asyncio.to_thread(self.withdraw, approval_id)
        admission = admission_for(live.id, decision, None)
        review = decision.details.get("review", "approved" if approve else "rejected")
        return {"id": approval_id, "session": live.id, "decision": "approve" if approve else "reject",
                "reviewer": reviewer, "outcome": review, "governor": admission.governor_object, "edited": False}


def decision_fields(decision: Decision) -> dict[str, Any]:
    """What the holding replica needs of a review's decision to answer its waiting request."""
    return {"action": decision.action.value, "enforced": decision.enforced, "cause": decision.cause,
            "fail_closed": decision.fail_closed, "details": dict(decision.details),
            "event": dict(decision.event) if decision.event is not None else None}


def decision_of(answer: dict[str, Any]) -> Decision:
    return Decision(action=Action(answer["action"]), enforced=bool(answer["enforced"]), cause=answer.get("cause"),
                    fail_closed=bool(answer.get("fail_closed")), details=answer.get("details") or {},
                    event=answer.get("event"))


__all__ = ["POLL_SEC", "SharedHolds", "decision_fields", "decision_of"]
