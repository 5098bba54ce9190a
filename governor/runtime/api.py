"""The one door between the enforcement point (proxy, control plane) and the rest.

The proxy turns traffic into steps (adapters), asks the runtime, and applies the
answer. The runtime composes the pure decision point, the state store and the
evidence journal. This module fixes that contract so both sides can be built and
tested independently; `governor.runtime.core.Runtime` implements it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from governor.policy.reasons import governor_object
from governor.policy.steps import Action, Decision, Step, UsageReport
from governor.sessions.entries import halted_reason

@dataclass(slots=True)
class Admission:
    """The runtime's answer to `admit`: the decision plus what the proxy must hand back.

    `ticket` is opaque to the proxy: it names the reservation and the in-flight slot
    the step holds, and must be passed to `usage` / `finish` exactly once finished.
    """

    decision: Decision
    session: str
    ticket: Any = None
    governor_object: dict[str, Any] = field(default_factory=dict)  # machine-readable reason for clients
    # plan editing (§5.4): a reviewer approved these arguments instead of the agent's; the
    # proxy sends the request upstream with them (governor.runtime.edit)
    edited_arguments: dict[str, Any] | None = None
    seqs: tuple[int, ...] = ()  # the seqs of the events the decision journaled (a trace names them)


def admission_for(session: str, decision: Decision, ticket: Any, seqs: tuple[int, ...] = ()) -> Admission:
    """The runtime's answer to a step: a refusal carries its reason, and in a halted session
    says why and what to do."""
    # a plain permit has no reason to give: skip building one on every request
    plain = decision.action is Action.PERMIT and decision.event is None
    if plain:
        return Admission(decision=decision, session=session, ticket=ticket, governor_object={})
    obj = governor_object(decision, session)
    if decision.blocks and decision.details and decision.details.get("halted"):
        obj["reason"] = halted_reason(decision.cause)
    return Admission(decision=decision, session=session, ticket=ticket, governor_object=obj, seqs=seqs)


class RuntimeAPI(Protocol):
    # --- steps ---------------------------------------------------------------------
    async def admit(self, session: str, step: Step) -> Admission:
        """Decide a step, reserve its expected consumption, journal any event.

        Never raises: an internal failure is a fail-closed HALT (cause
        on_governor_error) that is itself recorded. For a PAUSE the returned
        decision carries `approval`; the caller then awaits `await_approval`.
        """

    async def await_approval(self, session: str, approval_id: str) -> Admission:
        """Hold until a reviewer answers or the response time runs out.

        Approved: a PERMIT admission for the held step. Rejected: DENY.
        Timeout: the resolution of on_oversight_timeout (HALT by default).
        """

    async def usage(self, session: str, ticket: Any, report: UsageReport) -> Decision:
        """Account usage for an admitted model call (streams: cumulative, final=False).

        Returns PERMIT to go on, or the enforcement decision that cuts the stream.
        A final report replaces the step's reservation with the actual usage.
        """

    async def finish(self, session: str, ticket: Any, *, error: str | None = None) -> None:
        """The step is over (completed, failed or cut): release what it still holds."""

    def allowed_tools(self, session: str, persona: str | None = None) -> frozenset[str] | None:
        """The tools the session (persona) may use; None: no restriction declared (MCP tools/list)."""

    def halted(self, session: str) -> str | None:
        """The cause that halted the session, or None: the proxy refuses ungoverned traffic of a halted session."""

    # --- sessions, approvals, records (control plane) --------------------------------
    async def ready(self) -> dict[str, Any]:
        """{"ready": bool, ...}: the store answers and a passport is pinned (/readyz)."""

    def has_session(self, session: str) -> bool:
        """Whether the governor knows the session (running or ended), without reading the store."""

    async def sessions(self, after: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Views of the sessions whose ids sort after `after` (None: from the first), at most
        `limit` (None: all), in id order; the control plane pages with these."""

    async def session_view(self, session: str) -> dict[str, Any] | None:
        """The session's state and budgets (a store read), or None when unknown."""

    def approvals(self) -> list[dict[str, Any]]: ...

    async def resolve_approval(self, approval_id: str, approve: bool, reviewer: str, reason: str = "",
                               edited_arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record and apply a reviewer's answer (with the reviewer's note `reason`, when given;
        `edited_arguments`: plan editing, see governor.runtime.edit); KeyError when unknown or
        already answered."""

    async def end_session(self, session: str) -> dict[str, Any]:
        """Finalize, sign and write the session's record; returns it."""

    def record(self, session: str, nonce: str | None = None) -> dict[str, Any]:
        """A freshly signed record of the session so far, bound to `nonce` when given."""

    # Optional, looked up with getattr (governor.runtime.core.Runtime has them; scripted test
    # runtimes need not): `attach_sessions(book)` (record locks, learn of ends: see
    # governor.sessions.book), `end_session_by_principal(session)` (POST /v1/sessions/{id}/end),
    # `audit_record(nonce=None)` (GET /v1/audit/record), `answered_approval(id)` (how an
    # approval that is no longer pending ended, for the control plane's 409).
