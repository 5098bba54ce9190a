"""The runtime's side of the session book: locks, lifts and the governor's audit journal.

`AuditTrail` holds the attached session book and the audit journal; the book
(`governor.sessions.book`) decides who may act, and this records what it enforced (the book's
`recorder` is this object):

  * a lock (a halt with a locking cause) and its lift, with who lifted it: an event
    (cause on_governor_agent_lock, action halt / continue) in the record of the session that
    caused it, while that session's journal is open, and always in the audit journal;
  * the refusal that hit the agent-named cap (cause on_governor_session_cap, action halt): in
    the audit journal, since it belongs to no session;
  * a refusal the proxy made on its own, before any step was decided (a model call on a
    path no adapter claims, a stream whose held-back output outgrew its bound: cause
    on_governor_request_refused, action fallback), in the record of the session it belongs to;
  * the tools the proxy withheld from a request or a tools/list answer (cause
    on_governor_tools_withheld, action fallback), likewise;
  * an ephemeral Realtime key the operator allowed to be minted (cause on_governor_key_minted,
    action continue: the step went ahead; what the key spends is not governed), likewise.

The audit journal is a session journal like any other (`governor.evidence.Journal`),
`<data-dir>/audit/audit-<digest>.jsonl`, one per admitted passport digest; after each
event its signed record is written to `<data-dir>/audit/audit-<digest>.json`, which
`governor verify` checks as it checks a session's record.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable

from governor.evidence import Journal, SessionHeader, journal_path, recover_journal, sign_record, write_record
from governor.notify import events as notify
from governor.policy.causes import ON_GOVERNOR_KEY_MINTED as ON_KEY_MINTED  # docs/realtime.md
from governor.policy.steps import ON_REQUEST_REFUSED
from governor.policy.tools import ON_TOOLS_WITHHELD
from governor.policy.causes import ON_GOVERNOR_IDENTITY
from governor.runtime.session import LiveSession
from governor.runtime.settings import RuntimeSettings
from governor.sessions.book import SessionBook
from governor.sessions.entries import HOW_TO_OPEN, ON_AGENT_LOCK, Lock

log = logging.getLogger("governor.runtime")



def audit_paths(data_dir: Path, passport_digest: str) -> tuple[Path, Path, str]:
    """(journal, signed record, session name) of the audit journal for a passport digest."""
    stem = "audit-" + "".join(c for c in passport_digest if c.isalnum())[:16]
    return data_dir / "audit" / f"{stem}.jsonl", data_dir / "audit" / f"{stem}.json", f"governor-{stem}"


class AuditTrail:
    """Locks, lifts, the proxy's own refusals and the audit journal, for the runtime's sessions.
    `open_session` opens a live session (the runtime's, as its first request would)."""

    def __init__(self, *, sessions: dict[str, LiveSession],
                 open_session: Callable[[str], Awaitable[LiveSession]], data_dir: Path, settings: RuntimeSettings,
                 key: Any, governor_id: str, agent_id: str, clock: Callable[[], float], shared: Any = None) -> None:
        self.sessions = sessions
        self.shared = shared  # governor.runtime.shared.SharedSteps: a lock's session may be another replica's
        self.open_session = open_session
        self.data_dir = data_dir
        self.settings = settings  # limits, journal_sync, notifier: the runtime's, as they are now
        self.key = key
        self.governor_id = governor_id
        self.agent_id = agent_id
        self.clock = clock
        self.book: SessionBook | None = None
        self._audit: Journal | None = None
        self._audit_guard = threading.Lock()

    def attach(self, book: SessionBook) -> None:
        """Use `book` for who may act: its locks and lifts are recorded here, and it learns of ends."""
        self.book = book
        book.recorder = self  # type: ignore[assignment]

    # --- locks -------------------------------------------------------------------------

    async def on_halt(self, session: str, cause: str | None) -> None:
        """A session halted with `cause`: tell the operator how to go on, and lock the agent
        when the cause is a locking one."""
        log.warning("session %s HALTED (%s); it stays halted: %s", session, cause, HOW_TO_OPEN)
        self.settings.notifier.emit(notify.session_halted(self.agent_id, session, cause))
        book = self.book
        if book is None or cause not in book.lock_causes:
            return
        lock = book.lock(session, cause)
        if lock is not None:
            self.settings.notifier.emit(notify.agent_locked(self.agent_id, session, lock.id, cause))
            try:
                await self.record_lock(lock, lifted=False)
            except Exception:  # the lock holds regardless: refusing everything is the safe side
                log.exception("the lock %s of session %s could not be recorded", lock.id, session)

    async def record_lock(self, lock: Lock, *, lifted: bool) -> None:
        """Journal a lock or its lift in the session that caused it (while its journal is
        open) and in the audit journal. Raises when it cannot be recorded."""
        detail: dict[str, Any] = {"lock": lock.id, "locked_by": lock.cause, "session": lock.session}
        if lifted:
            detail["lifted_by"] = lock.lifted_by
        action = "continue" if lifted else "halt"
        now = lock.lifted_at if lifted else lock.at
        live = self.sessions.get(lock.session)
        if live is None and self.shared is not None and await asyncio.to_thread(self.shared.sessions.has_chain,
                                                                                 lock.session):
            live = await self.open_session(lock.session)  # its chain is in the store: the lift goes there
        if live is not None and not live.ended and live.journal.ending is None:
            await asyncio.to_thread(live.journal.append, ON_AGENT_LOCK, action, now, detail)
            detail = {**detail, "in_session_record": True}
        else:
            detail = {**detail, "in_session_record": False,
                      "note": "the session's journal had ended (restart or principal end): recorded here only"}
        await self.record_audit(ON_AGENT_LOCK, action, detail, at=now)

    # --- the proxy's own refusals ------------------------------------------------------

    async def record_refusal(self, session: str, detail: dict[str, Any]) -> bool:
        """Journal a refusal the proxy made before (or without) admitting a step, in
        `session`'s record (opened when new, as its first request would). False when the
        session has ended (nothing can be added to its record); raises when the journal
        cannot be written. The journal serializes appends itself: no session lock."""
        return await self._record_proxy_event(session, ON_REQUEST_REFUSED, detail)

    async def record_withheld(self, session: str, detail: dict[str, Any]) -> bool:
        """Journal the tools the proxy withheld from a request or an MCP tools/list answer
        (governor/proxy/withheld.py), in `session`'s record; as `record_refusal`."""
        return await self._record_proxy_event(session, ON_TOOLS_WITHHELD, detail)

    async def record_minted(self, session: str, detail: dict[str, Any]) -> bool:
        """Journal an ephemeral key minted through the governor (governor/proxy/realtime_sockets.py):
        action continue, the minting went ahead; as `record_refusal`."""
        return await self._record_proxy_event(session, ON_KEY_MINTED, detail, "continue")

    async def record_identity(self, session: str, detail: dict[str, Any]) -> bool:
        """Journal the persona and lineage a principal bound to the session as it opened
        (governor.sessions.identity): its record names them; action continue."""
        return await self._record_proxy_event(session, ON_GOVERNOR_IDENTITY, detail, "continue")

    async def _record_proxy_event(self, session: str, cause: str, detail: dict[str, Any],
                                  action: str = "fallback") -> bool:
        live = self.sessions.get(session) or await self.open_session(session)
        if live.ended or live.journal.ending is not None:
            return False
        await asyncio.to_thread(live.journal.append, cause, action, self.clock(), detail)
        return True

    # --- the audit journal -------------------------------------------------------------

    async def record_audit(self, cause: str, action: str, detail: dict[str, Any], *, at: float | None = None) -> None:
        await asyncio.to_thread(self._audit_append, cause, action, self.clock() if at is None else at, detail)

    def audit_event(self, cause: str, action: str, at: float, detail: dict[str, Any]) -> None:
        """Journal one event in the audit journal (and write its record). Blocking."""
        self._audit_append(cause, action, at, detail)

    def _audit_append(self, cause: str, action: str, at: float, detail: dict[str, Any]) -> None:
        with self._audit_guard:
            journal = self._audit_journal()
            journal.append(cause, action, at, detail)
            _, record_file, _ = audit_paths(self.data_dir, self.settings.limits.passport_digest)
            write_record(record_file, self._audit_signed(None))

    def _audit_journal(self) -> Journal:
        if self._audit is None:
            path, _, session = audit_paths(self.data_dir, self.settings.limits.passport_digest)
            if path.exists():
                self._audit = Journal.open(path, repair_torn_tail=True, sync=self.settings.journal_sync)
            else:
                header = SessionHeader(
                    governor=self.governor_id,
                    subject_id=self.settings.limits.passport_id or self.agent_id,
                    passport_digest=self.settings.limits.passport_digest,
                    session=session, tier=self.settings.limits.tier.value, start=self.clock(),
                )
                self._audit = Journal.create(path, header, sync=self.settings.journal_sync)
        return self._audit

    def _audit_signed(self, nonce: str | None) -> dict[str, Any]:
        assert self._audit is not None
        now = self.clock()
        book = self.book
        outcome = "halted" if book is not None and book.locked else "completed"
        return sign_record(self._audit.record.build(outcome=outcome, end=now, iat=now, nonce=nonce), self.key)

    def audit_record(self, nonce: str | None = None) -> dict[str, Any] | None:
        """The audit journal's record, freshly signed; None while it holds nothing."""
        path, _, _ = audit_paths(self.data_dir, self.settings.limits.passport_digest)
        if self._audit is None and not path.exists():
            return None
        with self._audit_guard:
            self._audit_journal()
            return self._audit_signed(nonce)

    def close(self) -> None:
        if self._audit is not None:
            self._audit.close()
            self._audit = None

    # --- sessions ------------------------------------------------------------------------

    def session_ended(self, session: str, halt_cause: str | None) -> None:
        if self.book is not None:
            self.book.ended(session, halt_cause)

    def ended_record(self, session: str, nonce: str | None = None) -> dict[str, Any] | None:
        """The record of a session that ended before this process started (a start finalized
        it, or an earlier process ended it), signed afresh from its ended journal, bound to
        `nonce` when given; None when there is no such ended journal. Blocking: a file read."""
        path = journal_path(self.data_dir, session)
        if not path.exists():
            return None
        recovery = recover_journal(path)
        if recovery.ending is None or recovery.header.session != session:
            return None  # one still running is the runtime's; a digest-named file of another id is not it
        if nonce is None and self.book is not None:
            nonce = self.book.nonce(session)
        return sign_record(recovery.build(iat=self.clock(), nonce=nonce), self.key)


__all__ = ["AuditTrail", "audit_paths"]
