"""Sessions across a governor restart: start-up finalization, the passport archive, anti-swap.

The rule, and why:
  * A restart ends every session the governor was governing. Whatever the governor held
    only in memory (requests held for review, in-flight steps, the last second of
    bookkeeping) is gone, so a session cannot be continued faithfully: at start-up, before
    the proxy serves, every journal without an end is finalized as halted and signed
    (`governor.evidence.finalize`), listed by `GET /v1/sessions` and served by `/record`.
    A graceful stop ends its sessions itself (`Runtime.close`).
  * A session may still be *resumed* from its state in the store (a shared store, a session
    a replica opened, a journal removed): its saved state carries the pin it was admitted
    with (`PIN_KEY`: passport digest, tier, subject). When that pin is not
    the governor's (another passport, re-signed, or another tier), §1.3 anti-swap applies:
    a session-integrity fault, resolved with the session's ORIGINAL passport's degradation
    (halt by default), recorded in its journal, whose header keeps naming the original
    passport. If the original declares something other than halt, the session goes on under
    its ORIGINAL limits, compiled from the archived passport (`<data-dir>/passports/<digest>.json`,
    written at every start and checked against the digest when read); when they cannot be
    reconstructed, it halts (fail closed). A saved state without a pin (another version or
    writer) is treated the same way: its pin is unknown.
  * New sessions use the new passport; per-day counters stay keyed by agent.

`Resumption` opens every session (new under the governor's pin, or resumed and checked
against it) and finalizes at start-up, with what it needs (the governor's pin, the store,
the journal directory, the signing key) from its constructor; the passport archive is
plain functions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from governor.common.canonical import canonicalize, sha256_b64url
from governor.evidence.finalize import FinalizeReport, Pin, finalize_interrupted
from governor.evidence.record import SessionHeader, write_durably, write_record
from governor.evidence import Journal, journal_path
from governor.evidence.deferred_spool import DeferredSpool
from governor.evidence.shared_journal import SharedJournal
from governor.policy import ON_GOVERNOR_ERROR, Limits, PassportPresented, SessionState, Tier, advance, compile_limits
from governor.policy.integrity import pin_changed
from governor.runtime.session import PIN_KEY, LiveSession
from governor.runtime.settings import RuntimeSettings
from governor.store import Store

log = logging.getLogger("governor.runtime")

PASSPORTS_DIR = "passports"
_DIGEST = re.compile(r"^[A-Za-z0-9_-]{43}$")


# --- the pin a session carries ---------------------------------------------------------


def saved_pin(saved: Mapping[str, Any] | None) -> dict[str, Any] | None:
    pin = saved.get(PIN_KEY) if saved else None
    if isinstance(pin, Mapping) and isinstance(pin.get("digest"), str) and isinstance(pin.get("tier"), str):
        return dict(pin)
    return None


# --- the passport archive --------------------------------------------------------------


def archive_passport(data_dir: Path | str, digest: str, canonical_bytes: bytes) -> Path:
    """Keep the admitted passport's canonical bytes under its digest, so a session admitted
    with it can be governed by its own limits after a restart with another passport."""
    directory = Path(data_dir) / PASSPORTS_DIR
    path = directory / f"{digest}.json"
    if path.exists() or not _DIGEST.match(digest):
        return path
    return write_durably(path, canonical_bytes)


def original_limits(data_dir: Path | str, digest: str, tier: str, pricing: Any) -> Limits | None:
    """The limits a session was admitted with, from the archived passport; None when the
    passport is not archived, does not hash to `digest`, or does not compile."""
    if not _DIGEST.match(digest):
        return None
    path = Path(data_dir) / PASSPORTS_DIR / f"{digest}.json"
    try:
        document = json.loads(path.read_bytes())
        if sha256_b64url(canonicalize(document)) != digest:
            log.error("archived passport %s does not hash to its digest: not used", path)
            return None
        return compile_limits(document, tier=Tier(tier), pricing=pricing, passport_digest=digest)
    except FileNotFoundError:
        return None
    except Exception:
        log.exception("archived passport %s cannot be compiled", path)
        return None


# --- resumption and start-up finalization ------------------------------------------------


class Resumption:
    """The governor's pin on the sessions it opens: a session opened new (its journal header
    names the pin) or resumed from its journal or its state in the store (its pin checked
    against the governor's), and the finalization at start-up of the sessions a previous
    process left without an end."""

    def __init__(self, *, store: Store, data_dir: Path, key: Any, clock: Callable[[], float],
                 settings: RuntimeSettings, governor_id: str, agent_id: str,
                 write_final: Callable[..., Path] = write_record, shared: Any = None) -> None:
        self.store = store
        self.shared = shared  # governor.runtime.shared.SharedSteps: journals are chains in the store
        self.write_final = write_final  # how a final record is written (logged first, with a log)
        self.data_dir = data_dir
        self.key = key
        self.clock = clock
        self.settings = settings  # limits, journal_sync: the runtime's, as they are now
        self.governor_id = governor_id
        self.agent_id = agent_id
        # refusals deferred while the shared store was unreachable, kept on disk until chained
        self.spool = DeferredSpool(data_dir / "sessions" / "deferred") if shared is not None else None

    def session_header(self, session_id: str, now: float) -> SessionHeader:
        """The journal header of a new session: the governor's pin."""
        return SessionHeader(
            governor=self.governor_id,
            subject_id=self.settings.limits.passport_id or self.agent_id,
            passport_digest=self.settings.limits.passport_digest,
            session=session_id,
            tier=self.settings.limits.tier.value,
            start=now,
            limits=dict(self.settings.limits.summary) or None,
        )

    def open_session(self, session_id: str) -> LiveSession:
        """A new session, or one resumed from its journal and/or its state in the store; a
        resumed one is checked against the governor's pin (§1.3, see the module docstring).
        Blocking (store reads, a journal fsync): Runtime calls it in a worker thread."""
        now = self.clock()
        path = journal_path(self.data_dir, session_id)
        saved = self.store.load_session(session_id)
        state = SessionState.from_dict(saved) if saved else SessionState.start(session_id, now)
        if self.shared is not None:
            return self.open_shared(session_id, state, saved, path, now)
        if path.exists():
            journal = Journal.open(path, repair_torn_tail=True, sync=self.settings.journal_sync)
            if journal.repaired is not None:
                log.warning("session %s: %s", session_id, journal.repaired.describe())
            session = LiveSession(session_id, state, journal, last_activity=now, limits=self.settings.limits)
            if journal.ending is not None:  # ended before: it stays ended
                session.ended = True
                return session
            header = journal.record.header
            self.check_pin(session, header.passport_digest, header.tier, now)
            return session
        if saved is None:
            journal = Journal.create(path, self.session_header(session_id, now), sync=self.settings.journal_sync)
            session = LiveSession(session_id, state, journal, last_activity=now, limits=self.settings.limits)
            self.store.save_session(session_id, session.saved_state())
            return session
        # resumed from the store alone: its journal here names the pin it was admitted with
        pin = saved_pin(saved)
        journal = Journal.create(path, self.resumed_header(session_id, pin, now), sync=self.settings.journal_sync)
        session = LiveSession(session_id, state, journal, last_activity=now, limits=self.settings.limits)
        self.check_pin(session, pin and pin["digest"], pin and pin["tier"], now)
        return session

    def open_shared(self, session_id: str, state: SessionState, saved: Mapping[str, Any] | None, path: Path,
                    now: float) -> LiveSession:
        """A session whose journal is its chain in the store: started here, or served by another
        replica before (its header, and so its pin, is the one that replica wrote)."""
        header = self.session_header(session_id, now) if saved is None else self.resumed_header(
            session_id, saved_pin(saved), now)
        journal = SharedJournal.open_or_create(self.shared.sessions, session_id, header, Path(f"store:chain/{session_id}"),
                                               self.shared.damaged, self.spool)
        session = LiveSession(session_id, state, journal, last_activity=now, limits=self.settings.limits)  # type: ignore[arg-type]
        if journal.ending is not None or state.ended:  # ended before (on any replica): it stays ended
            session.ended = True
            return session
        if saved is None:
            self.store.save_session(session_id, session.saved_state())
            self.shared.sessions.touch(session_id, now)
            return session
        started = journal.record.header  # type: ignore[union-attr]
        self.check_pin(session, started.passport_digest, started.tier, now)
        return session

    def resumed_header(self, session: str, pin: Mapping[str, Any] | None, now: float) -> SessionHeader:
        """The journal header of a session resumed from the store without a journal here: the
        pin it was admitted with when its state names one, else the governor's."""
        if pin is None:
            return self.session_header(session, now)
        # its limits as admitted, when the passport is archived here; else the record names none
        original = original_limits(self.data_dir, pin["digest"], pin["tier"], self.settings.limits.pricing)
        return SessionHeader(governor=self.governor_id, subject_id=str(pin.get("subject") or self.agent_id),
                             passport_digest=pin["digest"], session=session, tier=pin["tier"], start=now,
                             limits=dict(original.summary) or None if original is not None else None)

    def check_pin(self, live: LiveSession, digest: str | None, tier: str | None, now: float) -> None:
        """§1.3 for a resumed session: its pin against the governor's. A mismatch is recorded in
        its journal and resolved (see the module docstring); nothing happens when they match."""
        limits = self.settings.limits
        if digest == limits.passport_digest and tier == limits.tier.value:
            return
        original = original_limits(self.data_dir, digest, tier, limits.pricing) if digest and tier else None
        detail = {
            "message": "resumed after a restart under another passport or tier than it was admitted with; "
                       "the new limits are not adopted",
            "pinned_digest": digest, "pinned_tier": tier,
            "admitted_digest": limits.passport_digest, "configured_tier": limits.tier.value,
        }
        decision = pin_changed(original, detail)
        for event in decision.events:
            live.journal.append(event["cause"], event["action"], now, event.get("detail"))
        governing = original if original is not None else limits
        live.limits = governing
        live.state = advance(governing, live.state, PassportPresented(limits.passport_digest), decision, now)
        if original is None and not live.state.halted:  # cannot be governed by what it was admitted with
            live.state = live.state.evolve(halted=True, halt_cause=decision.cause)
        self.store.save_session(live.id, live.saved_state())
        log.warning("session %s resumed under another pin (%s %s, now %s %s): %s", live.id, tier, digest,
                    limits.tier.value, limits.passport_digest, decision.action.value)

    async def finalize_at_start(self, adopt: Callable[[str, SessionState, Any, dict[str, Any]], None],
                                ended: Callable[[str, str | None], None]) -> FinalizeReport:
        """Finalize every interrupted session (off the event loop) and make each one known to the
        runtime as an ended session (`adopt`: listed, its record served) and to the session book
        (`ended`). A governor that shares sessions now has only process-local sessions on disk
        (left by a run with `?sessions=local`): their records are written, and they are made
        known to neither, whose names are the shared sessions' (one may bear the same name)."""
        pin = Pin(self.settings.limits.passport_digest, self.settings.limits.tier.value)
        report = await asyncio.to_thread(finalize_interrupted, self.data_dir, key=self.key, pin=pin,
                                         clock=self.clock, sync=self.settings.journal_sync, write=self.write_final)
        if report.finalized and self.shared is not None:
            log.warning("finalized %d process-local session(s) a run with ?sessions=local left (%s): their records "
                        "are in %s; this governor shares its sessions through the store, where a session of the "
                        "same name is another one", len(report.finalized),
                        ", ".join(f.session for f in report.finalized[:5]), self.data_dir / "records")
        elif report.finalized:
            states = await asyncio.to_thread(self._halted_states, report)
            for finalized, state in zip(report.finalized, states):
                adopt(finalized.session, state, finalized.journal, finalized.record)
                # the session book learns it ended too: its token or name is refused as ended, and
                # after later restarts the session is still shown as ended (GET /v1/sessions/{id})
                ended(finalized.session, state.halt_cause if state.halted else None)
        return report

    def _halted_states(self, report: FinalizeReport) -> list[SessionState]:
        """Each finalized session's state, halted and ended, saved back to the store so that no
        replica sharing it resumes the session."""
        states = []
        for finalized in report.finalized:
            start = finalized.journal.record.header.start
            state = None
            try:
                saved = self.store.load_session(finalized.session)
                state = SessionState.from_dict(saved) if saved else None
            except Exception:
                log.exception("session %s: saved state unreadable; finalized from its journal alone", finalized.session)
            if state is None:
                from governor.evidence.record import parse_iso

                state = SessionState.start(finalized.session, parse_iso(start).timestamp())
            if finalized.record["outcome"] == "halted":
                state = state.evolve(halted=True, halt_cause=state.halt_cause or ON_GOVERNOR_ERROR)
            state = state.evolve(ended=True, in_flight=0, tools_in_flight=0, personas_live={})
            states.append(state)
            try:
                saved = {**state.to_dict(), PIN_KEY: {"digest": finalized.journal.record.header.passport_digest,
                                                      "tier": finalized.journal.record.header.tier}}
                self.store.save_session(finalized.session, saved)
            except Exception:
                log.exception("session %s: could not save its halted state", finalized.session)
        return states


__all__ = ["PASSPORTS_DIR", "PIN_KEY", "Resumption", "archive_passport", "original_limits", "saved_pin"]
