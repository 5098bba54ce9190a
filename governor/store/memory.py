"""An in-process store: for tests and single-process runs that need no persistence."""

from __future__ import annotations

import itertools
import threading
import uuid
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import orjson

from governor.policy.steps import CounterCharge, CounterKey
from governor.store.base import (
    DAY,
    Reservation,
    RollingWindow,
    StoreUnavailable,
    UnknownReservation,
    check_keys,
    encode_state,
    first_overshoot,
    totals_by_key,
)

_Sub = tuple[str | None, str]  # (persona, dimension) within a session or an agent
_EMPTY: Mapping = {}


@dataclass(slots=True)
class DayCounter:
    """A per_day counter: its buckets and their running total.

    Expired buckets are dropped (and taken off the total) once each, when the
    window has moved past `oldest`, so reading the rolling sum costs O(1).
    """

    buckets: dict[int, float]
    total: float
    oldest: int  # no bucket is older than this

    def live(self, first_live: int) -> float:
        if self.oldest < first_live:
            for b in [b for b in self.buckets if b < first_live]:
                self.total -= self.buckets.pop(b)
            self.oldest = first_live
        return self.total

    def add(self, bucket: int, amount: float) -> None:
        self.buckets[bucket] = self.buckets.get(bucket, 0.0) + amount
        self.total += amount
        self.oldest = min(self.oldest, bucket)

    def take(self, bucket: int, amount: float) -> None:
        if bucket in self.buckets:  # absent: aged out of the window, no longer counted
            self.buckets[bucket] -= amount
            self.total -= amount


@dataclass(slots=True)
class HeldReservation:
    agent: str
    session: str
    bucket: int
    created: float
    totals: dict[CounterKey, float]


class MemoryStore:
    """Thread-safe (one lock); everything is lost when the process ends."""

    remote = False

    def __init__(self, window: RollingWindow = DAY) -> None:
        self.window = window
        self._lock = threading.Lock()
        self._closed = False
        self._session_counters: dict[str, dict[_Sub, float]] = {}
        self._day_counters: dict[str, dict[_Sub, DayCounter]] = {}
        self._held: dict[str, HeldReservation] = {}
        self._sessions: dict[str, bytes] = {}  # as JSON, like the other backends
        self._nonces: dict[str, float] = {}
        # reservation ids: a random prefix per store (ids written behind to a file stay unique
        # across restarts) and a counter, cheaper than a uuid4 per reservation
        self._id_prefix = uuid.uuid4().hex[:16] + "-"
        self._ids = itertools.count(1)

    # --- counters ----------------------------------------------------------------------
    # Each operation resolves the session's and the agent's counter tables once and walks
    # its keys (the per-request path: a model call reserves and settles four counters).
    def reserve(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> Reservation:
        totals = totals_by_key(charges)
        with self._locked():
            first_live = self.window.first_live(now)
            overshoot = first_overshoot(charges, totals, self._values(agent, session, totals, first_live))
            if overshoot is not None:
                return Reservation(id=None, ok=False, failed=overshoot[0], observed=overshoot[1])
            bucket = self.window.bucket_of(now)
            self._add(agent, session, totals, bucket, first_live)
            rid = f"{self._id_prefix}{next(self._ids):x}"
            self._held[rid] = HeldReservation(agent, session, bucket, now, totals)
            return Reservation(id=rid, ok=True)

    def reserve_within(self, agent: str, session: str, keys: Sequence[CounterKey], charges: Sequence[CounterCharge],
                       now: float) -> tuple[dict[CounterKey, float], Reservation]:
        """snapshot() then reserve() under one hold of the lock, the counters read once."""
        check_keys(keys)
        totals = totals_by_key(charges)
        with self._locked():
            first_live = self.window.first_live(now)
            counters = self._values(agent, session, keys, first_live)
            # the charges' counters are among the snapshot's for a model call; read any that are not
            current = counters if totals.keys() <= counters.keys() else \
                {**counters, **self._values(agent, session, totals, first_live)}
            overshoot = first_overshoot(charges, totals, current)
            if overshoot is not None:
                return counters, Reservation(id=None, ok=False, failed=overshoot[0], observed=overshoot[1])
            bucket = self.window.bucket_of(now)
            self._add(agent, session, totals, bucket, first_live)
            rid = f"{self._id_prefix}{next(self._ids):x}"
            self._held[rid] = HeldReservation(agent, session, bucket, now, totals)
            return counters, Reservation(id=rid, ok=True)

    def commit(self, reservation_id: str, actual: Sequence[CounterCharge] | None, now: float) -> None:
        actual_totals = None if actual is None else totals_by_key(actual)
        with self._locked():
            held = self._held.pop(reservation_id, None)
            if held is None:
                raise UnknownReservation(reservation_id)
            if actual_totals is None:
                return
            self._unhold(held)
            self._add(held.agent, held.session, actual_totals, held.bucket, self.window.first_live(now))

    def release(self, reservation_id: str) -> bool:
        with self._locked():
            held = self._held.pop(reservation_id, None)
            if held is None:
                return False
            self._unhold(held)
            return True

    def extend(self, reservation_id: str, charges: Sequence[CounterCharge], now: float) -> Reservation:
        totals = totals_by_key(charges)
        with self._locked():
            held = self._held.get(reservation_id)
            if held is None:
                raise UnknownReservation(reservation_id)
            first_live = self.window.first_live(now)
            overshoot = first_overshoot(charges, totals, self._values(held.agent, held.session, totals, first_live))
            if overshoot is not None:
                return Reservation(id=None, ok=False, failed=overshoot[0], observed=overshoot[1])
            # a new dict, never the old one changed: a flush may be writing the old one
            grown = dict(held.totals)
            for key, amount in totals.items():
                grown[key] = grown.get(key, 0.0) + amount
            held.totals = grown
            self._extended(reservation_id)
            self._add(held.agent, held.session, totals, held.bucket, first_live)
            return Reservation(id=reservation_id, ok=True)

    def _extended(self, reservation_id: str) -> None:
        """A reservation's amounts grew (store lock held): a store that persists it rewrites it."""

    def add(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> None:
        totals = totals_by_key(charges)
        with self._locked():
            self._add(agent, session, totals, self.window.bucket_of(now), self.window.first_live(now))

    def snapshot(
        self, agent: str, session: str, now: float, keys: Sequence[CounterKey] | None = None
    ) -> dict[CounterKey, float]:
        if keys is not None:
            check_keys(keys)
        with self._locked():
            first_live = self.window.first_live(now)
            if keys is not None:
                return self._values(agent, session, keys, first_live)
            values = {("per_session", p, d): v for (p, d), v in self._session_counters.get(session, {}).items()}
            for (p, d), counter in self._day_counters.get(agent, {}).items():
                value = counter.live(first_live)
                if counter.buckets:
                    values[("per_day", p, d)] = value
            return values

    def settle_reservations(self, before: float) -> int:
        with self._locked():
            stale = [rid for rid, held in self._held.items() if held.created < before]
            for rid in stale:
                del self._held[rid]
            return len(stale)

    def _values(self, agent: str, session: str, keys: Iterable[CounterKey], first_live: int) -> dict[CounterKey, float]:
        sessions = self._session_counters.get(session, _EMPTY)
        days = self._day_counters.get(agent, _EMPTY)
        values = {}
        for key in keys:
            scope, persona, dimension = key
            if scope == "per_session":
                values[key] = sessions.get((persona, dimension), 0.0)
            else:
                counter = days.get((persona, dimension))
                values[key] = 0.0 if counter is None else counter.live(first_live)
        return values

    def _add(self, agent: str, session: str, totals: dict[CounterKey, float], bucket: int, first_live: int) -> None:
        """Add each amount to its counter (made on first use), then tell `_changed`."""
        sessions: dict[_Sub, float] | None = None
        days: dict[_Sub, DayCounter] | None = None
        for (scope, persona, dimension), amount in totals.items():
            sub = (persona, dimension)
            if scope == "per_session":
                if sessions is None:
                    sessions = self._session_counters.setdefault(session, {})
                sessions[sub] = sessions.get(sub, 0.0) + amount
            elif bucket >= first_live:  # usage dated before the window no longer counts
                if days is None:
                    days = self._day_counters.setdefault(agent, {})
                counter = days.get(sub)
                if counter is None:
                    counter = days[sub] = DayCounter({}, 0.0, bucket)
                counter.live(first_live)
                counter.add(bucket, amount)
        self._changed(agent, session, totals, bucket)

    def _unhold(self, held: HeldReservation) -> None:
        """Take a reservation's amounts off its counters (those still present)."""
        sessions = self._session_counters.get(held.session, _EMPTY)
        days = self._day_counters.get(held.agent, _EMPTY)
        for (scope, persona, dimension), amount in held.totals.items():
            sub = (persona, dimension)
            if scope == "per_session":
                if sub in sessions:
                    sessions[sub] -= amount
            else:
                counter = days.get(sub)
                if counter is not None:
                    counter.take(held.bucket, amount)
        self._changed(held.agent, held.session, held.totals, held.bucket)

    def _changed(self, agent: str, session: str, keys: Iterable[CounterKey], bucket: int) -> None:
        """Counters `keys` changed (in `bucket` for per_day ones): nothing to do here; a
        store that persists them marks them for writing."""

    # --- sessions ----------------------------------------------------------------------
    def save_session(self, session: str, state: dict) -> None:
        encoded = encode_state(state)
        with self._locked():
            self._sessions[session] = encoded

    def load_session(self, session: str) -> dict | None:
        with self._locked():
            encoded = self._sessions.get(session)
        return None if encoded is None else orjson.loads(encoded)

    def list_sessions(self) -> list[str]:
        with self._locked():
            return sorted(self._sessions)

    def delete_session(self, session: str) -> bool:
        with self._locked():
            for rid in [rid for rid, held in self._held.items() if held.session == session]:
                del self._held[rid]
            self._session_counters.pop(session, None)
            return self._sessions.pop(session, None) is not None

    # --- nonces ------------------------------------------------------------------------
    def put_nonce(self, nonce: str, expires_at: float, now: float) -> None:
        with self._locked():
            for old in [n for n, exp in self._nonces.items() if exp <= now]:
                del self._nonces[old]
            self._nonces[nonce] = expires_at

    def take_nonce(self, nonce: str, now: float) -> bool:
        with self._locked():
            expires_at = self._nonces.pop(nonce, None)
            return expires_at is not None and now < expires_at

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _locked(self) -> threading.Lock:
        if self._closed:
            raise StoreUnavailable("memory store is closed")
        return self._lock
