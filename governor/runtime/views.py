"""The control plane's views of the runtime: readiness, the paged session listing and one
session's view with its budgets (which also feed the budget gauges the sweeper refreshes).

`Views` reads the live-session table and the store it is handed in its constructor.
Nothing here is on the per-request path: the listing yields to the proxy's loop every few
sessions, and store reads go off the loop for a remote store.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from governor.policy import Limits
from governor.runtime.approvals import Approvals
from governor.runtime.session import LiveSession
from governor.runtime.shared_views import SharedViews
from governor.sessions.index import SessionIndex
from governor.runtime.settings import RuntimeSettings
from governor.store import Store, StoreError
from governor.evidence import iso_utc

if TYPE_CHECKING:
    from governor.runtime.metrics import Metrics

# calls the store: inline when local, from a worker thread when it crosses the network (Runtime._store)
StoreCall = Callable[..., Awaitable[Any]]

log = logging.getLogger("governor.runtime")

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


class Views:
    """What the control plane reads of the runtime's sessions."""

    def __init__(self, *, sessions: dict[str, LiveSession], index: SessionIndex, store: Store, store_call: StoreCall,
                 settings: RuntimeSettings, agent_id: str, metrics: Metrics, clock: Callable[[], float],
                 approvals: Approvals, shared: Any = None) -> None:
        self.sessions = sessions
        self.index = index
        self.store = store
        self.store_call = store_call
        self.settings = settings  # its limits: the runtime's, as they are now
        self._caps: tuple[Limits, dict] | None = None  # the runtime's limits and their caps, once per limits
        self.agent_id = agent_id
        self.metrics = metrics
        self.clock = clock
        self.approvals = approvals
        # replicas sharing sessions (a SharedRetention): every replica lists every shared session
        self.shared = SharedViews(retention=shared, holds=shared.sessions.holds, budgets=self.budgets,
                                  limits=lambda: self.settings.limits) if shared is not None else None

    def caps(self) -> dict:
        """The caps of the runtime's limits as they are now (computed again only when replaced)."""
        limits = self.settings.limits
        if self._caps is None or self._caps[0] is not limits:
            self._caps = (limits, caps_by_key(limits))
        return self._caps[1]

    async def ready(self) -> dict[str, Any]:
        try:
            await asyncio.to_thread(self.store.snapshot, self.agent_id, "readiness-probe", self.clock(), ())
        except StoreError as exc:
            self.metrics.store_error()
            return {"ready": False, "store": f"unreachable: {exc}", "passport_digest": self.settings.limits.passport_digest}
        ready = {"ready": True, "store": "ok", "passport_digest": self.settings.limits.passport_digest,
                 "tier": self.settings.limits.tier.value}
        if self.settings.duplicates is not None:
            self.settings.duplicates.mark(ready)
        return ready

    async def acknowledge_store(self) -> dict[str, Any]:
        """An operator accepts that the store lost its data (StoreIntegrityError until then):
        it serves again from what it holds. Sessions halted meanwhile stay halted."""
        acknowledge = getattr(self.store, "acknowledge", None)
        if acknowledge is None:
            return {"acknowledged": False, "lost": None, "reason": "this store keeps no fence to acknowledge"}
        return await asyncio.to_thread(acknowledge)

    async def page(self, after: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Views of the sessions whose ids sort after `after`, at most `limit` (None: all):
        O(log n + page), budget reads for the page only."""
        if self.shared is not None:  # every replica's sessions, as the store holds them
            try:
                return await self.shared.page(after, limit)
            except StoreError as exc:  # this replica's own, each view saying the store did not answer
                log.warning("the shared session list could not be read, listing this replica's: %s", exc)
        ids = self.index.page(after, len(self.index) if limit is None else limit, self.sessions.__contains__)
        views = []
        for n, session in enumerate(ids, 1):
            if n % VIEW_SLICE == 0:  # a page of 1,000 must not hold the proxy's loop in one piece
                await asyncio.sleep(0)
            # no gauge refresh here (the sweeper's): a page would set ~10 labelled gauges per session
            if (view := await self.session_view(session, gauges=False)) is not None:
                views.append(view)
        return views

    async def session_view(self, session: str, gauges: bool = True) -> dict[str, Any] | None:
        live = self.sessions.get(session)
        if live is None:
            return None
        try:  # a store read: off the loop for Redis, as on the per-request path
            budgets, store_error = await self.store_call(self.budgets, session, gauges and not live.ended), None
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
            "pending_approvals": self.approvals.views_of(live),
        }
        if store_error:
            view["store_error"] = store_error
        return view

    def budgets(self, session: str, gauges: bool = True) -> list[dict[str, Any]]:
        """Every counter in use or capped, against its cap; refreshes the budget gauges
        (not for an ended session: its per-session series were dropped)."""
        counters = self.store.snapshot(self.agent_id, session, self.clock())
        live = self.sessions.get(session)
        caps = self.caps() if live is None or live.limits is self.settings.limits else caps_by_key(live.limits)
        budgets = []
        for key in sorted(set(counters) | set(caps), key=lambda k: (k[0], k[1] or "", k[2])):
            scope, persona, dimension = key
            used, cap = counters.get(key, 0.0), caps.get(key)
            budgets.append({"dimension": dimension, "scope": scope, "persona": persona, "used": used, "limit": cap})
            if gauges:
                self.metrics.budget(dimension, scope, used, cap, session=session, persona=persona)
        return budgets


__all__ = ["Views", "caps_by_key"]
