"""The runtime's background sweeper: once a tick it ends idle persona instances, charges
the wall-clock of running sessions, expires unanswered reviews, ends idle sessions, saves
states the per-request path left unsaved, and refreshes the budget gauges of a batch of
sessions.

`Sweeper` is handed the live-session table, the runtime's step path and the collaborators
a pass uses (approvals, records, views, the audit trail) in its constructor. Nothing here
is on the per-request path: a pass yields to the proxy's loop every SWEEP_SLICE sessions,
and store reads go off the loop for a remote store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from governor.evidence.errors import JournalClosedError
from governor.policy import Tick
from governor.runtime.approvals import Apply, Approvals
from governor.runtime.audit import AuditTrail
from governor.runtime.records import Records
from governor.runtime.session import LiveSession
from governor.runtime.views import StoreCall, Views
from governor.sessions.index import SessionIndex
from governor.runtime.settings import RuntimeSettings
from governor.store import StoreError

if TYPE_CHECKING:
    from governor.runtime.metrics import Metrics
    from governor.runtime.personas import PersonaInstances

log = logging.getLogger("governor.runtime")

# The sweeper charges the wall-clock (a full decision round) of a session that was active
# since its last sweep; of an idle one only every IDLE_SWEEP_SEC, at most
# IDLE_SWEEPS_PER_PASS of them a pass, so a pass over 10,000 idle sessions stays cheap. An
# idle session loses nothing by it: its next step projects the clock to its own time.
IDLE_SWEEP_SEC = 30.0
IDLE_SWEEPS_PER_PASS = 200
SWEEP_SLICE = 200  # sessions the sweeper handles before letting the proxy run
GAUGE_BATCH = 50  # sessions whose budget gauges one tick refreshes
ABANDONED_SWEEP_SEC = 5.0  # how often a replica looks for shared sessions a dead replica left
SWEEP_STOP_SEC = 5.0  # how long close() lets a sweep pass in progress finish


class Sweeper:
    """The background pass over the runtime's sessions, every `settings.sweep_interval_sec`
    (1 s under `governor run`, whatever its `tick_interval`: that option sets only the proxy's
    in-flight ticks, so no deadline kept here stops firing because of it)."""

    def __init__(self, *, sessions: dict[str, LiveSession], index: SessionIndex, metrics: Metrics,
                 clock: Callable[[], float], store_call: StoreCall, save: Callable[[LiveSession], None],
                 apply: Apply, approvals: Approvals, records: Records, views: Views, audit: AuditTrail,
                 personas: PersonaInstances, settings: RuntimeSettings, shared: Any = None, spool: Any = None) -> None:
        self.sessions = sessions
        self.spool = spool  # governor.evidence.deferred_spool.DeferredSpool: refusals to chain
        self.shared = shared  # governor.runtime.shared.SharedSteps: sessions other replicas serve too
        self.abandoned_at = 0.0  # when the last look for sessions a dead replica left was taken
        self.index = index
        self.metrics = metrics
        self.clock = clock
        self.store_call = store_call
        self.save = save
        self.apply = apply
        self.approvals = approvals
        self.records = records
        self.views = views
        self.audit = audit
        self.personas = personas
        self.settings = settings  # sweep_interval_sec, session_idle_sec: the runtime's, as they are now
        self.task: asyncio.Task | None = None
        self.sweeping = False  # a pass is in progress
        self.stopping = False  # close() asked the sweeper to stop after its pass
        self.gauge_cursor: str | None = None  # where the next gauge batch starts

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._sweep_forever(), name="governor-sweeper")

    async def _sweep_forever(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.settings.sweep_interval_sec)
            self.sweeping = True
            try:
                await self.sweep()
            except Exception:  # the sweeper must outlive any one bad session
                log.exception("sweep failed")
            finally:
                self.sweeping = False

    async def stop(self, timeout: float = SWEEP_STOP_SEC) -> None:
        """Stop the sweeper between passes: one asleep is cancelled; a pass in progress ends
        first (at most `timeout` s), since a cancel inside it could drop the event it was
        recording (a tick's, an approval's expiry: a decision made in a worker thread, a
        journal append still queued for one) before close() signs the final records."""
        sweeper = self.task
        if sweeper is None:
            return
        self.stopping = True
        if not self.sweeping:
            sweeper.cancel()
        done, _ = await asyncio.wait({sweeper}, timeout=timeout)
        if not done:
            log.error("the sweeper's pass did not end within %.1fs of the stop; cancelled: its last "
                      "events may be missing from the final records", timeout)
            sweeper.cancel()
        try:
            await sweeper
        except asyncio.CancelledError:
            pass
        self.stopping = False  # a later start() sweeps again
        self.task = None

    async def sweep(self) -> None:
        """One pass: end idle persona instances, charge wall-clock, expire unanswered approvals,
        end idle sessions, then refresh the budget gauges of the next batch of sessions. The
        pass yields to the proxy every SWEEP_SLICE sessions: with thousands of sessions it must
        not hold the loop."""
        await self.personas.sweep()
        if self.settings.duplicates is not None:  # another live governor with this one's id or key
            await self.settings.duplicates.tick(self.store_call)
        transparency_log = self.records.transparency_log
        if transparency_log is not None and transparency_log.checkpoint_size != transparency_log.size:
            # entries that waited past --log-checkpoint-seconds get their checkpoint without an append
            await asyncio.to_thread(transparency_log.checkpoint)
        proofs = self.records.proofs
        if transparency_log is not None and proofs is not None:  # the shared records' proofs this log holds
            try:
                await asyncio.to_thread(proofs.publish)
            except StoreError:  # published at a later pass
                log.debug("the awaited proofs could not be published now", exc_info=True)
        now = self.clock()
        idle_budget = IDLE_SWEEPS_PER_PASS
        for n, live in enumerate(list(self.sessions.values()), 1):
            if n % SWEEP_SLICE == 0:
                await asyncio.sleep(0)
            if live.ended:
                continue
            if live.state.personas_live:
                self.personas.reconcile(live.id, live.state.personas_live)
            for approval_id, pending in list(live.pending.items()):
                if now >= pending.expires_at and not pending.answer.done():
                    await self.approvals.expire(live, approval_id)
            idle = not live.pending and live.state.in_flight == 0 and now - live.last_activity >= self.settings.session_idle_sec
            if idle and self.shared is not None:  # idle here, but maybe served by another replica
                idle = not await self.shared.still_active(live, now, self.settings.session_idle_sec)
            book = self.audit.book
            if idle and not (book is not None and book.holds_lock(live.id)):
                # (a session holding the agent's lock stays open, so its lift is recorded in its record)
                await self.records.end_session(live.id)
                continue
            if live.unsaved and self.shared is None:  # (a shared state is saved by its round only: never clobbered)
                await self.store_call(self.save, live)
            if not live.limits.clock_checked or live.state.halted:
                continue
            # a live persona instance draws on its wall-clock share while idle: tick it each pass
            active = (live.last_activity >= live.swept_at or live.pending or live.state.in_flight
                      or live.state.personas_live)
            if not active:
                if now - live.swept_at < IDLE_SWEEP_SEC or idle_budget <= 0:
                    continue
                idle_budget -= 1
            live.swept_at = now
            async with live.lock:
                await self.apply(live, Tick(), None)
        if self.shared is not None and now - self.abandoned_at >= ABANDONED_SWEEP_SEC:
            self.abandoned_at = now
            await self.chain_deferred()
            await self.end_abandoned(now)
            await self.remove_ended(now)
            await self.count_shared()
        await self._refresh_gauges()

    async def end_abandoned(self, now: float) -> None:
        """End the shared sessions no replica served within the idle timeout (their replica died
        or stopped; the in-flight calls a dead replica counted never end), unless a step is held
        for review here: whichever replica comes first writes the one record (the end line is
        a compare-and-append)."""
        shared = self.shared
        for session in await shared.abandoned(now, self.settings.session_idle_sec,  # type: ignore[union-attr]
                                              lambda s: s in self.sessions and bool(self.sessions[s].pending)):
            try:
                record = await self.records.end_session(session)
                log.info("session %s, left by a replica, ended (%s)", session, record.get("outcome"))
            except Exception:
                log.exception("session %s, left by a replica, could not be ended", session)

    async def chain_deferred(self) -> None:
        """Chain the refusals this replica deferred while the store was unreachable and kept on
        disk (its earlier process's too, killed before it could): now rather than at the
        session's next step. A session another replica ended meanwhile cannot take them: they
        go in this governor's audit journal, named as such."""
        spool = self.spool
        if spool is None or self.shared is None:
            return
        for session in await asyncio.to_thread(spool.sessions):
            live = self.sessions.get(session)
            if live is not None and live.lock.locked():
                continue  # its round flushes them
            try:  # a chain gone (removed long after its session ended) has nothing to chain into
                if live is not None or await asyncio.to_thread(self.shared.sessions.has_chain, session):
                    live = await self.records.open_session(session)
                    async with live.lock:
                        await asyncio.to_thread(live.journal.flush)
                    log.info("session %s: refusals deferred while the store was unreachable are chained", session)
                    continue
            except JournalClosedError:  # ended on another replica meanwhile: the audit journal takes them
                pass
            except StoreError:  # still unreachable: the next pass
                return
            except Exception:
                log.exception("session %s: deferred refusals could not be chained", session)
                continue
            events = live.journal.deferred if live is not None else await asyncio.to_thread(spool.events, session)
            for event in list(events):
                detail = {**(event.get("detail") or {}), "session": session, "refused_at": event.get("at"),
                          "reason": "deferred_refusal_after_end"}
                await asyncio.to_thread(self.audit.audit_event, event["cause"], event["action"], self.clock(), detail)
            if live is not None:
                live.journal.deferred.clear()
            await asyncio.to_thread(spool.keep, session, [])
            log.warning("session %s ended on another replica before %d deferred refusal(s) of this replica were "
                        "chained: recorded in the audit journal", session, len(events))

    async def remove_ended(self, now: float) -> None:
        """Remove from the store what shared sessions ended longer than its retention ago left
        (their chains, states, records, counters; governor.store.redis_retention)."""
        shared = self.views.shared
        if shared is None:
            return
        try:
            removed = await asyncio.to_thread(shared.retention.remove_ended, now)
            for session in removed:
                await asyncio.to_thread(self.views.store.delete_session, session)
        except StoreError as exc:  # the next pass takes them
            log.warning("could not remove what ended shared sessions left in the store: %s", exc)
            return
        if removed:
            log.info("removed what %d shared session(s) ended long ago left in the store", len(removed))

    async def count_shared(self) -> None:
        """Refresh `governor_shared_sessions` (every replica's sessions by state, read from the
        store: O(open sessions)) while something scrapes it; unread, it has no samples rather
        than an old count."""
        shared, series = self.views.shared, self.metrics.shared_sessions
        if shared is None or not series.wanted(time.monotonic()):
            return
        try:
            series.counts = await shared.tally()
        except StoreError as exc:
            series.counts = None
            log.warning("could not count the shared sessions for governor_shared_sessions: %s", exc)

    async def _refresh_gauges(self) -> None:
        """Keep the budget gauges current for scrapers, GAUGE_BATCH sessions a tick, round
        robin: a bounded number of store reads per tick (off the loop for Redis)."""
        def running(session: str) -> bool:
            live = self.sessions.get(session)
            return live is not None and not live.ended

        batch = self.index.page(self.gauge_cursor, GAUGE_BATCH, running)
        self.gauge_cursor = batch[-1] if len(batch) == GAUGE_BATCH else None
        if batch:
            await self.store_call(self._refresh_batch, batch)

    def _refresh_batch(self, sessions: list[str]) -> None:
        for session in sessions:
            try:
                self.views.budgets(session)
            except StoreError:  # the next step's snapshot fails closed; a gauge can wait
                self.metrics.store_error()
                log.warning("could not read the budgets of session %s for its gauges", session)


__all__ = ["GAUGE_BATCH", "SWEEP_SLICE", "Sweeper"]
