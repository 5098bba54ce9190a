"""The runtime's side of the session book: locks, lifts and the governor's audit journal.

Mixed into `governor.runtime.core.Runtime` (kept apart: runtime.py is long enough). The book
(`governor.sessions`) decides who may act; this records what it enforced:

  * a lock (a halt with a locking cause) and its lift, with who lifted it: an event
    (cause on_agent_lock, action halt / continue) in the record of the session that
    caused it, while that session's journal is open, and always in the audit journal;
  * the refusal that hit the agent-named cap (cause on_session_cap, action halt): in
    the audit journal, since it belongs to no session;
  * a refusal the proxy made on its own, before any step was decided (a model call on a
    path no adapter claims, a stream whose held-back output outgrew its bound: cause
    on_request_refused, action fallback), in the record of the session it belongs to;
  * the tools the proxy withheld from a request or a tools/list answer (cause
    on_tools_withheld, action fallback), likewise.

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
from typing import Any

from governor.evidence import Journal, SessionHeader, journal_path, recover_journal, sign_record, write_record
from governor.notify import events as notify
from governor.policy.steps import ON_REQUEST_REFUSED
from governor.policy.tools import ON_TOOLS_WITHHELD
from governor.sessions import HOW_TO_OPEN, ON_AGENT_LOCK, Lock, SessionBook, halted_reason

log = logging.getLogger("governor.runtime")


def audit_paths(data_dir: Path, passport_digest: str) -> tuple[Path, Path, str]:
    """(journal, signed record, session name) of the audit journal for a passport digest."""
    stem = "audit-" + "".join(c for c in passport_digest if c.isalnum())[:16]
    return data_dir / "audit" / f"{stem}.jsonl", data_dir / "audit" / f"{stem}.json", f"governor-{stem}"


class SessionEvidence:
    """Mixin for Runtime: uses self.data_dir, limits, key, governor_id, agent_id, clock,
    journal_sync, metrics and _sessions."""

    session_book: SessionBook | None = None
    _audit: Journal | None = None
    _audit_guard: threading.Lock | None = None

    def attach_sessions(self, book: SessionBook) -> None:
        """Use `book` for who may act: the runtime records its locks and learns of ends."""
        self.session_book = book
        book.recorder = self  # type: ignore[assignment]

    # --- locks -------------------------------------------------------------------------

    async def _on_halt(self, session: str, cause: str | None) -> None:
        """A session halted with `cause`: tell the operator how to go on, and lock the agent
        when the cause is a locking one."""
        log.warning("session %s HALTED (%s); it stays halted: %s", session, cause, HOW_TO_OPEN)
        self.notifier.emit(notify.session_halted(self.agent_id, session, cause))  # type: ignore[attr-defined]
        book = self.session_book
        if book is None or cause not in book.lock_causes:
            return
        lock = book.lock(session, cause)
        if lock is not None:
            self.notifier.emit(notify.agent_locked(self.agent_id, session, lock.id, cause))  # type: ignore[attr-defined]
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
        live = self._sessions.get(lock.session)  # type: ignore[attr-defined]
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

    async def _record_proxy_event(self, session: str, cause: str, detail: dict[str, Any]) -> bool:
        live = self._sessions.get(session) or await self._session(session)  # type: ignore[attr-defined]
        if live.ended or live.journal.ending is not None:
            return False
        await asyncio.to_thread(live.journal.append, cause, "fallback", self.clock(), detail)  # type: ignore[attr-defined]
        return True

    # --- the audit journal -------------------------------------------------------------

    async def record_audit(self, cause: str, action: str, detail: dict[str, Any], *, at: float | None = None) -> None:
        await asyncio.to_thread(self._audit_append, cause, action, self.clock() if at is None else at, detail)  # type: ignore[attr-defined]

    def _audit_append(self, cause: str, action: str, at: float, detail: dict[str, Any]) -> None:
        if self._audit_guard is None:
            self._audit_guard = threading.Lock()
        with self._audit_guard:
            journal = self._audit_journal()
            journal.append(cause, action, at, detail)
            _, record_file, _ = audit_paths(self.data_dir, self.limits.passport_digest)  # type: ignore[attr-defined]
            write_record(record_file, self._audit_signed(None))

    def _audit_journal(self) -> Journal:
        if self._audit is None:
            path, _, session = audit_paths(self.data_dir, self.limits.passport_digest)  # type: ignore[attr-defined]
            if path.exists():
                self._audit = Journal.open(path, repair_torn_tail=True, sync=self.journal_sync)  # type: ignore[attr-defined]
            else:
                header = SessionHeader(
                    governor=self.governor_id,  # type: ignore[attr-defined]
                    subject_id=self.limits.passport_id or self.agent_id,  # type: ignore[attr-defined]
                    passport_digest=self.limits.passport_digest,  # type: ignore[attr-defined]
                    session=session, tier=self.limits.tier.value, start=self.clock(),  # type: ignore[attr-defined]
                )
                self._audit = Journal.create(path, header, sync=self.journal_sync)  # type: ignore[attr-defined]
        return self._audit

    def _audit_signed(self, nonce: str | None) -> dict[str, Any]:
        assert self._audit is not None
        now = self.clock()  # type: ignore[attr-defined]
        book = self.session_book
        outcome = "halted" if book is not None and book.locked else "completed"
        return sign_record(self._audit.record.build(outcome=outcome, end=now, iat=now, nonce=nonce), self.key)  # type: ignore[attr-defined]

    def audit_record(self, nonce: str | None = None) -> dict[str, Any] | None:
        """The audit journal's record, freshly signed; None while it holds nothing."""
        path, _, _ = audit_paths(self.data_dir, self.limits.passport_digest)  # type: ignore[attr-defined]
        if self._audit is None and not path.exists():
            return None
        if self._audit_guard is None:
            self._audit_guard = threading.Lock()
        with self._audit_guard:
            self._audit_journal()
            return self._audit_signed(nonce)

    def _close_audit(self) -> None:
        if self._audit is not None:
            self._audit.close()
            self._audit = None

    # --- sessions ------------------------------------------------------------------------

    def _session_ended(self, session: str, halt_cause: str | None) -> None:
        if self.session_book is not None:
            self.session_book.ended(session, halt_cause)

    async def open_session(self, session: str) -> None:
        """Start a session the book opened for a principal: its journal (the record's window
        starts here) and its place in the session list."""
        await self._session(session)  # type: ignore[attr-defined]

    async def end_session_by_principal(self, session: str) -> dict[str, Any]:
        """A principal ends `session` (the control plane): one opened but never used gets
        its (empty) record too, and a halted default session is released."""
        book = self.session_book
        entry = book.get(session) if book is not None else None
        if entry is not None and session not in self._sessions and entry.ended_at is None:  # type: ignore[attr-defined]
            await self._session(session)  # type: ignore[attr-defined]
        record = await self.end_session(session)  # type: ignore[attr-defined]
        if book is not None:
            book.ended_by_principal(session)
        return record

    def ended_record(self, session: str, nonce: str | None = None) -> dict[str, Any] | None:
        """The record of a session that ended before this process started (a start finalized
        it, or an earlier process ended it), signed afresh from its ended journal, bound to
        `nonce` when given; None when there is no such ended journal. Blocking: a file read."""
        path = journal_path(self.data_dir, session)  # type: ignore[attr-defined]
        if not path.exists():
            return None
        recovery = recover_journal(path)
        if recovery.ending is None or recovery.header.session != session:
            return None  # one still running is the runtime's; a digest-named file of another id is not it
        if nonce is None and self.session_book is not None:
            nonce = self.session_book.nonce(session)
        return sign_record(recovery.build(iat=self.clock(), nonce=nonce), self.key)  # type: ignore[attr-defined]

    def _halted_object(self, obj: dict[str, Any], cause: str | None) -> dict[str, Any]:
        """The refusal of a step in a halted session says so, why, and what to do."""
        obj["reason"] = halted_reason(cause)
        return obj


__all__ = ["SessionEvidence", "audit_paths"]
