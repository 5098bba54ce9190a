"""The governor's Prometheus metrics, all on one registry per `Metrics` object.

Every metric the proxy, the runtime and the control plane update is defined here,
so names and labels stay consistent and a test can make a fresh, isolated set
(`Metrics()`) instead of sharing prometheus_client's global registry.

Cardinality: labels take values from small closed sets (causes, actions, budget
dimensions and scopes, declared personas, wire protocols). The one open-ended
label is `session`, and only on the per-session budget gauges; `forget_session`
drops those series when a session ends, so a long-running governor exports the
live sessions only. Per-day budget gauges are agent-wide and carry `session=""`.

Hot paths make one call per event (`decided`, `upstream`, ...). The per-request series
(decision counts, decision and upstream latency) are plain numbers behind a collector
that builds the families at scrape time: prometheus_client's Counter and Histogram take
a lock and walk the buckets on every call, ~2 us a decision on the proxy's per-request
path. Those numbers are only updated on the event loop's thread.
"""

from __future__ import annotations

import enum
from bisect import bisect_left
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from governor.policy.steps import Decision

# Decisions are in-process and pure: microseconds, occasionally a millisecond or two
# when the store is Redis.
DECISION_BUCKETS = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
    1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
)
# Upstream calls: LLM completions and tool calls, from milliseconds to minutes.
UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: object) -> str:
    """Label text for a cause/action that may be None or an enum."""
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


class _Histogram:
    """One histogram series as plain numbers: observing is a bisect and two additions."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # bucket i counts value <= bounds[i]
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), list(self.counts)):
            total += count
            out.append((floatToGoString(bound), total))
        return out


class _PerRequestSeries:
    """Collector of the series updated on every request (see the module's docstring)."""

    DECISIONS = ("governor_decisions", "Decisions taken, by the cause that fired and the resolved action "
                 "(cause=none, action=permit for a plain permit; enforced=false at R1, where the action "
                 "is what would have happened)")
    DECISION_SECONDS = ("governor_decision_seconds", "Time to decide one step (policy, store reservation, journal)")
    UPSTREAM_SECONDS = ("governor_upstream_seconds", "Upstream response time, by wire protocol")

    def __init__(self) -> None:
        self.decisions: dict[tuple[object, object, bool], int] = {}  # raw (cause, action, enforced)
        self.decision_seconds = _Histogram(DECISION_BUCKETS)
        self.upstream_seconds: dict[str, _Histogram] = {}  # by protocol

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(*self.DECISIONS, labels=["cause", "action", "enforced"])
        yield HistogramMetricFamily(*self.DECISION_SECONDS)
        yield HistogramMetricFamily(*self.UPSTREAM_SECONDS, labels=["protocol"])

    def collect(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily(*self.DECISIONS, labels=["cause", "action", "enforced"])
        by_labels: dict[tuple[str, str, str], int] = {}
        for (cause, action, enforced), count in list(self.decisions.items()):
            labels = (_label(cause), _label(action), "true" if enforced else "false")
            by_labels[labels] = by_labels.get(labels, 0) + count
        for labels, count in sorted(by_labels.items()):
            decisions.add_metric(labels, count)
        yield decisions
        latency = HistogramMetricFamily(*self.DECISION_SECONDS)
        latency.add_metric([], self.decision_seconds.cumulative(), self.decision_seconds.sum)
        yield latency
        upstream = HistogramMetricFamily(*self.UPSTREAM_SECONDS, labels=["protocol"])
        for protocol, histogram in sorted(list(self.upstream_seconds.items())):
            upstream.add_metric([protocol], histogram.cumulative(), histogram.sum)
        yield upstream


class Metrics:
    """The governor's metric objects, registered on `self.registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.per_request = _PerRequestSeries()
        r.register(self.per_request)
        self.budget_used = Gauge(
            "governor_budget_used", "Budget consumed, by dimension and scope; session is set for "
            "per_session only; persona is empty for the parent's aggregate",
            ["dimension", "scope", "session", "persona"], registry=r)
        self.budget_limit = Gauge(
            "governor_budget_limit", "Declared budget cap, by dimension and scope (same labels as "
            "governor_budget_used)", ["dimension", "scope", "session", "persona"], registry=r)
        self.pending_approvals = Gauge(
            "governor_pending_approvals", "Steps paused for human review, awaiting an answer", registry=r)
        self.streams_cut = Counter(
            "governor_streams_cut", "Streaming responses cut mid-flight because a limit fired",
            ["cause", "protocol"], registry=r)
        self.records_signed = Counter(
            "governor_records_signed", "Enforcement records signed (kind=final at session end, "
            "snapshot on request; nonce=true when bound to a counterparty nonce)",
            ["kind", "nonce"], registry=r)
        self.threshold_warnings = Counter(
            "governor_threshold_warnings", "One-time budget threshold warnings",
            ["dimension", "scope", "fraction"], registry=r)
        self.session_refusals = Counter(
            "governor_session_refusals", "Requests refused before any session was touched: a malformed, "
            "unknown or ended session token, no token where one is required, the agent-named cap, a lock "
            "(reason = the refusal code)", ["reason"], registry=r)
        self.sessions_opened = Counter(
            "governor_sessions_opened", "Sessions opened, by who opened them (principal, agent)", ["by"], registry=r)
        self.agent_locks = Gauge(
            "governor_agent_locks", "Locks in force: while above 0 every session of the agent is refused", registry=r)
        self._session_series: dict[str, set[tuple[str, str, str, str]]] = {}

    # --- hot path ----------------------------------------------------------------------

    def decision(self, cause: str | None, action: object, seconds: float, *, enforced: bool = True) -> None:
        """Count one decision and observe how long it took."""
        series = self.per_request
        key = (cause, action, enforced)  # the raw values: label text is built at scrape time
        series.decisions[key] = series.decisions.get(key, 0) + 1
        series.decision_seconds.observe(seconds)

    def decided(self, decision: Decision, seconds: float) -> None:
        """`decision` plus the decision's threshold warnings: the one call per step."""
        self.decision(decision.cause, decision.action, seconds, enforced=decision.enforced)
        for dimension, scope, fraction in decision.warnings:
            self.threshold_warning(dimension, scope, fraction)

    def upstream(self, protocol: str, seconds: float) -> None:
        """Observe one upstream round trip ("openai", "anthropic", "mcp", "a2a", ...)."""
        histogram = self.per_request.upstream_seconds.get(protocol)
        if histogram is None:
            histogram = self.per_request.upstream_seconds[protocol] = _Histogram(UPSTREAM_BUCKETS)
        histogram.observe(seconds)

    def stream_cut(self, cause: str | None, protocol: str) -> None:
        self.streams_cut.labels(_label(cause), protocol).inc()

    def record_signed(self, kind: str, *, nonce: bool = False) -> None:
        """kind: "final" (session end) or "snapshot" (a record of the session so far)."""
        self.records_signed.labels(kind, "true" if nonce else "false").inc()

    def threshold_warning(self, dimension: str, scope: str, fraction: float) -> None:
        self.threshold_warnings.labels(dimension, scope, f"{fraction:g}").inc()

    # --- state gauges ------------------------------------------------------------------

    def budget(self, dimension: str, scope: str, used: float, limit: float | None, *,
               session: str | None = None, persona: str | None = None) -> None:
        """Set one budget counter's consumption and cap (cap None: tracked, not capped).

        `session` is used for scope "per_session" only: per-day counters are agent-wide.
        """
        session_label = (session or "") if scope == "per_session" else ""
        labels = (dimension, scope, session_label, persona or "")
        self.budget_used.labels(*labels).set(used)
        if limit is not None:
            self.budget_limit.labels(*labels).set(limit)
        if session_label:
            self._session_series.setdefault(session_label, set()).add(labels)

    def forget_session(self, session: str) -> None:
        """Drop the session's per-session series (call when the session ends)."""
        for labels in self._session_series.pop(session, ()):
            for gauge in (self.budget_used, self.budget_limit):
                try:
                    gauge.remove(*labels)
                except KeyError:  # a capless counter has no limit series
                    pass

    def session_refused(self, reason: str) -> None:
        self.session_refusals.labels(reason).inc()

    def session_opened(self, by: str) -> None:
        self.sessions_opened.labels(by).inc()

    def set_locks(self, count: int) -> None:
        self.agent_locks.set(count)

    def set_pending_approvals(self, count: int) -> None:
        self.pending_approvals.set(count)

    # --- exposition --------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)

