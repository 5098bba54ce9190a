"""The record every replica serves of a session shared by replicas (`GET
/v1/sessions/{id}/record`; docs/reference/shared-sessions.md, "Records").

An ended session's record is the one final record written once, by the replica that ended
it, into the store (`rec:<session>`): every replica serves those bytes, whatever it still
holds of the session in memory. A replica that served the session before another ended it
learns the end here (its copy of the chain and state read again first) and stops serving
its stale copy: its live session is marked ended with that record, as if it had tried to
end it. With a nonce the record is signed afresh over the whole ended chain, bound to it.

An open session's record is interim: signed now over the chain as it stands in the store
(every replica's events, in the chain's order) with the outcome so far, and said to be
interim so the control plane can tell the caller.

When the store lost its data (a fence gone: FLUSHALL, a lossy failover: the store's
`integrity` names the loss), the shared chain is gone for good and waiting will not bring it
back: a replica that holds the session serves its own copy, signed now and said to be `local`
(this replica's events only; the loss and the refusals since are among them), rather than
nothing. Any other integrity error (a budget counter forged in the store, CounterDamaged) is
not that loss and is answered as what it is (RecordStoreDamaged); one raised while the store
names no loss (an acknowledgement on another replica just cleared it) is retryable.

`proved` is the final record with its transparency-log proof (runtime/shared_proofs.py):
served by any replica once the session ended on any replica.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from governor.runtime.records import Records
from governor.runtime.session import LiveSession
from governor.runtime.shared_proofs import ProofStoreUnavailable
from governor.store import CounterDamaged, StoreError, StoreIntegrityError


class RecordUnavailable(Exception):
    """The store did not answer: no record can be served that is known to be current."""


class RecordUnreadable(Exception):
    """The session's state in the store is no session state (edited there): no record is signed."""


class RecordStoreDamaged(Exception):
    """The store holds damaged data the record's reads met (not a loss of the chain): the
    message names it; waiting does not mend it."""


class NotFinal(Exception):
    """A proof was asked of a session with no final record (`kind` says what it has instead:
    "interim", an open session; "local", the store lost the shared chain)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class SharedRecords:
    def __init__(self, *, records: Records, steps: Any, sessions: dict[str, LiveSession],
                 open_session: Callable[[str], Awaitable[LiveSession]]) -> None:
        self.records = records  # signs records and takes the record of a session ended elsewhere
        self.steps = steps  # governor.runtime.shared.SharedSteps: the store's sessions, state reads
        self.sessions = sessions  # the runtime's live-session table
        self.open_session = open_session

    async def known(self, session: str) -> bool:
        """Whether `session` is one this replica or the store holds (RecordUnavailable: the
        store did not answer)."""
        if session in self.sessions:
            return True
        try:
            return await asyncio.to_thread(self.steps.sessions.has_chain, session)
        except StoreError as exc:
            raise RecordUnavailable(str(exc)) from None

    async def record(self, session: str, nonce: str | None = None) -> tuple[dict[str, Any], str]:
        """(the session's record, its kind: "final", "interim" or "local"). KeyError: no such
        session; RecordUnavailable: the store did not answer; RecordUnreadable: its state is
        damaged; RecordStoreDamaged: the store holds damaged data; EvidenceError: its chain
        is damaged."""
        try:
            record, ended = await self._record(session, nonce)
            return record, "final" if ended else "interim"
        except CounterDamaged as exc:  # a forged counter is not a lost chain (module docstring)
            raise RecordStoreDamaged(str(exc)) from None
        except StoreIntegrityError as exc:
            live = self.sessions.get(session)
            if live is None or getattr(self.steps.store, "integrity", None) is None:
                raise RecordUnavailable(str(exc)) from None
            async with live.lock:  # the store lost the chain: this replica's own copy (module docstring)
                return self.records.signed(live, nonce), "local"
        except StoreError as exc:
            raise RecordUnavailable(str(exc)) from None
        except ValueError as exc:  # the written record edited in the store: not JSON (UnicodeDecodeError too)
            raise RecordUnreadable(f"the session's record in the store is unreadable: {type(exc).__name__}: "
                                   f"{exc}") from None

    async def proved(self, session: str) -> tuple[dict[str, Any], bytes]:
        """The session's final record and its C2SP tlog-proof, on any replica. As `record`, and
        NotFinal (no final record), RecordUnavailable (the store did not answer), and
        shared_proofs' ProofPending, ProofNotLogged, ProofInvalid; NotWitnessed."""
        record, kind = await self.record(session)
        if kind != "final":
            raise NotFinal(kind)
        try:
            return record, await asyncio.to_thread(self.records.proofs.proof, session, record)  # type: ignore[union-attr]
        except ProofStoreUnavailable as exc:
            raise RecordUnavailable(str(exc)) from None

    async def _record(self, session: str, nonce: str | None) -> tuple[dict[str, Any], bool]:
        store = self.steps.sessions
        live = self.sessions.get(session)
        if live is not None and live.final_record is not None and nonce is None:
            return live.final_record, True
        if live is None:  # never served here: the written record, without opening the session
            written = await asyncio.to_thread(store.get_record, session) if nonce is None else None
            if written is not None:
                return written, True
            if not await asyncio.to_thread(store.has_chain, session):
                raise KeyError(session)
            live = await self.open_session(session)
        async with live.lock:  # (between rounds of this replica: the state and chain as one round left them)
            await asyncio.to_thread(self._read_again, live)
            if live.ended or live.journal.ending is not None:
                final = await self.records.ended_elsewhere(live)  # the one written (signed here if its ender died)
                return (final, True) if nonce is None else (self.records.signed(live, nonce), True)
            return self.records.signed(live, nonce), False

    def _read_again(self, live: LiveSession) -> None:
        """The session's state and chain as the store holds them now (another replica's events,
        its end). Blocking."""
        try:
            self.steps.load_state(live)
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordUnreadable(f"the session's state in the store is unreadable: {type(exc).__name__}: {exc}") \
                from None
        live.journal.refresh()


__all__ = ["NotFinal", "RecordStoreDamaged", "RecordUnavailable", "RecordUnreadable", "SharedRecords"]
