"""Rate limits per time window (issue #32 item 7; seed 000's max_writes_per_agent_per_window):
what a limit is, what a step draws on each, and the refusal when one is full. Pure.

A limit caps one dimension over a tumbling window of `window_sec` seconds:

  requests    every model call and tool call the governor admits
  tool_calls  every tool call it admits (proposed by a model answer or invoked over MCP/A2A)
  tokens      a model call's expected input + output tokens, corrected to its usage at its end
  cost_usd    the same, priced by the pricing table

for one of three scopes: `agent` (every session of the governed agent, on every replica that
shares the store), `tool` (one tool of the agent, or each tool: `*`) and `fleet` (every
governor on the store, whatever its agent). ADL 0.4 declares no per-window limit in the
passport (only `max_concurrent`), so limits come from the operator (`--rate-limit`,
governor/cli/identity_options.py). Written `SCOPE[:TOOL]:DIMENSION=LIMIT/WINDOW`, e.g.
`agent:requests=60/1m`, `tool:search:tool_calls=10/30s`, `fleet:cost_usd=5/1h`.

The runtime takes a step's amounts from the store's window counters before the decision,
atomically across every limit (governor.store.windows), and gives them back when the
decision refuses the step. A full window refuses the step (`rate_refusal`), retryable: the
answer's Retry-After is when the window rolls.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from governor.policy.digests import STEP_KINDS, enforcement_event
from governor.policy.steps import Action, Decision, ModelCall, ToolCall
from governor.policy.causes import ON_GOVERNOR_RATE_LIMIT

# The governor's own cause for a full window (not one of §8.3's seven: the governor's namespace).

RATE_SCOPES = ("agent", "tool", "fleet")
RATE_DIMENSIONS = ("requests", "tool_calls", "tokens", "cost_usd")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_FORM = re.compile(r"^(agent|tool|fleet)(?::([a-z][a-z0-9_]*|\*))?:([a-z_]+)=([0-9.eE+]+)/([0-9.]*)([smhd]?)$")
MAX_WINDOW_SEC = 7 * 86400.0


class RateLimitError(ValueError):
    """A rate limit that cannot be read."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    scope: str  # agent | tool | fleet
    dimension: str  # requests | tool_calls | tokens | cost_usd
    limit: float
    window_sec: float
    tool: str | None = None  # scope tool: the tool's name, or "*" for each tool

    def text(self) -> str:
        tool = f":{self.tool}" if self.tool is not None else ""
        return f"{self.scope}{tool}:{self.dimension}={_number(self.limit)}/{_number(self.window_sec)}s"

    def counter(self, agent: str, tool: str | None) -> str:
        """The window counter this limit draws on (before the window's index): names of
        variable length are prefixed with their length, so no two collide."""
        window = _number(self.window_sec)
        if self.scope == "fleet":
            return f"f:{self.dimension}:{window}"
        name = f"{len(agent)}:{agent}"
        if self.scope == "agent":
            return f"a:{name}:{self.dimension}:{window}"
        return f"t:{name}:{len(tool or '')}:{tool}:{self.dimension}:{window}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_rate_limit(text: str) -> RateLimit:
    """`SCOPE[:TOOL]:DIMENSION=LIMIT/WINDOW` (WINDOW: a number of seconds, or with s, m, h, d)."""
    match = _FORM.match(text.strip())
    if match is None:
        raise RateLimitError(f"rate limit {text!r}: expected SCOPE[:TOOL]:DIMENSION=LIMIT/WINDOW, e.g. "
                             "agent:requests=60/1m or tool:search:tool_calls=10/30s (scopes: agent, tool, fleet)")
    scope, tool, dimension, limit_text, window_text, unit = match.groups()
    if dimension not in RATE_DIMENSIONS:
        raise RateLimitError(f"rate limit {text!r}: unknown dimension {dimension!r} (one of {', '.join(RATE_DIMENSIONS)})")
    if (scope == "tool") != (tool is not None):
        raise RateLimitError(f"rate limit {text!r}: a tool limit names its tool (tool:NAME:... or tool:*:...), "
                             "and only a tool limit does")
    if scope == "tool" and dimension not in ("requests", "tool_calls"):
        raise RateLimitError(f"rate limit {text!r}: a tool limit counts requests or tool_calls")
    try:
        limit = float(limit_text)
        window = float(window_text or "1") * _UNITS[unit]
    except ValueError:
        raise RateLimitError(f"rate limit {text!r}: LIMIT and WINDOW must be numbers") from None
    if not (math.isfinite(limit) and limit >= 0):
        raise RateLimitError(f"rate limit {text!r}: the limit must be a number >= 0")
    if dimension in ("requests", "tool_calls") and not limit.is_integer():
        raise RateLimitError(f"rate limit {text!r}: {dimension} are counted in whole numbers")
    if not (1 <= window <= MAX_WINDOW_SEC) or not window.is_integer():
        raise RateLimitError(f"rate limit {text!r}: the window must be a whole number of seconds from 1 to 7 days")
    return RateLimit(scope, dimension, limit, window, tool)


def parse_rate_limits(items: Any) -> tuple[RateLimit, ...]:
    """A list of limits, or one string of comma-separated ones; two limits on one counter
    (same scope, tool, dimension and window) are refused."""
    if items is None:
        return ()
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, (list, tuple)):
        raise RateLimitError("rate limits: expected a list of SCOPE[:TOOL]:DIMENSION=LIMIT/WINDOW entries")
    limits: list[RateLimit] = []
    for item in items:
        if not isinstance(item, str):
            raise RateLimitError(f"rate limits: expected text entries, got {item!r}")
        limits.extend(parse_rate_limit(piece) for piece in item.split(",") if piece.strip())
    seen: set[tuple[Any, ...]] = set()
    for limit in limits:
        key = (limit.scope, limit.tool, limit.dimension, limit.window_sec)
        if key in seen:
            raise RateLimitError(f"rate limits: {limit.text()} is given twice (one limit per counter)")
        seen.add(key)
    return tuple(limits)


@dataclass(frozen=True, slots=True)
class RateDraw:
    """What one step draws on one limit's window counter."""

    limit: RateLimit
    counter: str
    amount: float


def rate_draws(limits: tuple[RateLimit, ...], agent: str, step: Any, pricing: Any) -> tuple[RateDraw, ...] | str:
    """The draws of `step` (a model call or a tool call) on every limit it counts against,
    or why it cannot be counted (a cost limit and a model without a price: refused, as a
    cost budget refuses it)."""
    kind = type(step)
    draws: list[RateDraw] = []
    for limit in limits:
        dimension = limit.dimension
        tool = step.tool if kind is ToolCall else None
        if limit.scope == "tool" and (tool is None or limit.tool not in ("*", tool)):
            continue
        if dimension == "requests":
            amount = 1.0
        elif dimension == "tool_calls":
            if kind is not ToolCall:
                continue
            amount = 1.0
        elif kind is not ModelCall:
            continue
        elif dimension == "tokens":
            amount = float(step.expected_input_tokens + step.expected_output_tokens)
        else:
            cost = pricing.cost(step.model, step.expected_input_tokens, step.expected_output_tokens, 0, step.units)
            if cost is None:
                return f"model {step.model!r} has no price, so its cost cannot be counted against {limit.text()}"
            amount = float(cost)
        draws.append(RateDraw(limit, limit.counter(agent, tool), amount))
    return tuple(draws)


def usage_corrections(draws: tuple[RateDraw, ...], report: Any, pricing: Any) -> list[tuple[RateDraw, float]]:
    """A model call's final usage against what its admission drew (tokens and cost): the
    difference each window counter is corrected by (negative: it used less)."""
    corrections: list[tuple[RateDraw, float]] = []
    for draw in draws:
        if draw.limit.dimension == "tokens":
            actual = float(report.input_tokens + report.output_tokens)
        elif draw.limit.dimension == "cost_usd":
            cost = pricing.cost(report.model, report.input_tokens, report.output_tokens,
                                report.cached_input_tokens, report.units)
            if cost is None:
                continue  # an unpriced answer: what was drawn keeps counting
            actual = float(cost)
        else:
            continue
        if actual != draw.amount:
            corrections.append((draw, actual - draw.amount))
    return corrections


def rate_refusal(step: Any, draw: RateDraw | None, observed: float, retry_after: float,
                 reason: str | None = None) -> Decision:
    """The refusal of a step whose window is full (or that cannot be counted): retryable once
    the window rolls, the session goes on. Recorded as §6's fallback (the refusal stands in
    for the step and the session goes on), not `continue`, which would say the step went on."""
    if draw is None:
        detail = {"step": STEP_KINDS.get(type(step), type(step).__name__), "refused_step": "not_executed",
                  "reason": reason or "the step cannot be counted against the rate limits"}
        return _refused(detail)
    limit = draw.limit
    detail: dict[str, Any] = {
        "step": STEP_KINDS.get(type(step), type(step).__name__), "refused_step": "not_executed",
        "rate_limit": limit.text(), "scope": f"rate:{limit.scope}", "dimension": limit.dimension,
        "limit": limit.limit, "window": limit.window_sec,
        "observed": observed, "projected": observed + draw.amount, "retryable": True,
        "retry_after": max(1, math.ceil(retry_after)),
        "reason": reason or f"the {limit.scope} {limit.dimension} rate limit ({_number(limit.limit)} per "
                            f"{_number(limit.window_sec)} s) is reached: retry when the window rolls",
    }
    if limit.tool is not None:
        detail["tool"] = getattr(step, "tool", limit.tool)
    return _refused(detail)


def _refused(detail: dict[str, Any]) -> Decision:
    event = enforcement_event(ON_GOVERNOR_RATE_LIMIT, Action.FALLBACK.value, detail)
    return Decision(action=Action.DENY, cause=ON_GOVERNOR_RATE_LIMIT, details=detail, event=event)
