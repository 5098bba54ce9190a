"""The state store contract: budget counters, session state and single-use nonces.

The policy engine decides from a snapshot of the counters; the runtime then asks
the store to *reserve* the decision's charges. A reservation is atomic across
every counter it touches: either each capped counter stays within its cap after
the step's amounts are added, or nothing changes and the store names the charge
that would overshoot. Concurrent steps (threads, processes, replicas sharing a
backend) therefore can never admit more than a cap between them.

Counters (Runtime §2): per_session counters are keyed by (session, persona,
dimension); per_day counters by (agent, persona, dimension) and summed over a
rolling 24 hours, across the agent's sessions. persona None is the parent's
aggregate counter; the policy engine emits a charge for each counter a step
draws on (aggregate and persona alike), the store derives nothing.

A counter's value is committed usage plus outstanding reservations. It goes up
by reserve and add, and down only when a reservation is released or replaced
by its (smaller) actual usage at commit; per_day values also fall as usage ages
out of the window.

Time is always passed in; no implementation reads the clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import orjson

from governor.policy.steps import CounterCharge, CounterKey

SCOPES = ("per_session", "per_day")
DIMENSIONS = ("tokens", "cost_usd", "wall_clock_sec")

# Caps are compared with this relative tolerance so that the order in which a
# backend sums floats (SQL SUM, Lua, Python) cannot turn the policy engine's
# permit into a store refusal.
CAP_TOLERANCE = 1e-9


class StoreError(Exception):
    """The store could not do what was asked."""


class StoreUnavailable(StoreError):
    """The backend failed or cannot be reached: the caller must fail closed. Transient: the
    step is refused as retryable (after `retry_after` seconds), the session goes on once the
    backend answers again. (Its subclass StoreIntegrityError is not transient.)"""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreIntegrityError(StoreUnavailable):
    """The backend lost state the store had written (a Redis emptied by FLUSHALL, a failover to
    an empty replica, a restart without persistence): its counters can no longer be trusted.
    Every operation fails closed until an operator acknowledges the loss (`acknowledge`)."""


class CounterDamaged(StoreError):
    """A counter in the store holds something that is not a count: a budget counter or a rate
    limit's window counter edited in Redis (text, nan, an infinite or negative number, a key of
    another type), or a budget counter edited into the SQLite state file. Damage to that one
    key, not a loss of the store (neither transient nor a StoreIntegrityError): it is never
    read as zero, what met it wrote nothing, and the key is left as found. Every step that
    reads it is refused (fail closed, recorded, not retryable: waiting does not mend it) and
    the session goes on: once an operator deletes or corrects the key, its steps are served
    again, with no acknowledgement (docs/reference/stores.md says why). `key` names it (with
    the field, in brackets), `found` is what it holds."""

    def __init__(self, key: str, found: str) -> None:
        # a process-local session's keys hold a control character (store/redis.py LOCAL_SESSIONS):
        # named as redis-cli reads it between double quotes
        key = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in key)
        super().__init__(f"the counter {key} is not a count (it holds {found!r}): it was edited or damaged in the "
                         "store and is left as found; every step that reads it is refused until an operator "
                         "deletes or corrects it")
        self.key, self.found = key, found


class UnknownReservation(StoreError, LookupError):
    """No outstanding reservation has this id (never made, already committed or released)."""

    def __init__(self, reservation_id: str) -> None:
        super().__init__(
            f"no outstanding reservation {reservation_id!r} (never made, already committed or released)"
        )
        self.reservation_id = reservation_id


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to `reserve`.

    ok:       the charges are held under `id` until commit or release.
    failed:   when refused, the (first) capped charge that would overshoot;
    observed: that counter's value (committed + reserved) before this step.
    """

    id: str | None
    ok: bool
    failed: CounterCharge | None = None
    observed: float | None = None

    @property
    def key(self) -> CounterKey | None:
        """The failing counter, for the boundary event."""
        return None if self.failed is None else counter_key(self.failed)


@dataclass(frozen=True, slots=True)
class RollingWindow:
    """The per_day window: `length` seconds, resolved to buckets of `bucket` seconds.

    Usage is dated to the bucket of its reservation (or of `add`). A bucket
    counts while any of it lies within the last `length` seconds, so usage
    leaves the per_day sum between `length` and `length + bucket` seconds after
    it happened: the window errs on the side of counting.
    """

    length: float = 86400.0
    bucket: float = 60.0

    def __post_init__(self) -> None:
        if not (self.bucket > 0 and self.length > 0):
            raise ValueError("window length and bucket width must be positive")

    def bucket_of(self, t: float) -> int:
        return math.floor(t / self.bucket)

    def first_live(self, now: float) -> int:
        """The oldest bucket still counted at `now`."""
        return math.floor((now - self.length) / self.bucket)


DAY = RollingWindow()


class Store(Protocol):
    """What the runtime and the control plane use; all methods are synchronous.

    Every method raises StoreUnavailable when the backend fails, so the caller
    can deny the step and record why.
    """

    window: RollingWindow
    # True when calls cross the network (Redis): the runtime then calls the store from a
    # worker thread, so a slow round trip never stalls the proxy's event loop. Local
    # stores (memory, SQLite) answer in microseconds and are called inline.
    remote: bool

    # --- budget counters -------------------------------------------------------------
    def reserve(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> Reservation:
        """Hold `charges` atomically if every capped counter stays within its cap."""

    def commit(self, reservation_id: str, actual: Sequence[CounterCharge] | None, now: float) -> None:
        """Replace a reservation by the step's actual usage (None: exactly what was reserved).

        `actual` lists the step's whole usage: reserved counters it omits get
        zero, counters it adds are created. Caps are not checked (the
        reservation admitted the step). Usage is dated at the reservation.
        Raises UnknownReservation when the reservation is not outstanding.
        """

    def release(self, reservation_id: str) -> bool:
        """Drop an unused reservation; False (and nothing changes) when it is not outstanding."""

    def extend(self, reservation_id: str, charges: Sequence[CounterCharge], now: float) -> Reservation:
        """Grow an outstanding reservation by `charges`, atomically, if every capped counter
        stays within its cap (as `reserve` checks); refused, nothing changes. The amounts are
        dated at the reservation, and commit/release then treat them as part of it (a
        stream whose usage passed what its admission reserved). Raises UnknownReservation
        when the reservation is not outstanding."""

    def add(self, agent: str, session: str, charges: Sequence[CounterCharge], now: float) -> None:
        """Record usage unconditionally, dated `now` (caps are not checked)."""

    def reserve_within(self, agent: str, session: str, keys: Sequence[CounterKey], charges: Sequence[CounterCharge],
                       now: float) -> tuple[dict[CounterKey, float], Reservation]:
        """`snapshot(agent, session, now, keys)` and then `reserve(agent, session, charges, now)`
        as one operation: the counters `keys` as they were before the reservation, and the
        reservation (refused: nothing held). What the runtime admits the usual model call with
        (its charges do not depend on the counters; it decides on the snapshot and releases
        the reservation when the decision is not that plain permit). `reserve_within` below
        is the default, in two operations; a store may do it in one."""

    def snapshot(
        self, agent: str, session: str, now: float, keys: Sequence[CounterKey] | None = None
    ) -> dict[CounterKey, float]:
        """Counter values (committed + reserved): `keys` (0.0 when unused) or every counter in use."""

    def settle_reservations(self, before: float) -> int:
        """Commit every reservation made before `before` as reserved; returns how many.

        For reservations whose step's outcome was lost (the process that held
        them died): they keep counting, and their records are forgotten.
        """

    # --- session state ---------------------------------------------------------------
    def save_session(self, session: str, state: dict) -> None: ...

    def load_session(self, session: str) -> dict | None: ...

    def list_sessions(self) -> list[str]:
        """Sessions with saved state, sorted."""

    def delete_session(self, session: str) -> bool:
        """Forget a session: its state, its per_session counters and its open reservations.

        Open reservations are settled as reserved (their per_day amounts keep
        counting). Returns whether the session had saved state.
        """

    # --- single-use nonces (control plane, §8.5) --------------------------------------
    def put_nonce(self, nonce: str, expires_at: float, now: float) -> None:
        """Remember an issued nonce until `expires_at` (re-issuing replaces the expiry)."""

    def take_nonce(self, nonce: str, now: float) -> bool:
        """True once for a nonce issued and not yet expired at `now`; it is consumed either way."""

    def close(self) -> None: ...


# --- helpers shared by the implementations ---------------------------------------------


def reserve_within(store: Store, agent: str, session: str, keys: Sequence[CounterKey],
                   charges: Sequence[CounterCharge], now: float) -> tuple[dict[CounterKey, float], Reservation]:
    """Store.reserve_within in two of the store's operations: the snapshot, then the reservation."""
    counters = store.snapshot(agent, session, now, keys)
    return counters, store.reserve(agent, session, charges, now)


def counter_key(charge: CounterCharge) -> CounterKey:
    return (charge.scope, charge.persona, charge.dimension)


def _check_key(key: CounterKey) -> None:
    scope, persona, dimension = key
    if scope not in SCOPES:
        raise ValueError(f"unknown counter scope {scope!r} (expected one of {SCOPES})")
    if dimension not in DIMENSIONS:
        raise ValueError(f"unknown budget dimension {dimension!r} (expected one of {DIMENSIONS})")
    if persona is not None and (not isinstance(persona, str) or not persona):
        raise ValueError(f"persona must be None or a non-empty name, got {persona!r}")


# Keys already checked: a governor draws on a handful of counters, so after the first
# steps a check is one set lookup (this runs on every step's per-request path).
_KEYS_SEEN: set[CounterKey] = set()
_INF = math.inf


def _check_known(key: CounterKey) -> None:
    try:
        if key in _KEYS_SEEN:
            return
    except TypeError:  # an unhashable part: _check_key names it
        pass
    _check_key(key)
    _KEYS_SEEN.add(key)


def totals_by_key(charges: Sequence[CounterCharge]) -> dict[CounterKey, float]:
    """The amount each counter receives (several charges may name one counter); raises
    ValueError for a charge no counter can be made of."""
    totals: dict[CounterKey, float] = {}
    for c in charges:
        key = (c.scope, c.persona, c.dimension)
        _check_known(key)
        amount, cap = c.amount, c.cap
        if not 0 <= amount < _INF:  # also false for NaN
            raise ValueError(f"charge amount must be finite and >= 0, got {amount!r}")
        if cap is not None and not 0 <= cap < _INF:
            raise ValueError(f"charge cap must be None or finite and >= 0, got {cap!r}")
        totals[key] = totals.get(key, 0.0) + float(amount)
    return totals


def cap_limit(cap: float) -> float:
    """The largest counter value a cap admits (the cap plus the summation tolerance)."""
    return cap + CAP_TOLERANCE * max(1.0, abs(cap))


def first_overshoot(
    charges: Sequence[CounterCharge], totals: dict[CounterKey, float], current: dict[CounterKey, float]
) -> tuple[CounterCharge, float] | None:
    """The first capped charge whose counter would exceed its cap, with the counter's value."""
    for c in charges:
        if c.cap is None:
            continue
        key = counter_key(c)
        value = current.get(key, 0.0)
        if value + totals[key] > cap_limit(c.cap):
            return c, value
    return None


COUNT_SLACK = 1e-6  # how far below zero float sums of adds and takes may leave a count (the Lua's SLACK)


def stored_count(value: object, table: str, **row: object) -> float:
    """A counter value read from the SQLite state file: a count, else CounterDamaged naming
    the row (text, inf, a negative number: the file was edited; SQLite keeps text in a REAL
    column, and its sums read text as zero). The row's name is built only for the error: a
    shared SQLite store reads counters on every step."""
    if type(value) in (float, int) and -COUNT_SLACK <= value < _INF:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]
    raise CounterDamaged(state_row(table, **row), str(value)[:64])


def state_row(table: str, **columns: object) -> str:
    """A row of the state file, as CounterDamaged names it (what an operator deletes or corrects)."""
    return f"{table}(" + ", ".join(f"{name}={value!r}" for name, value in columns.items()) + ")"


def check_keys(keys: Sequence[CounterKey]) -> None:
    for key in keys:
        _check_known(tuple(key))  # type: ignore[arg-type]


def encode_state(state: dict) -> bytes:
    """Session state as JSON bytes (what every backend keeps)."""
    try:
        return orjson.dumps(state)
    except TypeError as exc:
        raise TypeError(f"session state is not JSON-serializable: {exc}") from exc
