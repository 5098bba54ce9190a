"""The statistical envelope (#32 item 7): an agent's rates ACROSS its sessions, over tumbling
windows, against the running mean and variance of its own past windows (R3).

Pure: the state and `now` are passed in, nothing is read from a clock or a store; the runtime
(`governor/runtime/envelope.py`) feeds it and keeps it in the store, where on Redis the fold is
done by a Lua script with the same arithmetic (`governor/store/envelope_books.py`).

What it watches, per agent, per window of `window_sec` seconds (window i covers
[i * window_sec, (i + 1) * window_sec) in epoch seconds):

  requests    model calls admitted
  tool_calls  tool calls admitted
  tokens      tokens of the final usage reports (input + output)
  cost_usd    their cost at the passport's prices

Windows. A window closes when a step of a later window is fed; its counts are then folded into
a Welford running mean and variance per metric (one pass, O(1) memory, numerically stable).
Windows in which the agent did nothing are not folded: the envelope describes the agent's
active windows (a night of idleness would otherwise make any morning look like a spike).
Clock skew never reopens a closed window: a timestamp older than the current window counts
in the current one (a governor whose clock is behind adds to the fleet's current window).

Tests, on each closed window, against the baseline of the windows closed before it:

  rate spike     a metric's count beyond mean + k * sd, k = `k` (4.0). The sd is floored at
                 SD_FLOOR[metric] and at SD_FLOOR_RATIO of the mean, so that a perfectly
                 regular agent (sd 0) is not flagged for one request more than usual.
  concentration  one tool's share of the window's tool calls beyond `concentration_share`
                 (0.9) with at least `concentration_min_calls` (20) calls, when that tool's
                 share of all the tool calls of the past windows is at most the bound (an
                 agent that always uses one tool is not concentrating anew).

Cold start: no verdict before `min_windows` (8) active windows closed; the deviation detail
and `monitored()` say so. Every closed window, deviant or not, is folded into the baseline
(the deviation is sticky until the principal resets it, who has seen that window).
A deviation is sticky per agent: it stays in the state until `reset`; the runtime fires
on_anomaly (through §6) once in each of the agent's sessions while it stands.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

METRICS = ("requests", "tool_calls", "tokens", "cost_usd")
# the smallest sd a spike is measured against, per metric: one request or tool call, 100
# tokens, a tenth of a cent; and SD_FLOOR_RATIO of the baseline's mean
SD_FLOOR: dict[str, float] = {"requests": 1.0, "tool_calls": 1.0, "tokens": 100.0, "cost_usd": 0.001}
SD_FLOOR_RATIO = 0.1
DEVIATION_KEY = "envelope"  # the §7 deviation key prefix recorded in a session's state


@dataclass(frozen=True, slots=True)
class EnvelopeConfig:
    window_sec: float = 300.0
    k: float = 4.0
    min_windows: int = 8
    concentration_share: float = 0.9
    concentration_min_calls: int = 20

    def __post_init__(self) -> None:
        if not (self.window_sec > 0 and self.k > 0 and self.min_windows >= 2
                and 0 < self.concentration_share < 1 and self.concentration_min_calls >= 1):
            raise ValueError(f"bad envelope configuration: {self}")

    def window_of(self, now: float) -> int:
        return math.floor(now / self.window_sec)


@dataclass(frozen=True, slots=True)
class Welford:
    """Welford's running mean and sum of squared deviations (m2) of n observations."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> Welford:
        n = self.n + 1
        delta = x - self.mean
        mean = self.mean + delta / n
        return Welford(n, mean, self.m2 + delta * (x - mean))

    def merge(self, other: Welford) -> Welford:
        """Chan et al.'s combination of two disjoint sets of observations."""
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        delta = other.mean - self.mean
        return Welford(n, self.mean + delta * other.n / n, self.m2 + other.m2 + delta * delta * self.n * other.n / n)

    @property
    def variance(self) -> float:
        """The sample variance (n - 1); 0 below two observations."""
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0

    @property
    def sd(self) -> float:
        return math.sqrt(max(self.variance, 0.0))


@dataclass(frozen=True, slots=True)
class ClosedWindow:
    """A window that just closed, with the baseline of the windows closed before it."""

    index: int
    counts: Mapping[str, float]
    tools: Mapping[str, int]
    baseline: Mapping[str, Welford]
    tool_history: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class EnvelopeState:
    window: int | None = None  # the current (open) window's index
    counts: Mapping[str, float] = field(default_factory=dict)
    tools: Mapping[str, int] = field(default_factory=dict)
    stats: Mapping[str, Welford] = field(default_factory=dict)
    tool_history: Mapping[str, int] = field(default_factory=dict)
    deviation: Mapping[str, Any] | None = None  # sticky until reset

    @property
    def closed_windows(self) -> int:
        return max((w.n for w in self.stats.values()), default=0)

    def to_json(self) -> dict[str, Any]:
        return {"window": self.window, "counts": dict(self.counts), "tools": dict(self.tools),
                "stats": {m: [w.n, w.mean, w.m2] for m, w in self.stats.items()},
                "tool_history": dict(self.tool_history), "deviation": self.deviation}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EnvelopeState:
        return cls(window=None if data.get("window") is None else int(data["window"]),
                   counts={str(m): float(v) for m, v in data.get("counts", {}).items()},
                   tools={str(t): int(c) for t, c in data.get("tools", {}).items()},
                   stats={str(m): Welford(int(v[0]), float(v[1]), float(v[2])) for m, v in data.get("stats", {}).items()},
                   tool_history={str(t): int(c) for t, c in data.get("tool_history", {}).items()},
                   deviation=data.get("deviation"))


def fold(stats: Mapping[str, Welford], tool_history: Mapping[str, int], counts: Mapping[str, float],
         tools: Mapping[str, int]) -> tuple[dict[str, Welford], dict[str, int]]:
    """The baseline with one more closed window (an active one: the caller checks)."""
    folded = {m: stats.get(m, Welford()).add(float(counts.get(m, 0.0))) for m in METRICS}
    history = dict(tool_history)
    for tool, c in tools.items():
        history[tool] = history.get(tool, 0) + c
    return folded, history


def feed(config: EnvelopeConfig, state: EnvelopeState, now: float, increments: Mapping[str, float],
         tools: Mapping[str, int]) -> tuple[EnvelopeState, ClosedWindow | None]:
    """`state` with `increments` (metric -> amount) and `tools` (tool -> calls) counted at `now`,
    and the window this closed (None if none). A `now` before the current window counts in it."""
    index = config.window_of(now)
    closed = None
    if state.window is None:
        state = dataclasses.replace(state, window=index)
    elif index > state.window:
        closed = ClosedWindow(state.window, state.counts, state.tools, state.stats, state.tool_history)
        stats, history = state.stats, state.tool_history
        if any(v > 0 for v in state.counts.values()):
            stats, history = fold(stats, history, state.counts, state.tools)
        state = dataclasses.replace(state, window=index, counts={}, tools={}, stats=stats, tool_history=history)
    if increments or tools:
        counts = dict(state.counts)
        for metric, amount in increments.items():
            counts[metric] = counts.get(metric, 0.0) + amount
        calls = dict(state.tools)
        for tool, c in tools.items():
            calls[tool] = calls.get(tool, 0) + c
        state = dataclasses.replace(state, counts=counts, tools=calls)
    return state, closed


def judge(config: EnvelopeConfig, closed: ClosedWindow) -> list[dict[str, Any]]:
    """The deviations a closed window makes, against the baseline before it (none at cold start)."""
    windows = max((w.n for w in closed.baseline.values()), default=0)
    if windows < config.min_windows or not any(v > 0 for v in closed.counts.values()):
        return []
    where = {"index": closed.index, "start": closed.index * config.window_sec,
             "end": (closed.index + 1) * config.window_sec, "window_sec": config.window_sec}
    found: list[dict[str, Any]] = []
    for metric in METRICS:
        w = closed.baseline.get(metric)
        if w is None:
            continue
        observed = float(closed.counts.get(metric, 0.0))
        sd = max(w.sd, SD_FLOOR[metric], SD_FLOOR_RATIO * w.mean)
        bound = w.mean + config.k * sd
        if observed > bound:
            found.append({"key": f"{DEVIATION_KEY}:rate:{metric}", "kind": "envelope_rate_spike", "metric": metric,
                          "window": where, "observed": observed, "statistic": round((observed - w.mean) / sd, 6),
                          "k": config.k, "bound": bound,
                          "baseline": {"windows": w.n, "mean": w.mean, "sd": w.sd, "sd_used": sd}})
    calls = sum(closed.tools.values())
    if calls >= config.concentration_min_calls:
        tool, top = max(closed.tools.items(), key=lambda item: (item[1], item[0]))
        share = top / calls
        past = sum(closed.tool_history.values())
        past_share = closed.tool_history.get(tool, 0) / past if past else 0.0
        if share > config.concentration_share and past_share <= config.concentration_share:
            found.append({"key": f"{DEVIATION_KEY}:concentration:{tool}", "kind": "envelope_concentration",
                          "tool": tool, "window": where, "calls": calls, "statistic": round(share, 6),
                          "bound": config.concentration_share,
                          "baseline": {"windows": windows, "tool_calls": past, "share": round(past_share, 6)}})
    return found


def deviation_of(agent: str, closed: ClosedWindow, found: list[dict[str, Any]]) -> dict[str, Any]:
    """The sticky deviation an agent gets for `found` (its id names the agent and the window)."""
    return {"id": f"{agent}@{closed.index}", "agent": agent, "window": closed.index, "deviations": found}


def session_key(deviation: Mapping[str, Any]) -> str:
    """The key a session records the sticky deviation under (once per session and deviation)."""
    return f"{DEVIATION_KEY}@{deviation['id']}"


def recorded_deviations(deviation: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The §7 deviations a session's on_anomaly event lists for the sticky deviation: the first
    carries the session key, so `advance` remembers that the session recorded it."""
    found = [dict(d) for d in deviation.get("deviations", ())] or [{"kind": "envelope"}]
    for d in found:
        d["key"] = f"{d.get('key', DEVIATION_KEY)}@{deviation['id']}"
    found[0]["key"] = session_key(deviation)
    return found


def reset(state: EnvelopeState) -> EnvelopeState:
    return dataclasses.replace(state, deviation=None)


def monitored(config: EnvelopeConfig) -> dict[str, Any]:
    """What the envelope watches, for the R3 record's `limits.anomaly_monitoring`."""
    return {"metrics": list(METRICS), "window_sec": config.window_sec, "k": config.k,
            "cold_start": f"no verdict before {config.min_windows} active windows closed",
            "concentration": {"share": config.concentration_share, "min_calls": config.concentration_min_calls},
            "test": "a closed window's count beyond mean + k*sd of the agent's past active windows (Welford); "
                    "one tool's share of a window's tool calls beyond the bound",
            "sticky": "until the principal resets it (POST /v1/envelope/reset, governor envelope reset)"}


__all__ = ["METRICS", "SD_FLOOR", "SD_FLOOR_RATIO", "DEVIATION_KEY", "EnvelopeConfig", "Welford", "ClosedWindow",
           "EnvelopeState", "fold", "feed", "judge", "deviation_of", "session_key", "recorded_deviations", "reset", "monitored"]
