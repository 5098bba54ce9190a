"""The governor's Prometheus metrics, all on one registry per `Metrics` object.

Every metric the proxy, the runtime and the control plane update is defined here,
so names and labels stay consistent and a test can make a fresh, isolated set
(`Metrics()`) instead of sharing prometheus_client's global registry.

Cardinality: every label takes its values from a closed set fixed by the code or
the pinned passport (causes, actions, budget scopes, declared personas, wire
protocols, record kinds); nothing an agent sends becomes a label value. A persona
the passport does not declare is labelled "undeclared". Budgets are one family per
unit (tokens, USD, seconds); the per-session scope exports the highest consumption
among live sessions. Series per session (label `session`, the agent's own
ADL-Session value) exist only when opted in (`Metrics(per_session=N)`,
`governor run --metrics-per-session N`), for at most N live sessions;
`forget_session` frees a session's slot when it ends.

Hot paths make one call per event (`decided`, `upstream`, ...). The per-request series
(decision counts, decision and upstream latency) are plain numbers behind a collector
that builds the families at scrape time: prometheus_client's Counter and Histogram take
a lock and walk the buckets on every call, ~2 us a decision on the proxy's per-request
path. Those numbers are only updated on the event loop's thread.
"""

from __future__ import annotations

import enum
from bisect import bisect_left
from typing import Any, Callable, Iterator

import platform
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from governor.policy.steps import Decision

# Decisions are in-process and pure: microseconds, occasionally a millisecond or two
# when the store is Redis.
DECISION_BUCKETS = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
    1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
)
# Upstream calls: LLM completions and tool calls, from milliseconds to minutes.
# Human review: from seconds to the longest response_time a passport declares (hours).
APPROVAL_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 86400.0)
APPROVAL_OUTCOMES = ("approved", "rejected", "expired", "session_ended")
REVIEW_HOLD_OUTCOMES = ("attached", "refused_pending", "answered")  # governor.proxy.holds
SHARED_ROUND_STEPS = ("tick", "model_call", "usage_report", "step_done", "tool_call", "other")  # governor.runtime.shared
SHARED_RETRY_REASONS = ("conflict", "round", "fallback", "late")  # governor.runtime.shared_fast
SESSION_STATES = ("active", "paused", "halted", "ended")
UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = OPENMETRICS_TYPE  # asked for in Accept: exemplars included


def _label(value: object) -> str:
    """Label text for a cause/action that may be None or an enum."""
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


class _Histogram:
    """One histogram series as plain numbers: observing is a bisect and two additions.

    With traces on (governor.proxy.tracing) each bucket keeps the trace of its latest
    observation as an exemplar (OpenMetrics exposition only)."""

    __slots__ = ("bounds", "counts", "sum", "exemplars")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0
        self.exemplars: list[Exemplar | None] | None = None  # per bucket, once a trace was observed

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # bucket i counts value <= bounds[i]
        self.sum += value

    def observe_traced(self, value: float, trace: dict[str, str] | None) -> None:
        bucket = bisect_left(self.bounds, value)
        self.counts[bucket] += 1
        self.sum += value
        if trace is not None:
            if self.exemplars is None:
                self.exemplars = [None] * len(self.counts)
            self.exemplars[bucket] = Exemplar(trace, value, time.time())

    def cumulative(self) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
        out: list[Any] = []
        total = 0
        exemplars = self.exemplars or [None] * len(self.counts)
        for bound, count, exemplar in zip((*self.bounds, float("inf")), list(self.counts), exemplars):
            total += count
            out.append((floatToGoString(bound), total) if exemplar is None
                       else (floatToGoString(bound), total, exemplar))
        return out


class _PerRequestSeries:
    """Collector of the series updated on every request (see the module's docstring)."""

    DECISIONS = ("governor_decisions", "Decisions taken, by the cause that fired and the resolved action "
                 "(cause=none, action=permit for a plain permit; enforced=false at R1, where the action "
                 "is what would have happened)")
    DECISION_SECONDS = ("governor_decision_seconds", "Time to decide one step (policy, store reservation, journal)")
    UPSTREAM_SECONDS = ("governor_upstream_seconds", "Upstream response time, by wire protocol")
    UPSTREAM_ERRORS = ("governor_upstream_errors", "Upstream answers with an HTTP error status (code 400-599), "
                       "or no answer at all (code=none), by wire protocol")

    def __init__(self) -> None:
        self.decisions: dict[tuple[object, object, bool], int] = {}  # raw (cause, action, enforced)
        self.decision_seconds = _Histogram(DECISION_BUCKETS)
        self.upstream_seconds: dict[str, _Histogram] = {}  # by protocol
        self.upstream_errors: dict[tuple[str, str], int] = {}  # (protocol, code)

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(*self.DECISIONS, labels=["cause", "action", "enforced"])
        yield HistogramMetricFamily(*self.DECISION_SECONDS)
        yield HistogramMetricFamily(*self.UPSTREAM_SECONDS, labels=["protocol"])
        yield CounterMetricFamily(*self.UPSTREAM_ERRORS, labels=["protocol", "code"])

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
        errors = CounterMetricFamily(*self.UPSTREAM_ERRORS, labels=["protocol", "code"])
        for labels, count in sorted(list(self.upstream_errors.items())):
            errors.add_metric(list(labels), count)
        yield errors


# budget dimension (policy.limits.DIMENSIONS) -> the unit in the family's name
BUDGET_UNITS = {"tokens": "tokens", "cost_usd": "usd", "wall_clock_sec": "seconds"}
UNDECLARED = "undeclared"
MAX_SESSION_LABEL = 128  # opted-in session label values are cut to this many characters


class _BudgetSeries:
    """Collector of the budget gauges: `governor_budget_{used,limit}_{tokens,usd,seconds}`
    by scope and persona, and the opted-in per-session families.

    Values are kept as plain numbers and the families built at scrape time. Agent-wide
    scopes (per_day, ...) are one value each; scope per_session exports the maximum over
    live sessions (the one a "near its limit" alert needs), computed per scrape over the
    sessions the sweeper has refreshed."""

    def __init__(self, per_session: int) -> None:
        self.per_session = per_session  # 0: no series by session
        self.agent_wide: dict[tuple[str, str, str], tuple[float, float | None]] = {}  # (unit, scope, persona)
        self.sessions: dict[str, dict[tuple[str, str], tuple[float, float | None]]] = {}  # session -> (unit, persona)

    def set(self, unit: str, scope: str, persona: str, used: float, limit: float | None, session: str | None) -> None:
        if scope == "per_session":
            if session is None:
                return
            self.sessions.setdefault(session, {})[(unit, persona)] = (used, limit)
        else:
            self.agent_wide[(unit, scope, persona)] = (used, limit)

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(fill=True))

    def _families(self, fill: bool = False) -> list[Metric]:
        used = {u: GaugeMetricFamily(f"governor_budget_used_{u}", f"Budget consumed, in {u}, by scope (per_session: "
                                     "the highest among live sessions); persona empty for the agent's aggregate",
                                     labels=["scope", "persona"]) for u in BUDGET_UNITS.values()}
        limit = {u: GaugeMetricFamily(f"governor_budget_limit_{u}", f"Declared budget cap, in {u}, by scope and persona",
                                      labels=["scope", "persona"]) for u in BUDGET_UNITS.values()}
        families: list[Metric] = [*used.values(), *limit.values()]
        if self.per_session:
            s_used = {u: GaugeMetricFamily(f"governor_session_budget_used_{u}", f"Budget consumed by one session, in {u} "
                                           "(opt-in, at most --metrics-per-session sessions)", labels=["session", "persona"])
                      for u in BUDGET_UNITS.values()}
            families += s_used.values()
        if not fill:
            return families
        for (unit, scope, persona), (value, cap) in sorted(list(self.agent_wide.items())):
            used[unit].add_metric([scope, persona], value)
            if cap is not None:
                limit[unit].add_metric([scope, persona], cap)
        highest: dict[tuple[str, str], tuple[float, float | None]] = {}
        for n, (session, counters) in enumerate(list(self.sessions.items())):
            for key, (value, cap) in list(counters.items()):
                best = highest.get(key)
                highest[key] = (max(value, best[0]) if best else value, cap if cap is not None else (best[1] if best else None))
                if n < self.per_session:
                    s_used[key[0]].add_metric([session[:MAX_SESSION_LABEL], key[1]], value)
        for (unit, persona), (value, cap) in sorted(highest.items()):
            used[unit].add_metric(["per_session", persona], value)
            if cap is not None:
                limit[unit].add_metric(["per_session", persona], cap)
        return families


SHARED_SESSIONS_WANTED_SEC = 120.0  # the shared count is refreshed while scraped this recently


class _SharedSessionSeries:
    """`governor_shared_sessions` by state: the sessions of every replica sharing the store, as
    the store holds them (the same value on every replica, unlike `governor_sessions`, which a
    session served by several replicas is in on each). Set by the sweeper off the request path
    (governor.runtime.shared_views.SharedViews.tally), and only while something scrapes it;
    without a store that shares sessions, or while the store cannot be read, no samples."""

    HELP = ("governor_shared_sessions", "Sessions of every replica sharing this governor's store, by state, as "
            "the store holds them (ended: records written and kept, ended_ttl); the same on every replica: "
            "aggregate with max, not sum. No samples without a store that shares sessions")

    def __init__(self) -> None:
        self.counts: dict[str, int] | None = None
        self.scraped_at: float | None = None  # time.monotonic() of the last scrape

    def wanted(self, now: float) -> bool:
        """Whether the sweeper should count now: never counted yet, or scraped lately."""
        return self.counts is None or (self.scraped_at is not None and now - self.scraped_at < SHARED_SESSIONS_WANTED_SEC)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(*self.HELP, labels=["state"])

    def collect(self) -> Iterator[Metric]:
        self.scraped_at = time.monotonic()
        family = GaugeMetricFamily(*self.HELP, labels=["state"])
        counts = self.counts
        if counts is not None:
            for state in SESSION_STATES:
                family.add_metric([state], counts.get(state, 0))
        yield family


class Metrics:
    """The governor's metric objects, registered on `self.registry`."""

    def __init__(self, registry: CollectorRegistry | None = None, *, per_session: int = 0) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.per_request = _PerRequestSeries()
        r.register(self.per_request)
        # with traces on: () -> {trace_id, span_id} of the flow being governed, or None
        # (governor.proxy.tracing); the latency histograms keep it as their buckets' exemplars
        self.exemplar: Callable[[], dict[str, str] | None] | None = None
        self.budgets = _BudgetSeries(per_session)
        r.register(self.budgets)
        self.personas: frozenset[str] = frozenset()  # declared in the pinned passport
        # the standard process_* and python_* families, on this registry rather than the global one
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.build_info = Gauge(
            "governor_build_info", "Always 1: the governor's version, the Python running it and the digest of "
            "the pinned passport", ["version", "python", "passport_digest"], registry=r)
        self.approvals = Counter(
            "governor_approvals", "Paused steps resolved, by outcome (approved, rejected, expired, session_ended)",
            ["outcome"], registry=r)
        self.approval_wait = Histogram(
            "governor_approval_wait_seconds", "Time a paused step waited for its resolution, by outcome",
            ["outcome"], buckets=APPROVAL_BUCKETS, registry=r)
        for outcome in APPROVAL_OUTCOMES:  # every outcome exported from the start, at 0
            self.approvals.labels(outcome)
            self.approval_wait.labels(outcome)
        self.review_holds = Counter(
            "governor_review_holds", "Requests at a step held for review (issue #21), by outcome: attached (an "
            "identical request joined the held step), refused_pending (told review_pending, with Retry-After), "
            "answered (given the review's outcome)", ["outcome"], registry=r)
        for outcome in REVIEW_HOLD_OUTCOMES:
            self.review_holds.labels(outcome)
        self.sessions = Gauge(
            "governor_sessions", "Sessions this process holds, by state (ended: since it started); kept on "
            "transitions", ["state"], registry=r)
        self._session_counts = {state: 0 for state in SESSION_STATES}
        for state in SESSION_STATES:
            self.sessions.labels(state).set_function(lambda state=state: self._session_counts[state])
        self.shared_sessions = _SharedSessionSeries()
        r.register(self.shared_sessions)
        self.shared_rounds = Counter(
            "governor_shared_rounds", "Decision rounds on shared sessions (the session held across replicas while "
            "one decides), by step: tick (wall-clock), model_call and usage_report (a model call's step that "
            "left the one-round-trip path), step_done, tool_call, other", ["step"], registry=r)
        self.shared_retries = Counter(
            "governor_shared_retries", "One-round-trip scripts on shared sessions answered other than done, by "
            "reason: conflict (another writer's state: decided again), round (a round held the session), "
            "fallback (the step went to a decision round), late (a settlement taken up after its response)",
            ["reason"], registry=r)
        for step in SHARED_ROUND_STEPS:  # every value exported from the start, at 0
            self.shared_rounds.labels(step)
        for reason in SHARED_RETRY_REASONS:
            self.shared_retries.labels(reason)
        self.pending_approvals = Gauge(
            "governor_pending_approvals", "Steps paused for human review, awaiting an answer", registry=r)
        self.oldest_pending_at: float | None = None  # wall-clock time the oldest pending step was paused
        self.oldest_pending_age = Gauge(
            "governor_pending_approval_oldest_age_seconds", "How long the oldest step still awaiting review "
            "has waited (0: none waits)", registry=r)
        self.oldest_pending_age.set_function(
            lambda: 0.0 if self.oldest_pending_at is None else max(0.0, time.time() - self.oldest_pending_at))
        self.store_errors = Counter(
            "governor_store_errors", "State-store operations that failed (the step they served failed closed, "
            "or a save, release or probe was missed)", registry=r)
        self.record_gaps = Counter(
            "governor_record_gaps", "Events that could not be journaled (a full or failing data disk): their steps "
            "were refused all the same, and the session's next event names the gap", registry=r)
        self.duplicate_identities = Gauge(
            "governor_duplicate_identities", "Other live governors on the shared store with this one's id or signing "
            "key (governor.runtime.duplicates)", registry=r)
        self.streams_cut = Counter(
            "governor_streams_cut", "Streaming responses cut mid-flight because a limit fired",
            ["cause", "protocol"], registry=r)
        self.records_signed = Counter(
            "governor_records_signed", "Enforcement records signed (kind=final at session end, "
            "snapshot on request; nonce=true when bound to a counterparty nonce)",
            ["kind", "nonce"], registry=r)
        self.witness_refusals = Counter(
            "governor_witness_refusals", "Checkpoints of the transparency log a witness refused as a rollback or "
            "fork (the log was replaced or rewritten): no log proof is served after one", registry=r)
        self.threshold_warnings = Counter(
            "governor_threshold_warnings", "One-time budget threshold warnings",
            ["dimension", "scope"], registry=r)
        self.session_refusals = Counter(
            "governor_session_refusals", "Requests refused before any session was touched: a malformed, "
            "unknown or ended session token, no token where one is required, the agent-named cap, a lock "
            "(reason = the refusal code)", ["reason"], registry=r)
        self.proxy_refusals = Counter(
            "governor_proxy_refusals", "Requests (or streams) the proxy refused on its own before any step "
            "was decided: reason = unclaimed_model_call, method_not_allowed, body_too_large, "
            "encoding_unsupported, bad_request, held_output_exceeded, event_too_large, unreadable_answer, "
            "ungoverned_endpoint, upstream_event_unreadable, unknown_traffic, host_not_allowed, session_halted, shutting_down; "
            "recorded = whether "
            "the refusal is in a session's record (false: it belongs to no session, or the record had ended)",
            ["reason", "recorded"], registry=r)
        self.sessions_opened = Counter(
            "governor_sessions_opened", "Sessions opened, by who opened them (principal, agent)", ["by"], registry=r)
        self.agent_locks = Gauge(
            "governor_agent_locks", "Locks in force: while above 0 every session of the agent is refused", registry=r)
        self.webhook_deliveries = Counter(
            "governor_webhook_deliveries", "Webhook notifications by outcome: delivered, failed (every attempt "
            "failed, or a non-retryable answer), dropped (its queue was full, or the governor stopped)",
            ["event", "outcome"], registry=r)
        self.webhook_retries = Counter(
            "governor_webhook_retries", "Webhook delivery attempts after the first", ["event"], registry=r)

    # --- hot path ----------------------------------------------------------------------

    def decision(self, cause: str | None, action: object, seconds: float, *, enforced: bool = True) -> None:
        """Count one decision and observe how long it took."""
        series = self.per_request
        key = (cause, action, enforced)  # the raw values: label text is built at scrape time
        series.decisions[key] = series.decisions.get(key, 0) + 1
        if self.exemplar is None:
            series.decision_seconds.observe(seconds)
        else:
            series.decision_seconds.observe_traced(seconds, self.exemplar())

    def decided(self, decision: Decision, seconds: float) -> None:
        """`decision` plus the decision's threshold warnings: the one call per step."""
        self.decision(decision.cause, decision.action, seconds, enforced=decision.enforced)
        for dimension, scope, fraction in decision.warnings:
            self.threshold_warning(dimension, scope, fraction)

    def upstream(self, protocol: str, seconds: float, status: int = 200) -> None:
        """Observe one upstream round trip ("openai", "anthropic", "mcp", "a2a", ...) and
        count it as an error when its status is 400-599."""
        histogram = self.per_request.upstream_seconds.get(protocol)
        if histogram is None:
            histogram = self.per_request.upstream_seconds[protocol] = _Histogram(UPSTREAM_BUCKETS)
        if self.exemplar is None:
            histogram.observe(seconds)
        else:
            histogram.observe_traced(seconds, self.exemplar())
        if status >= 400:
            # 600+ is not HTTP: one "other" value, so an upstream cannot mint label values
            self.upstream_error(protocol, str(status) if status < 600 else "other")

    def upstream_error(self, protocol: str, code: str = "none") -> None:
        """Count an upstream error: an HTTP status code, or "none" when no answer came."""
        errors = self.per_request.upstream_errors
        errors[(protocol, code)] = errors.get((protocol, code), 0) + 1

    def stream_cut(self, cause: str | None, protocol: str) -> None:
        self.streams_cut.labels(_label(cause), protocol).inc()

    def record_signed(self, kind: str, *, nonce: bool = False) -> None:
        """kind: "final" (session end) or "snapshot" (a record of the session so far)."""
        self.records_signed.labels(kind, "true" if nonce else "false").inc()

    def webhook(self, event: str, outcome: str, family: str = "deliveries") -> None:
        """One webhook delivery's outcome (family "deliveries"), or one retry ("retries").
        `event` is one of governor.notify.events.EVENTS: a closed set."""
        if family == "retries":
            self.webhook_retries.labels(event).inc()
        else:
            self.webhook_deliveries.labels(event, outcome).inc()

    def threshold_warning(self, dimension: str, scope: str, fraction: float) -> None:
        # the fraction crossed is not a label: it is a measured ratio, not a closed set
        self.threshold_warnings.labels(dimension, scope).inc()

    # --- state gauges ------------------------------------------------------------------

    def declare_personas(self, names: object) -> None:
        """The personas the pinned passport declares: the only persona label values."""
        self.personas = frozenset(str(n) for n in names)  # type: ignore[attr-defined]

    def budget(self, dimension: str, scope: str, used: float, limit: float | None, *,
               session: str | None = None, persona: str | None = None) -> None:
        """Set one budget counter's consumption and cap (cap None: tracked, not capped).

        `session` is used for scope "per_session" only: other scopes are agent-wide."""
        unit = BUDGET_UNITS.get(dimension)
        if unit is None:  # not a dimension the policy knows: no family for it
            return
        label = "" if not persona else persona if persona in self.personas else UNDECLARED
        self.budgets.set(unit, scope, label, used, limit, session)

    def forget_session(self, session: str) -> None:
        """Drop the session's budget values (call when the session ends)."""
        self.budgets.sessions.pop(session, None)

    def session_refused(self, reason: str) -> None:
        self.session_refusals.labels(reason).inc()

    def proxy_refused(self, reason: str, recorded: bool) -> None:
        self.proxy_refusals.labels(reason, "true" if recorded else "false").inc()

    def session_opened(self, by: str) -> None:
        self.sessions_opened.labels(by).inc()

    def set_locks(self, count: int) -> None:
        self.agent_locks.set(count)

    def set_build_info(self, passport_digest: str) -> None:
        from governor import __version__

        self.build_info.clear()  # one series: the passport pinned now
        self.build_info.labels(__version__, platform.python_version(), passport_digest).set(1)

    def approval_resolved(self, outcome: str, waited: float) -> None:
        """One paused step resolved: outcome in APPROVAL_OUTCOMES, after `waited` seconds."""
        if outcome not in APPROVAL_OUTCOMES:
            raise ValueError(f"unknown approval outcome {outcome!r}")
        self.approvals.labels(outcome).inc()
        self.approval_wait.labels(outcome).observe(max(0.0, waited))

    def review_hold(self, outcome: str) -> None:
        """A request at a held step: outcome in REVIEW_HOLD_OUTCOMES (governor.proxy.holds)."""
        if outcome not in REVIEW_HOLD_OUTCOMES:
            raise ValueError(f"unknown review hold outcome {outcome!r}")
        self.review_holds.labels(outcome).inc()

    def session_moved(self, before: str | None, after: str) -> None:
        """A session entered state `after` (from `before`, None when it just opened)."""
        counts = self._session_counts
        if before is not None:
            counts[before] -= 1
        counts[after] += 1

    def set_pending_approvals(self, count: int, *, oldest_held_at: float | None = None) -> None:
        self.pending_approvals.set(count)
        self.oldest_pending_at = oldest_held_at

    def store_error(self) -> None:
        self.store_errors.inc()

    def shared_round(self, step: str) -> None:
        """A decision round on a shared session: step in SHARED_ROUND_STEPS."""
        self.shared_rounds.labels(step if step in SHARED_ROUND_STEPS else "other").inc()

    def shared_retry(self, reason: str) -> None:
        """A one-round-trip script answered other than done: reason in SHARED_RETRY_REASONS."""
        self.shared_retries.labels(reason).inc()

    def record_gap(self) -> None:
        self.record_gaps.inc()

    # --- exposition --------------------------------------------------------------------

    def exposition(self, openmetrics: bool = False) -> bytes:
        """The registry in Prometheus text format, or OpenMetrics (which carries exemplars)."""
        if openmetrics:
            return openmetrics_latest(self.registry)
        return generate_latest(self.registry)

