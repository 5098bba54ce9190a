"""What the control plane's routes work with, in one typed object: `create_app(context)`
hands it to each route module, which keeps what it needs (none imports it back from the
app, and none reads it from module state).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from governor.control.auth import TokenSet
from governor.control.guard import ControlGuard
from governor.control.nonces import MemoryNonces, NonceIssuer
from governor.control.origin import ProxyOrigin
from governor.runtime.metrics import Metrics


@dataclasses.dataclass(frozen=True, slots=True)
class ControlContext:
    """The control plane's collaborators.

    `runtime` is the `RuntimeAPI` every handler reads or asks; `operators` the control
    token (empty: reads are open), `reviewers` the reviewer tokens; `origin` is shared with
    the proxy's origin guard (it reports its upstream sockets there); `sessions` is the session book
    (a `governor.sessions.book.SessionBook`), or None.
    """

    runtime: Any
    reviewers: TokenSet
    operators: TokenSet
    nonces: NonceIssuer
    metrics: Metrics
    origin: ProxyOrigin
    guard: ControlGuard
    sessions: Any = None
    ready_timeout: float = 5.0
    log_require_token: bool = False  # /log/ reads take the control token (docs/transparency-log.md)
    draining: Any = None  # () -> why the governor is not ready while it drains (None: it is not), or None
    # the operator role named for lifting locks besides the principal (docs/sessions.md)
    lock_lifters: TokenSet = dataclasses.field(default_factory=lambda: TokenSet(()))

    @classmethod
    def build(cls, runtime: Any, *, reviewer_tokens: Sequence[str] = (), control_token: str | None = None,
              nonces: NonceIssuer | None = None, nonce_ttl: float = 300.0, metrics: Metrics | None = None,
              origin: ProxyOrigin | None = None, ready_timeout: float = 5.0,
              control_hosts: Sequence[str] = (), sessions: Any = None,
              log_require_token: bool = False, draining: Any = None,
              lock_lifter_tokens: Sequence[str] = ()) -> ControlContext:
        """A context with defaults for what is not given: `nonces` an in-process issuer with
        `nonce_ttl`, fresh `metrics` and `origin`, the runtime's own `session_book`;
        `control_hosts` are the names besides localhost and the listen address that the Host
        header may carry ("*": any)."""
        return cls(
            runtime=runtime,
            reviewers=TokenSet(reviewer_tokens),
            operators=TokenSet([control_token] if control_token else []),
            nonces=nonces if nonces is not None else MemoryNonces(nonce_ttl),
            metrics=metrics if metrics is not None else Metrics(),
            origin=origin if origin is not None else ProxyOrigin(),
            guard=ControlGuard(control_hosts),
            sessions=sessions if sessions is not None else getattr(runtime, "session_book", None),
            ready_timeout=float(ready_timeout),
            log_require_token=log_require_token,
            draining=draining,
            lock_lifters=TokenSet(lock_lifter_tokens),
        )
