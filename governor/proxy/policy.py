"""How the enforcement point behaves: the `governor run` options its addons read."""

from __future__ import annotations

from dataclasses import dataclass

from governor.proxy import bodies, holds


@dataclass(frozen=True, slots=True)
class ProxyPolicy:
    """How the enforcement point behaves (the `governor run` options)."""

    default_session: str | None = None  # None: the runtime's (one per process), else one generated here
    unknown_traffic: str = "deny"  # "deny" (refused unless allowed) | "forward" (ungoverned: logged and counted)
    upstream_timeout: float = 300.0  # seconds without response headers, or between stream chunks
    tick_interval: float = 1.0  # wall-clock Tick steps while an exchange is in flight (0: never)
    max_body_bytes: int = 64 * 1024 * 1024  # governed request bodies larger than this (decoded): 413
    max_response_bytes: int = 256 * 1024 * 1024  # compressed answers the governor reads, decoded: 502 past it
    max_decoded_ratio: float = bodies.DEFAULT_RATIO  # decoded / compressed size, past 1 MiB decoded
    max_held_stream_bytes: int = 1024 * 1024  # a stream's output kept back during an admission: cut past it
    review_hold: float = holds.DEFAULT_HOLD_SEC  # a connection held for a reviewer, at most (then 429)
    review_retry_after: float = holds.DEFAULT_RETRY_AFTER_SEC  # the Retry-After of that 429
    agent_identity_headers: bool = False  # read ADL-Persona / ADL-Delegation-Depth (trusts the agent)
