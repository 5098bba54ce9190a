"""`governor run`'s options of who may do how much: rate limits per window (docs/rate-limits.md)
and whose word the agent's identity is (docs/sessions.md#identity): their help, and how their
values (flags, environment, config file) become the Settings' `rate_limits` and `agent_identity`."""

from __future__ import annotations

from typing import Any

from governor.cli import UsageError
from governor.policy.rates import RateLimitError, parse_rate_limits
from governor.sessions.identity import AGENT_IDENTITY_MODES

IDENTITY_OPTIONS: dict[str, tuple[str, str]] = {
    "rate_limit": ("GOVERNOR_RATE_LIMITS", "rate limits per tumbling window, SCOPE[:TOOL]:DIMENSION=LIMIT/WINDOW, "
                   "comma-separated (a list in the config file): scopes agent, tool (tool:NAME or tool:*), fleet "
                   "(every governor on the store); dimensions requests, tool_calls, tokens, cost_usd; e.g. "
                   "agent:requests=60/1m,tool:search:tool_calls=10/30s. Over a limit: 429 with Retry-After, "
                   "recorded (docs/rate-limits.md)"),
    "agent_identity": ("GOVERNOR_AGENT_IDENTITY", "principal (default): a session's persona and delegation lineage "
                       "are what its principal bound when opening it; headers: also read the agent's ADL-Persona and "
                       "ADL-Delegation-Depth headers, which trusts the agent (docs/sessions.md#identity)"),
}


def apply_identity_settings(settings: Any, value: Any) -> None:
    """--rate-limit (or $GOVERNOR_RATE_LIMITS, the config file's `rate_limit` list), --agent-identity."""
    if (mode := value("agent_identity")) is not None:
        if mode not in AGENT_IDENTITY_MODES:
            raise UsageError(f"--agent-identity: expected principal or headers, got {mode!r}")
        settings.agent_identity = mode
    given = value("rate_limit")
    if given is None:
        return
    try:
        settings.rate_limits = parse_rate_limits(given)
    except RateLimitError as exc:
        raise UsageError(f"--rate-limit: {exc}") from None
