"""The control plane (aiohttp): health, metrics, sessions, approvals, nonces, records."""

from governor.control.app import control_url, create_app, start_control
from governor.control.auth import TokenConfigError, load_control_token, load_reviewer_tokens
from governor.control.nonces import MemoryNonces, NonceError, NonceIssuer
from governor.control.origin import MARKER_HEADER, ProxyOrigin

__all__ = [
    "MARKER_HEADER", "MemoryNonces", "NonceError", "NonceIssuer", "ProxyOrigin", "TokenConfigError",
    "control_url", "create_app", "load_control_token", "load_reviewer_tokens", "start_control",
]
