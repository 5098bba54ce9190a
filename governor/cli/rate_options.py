"""`governor run`'s rate limits per window (docs/rate-limits.md): the option's help, and how its
value (flag, environment, config file list) becomes the Settings' `rate_limits`."""

from __future__ import annotations

from typing import Any

from governor.cli import UsageError
from governor.policy.rates import RateLimitError, parse_rate_limits

RATE_OPTIONS: dict[str, tuple[str, str]] = {
    "rate_limit": ("GOVERNOR_RATE_LIMITS", "rate limits per tumbling window, SCOPE[:TOOL]:DIMENSION=LIMIT/WINDOW, "
                   "comma-separated (a list in the config file): scopes agent, tool (tool:NAME or tool:*), fleet "
                   "(every governor on the store); dimensions requests, tool_calls, tokens, cost_usd; e.g. "
                   "agent:requests=60/1m,tool:search:tool_calls=10/30s. Over a limit: 429 with Retry-After, "
                   "recorded (docs/rate-limits.md)"),
}


def apply_rate_settings(settings: Any, value: Any) -> None:
    """--rate-limit / $GOVERNOR_RATE_LIMITS / the config file's `rate_limit` list."""
    given = value("rate_limit")
    if given is None:
        return
    try:
        settings.rate_limits = parse_rate_limits(given)
    except RateLimitError as exc:
        raise UsageError(f"--rate-limit: {exc}") from None
