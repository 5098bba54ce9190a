"""Bearer tokens for the control plane.

Two kinds: reviewer tokens (answer approvals; always required for that) and an
optional control token (when set, every /v1 endpoint asks for it or a reviewer
token). Tokens come from a file (one a line, `#` comments) or the environment;
they are compared in constant time against every configured token.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path
from typing import Mapping, Sequence

MIN_TOKEN_LENGTH = 16

REVIEWER_TOKEN_ENV = "GOVERNOR_REVIEWER_TOKEN"
REVIEWER_TOKENS_ENV = "GOVERNOR_REVIEWER_TOKENS"  # comma- or whitespace-separated
CONTROL_TOKEN_ENV = "GOVERNOR_CONTROL_TOKEN"


class TokenConfigError(ValueError):
    """A configured token is unusable (unreadable file, too short)."""


def _check(tokens: Sequence[str], where: str) -> tuple[str, ...]:
    for token in tokens:
        if len(token) < MIN_TOKEN_LENGTH:
            raise TokenConfigError(
                f"{where}: a token of {len(token)} characters is guessable; use at least "
                f"{MIN_TOKEN_LENGTH} (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    return tuple(dict.fromkeys(tokens))


def load_reviewer_tokens(path: str | os.PathLike[str] | None = None,
                         environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Reviewer tokens from `path` (when given) and the environment, deduplicated."""
    tokens: list[str] = []
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenConfigError(f"reviewer token file {path}: {exc}") from exc
        tokens += [line.strip() for line in text.splitlines()
                   if line.strip() and not line.lstrip().startswith("#")]
        _check(tokens, f"reviewer token file {path}")
    env_tokens = [environ.get(REVIEWER_TOKEN_ENV, "").strip()] + environ.get(REVIEWER_TOKENS_ENV, "").replace(",", " ").split()
    env_tokens = [t for t in env_tokens if t]
    _check(env_tokens, f"${REVIEWER_TOKEN_ENV}/${REVIEWER_TOKENS_ENV}")
    return _check(tokens + env_tokens, "reviewer tokens")


def load_control_token(value: str | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The read/operate token: `value` if given, else $GOVERNOR_CONTROL_TOKEN, else None (open)."""
    token = (value if value is not None else environ.get(CONTROL_TOKEN_ENV, "")).strip()
    if not token:
        return None
    return _check([token], "control token")[0]


class TokenSet:
    """Constant-time membership for bearer tokens."""

    def __init__(self, tokens: Sequence[str]) -> None:
        self._tokens = [t.encode() for t in _check(list(tokens), "token")]

    def replace(self, tokens: Sequence[str]) -> None:
        """Hold `tokens` from now on (a reload, SIGHUP): every route sharing this set sees them
        at its next request; one assignment, so a request sees the old set or the new."""
        self._tokens = [t.encode() for t in _check(list(tokens), "token")]

    def __bool__(self) -> bool:
        return bool(self._tokens)

    def __contains__(self, presented: object) -> bool:
        if not isinstance(presented, str):
            return False
        candidate = presented.encode()
        # Compare against every token (no early exit) so timing says nothing of which matched.
        return sum(hmac.compare_digest(candidate, token) for token in self._tokens) > 0


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
