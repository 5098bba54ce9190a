"""The counters and charges the Redis store's counter tests share (test_store_redis_fast,
test_store_redis_pipeline): an agent's day of tokens under a cap, a session's cost without
one, and a fresh key prefix per test so tests on one server never meet."""

from __future__ import annotations

import uuid

from governor.policy.steps import CounterCharge

T0 = 1_699_999_980.0
DAY_TOKENS = ("per_day", None, "tokens")
SESSION_COST = ("per_session", None, "cost_usd")
KEYS = [DAY_TOKENS, SESSION_COST]


def charges(tokens: float, cost: float, *, cap: float | None = 1000) -> list[CounterCharge]:
    return [CounterCharge("per_day", "tokens", tokens, cap), CounterCharge("per_session", "cost_usd", cost, None)]


def prefix() -> str:
    return f"test-{uuid.uuid4().hex}:"
