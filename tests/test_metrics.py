"""The governor's metrics registry: isolation, labels, cardinality, exposition."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from governor.runtime.metrics import DECISION_BUCKETS, UPSTREAM_BUCKETS, Metrics
from governor.policy.steps import Action, Decision


def _samples(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_fresh_metrics_are_isolated():
    a, b = Metrics(), Metrics()
    a.decision(None, Action.PERMIT, 1e-5)
    assert _samples(a)[("governor_decisions_total", (("action", "permit"), ("cause", "none"),
                                                     ("enforced", "true")))] == 1
    assert not any(name == "governor_decisions_total" for name, _ in _samples(b))


def test_decided_counts_cause_action_enforcement_latency_and_warnings():
    m = Metrics()
    observe_only = Decision(action=Action.HALT, cause="on_budget_exhausted", enforced=False,
                            warnings=(("tokens", "per_session", 0.8),))
    m.decided(observe_only, 3e-6)
    m.decided(observe_only, 4e-3)
    s = _samples(m)
    assert s[("governor_decisions_total", (("action", "halt"), ("cause", "on_budget_exhausted"),
                                           ("enforced", "false")))] == 2
    assert s[("governor_threshold_warnings_total", (("dimension", "tokens"), ("scope", "per_session")))] == 2
    assert s[("governor_decision_seconds_count", ())] == 2
    # Microsecond resolution: the 3 µs decision lands below 5 µs, the 4 ms one does not.
    assert s[("governor_decision_seconds_bucket", (("le", "5e-06"),))] == 1
    assert s[("governor_decision_seconds_bucket", (("le", "0.005"),))] == 2


def test_budget_families_have_one_unit_each_and_no_session_label_by_default():
    m = Metrics()
    m.declare_personas(["reviewer"])
    m.budget("tokens", "per_session", 1200, 5000, session="s1")
    m.budget("tokens", "per_session", 3000, 5000, session="s2")
    m.budget("tokens", "per_session", 300, 1000, session="s1", persona="reviewer")
    m.budget("tokens", "per_session", 7, 1000, session="s1", persona="made-up-by-the-agent")
    m.budget("tokens", "per_day", 4200, 50000, session="s1")  # agent-wide: session dropped
    m.budget("cost_usd", "per_session", 0.5, None, session="s2")  # tracked, not capped
    m.budget("wall_clock_sec", "per_day", 30, 3600)
    s = _samples(m)
    assert s[("governor_budget_used_tokens", (("persona", ""), ("scope", "per_session")))] == 3000  # the highest
    assert s[("governor_budget_limit_tokens", (("persona", ""), ("scope", "per_session")))] == 5000
    assert s[("governor_budget_used_tokens", (("persona", "reviewer"), ("scope", "per_session")))] == 300
    assert s[("governor_budget_used_tokens", (("persona", "undeclared"), ("scope", "per_session")))] == 7
    assert s[("governor_budget_used_tokens", (("persona", ""), ("scope", "per_day")))] == 4200
    assert s[("governor_budget_used_usd", (("persona", ""), ("scope", "per_session")))] == 0.5
    assert ("governor_budget_limit_usd", (("persona", ""), ("scope", "per_session"))) not in s
    assert s[("governor_budget_used_seconds", (("persona", ""), ("scope", "per_day")))] == 30
    assert not any("session" in dict(labels) for _, labels in s)
    assert not any("made-up" in str(labels) for _, labels in s)
    m.forget_session("s2")
    assert _samples(m)[("governor_budget_used_tokens", (("persona", ""), ("scope", "per_session")))] == 1200
    m.forget_session("s1")
    s = _samples(m)
    assert {labels for name, labels in s if name.startswith("governor_budget")} == {
        (("persona", ""), ("scope", "per_day"))}


def test_per_session_series_are_opt_in_and_capped():
    m = Metrics(per_session=2)
    for n in range(5):
        m.budget("tokens", "per_session", 100 + n, 5000, session=f"s{n}")
    s = _samples(m)
    sessions = {dict(labels)["session"] for name, labels in s if name == "governor_session_budget_used_tokens"}
    assert sessions == {"s0", "s1"}
    m.forget_session("s0")  # a slot frees when a session ends
    s = _samples(m)
    sessions = {dict(labels)["session"] for name, labels in s if name == "governor_session_budget_used_tokens"}
    assert sessions == {"s1", "s2"}
    assert s[("governor_session_budget_used_tokens", (("persona", ""), ("session", "s2")))] == 102


def test_counters_for_streams_records_upstream_and_pending():
    m = Metrics()
    m.stream_cut("on_budget_exhausted", "openai")
    m.record_signed("final")
    m.record_signed("snapshot", nonce=True)
    m.upstream("mcp", 0.02)
    m.upstream("openai", 0.5, 503)
    m.upstream("openai", 0.5, 429)
    m.upstream("openai", 0.5, 200)
    m.upstream("openai", 0.5, 999)  # not HTTP: one bounded value
    m.upstream("openai", 0.5, 1234)
    m.upstream_error("anthropic")  # no answer at all
    m.set_pending_approvals(3)
    s = _samples(m)
    errors = {labels: v for (name, labels), v in s.items() if name == "governor_upstream_errors_total"}
    assert errors == {(("code", "503"), ("protocol", "openai")): 1, (("code", "429"), ("protocol", "openai")): 1,
                      (("code", "other"), ("protocol", "openai")): 2, (("code", "none"), ("protocol", "anthropic")): 1}
    assert s[("governor_streams_cut_total", (("cause", "on_budget_exhausted"), ("protocol", "openai")))] == 1
    assert s[("governor_records_signed_total", (("kind", "final"), ("nonce", "false")))] == 1
    assert s[("governor_records_signed_total", (("kind", "snapshot"), ("nonce", "true")))] == 1
    assert s[("governor_upstream_seconds_count", (("protocol", "mcp"),))] == 1
    assert s[("governor_pending_approvals", ())] == 3


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(DECISION_BUCKETS), st.floats(0, 0.2, allow_nan=False)), max_size=30))
def test_per_request_histograms_expose_what_prometheus_clients_own_would(values):
    """The per-request series are kept as plain numbers: exposed, they must read exactly as
    prometheus_client's Histogram and Counter read (bounds inclusive, cumulative, +Inf)."""
    ours = Metrics()
    registry = CollectorRegistry()
    theirs = Histogram("governor_decision_seconds", "x", buckets=DECISION_BUCKETS, registry=registry)
    upstream = Histogram("governor_upstream_seconds", "x", ["protocol"], buckets=UPSTREAM_BUCKETS, registry=registry)
    counter = Counter("governor_decisions", "x", ["cause", "action", "enforced"], registry=registry)
    for i, value in enumerate(values):
        action = [Action.PERMIT, "permit", Action.HALT][i % 3]  # raw values that share a label
        ours.decision(None if i % 3 < 2 else "on_budget_exhausted", action, value)
        theirs.observe(value)
        counter.labels("none" if i % 3 < 2 else "on_budget_exhausted", "permit" if i % 3 < 2 else "halt", "true").inc()
        ours.upstream("openai", value * 1000)
        upstream.labels("openai").observe(value * 1000)
    expected = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                expected[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    got = {key: value for key, value in _samples(ours).items()
           if key[0].startswith(("governor_decision", "governor_upstream"))}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
