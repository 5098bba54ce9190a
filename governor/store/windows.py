"""Window counters: the rate limits' counts per tumbling window (governor.policy.rates).

A window counter is named (`counter`, e.g. "a:5:agent:requests:60") and split in windows of
`window_sec` seconds: window `floor(now / window_sec)` counts from its start until it rolls
at its end, then the next one starts from zero. `take` adds a step's amounts to every counter
it names, atomically, only when every capped counter stays within its cap (as a budget
reservation does: two replicas cannot admit more than a cap between them); `adjust` corrects
a counter of a past take (a model call's actual usage, or a step given back), in the window
the take counted in.

`LocalWindows` keeps them in the process (the memory and SQLite stores: one governor process
owns those). The Redis store implements the same two methods in Lua (`take_window`,
`adjust_window`), so replicas on one Redis share every window: `windows_for(store)`. A counter
found there that is not a count (edited in Redis) is never read as zero: `take_window` raises
`governor.store.CounterDamaged`, as a budget counter does, and the step is refused.

Time is passed in; nothing here reads the clock.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from governor.store.base import cap_limit


@dataclass(frozen=True, slots=True)
class WindowCharge:
    counter: str
    window_sec: float
    amount: float
    cap: float | None


@dataclass(frozen=True, slots=True)
class WindowTake:
    """`take`'s answer. ok: every amount was added, in windows `indexes` (one per charge).
    Refused: nothing changed; `failed` is the first charge whose counter would pass its cap,
    `observed` that counter's value, `rolls_at` when its window rolls."""

    ok: bool
    indexes: tuple[int, ...] = ()
    failed: int | None = None
    observed: float = 0.0
    rolls_at: float = 0.0


def window_index(now: float, window_sec: float) -> int:
    return math.floor(now / window_sec)


class WindowCounters(Protocol):
    def take_window(self, charges: Sequence[WindowCharge], now: float) -> WindowTake: ...

    def adjust_window(self, adjustments: Sequence[tuple[WindowCharge, int, float]]) -> None:
        """Add each delta (may be negative; a counter never goes below zero) to the counter's
        window of that index, when that window is still kept."""


def check_charges(charges: Sequence[WindowCharge]) -> None:
    for charge in charges:
        if not (0 <= charge.amount < math.inf) or not (charge.window_sec >= 1):
            raise ValueError(f"window charge {charge!r}: amount must be finite and >= 0, window >= 1 s")


class LocalWindows:
    """Window counters in the process; thread-safe. Only the current and the previous window
    of a counter are kept (an adjustment arrives at most one call's length later)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, float, int, float]] = {}  # counter -> (index, value, previous index, value)

    def _value(self, counter: str, index: int) -> float:
        kept = self._counts.get(counter)
        if kept is None:
            return 0.0
        if kept[0] == index:
            return kept[1]
        return kept[3] if kept[2] == index else 0.0

    def _set(self, counter: str, index: int, value: float) -> None:
        kept = self._counts.get(counter)
        if kept is None or kept[0] < index:  # a new window: the current one becomes the previous
            previous = (kept[0], kept[1]) if kept is not None and kept[0] == index - 1 else (-1, 0.0)
            self._counts[counter] = (index, value, *previous)
        elif kept[0] == index:
            self._counts[counter] = (index, value, kept[2], kept[3])
        elif kept[2] == index:
            self._counts[counter] = (kept[0], kept[1], index, value)

    def take_window(self, charges: Sequence[WindowCharge], now: float) -> WindowTake:
        check_charges(charges)
        indexes = tuple(window_index(now, c.window_sec) for c in charges)
        with self._lock:
            totals: dict[tuple[str, int], float] = {}
            for c, index in zip(charges, indexes):
                totals[(c.counter, index)] = totals.get((c.counter, index), 0.0) + c.amount
            for i, (c, index) in enumerate(zip(charges, indexes)):
                value = self._value(c.counter, index)
                if c.cap is not None and value + totals[(c.counter, index)] > cap_limit(c.cap):
                    return WindowTake(False, failed=i, observed=value, rolls_at=(index + 1) * c.window_sec)
            for (counter, index), amount in totals.items():
                self._set(counter, index, self._value(counter, index) + amount)
            if len(self._counts) > 4096:
                self._evict(now)
        return WindowTake(True, indexes)

    def adjust_window(self, adjustments: Sequence[tuple[WindowCharge, int, float]]) -> None:
        with self._lock:
            for charge, index, delta in adjustments:
                kept = self._counts.get(charge.counter)
                if kept is not None and index in (kept[0], kept[2]):
                    self._set(charge.counter, index, max(0.0, self._value(charge.counter, index) + delta))

    def _evict(self, now: float) -> None:
        """Counters whose windows have all rolled (lock held): many tools, many agents."""
        for counter, kept in list(self._counts.items()):
            window = _window_of(counter)
            if window is not None and kept[0] < window_index(now, window) - 1:
                del self._counts[counter]


def _window_of(counter: str) -> float | None:
    try:
        return float(counter.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def windows_for(store: Any) -> WindowCounters:
    """The store's own window counters when it shares them across processes (Redis), else
    counters in this process."""
    if callable(getattr(store, "take_window", None)) and callable(getattr(store, "adjust_window", None)):
        return store
    return LocalWindows()
