"""The control plane's views of the runtime and its background sweeper: readiness, the
paged session listing and one session's view with its budgets, and the sweeper that
charges wall-clock, expires reviews, ends idle sessions and refreshes the budget gauges.

Mixed into `governor.runtime.core.Runtime` (kept apart: runtime.py is long enough). Nothing
here is on the per-request path: the listing and the sweeper yield to the proxy's loop
every few sessions, and store reads go off the loop for a remote store.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from governor.policy import Limits, Tick
from governor.store import StoreError
from governor.evidence import iso_utc


log = logging.getLogger("governor.runtime")

# The sweeper charges the wall-clock (a full decision round) of a session that was active
# since its last sweep; of an idle one only every IDLE_SWEEP_SEC, at most
# IDLE_SWEEPS_PER_PASS of them a pass, so a pass over 10,000 idle sessions stays cheap. An
# idle session loses nothing by it: its next step projects the clock to its own time.
IDLE_SWEEP_SEC = 30.0
IDLE_SWEEPS_PER_PASS = 200
SWEEP_SLICE = 200  # sessions the sweeper handles before letting the proxy run
GAUGE_BATCH = 50  # sessions whose budget gauges one tick refreshes
SWEEP_STOP_SEC = 5.0  # how long close() lets a sweep pass in progress finish
VIEW_SLICE = 50  # session views a listing builds before letting the proxy run


def caps_by_key(limits: Limits) -> dict[tuple, float]:
    """Every declared cap by its counter key (the budgets a view shows against their use)."""
    caps: dict[tuple, float] = {}
    for table in (limits.meters, limits.clock_meters):
        for meters in table.values():
            for meter in meters:
                if meter.cap is not None:
                    caps[meter.key] = meter.cap
    return caps


class RuntimeViews:
    """Views and the sweeper, for `governor.runtime.core.Runtime`."""

    async def ready(self) -> dict[str, Any]:
        try:
            await asyncio.to_thread(self.store.snapshot, self.agent_id, "readiness-probe", self.clock(), ())
        except StoreError as exc:
            self.metrics.store_error()
            return {"ready": False, "store": f"unreachable: {exc}", "passport_digest": self.limits.passport_digest}
        return {"ready": True, "store": "ok", "passport_digest": self.limits.passport_digest,
                "tier": self.limits.tier.value}

    async def acknowledge_store(self) -> dict[str, Any]:
        """An operator accepts that the store lost its data (StoreIntegrityError until then):
        it serves again from what it holds. Sessions halted meanwhile stay halted."""
        acknowledge = getattr(self.store, "acknowledge", None)
        if acknowledge is None:
            return {"acknowledged": False, "lost": None, "reason": "this store keeps no fence to acknowledge"}
        return await asyncio.to_thread(acknowledge)

    def has_session(self, session: str) -> bool:
        return session in self._sessions

    async def sessions(self, after: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Views of the sessions whose ids sort after `after`, at most `limit` (None: all):
        O(log n + page), budget reads for the page only."""
        ids = self._index.page(after, len(self._index) if limit is None else limit, self._sessions.__contains__)
        views = []
        for n, session in enumerate(ids, 1):
            if n % VIEW_SLICE == 0:  # a page of 1,000 must not hold the proxy's loop in one piece
                await asyncio.sleep(0)
            # no gauge refresh here (the sweeper's): a page would set ~10 labelled gauges per session
            if (view := await self.session_view(session, gauges=False)) is not None:
                views.append(view)
        return views

    async def session_view(self, session: str, gauges: bool = True) -> dict[str, Any] | None:
        live = self._sessions.get(session)
        if live is None:
            return None
        try:  # a store read: off the loop for Redis, as on the per-request path
            budgets, store_error = await self._store(self._budgets, session, gauges and not live.ended), None
        except StoreError as exc:
            budgets, store_error = [], str(exc)
        state = live.state
        view = {
            "session": session,
            "state": "ended" if live.ended else "halted" if state.halted else "paused" if live.pending else "active",
            "tier": live.limits.tier.value,
            "started_at": iso_utc(state.started_at),
            "iterations": state.iterations,
            "tool_calls": state.tool_calls,
            "in_flight": state.in_flight,
            "halt_cause": state.halt_cause,
            "budgets": budgets,
            "limits": {"max_iterations": live.limits.max_iterations,
                       "max_tool_calls_per_session": live.limits.max_tool_calls},
            "events": len(live.journal.record),
            "pending_approvals": self._approval_views(live),
        }
        if store_error:
            view["store_error"] = store_error
        return view

    def _budgets(self, session: str, gauges: bool = True) -> list[dict[str, Any]]:
        """Every counter in use or capped, against its cap; refreshes the budget gauges
        (not for an ended session: its per-session series were dropped)."""
        counters = self.store.snapshot(self.agent_id, session, self.clock())
        live = self._sessions.get(session)
        caps = self._caps if live is None or live.limits is self.limits else caps_by_key(live.limits)
        budgets = []
        for key in sorted(set(counters) | set(caps), key=lambda k: (k[0], k[1] or "", k[2])):
            scope, persona, dimension = key
            used, cap = counters.get(key, 0.0), caps.get(key)
            budgets.append({"dimension": dimension, "scope": scope, "persona": persona, "used": used, "limit": cap})
            if gauges:
                self.metrics.budget(dimension, scope, used, cap, session=session, persona=persona)
        return budgets

    _sweeping = False  # a pass is in progress
    _sweep_stopping = False  # close() asked the sweeper to stop after its pass

    async def _sweep_forever(self) -> None:
        while not self._sweep_stopping:
            await asyncio.sleep(self.tick_interval_sec)
            self._sweeping = True
            try:
                await self.sweep()
            except Exception:  # the sweeper must outlive any one bad session
                log.exception("sweep failed")
            finally:
                self._sweeping = False

    async def _stop_sweeper(self, sweeper: asyncio.Task, timeout: float = SWEEP_STOP_SEC) -> None:
        """Stop the sweeper between passes: one asleep is cancelled; a pass in progress ends
        first (at most `timeout` s), since a cancel inside it could drop the event it was
        recording (a tick's, an approval's expiry: a decision made in a worker thread, a
        journal append still queued for one) before close() signs the final records."""
        self._sweep_stopping = True
        if not self._sweeping:
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
        self._sweep_stopping = False  # a later start() sweeps again

    async def sweep(self) -> None:
        """One pass: end idle persona instances, charge wall-clock, expire unanswered approvals,
        end idle sessions, then refresh the budget gauges of the next batch of sessions. The
        pass yields to the proxy every SWEEP_SLICE sessions: with thousands of sessions it must
        not hold the loop."""
        await self.personas.sweep()
        now = self.clock()
        idle_budget = IDLE_SWEEPS_PER_PASS
        for n, live in enumerate(list(self._sessions.values()), 1):
            if n % SWEEP_SLICE == 0:
                await asyncio.sleep(0)
            if live.ended:
                continue
            if live.state.personas_live:
                self.personas.reconcile(live.id, live.state.personas_live)
            for approval_id, pending in list(live.pending.items()):
                if now >= pending.expires_at and not pending.answer.done():
                    await self._expire(live, approval_id)
            idle = not live.pending and live.state.in_flight == 0 and now - live.last_activity >= self.session_idle_sec
            if idle and not (self.session_book is not None and self.session_book.holds_lock(live.id)):
                # (a session holding the agent's lock stays open, so its lift is recorded in its record)
                await self.end_session(live.id)
                continue
            if live.unsaved:
                await self._store(self._save, live)
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
                await self._apply(live, Tick(), None)
        await self._refresh_gauges()

    async def _refresh_gauges(self) -> None:
        """Keep the budget gauges current for scrapers, GAUGE_BATCH sessions a tick, round
        robin: a bounded number of store reads per tick (off the loop for Redis)."""
        def running(session: str) -> bool:
            live = self._sessions.get(session)
            return live is not None and not live.ended

        batch = self._index.page(self._gauge_cursor, GAUGE_BATCH, running)
        self._gauge_cursor = batch[-1] if len(batch) == GAUGE_BATCH else None
        if batch:
            await self._store(self._refresh_batch, batch)

    def _refresh_batch(self, sessions: list[str]) -> None:
        for session in sessions:
            try:
                self._budgets(session)
            except StoreError:  # the next step's snapshot fails closed; a gauge can wait
                self.metrics.store_error()
                log.warning("could not read the budgets of session %s for its gauges", session)
