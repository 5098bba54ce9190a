"""What the session book holds and answers: a session it knows (`Opened`), a lock (`Lock`),
why a request may act in no session (`Refusal`), and the texts that tell the agent how to go on.

Plain values with their views (the control plane's JSON); the book (`governor.sessions.book`)
decides, `governor.sessions.book_log` persists them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from governor.policy import causes
from governor.sessions.identity import Identity

DAY = 86400.0  # the agent-named cap's rolling day, and how long a compacted log keeps an agent-named session

ON_AGENT_LOCK = causes.ON_GOVERNOR_AGENT_LOCK  # the cause of lock and lift events (records: action halt / continue)
ON_SESSION_CAP = causes.ON_GOVERNOR_SESSION_CAP  # the agent-named cap's refusal (audit journal, action halt)

HOW_TO_OPEN = ("a principal opens a new session with `governor sessions open` (or POST /v1/sessions on the "
               "control plane) and gives the agent its token for the ADL-Session header")


def iso(ts: float | None) -> str | None:
    """A timestamp as the book's views show it (UTC, to the second)."""
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def halted_reason(cause: str | None) -> str:
    """What the agent is told when its session is halted."""
    return (f"the session is halted ({cause or 'halted'}) and stays halted: nothing more runs in it; "
            + HOW_TO_OPEN)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request names no session it may act in. It belongs to no session: it is
    counted and logged, and recorded nowhere but (`audit`) the governor's audit journal."""

    code: str
    message: str
    session: str | None = None
    cause: str | None = None
    lock: str | None = None
    audit: dict[str, Any] | None = None  # an event for the audit journal, recorded before the answer

    def governor_object(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"cause": self.cause, "action": "halt" if self.cause else "deny",
                               "refusal": self.code, "reason": self.message, "session": self.session}
        if self.lock:
            obj["lock"] = self.lock
        return obj


@dataclass(slots=True)
class Opened:
    """A session the book knows: opened by a principal, the default one, or agent-named."""

    id: str
    by: str  # "principal" | "default" | "agent"
    opened_at: float
    label: str | None = None
    nonce: str | None = None
    ended_at: float | None = None
    halt_cause: str | None = None
    token_sha256: str | None = None  # a principal's session: its token, hashed
    identity: Identity | None = None  # the persona and lineage its principal bound (governor.sessions.identity)

    def view(self) -> dict[str, Any]:
        return {"session": self.id, "opened_by": self.by, "opened_at": iso(self.opened_at), "label": self.label,
                "nonce": self.nonce, "ended_at": iso(self.ended_at) if self.ended_at else None,
                "halt_cause": self.halt_cause, "identity": self.identity.view() if self.identity else None}


@dataclass(slots=True)
class Lock:
    """The agent locked by a halt of `session` with `cause`, until a principal lifts it."""

    id: str
    session: str
    cause: str
    at: float
    lifted_by: str | None = None
    lifted_at: float | None = None

    @property
    def active(self) -> bool:
        return self.lifted_at is None

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "session": self.session, "cause": self.cause, "locked_at": iso(self.at),
                "state": "locked" if self.active else "lifted", "lifted_by": self.lifted_by,
                "lifted_at": iso(self.lifted_at) if self.lifted_at else None}


class Recorder(Protocol):
    """What records the book's enforcement (the runtime: session journals, audit journal)."""

    async def record_lock(self, lock: Lock, *, lifted: bool) -> None: ...

    async def record_audit(self, cause: str, action: str, detail: dict[str, Any]) -> None: ...


class SessionBookError(Exception):
    """The book's log cannot be read or written."""
