"""How a session ends and what it leaves: `end_session` (the last wall-clock settled, the
journal closed with its outcome, held steps refused, the final record signed and
written) and `record` (a signed snapshot of a running session's record).

Mixed into `governor.runtime.core.Runtime` (kept apart: runtime.py is long enough). The
record's format and signature are the evidence room's (governor.evidence); this decides
when a record is made and with which outcome.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from governor.evidence import journal_path, record_path, sign_record, write_record
from governor.policy import SessionEnd
from governor.runtime.refusals import ended_refusal

if TYPE_CHECKING:
    from governor.runtime.core import _Session


class RuntimeRecords:
    """Session ends and signed records, for `governor.runtime.core.Runtime`."""

    def _outcome(self, live: _Session) -> str:
        if live.state.halted:
            return "halted"
        if live.pending:
            return "paused"
        return "completed"

    async def end_session(self, session: str) -> dict[str, Any]:
        if session not in self._sessions and not journal_path(self.data_dir, session).exists():
            raise KeyError(session)
        live = await self._session(session)
        if not live.ended:  # each persona instance's end is recorded beside its spawn
            await self.personas.end_all(session, "session_end")
        async with live.lock:
            if live.ended:
                return live.final_record or self._signed(live, None)
            await self._apply(live, SessionEnd(), None)
            outcome = self._outcome(live)
            now = self.clock()
            await asyncio.to_thread(live.journal.end, outcome, now)
            live.ended = True
            self._restate(live)
            for approval_id in list(live.pending):  # a held step never runs after its session ended
                self._answer(live, approval_id, False, self._admission(live.id, ended_refusal(live), None), "session_ended")
            record = self._signed(live, None, kind="final")
            await asyncio.to_thread(write_record, record_path(self.data_dir, session), record)
            live.final_record = record
        self._session_ended(session, live.state.halt_cause if live.state.halted else None)
        self.metrics.forget_session(session)
        self.personas.forget(session)
        if session == self._default_session:
            self._default_session = self._new_default_session()
        return record

    def record(self, session: str, nonce: str | None = None) -> dict[str, Any]:
        live = self._sessions.get(session)
        if live is None:
            raise KeyError(session)
        return self._signed(live, nonce)

    def _signed(self, live: _Session, nonce: str | None, *, kind: str = "snapshot") -> dict[str, Any]:
        now = self.clock()
        if nonce is None and self.session_book is not None:
            nonce = self.session_book.nonce(live.id)  # the counterparty nonce the session was opened with (§8.5)
        ending = live.journal.ending
        if ending is not None:
            outcome, end = ending.outcome, ending.at
        else:
            # a record of a running session: its outcome so far (the format has no "running")
            outcome, end = self._outcome(live), now
        record = sign_record(live.journal.record.build(outcome=outcome, end=end, iat=now, nonce=nonce), self.key)
        self.metrics.record_signed(kind, nonce=nonce is not None)
        return record
