"""The session listing of replicas that share sessions (docs/reference/shared-sessions.md).

Every replica lists every shared session, whatever replica opened, served or ended it: the
page's ids come from the store's index (`governor.store.redis_retention`), each view from
what the store holds of the session (its state as the last round on any replica left it,
its chain's length, its budgets, the steps held for it on any replica), so every replica
gives the same page. A session the store holds no chain head or no readable state for (a
forged index member, another writer's garbage) is left out and logged, never shown as one.

`tally` counts the shared sessions by state as the listing would show them (the
`governor_shared_sessions` gauge, the same on every replica): the open ones read one by one
(O(open sessions), with the same checks), the ended ones counted from the store's index of
written records.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import orjson

from governor.evidence import iso_utc
from governor.policy import SessionState
from governor.store import StoreError

log = logging.getLogger("governor.runtime")

VIEW_SLICE = 50  # views built before letting the proxy run
TALLY_PAGE = 500  # open sessions read in one pipelined round trip by `tally`


def saved_state(session: str, saved: bytes | None) -> SessionState | None:
    """The state a round saved for `session` (None: none yet); ValueError, KeyError or TypeError
    when it is unreadable or another session's."""
    state = SessionState.from_dict(orjson.loads(saved)) if saved is not None else None
    if state is not None and state.session != session:
        raise ValueError(f"the state saved under {session} is session {state.session}'s")
    return state


def state_label(state: SessionState | None, recorded: bool, held: bool) -> str:
    """A listed session's state: ended, halted, paused (a step held for review) or active."""
    if recorded or (state is not None and state.ended):
        return "ended"
    if state is not None and state.halted:
        return "halted"
    return "paused" if held else "active"


class SharedViews:
    def __init__(self, *, retention: Any, holds: Callable[[], list[dict[str, Any]]], budgets: Callable[..., Any],
                 limits: Callable[[], Any]) -> None:
        self.retention = retention  # governor.store.redis_retention.SharedRetention
        self.holds = holds  # every held step listed in the store (RedisSessions.holds)
        self.budgets = budgets  # Views.budgets (a store read, blocking)
        self.limits = limits  # the runtime's limits as they are now

    async def page(self, after: str | None, limit: int | None) -> list[dict[str, Any]]:
        """Views of the shared sessions whose ids sort after `after`, at most `limit` (None: 1000);
        ids that are not sessions are passed over (the page is filled from the next ones)."""
        retention = self.retention
        limit = 1000 if limit is None else limit
        try:
            held = await asyncio.to_thread(self.holds)
        except StoreError:
            held = []
        held_by: dict[str, list[dict[str, Any]]] = {}
        for view in held:
            if isinstance(view, dict) and isinstance(view.get("session"), str):
                held_by.setdefault(view["session"], []).append(
                    {k: v for k, v in view.items() if k != "expires_at_epoch"})
        views: list[dict[str, Any]] = []
        while len(views) < limit:
            wanted = limit - len(views)
            ids = await asyncio.to_thread(retention.page, after, wanted)
            found = await asyncio.to_thread(retention.entries, ids)
            for n, session in enumerate(ids, 1):
                if n % VIEW_SLICE == 0:
                    await asyncio.sleep(0)
                if session not in found:
                    log.warning("session %s is in the store's index but has no chain: not listed", session)
                    continue
                view = await self.view(session, *found[session], held_by.get(session, []))
                if view is not None:
                    views.append(view)
            if len(ids) < wanted:  # the index's end
                break
            after = ids[-1]
        return views

    async def view(self, session: str, length: int, saved: bytes | None, recorded: bool, began: str | None,
                   held: list[dict[str, Any]]) -> dict[str, Any] | None:
        try:
            state = saved_state(session, saved)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("session %s: its state in the store is unreadable, not listed: %s", session, exc)
            return None
        label = state_label(state, recorded, bool(held))
        ended = label == "ended"
        try:
            budgets, store_error = await asyncio.to_thread(self.budgets, session, False), None
        except StoreError as exc:
            budgets, store_error = [], str(exc)
        limits = self.limits()
        view = {
            "session": session,
            "state": label,
            "tier": limits.tier.value,
            "started_at": iso_utc(state.started_at) if state is not None else began,
            "iterations": state.iterations if state is not None else 0,
            "tool_calls": state.tool_calls if state is not None else 0,
            "in_flight": state.in_flight if state is not None else 0,
            "halt_cause": state.halt_cause if state is not None else None,
            "budgets": budgets,
            "limits": {"max_iterations": limits.max_iterations, "max_tool_calls_per_session": limits.max_tool_calls},
            "events": max(0, length - 1 - (1 if ended else 0)),  # the chain: a header, the events, an end
            "pending_approvals": held,
        }
        if store_error:
            view["store_error"] = store_error
        return view

    async def tally(self) -> dict[str, int]:
        """How many shared sessions are in each state, as `page` would list them: the open ones
        (a last activity in the store) each read and checked as the listing checks it (no chain
        head, an unreadable state: not counted), plus the sessions whose records are written.
        StoreError when the store cannot be read."""
        live, ended = await asyncio.to_thread(self.retention.tally_sources)
        held = await asyncio.to_thread(self.holds)
        held_sessions = {view.get("session") for view in held if isinstance(view, dict)}
        counts = {"active": 0, "paused": 0, "halted": 0, "ended": ended}
        for start in range(0, len(live), TALLY_PAGE):
            found = await asyncio.to_thread(self.retention.entries, live[start:start + TALLY_PAGE])
            for n, (session, (_, saved, recorded, _)) in enumerate(found.items(), 1):
                if n % VIEW_SLICE == 0:
                    await asyncio.sleep(0)
                if recorded:  # (a settlement that touched it after its end): counted in `ended` already
                    continue
                try:
                    state = saved_state(session, saved)
                except (ValueError, KeyError, TypeError):
                    continue  # the listing leaves it out too (and says so when it lists)
                counts[state_label(state, False, session in held_sessions)] += 1
        return counts


__all__ = ["SharedViews"]
