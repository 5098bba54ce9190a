"""`governor run`'s option for the absorbing barrier (a lock on every session, docs/sessions.md):
who besides the principal (the control token) may lift a lock. Reviewer tokens never can."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from governor.cli import UsageError

BARRIER_OPTIONS: dict[str, tuple[str, str]] = {
    "lock_lifter_tokens": ("GOVERNOR_LOCK_LIFTER_TOKENS_FILE", "file of lock-lifter tokens (one a line): the "
                           "operator role that may lift a lock besides the principal's control token; a reviewer "
                           "token cannot (docs/sessions.md)"),
}


def apply_barrier_settings(settings: Any, value: Any) -> None:
    """The lock-lifter tokens from their file, each checked as every control-plane token is."""
    path = value("lock_lifter_tokens")
    if path is None:
        return
    if not isinstance(path, str) or not path:
        raise UsageError(f"--lock-lifter-tokens: expected the path of a file, got {path!r}")
    from governor.control.auth import TokenConfigError, TokenSet

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--lock-lifter-tokens {path}: {exc}") from None
    tokens = tuple(dict.fromkeys(line.strip() for line in text.splitlines()
                                 if line.strip() and not line.lstrip().startswith("#")))
    try:
        TokenSet(tokens)  # the length check every token gets
    except TokenConfigError as exc:
        raise UsageError(f"--lock-lifter-tokens {path}: {exc}") from None
    if not tokens:
        raise UsageError(f"--lock-lifter-tokens {path}: the file names no token")
    overlap = set(tokens) & set(settings.reviewer_tokens)
    if overlap:  # a reviewer token would then lift locks after all
        raise UsageError(f"--lock-lifter-tokens {path}: {len(overlap)} token(s) are also reviewer tokens")
    settings.lock_lifter_tokens = tokens
