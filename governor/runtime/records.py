"""How a session ends and what it leaves: `end_session` (the last wall-clock settled, the
journal closed with its outcome, held steps refused, the final record signed and
written) and `record` (a signed snapshot of a running session's record).

`Records` is handed the live-session table, the runtime's step path and the collaborators
an end touches (approvals, persona instances, the audit trail) in its constructor. The
record's format and signature are the evidence room's (governor.evidence); this decides
when a record is made and with which outcome.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from governor.evidence import JournalClosedError, journal_path, record_path, sign_record, write_record
from governor.policy import SessionEnd
from governor.runtime.api import admission_for
from governor.runtime.approvals import Apply, Approvals
from governor.runtime.audit import AuditTrail
from governor.runtime.refusals import ended_refusal
from governor.runtime.session import LiveSession
from governor.runtime.shared_proofs import SharedProofs
from governor.store import StoreError

if TYPE_CHECKING:
    from governor.runtime.metrics import Metrics
    from governor.runtime.personas import PersonaInstances


log = logging.getLogger("governor.runtime")

# a shared session another replica ended: how long its record is waited for before it is
# signed here (that replica may have died between its end line and its record)
ENDED_RECORD_POLLS = 20
ENDED_RECORD_POLL_SEC = 0.1


class Records:
    """Session ends and signed records. `open_session` opens a live session (resumed when it
    is not live yet); `ended` is told of each session this ends, once its record is written."""

    def __init__(self, *, sessions: dict[str, LiveSession], data_dir: Path, key: Any, metrics: Metrics,
                 clock: Callable[[], float], open_session: Callable[[str], Awaitable[LiveSession]], apply: Apply,
                 approvals: Approvals, personas: PersonaInstances, audit: AuditTrail,
                 ended: Callable[[str, str | None], None], transparency_log: Any = None,
                 witnessing: Any = None, shared: Any = None) -> None:
        self.sessions = sessions
        self.shared = shared  # governor.runtime.shared.SharedSteps: the session may end on any replica
        # the transparency log (governor.evidence.translog): each final record's entry is
        # appended durably before the record is written; None: records are not logged
        self.transparency_log = transparency_log
        self.witnessing = witnessing  # proofs only at checkpoints a quorum of witnesses cosigned
        self.write_final = transparency_log.write_record if transparency_log is not None else write_record
        # a shared session's record may be asked for with its proof on any replica (runtime/shared_proofs.py)
        self.proofs = SharedProofs(sessions=shared.sessions, key=key, transparency_log=transparency_log,
                                   witnessing=witnessing) if shared is not None else None
        self.data_dir = data_dir
        self.key = key
        self.metrics = metrics
        self.clock = clock
        self.open_session = open_session
        self.apply = apply
        self.approvals = approvals
        self.personas = personas
        self.audit = audit
        self.ended = ended

    @staticmethod
    def outcome(live: LiveSession) -> str:
        if live.state.halted:
            return "halted"
        if live.pending:
            return "paused"
        return "completed"

    async def end_session(self, session: str) -> dict[str, Any]:
        if session not in self.sessions and not journal_path(self.data_dir, session).exists() and not (
                self.shared is not None and await asyncio.to_thread(self.shared.sessions.has_chain, session)):
            raise KeyError(session)
        live = await self.open_session(session)
        if not live.ended:  # each persona instance's end is recorded beside its spawn
            await self.personas.end_all(session, "session_end")
        async with live.lock:
            if live.ended and self.shared is not None:
                return await self.ended_elsewhere(live)
            if live.ended:
                return live.final_record or self.signed(live, None)
            await self.apply(live, SessionEnd(), None)
            if live.ended and self.shared is not None:  # another replica ended it meanwhile
                return await self.ended_elsewhere(live)
            outcome = self.outcome(live)
            now = self.clock()
            try:
                await asyncio.to_thread(live.journal.end, outcome, now)
            except JournalClosedError:
                if self.shared is None or live.journal.ending is None:
                    raise
                return await self.ended_elsewhere(live)  # another replica's end line got in first
            live.ended = True
            if self.shared is not None:
                await asyncio.to_thread(self.shared.mark_ended, live)
            live.restate(self.metrics)
            for approval_id in list(live.pending):  # a held step never runs after its session ended
                self.approvals.answer(live, approval_id, False, admission_for(live.id, ended_refusal(live), None),
                                      "session_ended")
            record = self.signed(live, None, kind="final")
            await asyncio.to_thread(self.write_final, record_path(self.data_dir, session), record)
            live.final_record = record
            if self.shared is not None:  # any replica serves it (and its proof, once published)
                await asyncio.to_thread(self.proofs.put_record, session, record)  # type: ignore[union-attr]
        self.ended(session, live.state.halt_cause if live.state.halted else None)
        return record

    async def ended_elsewhere(self, live: LiveSession) -> dict[str, Any]:
        """A shared session whose chain holds its end: the record the replica that ended it
        wrote; when that replica died before writing it, signed and written here (one record
        per session: only after waiting for the other's). Lock held."""
        sessions = self.shared.sessions  # type: ignore[union-attr]
        if live.final_record is not None:
            return live.final_record
        live.ended = True
        live.restate(self.metrics)
        record = None
        for _ in range(ENDED_RECORD_POLLS):
            record = await asyncio.to_thread(sessions.get_record, live.id)
            if record is not None or live.journal.ending is None:
                break
            await asyncio.sleep(ENDED_RECORD_POLL_SEC)
        if record is None:
            await asyncio.to_thread(live.journal.refresh)
            record = self.signed(live, None, kind="final")
            await asyncio.to_thread(self.write_final, record_path(self.data_dir, live.id), record)
            await asyncio.to_thread(self.proofs.put_record, live.id, record)  # type: ignore[union-attr]
            record = await asyncio.to_thread(sessions.get_record, live.id) or record  # the first one written stands
        live.final_record = record
        await asyncio.to_thread(sessions.forget_activity, live.id)
        for approval_id in list(live.pending):
            self.approvals.answer(live, approval_id, False, admission_for(live.id, ended_refusal(live), None),
                                  "session_ended")
        self.ended(live.id, live.state.halt_cause if live.state.halted else None)
        return record

    async def publish_proofs(self) -> None:
        """At a stop: the proofs of shared records this replica logged and has not published
        yet (runtime/shared_proofs.py), so that no other replica waits for them in vain."""
        if self.proofs is None or self.transparency_log is None:
            return
        try:
            await asyncio.to_thread(self.proofs.publish, stopping=True)
        except StoreError:
            log.warning("the proofs of the shared records this replica logged could not be published at its stop: "
                        "they are published at its next start on this data directory")

    async def end_by_principal(self, session: str) -> dict[str, Any]:
        """A principal ends `session` (the control plane): one opened but never used gets
        its (empty) record too, and a halted default session is released."""
        book = self.audit.book
        entry = book.get(session) if book is not None else None
        if entry is not None and session not in self.sessions and entry.ended_at is None:
            await self.open_session(session)
        record = await self.end_session(session)
        if book is not None:
            book.ended_by_principal(session)
        return record

    async def final_record_with_proof(self, session: str) -> tuple[dict[str, Any], bytes]:
        """An ended session's final record as it was logged (read back from its file) and a
        C2SP tlog-proof of it (a checkpoint made now when the latest does not hold it).
        KeyError: no final record; LookupError: no transparency log, or the record is not in it."""
        if self.transparency_log is None:
            raise LookupError("this governor keeps no transparency log")
        path = record_path(self.data_dir, session)
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise KeyError(session) from None
        record = json.loads(data)
        prove = self.witnessing.prove if self.witnessing is not None else self.transparency_log.prove
        proof = await asyncio.to_thread(prove, record)  # NotWitnessed: no cosigned checkpoint holds it
        return record, proof

    def record(self, session: str, nonce: str | None = None) -> dict[str, Any]:
        live = self.sessions.get(session)
        if live is None:
            raise KeyError(session)
        return self.signed(live, nonce)

    def signed(self, live: LiveSession, nonce: str | None, *, kind: str = "snapshot") -> dict[str, Any]:
        now = self.clock()
        book = self.audit.book
        if nonce is None and book is not None:
            nonce = book.nonce(live.id)  # the counterparty nonce the session was opened with (§8.5)
        ending = live.journal.ending
        if ending is not None:
            outcome, end = ending.outcome, ending.at
        else:
            # a record of a running session: its outcome so far (the format has no "running")
            outcome, end = self.outcome(live), now
        record = sign_record(live.journal.record.build(outcome=outcome, end=end, iat=now, nonce=nonce), self.key)
        self.metrics.record_signed(kind, nonce=nonce is not None)
        return record


__all__ = ["Records"]
