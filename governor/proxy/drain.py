"""A graceful stop (SIGTERM): the proxy drains before the governor stops.

    drain = Drain(exchanges, enforcer, guard, ...)    # one per running governor
    await drain.run(grace, hurry)                     # closed to new steps, in flight waited for, the rest cut

Once the drain begins (`begin`):

  * no new step: every new request is answered 503 with `Retry-After` and `Connection:
    close` (so a client's retry opens a new connection, which a Service sends to another
    replica), recorded in its session as a refusal (reason `shutting_down`); the session
    binding asks `closed` per request (one attribute read);
  * `/readyz` answers not-ready at once (the control plane asks `draining`), so a Service
    stops sending;
  * what is in flight (streams included) may finish until the grace period is over, or
    until `hurry` is set (a second SIGTERM or SIGINT);
  * then a connection waiting for a reviewer is answered as its hold time would answer it
    (429 `review_pending`, Retry-After: the review itself goes on, in the control plane),
    and every governed exchange still in flight is cut the way a refusal cuts it (a stream:
    its provider's error event, then the end; a request not yet answered: 503 in the
    provider's format, with Retry-After), and the cut recorded in its session. Then every
    client connection is closed (`close_connections`): what is not governed (allowed or
    forwarded traffic, tunnels, WebSockets) ends there.

The records are written after the drain, when the runtime ends every open session
(`Running.stop`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from governor.adapters.base import Reply
from governor.policy.steps import Action, Decision
from governor.proxy import refusals
from governor.proxy.enforcing import Enforcer
from governor.proxy.exchanges import Exchanges
from governor.proxy.refusing import as_raw, generic_error

log = logging.getLogger("governor.proxy")

DEFAULT_GRACE_SEC = 25.0  # Kubernetes' default terminationGracePeriodSeconds (30) less a margin for the records
RETRY_AFTER_SEC = 5  # a client's retry goes to another replica: soon
POLL_SEC = 0.05
SETTLE_AFTER_CUT_SEC = 2.0  # the cuts' terminal events written and their exchanges ended, at most this long
MESSAGE = "the governor is shutting down; retry on a new connection"
CUT_MESSAGE = "the governor is shutting down and its grace period for calls in flight is over; the call was cut"


class Drain:
    """The drain of one running proxy."""

    def __init__(self, exchanges: Exchanges, enforcer: Enforcer, *, guard: Any = None, holds: Any = None,
                 clock: Any = time.monotonic) -> None:
        self.exchanges = exchanges  # governed exchanges in flight, by session
        self.holds = holds  # governor.proxy.holds.Holds: connections waiting for a reviewer
        self.enforcer = enforcer  # cuts
        self.guard = guard  # governor.proxy.connections.ConnectionGuard: every connection with a request in flight
        self.clock = clock
        self.closed = False  # new requests refused
        self.started: float | None = None
        self.deadline: float | None = None

    @property
    def draining(self) -> str | None:
        """Why the governor is not ready (None: it is not draining)."""
        return "draining: the governor is shutting down" if self.closed else None

    def begin(self, grace: float) -> None:
        if not self.closed:
            self.closed = True
            self.started = self.clock()
            self.deadline = self.started + grace

    def in_flight(self) -> int:
        """Requests in flight: every connection with one (governed or not), else the governed exchanges."""
        governed = sum(len(live) for live in self.exchanges.by_session.values())
        if self.guard is None:
            return governed
        return max(self.guard.busy_connections, governed)

    async def run(self, grace: float, hurry: asyncio.Event | None = None) -> int:
        """Drain: closed to new steps, in flight waited for at most `grace` seconds (or until
        `hurry`), then the governed exchanges left cut. Returns how many were cut."""
        self.begin(grace)
        left = self.in_flight()
        log.info("governor: draining: new requests are refused (503); %d request(s) in flight may finish "
                 "within %gs (a second SIGTERM or SIGINT stops at once)", left, grace)
        assert self.deadline is not None
        while self.in_flight() and self.clock() < self.deadline and not (hurry is not None and hurry.is_set()):
            await asyncio.sleep(POLL_SEC)
        cut = self.cut_all()
        if self.holds is not None:  # a connection waiting for a review: answered 429 review_pending now
            self.holds.release_waiting()
            settle = self.clock() + SETTLE_AFTER_CUT_SEC
            while self.in_flight() and self.clock() < settle:
                await asyncio.sleep(POLL_SEC)
        if cut:
            log.warning("governor: drain over (%s): cut %d call(s) still in flight",
                        "stopped at once" if hurry is not None and hurry.is_set() else f"grace period of {grace:g}s",
                        cut)
            settle = self.clock() + SETTLE_AFTER_CUT_SEC
            while self.exchanges.by_session and self.clock() < settle:
                await asyncio.sleep(POLL_SEC)
        else:
            log.info("governor: drained: nothing left in flight")
        await self.close_connections()
        return cut

    async def close_connections(self) -> None:
        """Every client connection closed before the master stops (it would cancel each
        connection's task mid-await, and asyncio logs a traceback for each)."""
        if self.guard is None:
            return
        self.guard.close_all()
        connections = getattr(self.enforcer.proxyserver, "connections", None)
        deadline = self.clock() + SETTLE_AFTER_CUT_SEC
        while connections and self.clock() < deadline:
            await asyncio.sleep(POLL_SEC)

    def cut_all(self) -> int:
        """Cut every governed exchange still in flight, each recorded in its session."""
        cut = 0
        for session, live in list(self.exchanges.by_session.items()):
            for flight, flow in list(live.items()):
                if flight.finished or flight.refusal is not None:
                    continue
                gov = {"cause": None, "action": "deny", "reason": CUT_MESSAGE, "session": session,
                       "refusal": refusals.SHUTTING_DOWN}
                try:
                    if flight.relay is None and flow.response is None:  # nothing answered yet: 503, Retry-After
                        flight.refusal = (Decision(action=Action.DENY), gov)
                        self.enforcer.answer(flow, as_raw(self._unanswered(flight, gov), "deny"))
                    else:
                        self.enforcer.enforce(flow, flight, Decision(action=Action.DENY), gov)
                except Exception:  # the master's stop closes it all the same
                    log.exception("governor: could not cut %s at shutdown", flow.request.pretty_url)
                    continue
                self.enforcer.record_refusal(session, refusals.SHUTTING_DOWN,
                                             refusals.detail(refusals.SHUTTING_DOWN, 503, flow.request, CUT_MESSAGE))
                cut += 1
        return cut

    @staticmethod
    def _unanswered(flight: Any, gov: dict[str, Any]) -> Reply:
        """A call the upstream had not begun to answer: 503 in its provider's format, Retry-After."""
        try:
            reply = flight.exchange.adapter.error_response(503, f"governor: {CUT_MESSAGE}", gov, flight.exchange)
        except Exception:
            log.exception("governor: adapter %s could not build a refusal", flight.exchange.adapter.name)
            reply = generic_error(503, f"governor: {CUT_MESSAGE}", gov)
        reply.headers = {**reply.headers, "Retry-After": str(RETRY_AFTER_SEC)}
        return reply


__all__ = ["Drain", "DEFAULT_GRACE_SEC", "RETRY_AFTER_SEC", "MESSAGE"]
