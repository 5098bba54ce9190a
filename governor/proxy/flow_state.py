"""What the governor keeps on a flow while it governs it: one `FlowState` in
`flow.metadata[STATE_KEY]`, the only per-flow state the proxy's addons share.

The session binding puts it there (governor.proxy.binding); admission reads the request
from it and adds the `Flight` of an exchange it forwards (governor.proxy.admission); the
answer's addon (governor.proxy.answers) and the in-flight addon (governor.proxy.in_flight)
read it, and the latter takes it off the flow when the exchange is over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from governor.adapters.base import Exchange
from governor.adapters.request_view import RequestView
from governor.policy.steps import Decision
from governor.runtime.api import Admission

STATE_KEY = "governor"  # flow.metadata: the flow's FlowState, while it is governed


@dataclass(eq=False)
class Flight:
    """One governed exchange in flight."""

    exchange: Exchange
    admissions: list[Admission]
    usage_ticket: Any = None  # the ModelCall admission's ticket, None when the exchange has no model call
    started: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)
    relay: Any = None  # a governed stream's governor.proxy.relay.StreamRelay, once its headers came
    refusal: tuple[Decision, dict[str, Any]] | None = None  # a cut decided while in flight
    finished: bool = False
    body: bytes = b""  # the request body the agent sent (decoded): names the request if its answer is held
    replaced: tuple[int | None, str] | None = None  # the governor replaced the answer: (upstream status, cause)


def live_flight(flow: Any) -> Flight | None:
    """The flow's exchange while it is in flight: admitted, forwarded, not yet ended."""
    state: FlowState | None = flow.metadata.get(STATE_KEY)
    flight = state.flight if state is not None else None
    return None if flight is None or flight.finished else flight


@dataclass(eq=False, slots=True)
class FlowState:
    """One flow, as the governor's addons see it (one allocation per request)."""

    session: str  # the session the request acts in ("": none, token-less traffic under `unknown_traffic: forward`)
    view: RequestView | None = None  # the request as the agent sent it (its ADL-* headers too), for admission
    persona: str | None = None  # the persona it acts as (its session's, or its ADL-Persona under the opt-in)
    identity_refused: str | None = None  # why the identity it claims is refused (governor.proxy.identity_headers)
    persona_host: str | None = None  # the parent session that counts its persona instance (None: its own)
    presented: str | None = None  # its ADL-Passport header
    encoded: bool = False  # whether its body has a Content-Encoding
    agent_fields: tuple[tuple[bytes, bytes], ...] = ()  # its header fields as the agent sent them
    unclaimed: bool = False  # no adapter governs it: the unknown-traffic addon decides what becomes of it
    allowed: bool = False  # unclaimed, and the operator's allow-list names it (governor.adapters.allow)
    flight: Flight | None = None  # the exchange, once admitted and forwarded
