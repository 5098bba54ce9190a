"""The Redis store's script arguments and answers, shared by its blocking client
(governor.store.redis) and its asyncio one (governor.store.redis_async): one encoding, so
the two cannot disagree on what a reservation holds."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from governor.policy.steps import CounterCharge, CounterKey
from governor.store.base import (
    CounterDamaged,
    Reservation,
    RollingWindow,
    cap_limit,
    check_keys,
    counter_key,
    totals_by_key,
)
from governor.store.redis_scripts import DAMAGED_ERROR

SCOPE_CODE = {"per_session": "s", "per_day": "d"}
SCOPE_NAME = {"s": "per_session", "d": "per_day"}


def sub(dimension: str, persona: str | None) -> str:
    return f"{dimension}|{persona or ''}"


def encode_totals(totals: dict[CounterKey, float]) -> list[Any]:
    args: list[Any] = [len(totals)]
    for (scope, persona, dimension), amount in totals.items():
        args += (SCOPE_CODE[scope], sub(dimension, persona), repr(amount))
    return args


def charge_args(charges: Sequence[CounterCharge]) -> tuple[list[Any], list[CounterCharge]]:
    """The charges' totals and cap checks, as RESERVE and EXTEND read them, and the capped
    charges in the order the scripts number them (a refusal names one by its place)."""
    totals = totals_by_key(charges)
    index = {key: i for i, key in enumerate(totals, start=1)}
    capped = [c for c in charges if c.cap is not None]
    args = encode_totals(totals)
    args.append(len(capped))
    for c in capped:
        args += (index[counter_key(c)], repr(cap_limit(c.cap)))
    return args, capped


def reserve_args(window: RollingWindow, ttl_ms: int, agent: str, session: str, rid: str,
                 charges: Sequence[CounterCharge], now: float) -> tuple[list[Any], list[CounterCharge]]:
    args: list[Any] = [agent, session, rid, window.bucket_of(now), window.first_live(now), ttl_ms, repr(now)]
    encoded, capped = charge_args(charges)
    return args + encoded, capped


# what Redis appends to an error a script raised (not part of what it found)
_SCRIPT_SUFFIX = re.compile(r" script: [0-9a-f]{40}, on @user_script:\d+\.$")


def counter_damaged(exc: Exception) -> CounterDamaged | None:
    """The typed error of a script's GOVERNOR_DAMAGED reply ("<length>:<key[field]> <found>":
    a budget counter that is not a count), or None for any other error."""
    text = str(exc)
    if not text.startswith(DAMAGED_ERROR + " "):
        return None
    length, _, rest = text[len(DAMAGED_ERROR) + 1:].partition(":")
    size = int(length) if length.isdigit() else 0
    raw = rest.encode()  # Lua's `#name` counts bytes: an agent or session name need not be ASCII
    return CounterDamaged(raw[:size].decode(errors="replace"),
                          _SCRIPT_SUFFIX.sub("", raw[size + 1:].decode(errors="replace")))


def refused(capped: Sequence[CounterCharge], index: Any, observed: Any) -> Reservation:
    return Reservation(id=None, ok=False, failed=capped[int(index) - 1], observed=float(observed))


@dataclass(frozen=True, slots=True)
class ReserveWithin:
    """One RESERVE_WITHIN call: its arguments, and how to read its answer."""

    rid: str
    args: list[Any]
    capped: list[CounterCharge]
    keys: tuple[CounterKey, ...]

    @classmethod
    def of(cls, window: RollingWindow, ttl_ms: int, agent: str, session: str, keys: Sequence[CounterKey],
           charges: Sequence[CounterCharge], now: float) -> ReserveWithin:
        check_keys(keys)
        rid = uuid.uuid4().hex
        args, capped = reserve_args(window, ttl_ms, agent, session, rid, charges, now)
        args.append(len(keys))
        for scope, persona, dimension in keys:
            args += (SCOPE_CODE[scope], sub(dimension, persona))
        return cls(rid, args, capped, tuple(keys))

    def answer(self, result: Sequence[Any]) -> tuple[dict[CounterKey, float], Reservation]:
        """The snapshot, and the reservation (held, with no charges an empty one as `reserve`
        holds it, or refused)."""
        snapshot = {key: float(value) for key, value in zip(self.keys, result[3:])}
        if int(result[0]) == 1:
            return snapshot, Reservation(id=self.rid, ok=True)
        return snapshot, refused(self.capped, result[1], result[2])


def commit_args(window: RollingWindow, ttl_ms: int, reservation_id: str, actual: Sequence[CounterCharge] | None,
                now: float) -> list[Any]:
    args: list[Any] = [reservation_id, window.first_live(now), ttl_ms]
    if actual is None:
        args += ("held", 0)
    else:
        args.append("actual")
        args += encode_totals(totals_by_key(actual))
    return args
