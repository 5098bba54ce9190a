"""The control plane (aiohttp): health, metrics, sessions, approvals, nonces, records."""

from typing import Any

from governor.control.auth import TokenConfigError, load_control_token, load_reviewer_tokens
from governor.control.nonces import MemoryNonces, NonceError, NonceIssuer
from governor.control.origin import MARKER_HEADER, ProxyOrigin

__all__ = [
    "ControlContext", "MARKER_HEADER", "MemoryNonces", "NonceError", "NonceIssuer", "ProxyOrigin", "TokenConfigError",
    "control_url", "create_app", "load_control_token", "load_reviewer_tokens", "start_control",
]

_APP = ("control_url", "create_app", "start_control")


def __getattr__(name: str) -> Any:
    # the app (aiohttp and the runtime's modules) is imported when first asked for, so the
    # `governor sessions|locks|approvals` commands, which only call it over HTTP, start fast
    if name in _APP:
        from governor.control import app

        return getattr(app, name)
    if name == "ControlContext":
        from governor.control.context import ControlContext

        return ControlContext
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
