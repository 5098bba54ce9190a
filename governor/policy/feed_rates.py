"""What the R3 anomaly substrate monitors beyond the §7 baseline: the feeds of §2-§5, their
expected rates and the materiality rule. Constants only (no import of the policy but the
envelope's own constants), so that
the limits summary (`limits.py`) and the monitor (`feeds.py`) read one table.

Each feed counts a session's events of one section; its test statistic is that count k over
the agent's actions n in the session (model calls + tool calls + spawns and delegations,
the current step included). A feed is *material* when k >= MIN_EVENTS and the one-sided
binomial tail P(X >= k | n, rate) is below the governor's `anomaly_alpha` (PolicyConfig, 0.01),
`rate` being the expected share of actions that produce the event. The ADL baseline declares
no rate for these events, so the rates are the governor's documented defaults, except where
the declared baseline speaks: a budget boundary on per-session cost beyond the declared
`cost_per_session_usd.max` is material at once (the baseline says sessions never cost that).
"""

from __future__ import annotations

from typing import Any

from governor.policy.envelope import EnvelopeConfig
from governor.policy.envelope import monitored as envelope_monitored

# feed -> (section, what it counts, expected rate per action)
FEEDS: dict[str, tuple[str, str, float]] = {
    "budget": ("§2", "budget boundaries: warnings (on_governor_budget_warning) and exhaustion (on_budget_exhausted)", 0.05),
    "iteration": ("§3", "loop and limit events (on_iteration_limit)", 0.02),
    "agents": ("§4", "persona spawns and peer delegations, admitted or denied", 0.25),
    "oversight": ("§5", "oversight trigger firings (on_governor_oversight_trigger pauses and monitor_only records)", 0.10),
}
MIN_EVENTS = 3  # fewer events of a feed in a session are never material, whatever the rate


def monitored(baseline_declared: bool) -> dict[str, Any]:
    """The enforcement record's `limits.anomaly_monitoring` at R3: what the substrate watched."""
    return {
        "baseline": "declared anomaly_baseline (§7)" if baseline_declared else "none declared",
        "feeds": {name: {"section": section, "counts": what, "expected_rate": rate}
                  for name, (section, what, rate) in FEEDS.items()},
        "test": "one-sided binomial tail of the feed's events over the session's actions",
        "material": f"at least {MIN_EVENTS} events and p < anomaly_alpha; a per-session cost boundary "
                    "beyond the declared cost_per_session_usd.max at once",
        "across_sessions": {"envelope": "the agent's rates across its sessions over tumbling windows "
                                        "(policy/envelope.py); its settings at their defaults unless "
                                        "governor run --envelope-* changed them",
                            **envelope_monitored(EnvelopeConfig())},
    }


__all__ = ["FEEDS", "MIN_EVENTS", "monitored"]
