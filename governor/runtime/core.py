"""The runtime: the pure decision point, the state store and the evidence journal, composed.

It implements `governor.runtime.api.RuntimeAPI`, the one door the proxy and the
control plane use. Per step:

  1. snapshot the budget counters the step may touch (store);
  2. decide (pure: `governor.policy.decide`);
  3. reserve the decision's charges atomically (store); when a concurrent step took
     the room first, re-read the counters and decide again, so the projection itself
     reports the exhaustion;
  4. journal every event of the decision, durably, BEFORE the decision takes effect;
  5. advance the session state and persist it.

Steps of one session are decided one at a time (an asyncio lock per session); the
upstream work they admit runs concurrently. Anything that goes wrong in 1-5 fails
closed: the step is refused with cause on_governor_error and, when the journal is
still writable, that is recorded too.

The per-step path (admit, usage, finish, and the decision round they share) is
`Runtime`'s own. The rest is done by collaborators it composes, each handed the shared
state it needs (the live-session table, the store, the journal directory, the signing
key, the metrics, the clock) and the step path's entry points in its constructor:
`Approvals` (held steps, reviews, plan edits), `Records` (session ends, signed records),
`Views` (what the control plane reads), `Sweeper` (the background pass), `AuditTrail`
(the session book's locks and lifts, the audit journal) and `Resumption` (the pin, resumed
sessions, finalization at start). `Runtime` keeps the door (`governor.runtime.api.RuntimeAPI`
and what the proxy and the control plane call) and hands each call to its collaborator.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path
from typing import Any, Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.evidence import Journal, record_path
from governor.runtime.metrics import Metrics
from governor.notify import events as notify
from governor.policy import (
    Action,
    Decision,
    Limits,
    ModelCall,
    SessionEnd,
    SessionState,
    Step,
    StepDone,
    Tick,
    ToolCall,
    UsageReport,
    advance,
    decide,
    governor_error,
    step_tools,
)
from governor.policy.extension import covered
from governor.policy.steps import ON_GOVERNOR_ERROR, PersonaSpawn
from governor.runtime.gaps import RecordGaps
from governor.runtime.rates import RateHold, rate_limiter
from governor.runtime.personas import DEFAULT_IDLE_SEC, InstanceLease, PersonaActivity, PersonaInstances
from governor.runtime import stream_budget
from governor.runtime.api import Admission, admission_for
from governor.runtime.approvals import Approvals
from governor.runtime.audit import AuditTrail
from governor.runtime.envelope import EnvelopeWatch
from governor.runtime.records import Records
from governor.runtime.local_steps import LocalSteps
from governor.runtime.remote_steps import RemoteSteps
from governor.runtime.refusals import ended_refusal, store_refusal, transient, unrecorded_failure
from governor.runtime.resume import Resumption
from governor.runtime.session import LiveSession, SessionTable, Ticket
from governor.runtime.settings import RuntimeSettings, SharedSetting
from governor.runtime.shared import SharedSteps
from governor.runtime.shared_fast import SharedFastSteps
from governor.runtime.shared_holds import SharedHolds
from governor.runtime.shared_records import SharedRecords
from governor.runtime.store_calls import StoreCalls
from governor.runtime.sweeper import Sweeper
from governor.runtime.views import Views
from governor.sessions.book import SessionBook
from governor.store import Store, StoreError
from governor.store.envelope_books import open_envelope_book
from governor.store.redis_retention import SharedRetention

log = logging.getLogger("governor.runtime")

# A reservation refused because a concurrent step got there first is re-decided with a
# fresh snapshot; the projection then reports the exhaustion. More rounds than this
# means the counters keep moving under us: fail closed rather than spin.
MAX_DECIDE_ROUNDS = 4


class Runtime:
    """One governor's sessions against one pinned passport."""

    def __init__(
        self,
        *,
        limits: Limits,
        store: Store,
        data_dir: Path | str,
        key: Ed25519PrivateKey,
        governor_id: str,
        agent_id: str,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        session_idle_sec: float = 900.0,
        sweep_interval_sec: float = 1.0,
        journal_sync: bool = True,
        pinned: Any = None,
        owns_store: bool = False,
        persona_idle_sec: float = DEFAULT_IDLE_SEC,
        transparency_log: Any = None,
        witnessing: Any = None,
    ) -> None:
        self.settings = settings = RuntimeSettings(limits, journal_sync=journal_sync, sweep_interval_sec=sweep_interval_sec,
                                                   session_idle_sec=session_idle_sec)
        self.pinned = pinned  # the PinnedPassport these limits were compiled from, when known
        self.admission: Any = None  # its admission report, when the caller keeps it (startup banner)
        self.store = store
        self.data_dir = Path(data_dir)
        self.key = key
        self.governor_id = governor_id
        self.agent_id = agent_id
        self.metrics = metrics or Metrics()
        self.metrics.declare_personas(limits.personas)  # the only persona label values
        self.metrics.set_build_info(limits.passport_digest)
        self.clock = clock
        self.owns_store = owns_store  # close() closes it (and so writes a write-behind store out)
        self._default_generation = itertools.count(1)
        self._default_session = self._new_default_session()
        # how the store is called from the loop (inline or from a thread), and the saves and
        # releases whose failure is only logged (runtime/store_calls.py)
        self.store_calls = calls = StoreCalls(store, self.metrics)
        self._store, self._save, self._release_quietly = calls.call, calls.save, calls.release_quietly
        self._store_in_thread = calls.in_thread
        # a store that shares sessions between replicas (Redis, unless its URL says sessions=local):
        # rounds on shared state (runtime/shared.py)
        shared_sessions = getattr(store, "shared_sessions", None)
        sessions = shared_sessions() if shared_sessions is not None else None
        self.shared = SharedSteps(sessions=sessions, store=store, metrics=self.metrics, clock=clock,
                                  record_audit=lambda *event: self.audit.audit_event(*event)
                                  ) if sessions is not None else None
        # a remote store's asyncio client: the model call's one round trip each way (runtime/remote_steps.py;
        # on shared sessions runtime/shared_fast.py, optimistic on the shared state)
        counters = getattr(store, "counters", None)
        steps = dict(counters=counters, agent_id=agent_id, clock=clock, advanced=self._advanced)
        self.remote = (RemoteSteps(**steps) if self.shared is None else SharedFastSteps(
            **steps, adopt=self.shared.adopt_saved, settle_round=self._settle_round, retried=self.metrics.shared_retry)
        ) if self._store_in_thread and counters else None
        # a local store's: the model call decided at once (runtime/local_steps.py)
        self.local = LocalSteps(store=store, agent_id=agent_id, clock=clock, advanced=self._advanced,
                                release=self._release_quietly
                                ) if not self._store_in_thread and self.shared is None else None
        self.transparency_log = transparency_log  # governor.evidence.translog.TransparencyLog, or None
        self.witnessing = witnessing  # governor.evidence.witnessing.Witnessing (its witnesses), or None
        self.resumption = Resumption(store=store, data_dir=self.data_dir, key=key, clock=clock, settings=settings,
                                     governor_id=governor_id, agent_id=agent_id, shared=self.shared,
                                     **({"write_final": transparency_log.write_record} if transparency_log else {}))
        self.gaps = RecordGaps(self.metrics)  # events that could not be recorded (a full disk): named, not ready
        self.table = SessionTable(opener=self.gaps.opener(self.resumption.open_session), metrics=self.metrics)
        self._sessions = self.table.live  # the live-session table, shared with the collaborators
        self.personas = PersonaInstances(self, idle_sec=persona_idle_sec)  # persona instances on the wire
        self.rates = None  # governor.runtime.rates.RateLimiter once `limit_rates` sets limits
        self.audit = AuditTrail(sessions=self._sessions, open_session=self.table.open, data_dir=self.data_dir,
                                settings=settings, key=key, governor_id=governor_id, agent_id=agent_id, clock=clock,
                                shared=self.shared)
        holds = SharedHolds(steps=self.shared, round_here=self._apply_here, open_session=self.table.open,
                            clock=clock) if self.shared is not None else None
        self.oversight = Approvals(sessions=self._sessions, metrics=self.metrics, clock=clock, agent_id=agent_id,
                                   settings=settings, apply=self._apply, admit=self.admit, holds=holds)
        self.envelope = EnvelopeWatch(open_book=lambda: open_envelope_book(store), agent_id=agent_id, clock=clock,  # R3
                                      remote=self._store_in_thread, apply=self._apply, hold=self.oversight.hold,
                                      await_approval=self.oversight.await_approval, record_audit=self.audit.record_audit)
        self.records = Records(sessions=self._sessions, data_dir=self.data_dir, key=key, metrics=self.metrics,
                               clock=clock, open_session=self.table.open, apply=self._apply, approvals=self.oversight,
                               personas=self.personas, audit=self.audit, ended=self._session_over,
                               transparency_log=transparency_log, witnessing=witnessing, shared=self.shared)
        self.shared_records = SharedRecords(records=self.records, steps=self.shared, sessions=self._sessions,  # GET record
                                            open_session=self.table.open) if self.shared is not None else None
        self.views = Views(sessions=self._sessions, index=self.table.index, store=store, store_call=self._store,
                           settings=settings, agent_id=agent_id, metrics=self.metrics, clock=clock,
                           approvals=self.oversight, shared=SharedRetention(sessions) if sessions is not None else None)
        self.sweeper = Sweeper(sessions=self._sessions, index=self.table.index, metrics=self.metrics, clock=clock,
                               store_call=self._store, save=self._save, apply=self._apply,
                               approvals=self.oversight, records=self.records, views=self.views, audit=self.audit,
                               personas=self.personas, settings=settings, shared=self.shared, spool=self.resumption.spool)

    # settings the collaborators share, kept in `self.settings`: replaced after construction
    # by the proxy's start-up (the notifier) and by tests, each reaches every collaborator
    limits = SharedSetting()
    notifier = SharedSetting()
    journal_sync = SharedSetting()
    sweep_interval_sec = SharedSetting()
    session_idle_sec = SharedSetting()

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the background sweeper (wall-clock ticks, approval expiry, idle sessions)."""
        self.sweeper.start()

    async def close(self, *, end_sessions: bool = True) -> None:
        await self.sweeper.stop()  # a pass in progress records its events first
        await self.records.publish_proofs()  # the shared records' proofs only this replica's log can make
        if self.remote is not None:  # settlements queued on the store's pipeline answered, failures journaled
            await self.remote.drain()
        await self.envelope.close()  # the pending tally reaches the store
        if end_sessions and self.shared is None:  # shared sessions go on on other replicas (or end idle)
            for session in list(self._sessions.values()):
                if not session.ended:
                    try:
                        record = await self.end_session(session.id)
                    except Exception:  # a session that cannot end is finalized from its journal later
                        log.exception("could not end session %s on shutdown", session.id)
                    else:  # say where each final record went
                        log.info("session %s ended on shutdown (%s): final record %s", session.id,
                                 record.get("outcome"), record_path(self.data_dir, session.id))
        for session in self._sessions.values():
            if session.unsaved and self.shared is None:  # a shared state is saved by its round only
                self._save(session)
            session.journal.close()
        self.audit.close()
        if self.witnessing is not None:
            await asyncio.to_thread(self.witnessing.stop)
        if self.owns_store:
            try:
                await asyncio.to_thread(self.store.close)  # a write-behind store flushes here
            except StoreError:
                log.exception("the state store could not be closed cleanly")

    @property
    def default_session(self) -> str:
        """The session for traffic without an ADL-Session header: one per process, renewed when it ends
        (with a session book, the proxy asks the book instead)."""
        return self._default_session

    def _new_default_session(self) -> str:
        started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        return f"default-{started}-{next(self._default_generation)}"

    def limit_rates(self, limits: tuple) -> None:  # rate limits per window (governor.runtime.rates)
        self.rates = rate_limiter(limits, store=self.store, agent_id=self.agent_id, clock=self.clock,
                                  call=self._store, metrics=self.metrics)

    # --- sessions ----------------------------------------------------------------------

    def adopt_finalized(self, session_id: str, state: SessionState, journal: Journal, record: dict[str, Any]) -> None:
        """A session finalized at start-up (governor.runtime.resume): known as ended, its record served."""
        self.table.adopt(LiveSession(session_id, state, journal, ended=True, final_record=record,
                                     last_activity=self.clock(), limits=self.settings.limits))

    async def recover(self) -> Any:
        """At start-up, before serving: finalize every session the governor left without an end."""
        return await self.resumption.finalize_at_start(self.adopt_finalized, self.audit.session_ended)

    # --- steps -------------------------------------------------------------------------

    async def admit(self, session: str, step: Step) -> Admission:
        if type(step) is PersonaActivity:  # a request of a persona instance: the registry spawns it
            return await self.personas.enter(session, step)
        started = time.perf_counter()
        try:
            live = self._sessions.get(session) or await self.table.open(session)
        except Exception as exc:  # journal or store unusable: nothing can be recorded, refuse
            log.exception("session %s could not be opened", session)
            decision = unrecorded_failure(step, exc)
            return admission_for(session, decision, None)
        if live.limits.enforce_anomaly and (stop := await self.envelope.before(live)) is not None:
            return admission_for(session, stop, None)  # the agent's envelope deviation, resolved through §6
        drawn: RateHold | None = None
        if self.rates is not None and type(step) in (ModelCall, ToolCall):  # rate limits: drawn first
            drawn, refused = await self.rates.take(live, step)
            if refused is not None:
                return admission_for(session, refused, None)
        admitted = None
        if type(step) is ModelCall:
            if self.local is not None:
                admitted = self.local.admit(live, step)
            elif self.remote is not None:
                admitted = await self.remote.admit(live, step)
        seqs: tuple[int, ...] = ()
        if admitted is not None:
            decision, ticket = admitted
        else:
            async with live.lock:
                decision, ticket = await self._apply(live, step, None)
                seqs = live.recorded if decision.events else ()
        if drawn is not None:  # kept by the step's ticket, or given back when it does not go ahead
            await self.rates.keep(drawn, ticket, decision)  # type: ignore[union-attr]
        if live.limits.enforce_anomaly:
            self.envelope.observed(step, decision, live.limits)
        self.metrics.decided(decision, time.perf_counter() - started)
        if decision.approval is not None and decision.enforced and decision.action is Action.PAUSE:
            self.oversight.hold(live, step, decision)
        return admission_for(session, decision, ticket, seqs)

    async def usage(self, session: str, ticket: Any, report: UsageReport) -> Decision:
        live = self._sessions.get(session)
        if live is None or not isinstance(ticket, Ticket):
            return unrecorded_failure(report, LookupError(f"no admitted step for session {session!r}"))
        started = time.perf_counter()
        if ticket.rates is not None and report.final:  # its tokens and cost drawn corrected to its usage
            drawn, ticket.rates = ticket.rates, None
            await self.rates.settle(drawn, report)  # type: ignore[union-attr]
        decision = None
        if self.local is not None:
            decision = self.local.settle(live, ticket, report)
        elif self.remote is not None:
            decision = await self.remote.settle(live, ticket, report)
        if decision is None:
            decision = await self._settle_round(live, ticket, report)
        if live.limits.enforce_anomaly:
            self.envelope.observed(report, decision, live.limits)
        self.metrics.decided(decision, time.perf_counter() - started)
        return decision

    async def _settle_round(self, live: LiveSession, ticket: Ticket, report: UsageReport) -> Decision:
        async with live.lock:
            # the final usage is the call's end: the same step frees its in-flight slot
            # (UsageReport.ends_call) rather than a StepDone after it or a finish() round
            ends_call = report.final and ticket.in_flight and not live.ended
            before = live.state
            decision, _ = await self._apply(live, report.with_reserved(ticket.charges, ends_call), ticket)
            if ends_call:
                ticket.in_flight = False
                if live.state is before and not live.ended:  # not applied (it could not be recorded)
                    await self._apply(live, StepDone(ticket.kind, ticket.persona), None)
        return decision

    def covers(self, ticket: Any, report: UsageReport) -> bool:
        """Whether a stream's running usage is within what its call holds, so the proxy may
        forward the chunk at once (otherwise it keeps it back until `usage` grew the
        reservation or cut the stream). Cheap: no store access."""
        return (not isinstance(ticket, Ticket) or ticket.reservation is None
                or covered(self.settings.limits, report, ticket.charges))

    def _advanced(self, live: LiveSession, state: SessionState, now: float) -> None:
        """A step decided at once took effect: the session's state and activity move on."""
        live.last_activity = now
        live.state = state
        live.unsaved = True
        live.restate(self.metrics)

    async def finish(self, session: str, ticket: Any, *, error: str | None = None) -> None:
        if type(ticket) is InstanceLease:  # the request of a persona instance is over
            ticket.release()
            return
        live = self._sessions.get(session)
        if live is None or not isinstance(ticket, Ticket) or ticket.done:
            return
        ticket.done = True
        # a ticket its final usage report settled and freed holds nothing: no lock round
        if ticket.reservation is not None or ticket.in_flight:
            await self._finish_held(live, ticket)
        if error:
            log.info("session %s: step finished with error: %s", session, error)

    async def _finish_held(self, live: LiveSession, ticket: Ticket) -> None:
        """Release what an unsettled step still holds: its reservation, its in-flight slot."""
        session = live.id
        async with live.lock:
            if ticket.reservation is not None:
                # never settled by a final usage report (upstream failed, client left):
                # the reservation was never consumption, so it is released
                try:
                    await self._store(self.store.release, ticket.reservation)
                except StoreError:
                    self.metrics.store_error()
                    log.exception("session %s: could not release reservation %s", session, ticket.reservation)
                ticket.reservation = None
            if ticket.in_flight and not live.ended:
                await self._apply(live, StepDone(ticket.kind, ticket.persona), None)

    async def _apply(self, live: LiveSession, step: Step, ticket: Ticket | None) -> tuple[Decision, Ticket | None]:
        """Decide `step`, reserve or settle its charges, journal its events, advance. Lock held
        (and, for a session shared by replicas, its round in the store: runtime/shared.py)."""
        if self.shared is not None:
            return await self.shared.apply(live, step, ticket, self._apply_here)
        return await self._apply_here(live, step, ticket)

    async def _apply_here(self, live: LiveSession, step: Step, ticket: Ticket | None) -> tuple[Decision, Ticket | None]:
        now = self.clock()
        if type(step) is not Tick:  # the sweeper's own ticks are not the agent's activity
            live.last_activity = now
        if live.ended:
            return ended_refusal(live), None
        state = live.state
        reservation: str | None = None
        try:
            if self._store_in_thread:
                state, decision, reservation = await asyncio.to_thread(self._decide, live, step, ticket, now)
            else:  # a local store answers in microseconds: no thread hop on the per-request path
                state, decision, reservation = self._decide(live, step, ticket, now)
        except Exception as exc:  # store down, internal error: fail closed and say why
            if isinstance(exc, StoreError):
                self.metrics.store_error()
            refusal = store_refusal(live.limits, live.state, step, exc)
            if refusal is not None:  # unreachable or a damaged counter: refused, the session goes on
                log.log(logging.DEBUG if type(step) is Tick else logging.WARNING if transient(exc) else logging.ERROR,
                        "session %s: %s refused, the store could not count it: %s", live.id, type(step).__name__, exc)
                decision = refusal  # ticks retry each pass, logged quietly
                if type(step) is UsageReport and ticket is not None:
                    # not settled: what it reserved keeps counting (the store errs on counting),
                    # never released as if unused
                    ticket.reservation = None
            else:
                log.exception("session %s: could not decide %s", live.id, type(step).__name__)
                decision = governor_error(live.limits, live.state, step, exc)  # _decide holds nothing then
            state = live.state
        chained = 0
        try:
            recorded = []  # their seqs: what a trace of the step names (governor.proxy.tracing)
            for chained, event in enumerate(decision.events):
                line = await asyncio.to_thread(live.journal.append, event["cause"], event["action"], now,
                                               event.get("detail"))
                recorded.append(line["seq"])
            if recorded:
                live.recorded = tuple(recorded)
        except Exception as exc:  # the event cannot be recorded, so the step must not take effect
            if self.shared is not None and reservation is None and self.shared.defer_refusal(
                    live, decision, decision.events[chained:], exc, now):
                return decision, None  # a refusal, recorded once the store holding the chain answers
            log.exception("session %s: could not journal an enforcement event", live.id)
            if reservation is not None:
                await self._store(self._release_quietly, reservation)
            return unrecorded_failure(step, exc), None
        live.state = advance(live.limits, state, step, decision, now)
        live.unsaved = True
        if decision.warnings:  # a budget crossed its warning threshold (once per session and budget)
            self.settings.notifier.emit(notify.budget_threshold(self.agent_id, live.id, decision.warnings))
        live.restate(self.metrics)
        if decision.events or decision.blocks or type(step) is SessionEnd:
            # enforcement changed the session: persist now. Plain permits are persisted by
            # the sweeper within a tick (budget counters and the journal are durable per step).
            await self._store(self._save, live)
            if decision.events and decision.halts:
                await self.audit.on_halt(live.id, decision.cause)  # logged; a locking cause locks every session
        new_ticket = None
        if not decision.blocks and type(step) in (ModelCall, ToolCall, PersonaSpawn):
            kind = "model" if type(step) is ModelCall else "tool" if type(step) is ToolCall else "other"
            new_ticket = Ticket(kind, getattr(step, "persona", None), decision.charges if reservation else (),
                                reservation, in_flight=kind != "other" and getattr(step, "origin", "agent") != "model")
        elif reservation is not None:  # a reservation nobody will settle
            await self._store(self._release_quietly, reservation)  # a Redis round trip: off the loop
        return decision, new_ticket

    def _decide(self, live: LiveSession, step: Step, ticket: Ticket | None,
                now: float) -> tuple[SessionState, Decision, str | None]:
        """Steps 1-3: snapshot, decide, reserve (or settle). Synchronous: called inline for a
        local store, from a worker thread for a remote one (the session lock is held)."""
        store = self.store
        limits = live.limits
        keys = limits.counter_keys(step)
        state = live.state
        if stream_budget.is_running(step, ticket, state):  # a stream past its reservation: grow it or cut
            state, decision = stream_budget.decide_running(
                store, self.settings.limits, state, step, ticket, now,  # type: ignore[arg-type]
                lambda: store.snapshot(self.agent_id, live.id, now, keys))
            return state, decision, None
        for _ in range(MAX_DECIDE_ROUNDS):
            if keys:
                state = live.state.with_counters(store.snapshot(self.agent_id, live.id, now, keys))
            # else: the step reads no counter, the state's last snapshot is left as it is
            decision = decide(limits, state, step, now)
            if not decision.charges or decision.blocks and not decision.settles:
                return state, decision, None
            if decision.settles:
                if ticket is not None and ticket.reservation is not None:
                    store.commit(ticket.reservation, decision.charges, now)
                    ticket.reservation = None
                else:
                    store.add(self.agent_id, live.id, decision.charges, now)
                return state, decision, None
            held = store.reserve(self.agent_id, live.id, decision.charges, now)
            if held.ok:
                return state, decision, held.id
        raise RuntimeError("budget counters kept changing under concurrent steps; refusing rather than guessing")

    def halted(self, session: str) -> str | None:
        """The cause that halted the session (None while it may go on): cheap, for ungoverned traffic."""
        live = self._sessions.get(session)
        if live is None:
            return None
        if live.state.halted:
            return live.state.halt_cause or ON_GOVERNOR_ERROR
        return "session_ended" if live.ended else None

    def allowed_tools(self, session: str, persona: str | None = None) -> frozenset[str] | None:
        """The tools the session (persona) may use (MCP tools/list filtering)."""
        live = self._sessions.get(session)
        return step_tools(live.limits if live is not None else self.settings.limits, persona)

    def has_session(self, session: str) -> bool:
        return session in self._sessions

    # --- held steps and reviews (Approvals) --------------------------------------------

    async def await_approval(self, session: str, approval_id: str) -> Admission:
        return await self.oversight.await_approval(session, approval_id)

    async def resolve_approval(self, approval_id: str, approve: bool, reviewer: str, reason: str = "",
                               edited_arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.oversight.resolve_approval(approval_id, approve, reviewer, reason, edited_arguments)

    def answered_approval(self, approval_id: str) -> dict[str, Any] | None:
        return self.oversight.answered_approval(approval_id)

    def approvals(self) -> list[dict[str, Any]]:
        return self.oversight.pending_views()

    # --- session ends and records (Records) --------------------------------------------

    async def end_session(self, session: str) -> dict[str, Any]:
        return await self.records.end_session(session)

    def record(self, session: str, nonce: str | None = None) -> dict[str, Any]:
        return self.records.record(session, nonce)

    def _session_over(self, session: str, halt_cause: str | None) -> None:
        """A session ended (its final record written): the book, the metrics and the persona
        registry forget it, and a new default session replaces an ended one."""
        self.audit.session_ended(session, halt_cause)
        self.metrics.forget_session(session)
        self.personas.forget(session)
        if session == self._default_session:
            self._default_session = self._new_default_session()

    # --- what the control plane reads (Views) and the sweeper ---------------------------

    async def ready(self) -> dict[str, Any]:
        ready = await self.views.ready()
        self.gaps.mark(ready)  # not ready while the record is incomplete (governor.runtime.gaps)
        if self.witnessing is not None:  # reported, not a reason to stop governing traffic
            ready["witnessing"] = self.witnessing.status()
        return ready

    async def acknowledge_store(self) -> dict[str, Any]:
        return await self.views.acknowledge_store()

    async def sessions(self, after: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        return await self.views.page(after, limit)

    async def session_view(self, session: str, gauges: bool = True) -> dict[str, Any] | None:
        if self.shared is not None:  # as the last round on any replica left it
            await self.shared.refresh(session, self._sessions, self.table.open)
        return await self.views.session_view(session, gauges)

    async def sweep(self) -> None:
        await self.sweeper.sweep()

    # --- the session book, locks and the audit journal (AuditTrail) ---------------------

    @property
    def session_book(self) -> SessionBook | None:
        return self.audit.book

    def attach_sessions(self, book: SessionBook) -> None:
        """Use `book` for who may act: the runtime records its locks and learns of ends."""
        self.audit.attach(book)

    async def record_refusal(self, session: str, detail: dict[str, Any]) -> bool:
        return await self.audit.record_refusal(session, detail)

    async def record_withheld(self, session: str, detail: dict[str, Any]) -> bool:
        return await self.audit.record_withheld(session, detail)

    async def record_minted(self, session: str, detail: dict[str, Any]) -> bool:
        return await self.audit.record_minted(session, detail)

    def audit_record(self, nonce: str | None = None) -> dict[str, Any] | None:
        return self.audit.audit_record(nonce)

    def ended_record(self, session: str, nonce: str | None = None) -> dict[str, Any] | None:
        record = self.audit.ended_record(session, nonce)
        return record if record is not None or self.shared is None else self.shared.final_record(session, nonce)

    async def open_session(self, session: str) -> None:
        """Start a session the book opened for a principal: its journal (the record's window
        starts here) and its place in the session list."""
        await self.table.open(session)

    async def end_session_by_principal(self, session: str) -> dict[str, Any]:
        return await self.records.end_by_principal(session)

    async def final_record_with_proof(self, session: str) -> tuple[dict[str, Any], bytes]:
        return await self.records.final_record_with_proof(session)


__all__ = ["Runtime"]
