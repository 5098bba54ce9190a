"""What a model call would charge, before its counters are read: the charges of
`quiet_model_call`'s permit (every meter of the parent's, its tokens or its cost, capped
when limits are enforced). A store across the network reserves these together with the
snapshot the step is then decided on (one round trip: Store.reserve_within); a decision
that charges otherwise has the reservation released and is reserved again."""

from __future__ import annotations

from governor.policy.checks import new_tuple
from governor.policy.limits import TOKENS, Limits
from governor.policy.steps import CounterCharge, ModelCall


def expected_charges(limits: Limits, step: ModelCall) -> tuple[CounterCharge, ...] | None:
    """The charges a quiet permit of `step` would make; None for a call no quiet permit
    answers (a persona's, a held one's, one that reserves nothing)."""
    if step.persona is not None or step.approval_id is not None:
        return None
    tokens = step.expected_input_tokens + step.expected_output_tokens
    cost = limits.pricing.cost(step.model, step.expected_input_tokens, step.expected_output_tokens, 0, step.units)
    capped = limits.enforce_hard
    charges = tuple([new_tuple(CounterCharge, (m.scope, m.dimension, tokens if m.dimension == TOKENS else cost,
                                                m.cap if capped else None, m.persona))
                     for m in limits.meters[None] if (tokens if m.dimension == TOKENS else cost) is not None])
    return charges or None
