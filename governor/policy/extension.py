"""Growing a streamed model call's reservation as its usage passes it (pure).

A model call reserves its expected consumption at admission (max_tokens, or the
adapters' default guess). A stream may run past that: an upstream that ignores
max_tokens, a request that named none. Its running usage is then charged as it goes:
before a chunk past the reservation is delivered, the reservation is extended
(atomically, against every cap, by the store) to cover the usage so far plus some
headroom, so that the next chunks need no store round trip. When even the exact
usage so far does not fit, nothing is extended: the running report's projection
(`decide`) then finds the cap crossed and the stream is cut.

Headroom: a quarter of the output so far, at least HEADROOM_MIN tokens (a stream
that keeps going needs O(log n) extensions), priced like the output it stands for.
"""

from __future__ import annotations

from typing import Mapping

from governor.policy.limits import TOKENS, Limits
from governor.policy.steps import CounterCharge, CounterKey, UsageReport

HEADROOM_MIN = 64
HEADROOM_FRACTION = 0.25


def headroom(step: UsageReport) -> int:
    """Output tokens reserved beyond a running report's usage when its reservation grows."""
    return max(HEADROOM_MIN, int(step.output_tokens * HEADROOM_FRACTION))


def covered(limits: Limits, step: UsageReport, reserved: tuple[CounterCharge, ...]) -> bool:
    """Whether a running report's usage is within what its call holds: nothing reserved
    (no budget is metered) or every metered amount within its reservation."""
    if not reserved:
        return True
    return limits.within_reservation(step.with_reserved(reserved))


def extension(limits: Limits, step: UsageReport, reserved: tuple[CounterCharge, ...],
              extra_output: int) -> tuple[CounterCharge, ...] | None:
    """The charges that grow `reserved` to cover `step`'s usage plus `extra_output` output
    tokens, each with its reserved counter's cap (a counter the admission did not draw on:
    the meter's, when caps are enforced). () when nothing needs to grow; None when the
    usage cannot be priced (an unpriced model while cost is metered): nothing can cover it."""
    meters = limits.meters.get(step.persona, limits.meters[None])
    output = step.output_tokens + extra_output
    tokens = step.input_tokens + output
    cost = limits.pricing.cost(step.model, step.input_tokens, output, step.cached_input_tokens, step.units)
    held: Mapping[CounterKey, CounterCharge] = {(c.scope, c.persona, c.dimension): c for c in reserved}
    out = []
    for m in meters:
        amount = tokens if m.dimension == TOKENS else cost
        if amount is None:
            return None
        charge = held.get(m.key)
        more = amount - (charge.amount if charge is not None else 0.0)
        if more > 0:
            cap = charge.cap if charge is not None else (m.cap if limits.enforce_hard else None)
            out.append(CounterCharge(m.scope, m.dimension, more, cap, m.persona))
    return tuple(out)


def grown(reserved: tuple[CounterCharge, ...], more: tuple[CounterCharge, ...]) -> tuple[CounterCharge, ...]:
    """`reserved` after the store granted `more`: one charge per counter, amounts summed."""
    totals = {(c.scope, c.persona, c.dimension): c for c in reserved}
    for c in more:
        key = (c.scope, c.persona, c.dimension)
        was = totals.get(key)
        totals[key] = c if was is None else was._replace(amount=was.amount + c.amount)
    return tuple(totals.values())
