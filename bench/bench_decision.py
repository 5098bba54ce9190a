"""Decision latency of the pure PDP: `decide` only, per call, with time.perf_counter_ns.

The passport declares every governed member (budgets on all three dimensions and both
scopes, personas with budget shares, delegation, tool-invocation limits with loop
detection, degradation, oversight triggers, requires_confirmation, an anomaly baseline).
The steps are a realistic mix: a model call, its usage report and one or two tool calls
per iteration, a third of them by a persona, with distinct tool arguments (so every
tool call computes its loop signature). State is advanced and the counter snapshot
refreshed between decisions, outside the timed region.

    .venv/bin/python bench/bench_decision.py [--decisions 120000]

Prints a table and writes bench/results/decision.json. Targets on the reference
machine: p50 <= 20 us, p99 <= 100 us.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from governor.runtime.prices import price_book
from governor.policy import (  # noqa: E402
    ModelCall,
    PolicyConfig,
    SessionState,
    StepDone,
    Tier,
    ToolCall,
    UsageReport,
    advance,
    compile_limits,
    decide,
    load_pricing,
)

TARGET_P50_US = 20.0
TARGET_P99_US = 100.0
BIG = 10.0**12


def passport() -> dict:
    return {
        "adl_spec": "0.4.0",
        "name": "Bench Agent",
        "description": "declares every governed member",
        "version": "1.0.0",
        "id": "https://bench.example/agents/bench",
        "data_classification": {"sensitivity": "internal", "categories": ["pii"]},
        "tools": [
            {"name": "search", "description": "search"},
            {"name": "read_file", "description": "read",
             "data_classification": {"sensitivity": "confidential", "categories": ["pii"]}},
            {"name": "write_file", "description": "write"},
            {"name": "send_email", "description": "mail", "requires_confirmation": True},
        ],
        "permissions": {
            "resource_limits": {
                "max_concurrent": 16,
                "max_duration_sec": BIG,
                "budget": {
                    "tokens": {"per_session": BIG, "per_day": BIG},
                    "cost_usd": {"per_session": BIG, "per_day": BIG},
                    "wall_clock_sec": {"per_session": BIG, "per_day": BIG},
                },
            },
            "sub_agents": [
                {"name": "researcher", "tools": ["search", "read_file"], "max_parallel": 4,
                 "budget_share": {"tokens": {"per_session": BIG}, "cost_usd": {"per_session": BIG, "per_day": BIG}}},
                {"name": "writer", "max_parallel": 1},
            ],
            "delegation": {
                "match": ["https://partners.example/agents/*"],
                "deny": ["https://partners.example/agents/evil"],
                "max_depth": 2,
                "attenuation": {"scopes_subset": True, "budget_subset": True},
            },
        },
        "security": {"authentication": {"type": "oauth2", "scopes": ["read", "write"]}},
        "runtime": {
            "tool_invocation": {
                "parallel": True, "max_concurrent": 8, "max_iterations": 10**9,
                "max_tool_calls_per_session": 10**9,
                "loop_detection": {"window": 10, "on_detected": {"action": "pause"}},
            },
            "error_handling": {"on_tool_error": "continue"},
            "degradation": {
                "on_budget_exhausted": {"action": "halt"},
                "on_iteration_limit": {"action": "halt"},
                "on_anomaly": {"action": "pause"},
                "on_tool_error": {"action": "continue"},
                "on_oversight_timeout": {"action": "halt"},
            },
        },
        "profiles": ["urn:adl:profile:governance:1.0"],
        "human_oversight": {
            "level": "on_exception",
            "triggers": [
                "free text",
                {"description": "big spend", "when": {"cost_usd_over": BIG}},
                {"description": "secrets", "when": {"path_matches": "/secrets/**", "data_classification_at_least": "restricted"}},
                {"description": "writes to etc", "when": {"tool": "write_file", "path_matches": "/etc/**"}},
            ],
            "response_time_minutes": 30,
            "intervention_model": "approve_reject",
        },
        "anomaly_baseline": {
            "expected_tools": [{"name": "search", "share": 0.5}, {"name": "read_file", "share": 0.3},
                               {"name": "write_file", "share": 0.2}, {"name": "send_email"}],
            "cost_per_session_usd": {"min": 0.0, "max": BIG},
            "data_classes": ["pii", "financial"],
        },
    }


def steps(count: int):
    """Yields (kind, step) in a repeating reason->act pattern."""
    models = ("gpt-4o-2024-08-06", "claude-sonnet-4-20250514", "gpt-4.1-mini")
    tools = ("search", "search", "read_file", "search", "write_file", "read_file", "search", "write_file", "read_file", "search")
    i = 0
    produced = 0
    while produced < count:
        persona = "researcher" if i % 3 == 0 else None
        model = models[i % len(models)]
        yield "model", ModelCall(model, 1200 + i % 500, 400, ("search", "read_file"), persona)
        yield "usage", UsageReport(model, 1100 + i % 400, 350, cached_input_tokens=200, persona=persona)
        produced += 2
        for j in range(1 + i % 2):
            tool = tools[(i + j) % len(tools)]
            if persona is not None and tool == "write_file":
                tool = "search"
            arguments = {"query": f"item {i}-{j}", "limit": 10, "filters": {"lang": "en", "year": 2024}}
            yield "tool", ToolCall(tool, arguments, target_path=f"/data/docs/{i % 97}.txt", data_classes=("pii",), persona=persona)
            produced += 1
        i += 1


def run(decisions: int) -> dict:
    limits = compile_limits(passport(), tier=Tier.R3, pricing=price_book(),
                            config=PolicyConfig())
    now = 1_760_000_000.0
    state = SessionState.start("bench-session", now)
    counters: dict = {}
    timings: dict[str, list[int]] = {"model": [], "usage": [], "tool": []}
    actions: dict[str, int] = {}
    last_charges: tuple = ()
    clock = time.perf_counter_ns
    gc.collect()
    for kind, step in steps(decisions):
        now += 0.01
        if kind == "usage":
            step = UsageReport(step.model, step.input_tokens, step.output_tokens, step.cached_input_tokens,
                               step.persona, True, last_charges)
        snapshot = state.with_counters({k: counters.get(k, 0.0) for k in limits.counter_keys(step)})
        started = clock()
        decision = decide(limits, snapshot, step, now)
        elapsed = clock() - started
        timings[kind].append(elapsed)
        actions[decision.action.value] = actions.get(decision.action.value, 0) + 1
        # the runtime's part, untimed: reserve or settle, advance, free in-flight slots
        if decision.settles:
            for charge in step.reserved:
                key = (charge.scope, charge.persona, charge.dimension)
                counters[key] -= charge.amount
        if decision.settles or not decision.blocks:
            for charge in decision.charges:
                key = (charge.scope, charge.persona, charge.dimension)
                counters[key] = counters.get(key, 0.0) + charge.amount
        if kind == "model" and not decision.blocks:
            last_charges = decision.charges
        state = advance(limits, snapshot, step, decision, now)
        if kind == "usage":
            state = advance(limits, state, StepDone("model", step.persona), decide(limits, state, StepDone("model"), now), now)
        elif kind == "tool" and not decision.blocks:
            state = advance(limits, state, StepDone("tool", step.persona), decide(limits, state, StepDone("tool"), now), now)

    def summary(values: list[int]) -> dict:
        ordered = sorted(values)
        pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000.0  # noqa: E731
        return {
            "n": len(values), "p50_us": pick(0.50), "p90_us": pick(0.90), "p99_us": pick(0.99),
            "p999_us": pick(0.999), "mean_us": statistics.fmean(values) / 1000.0, "max_us": ordered[-1] / 1000.0,
        }

    everything = [t for values in timings.values() for t in values]
    result = {
        "benchmark": "decision latency (governor.policy.decide only)",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "tier": "R3",
        "decisions": len(everything),
        "actions": actions,
        "targets_us": {"p50": TARGET_P50_US, "p99": TARGET_P99_US},
        "all": summary(everything),
        "by_step": {kind: summary(values) for kind, values in timings.items()},
    }
    result["met"] = result["all"]["p50_us"] <= TARGET_P50_US and result["all"]["p99_us"] <= TARGET_P99_US
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=120_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "decision.json")
    args = parser.parse_args()
    result = run(args.decisions)
    print(f"{'step':<8}{'n':>9}{'p50 us':>10}{'p90 us':>10}{'p99 us':>10}{'p99.9 us':>10}{'mean us':>10}")
    rows = [*result["by_step"].items(), ("all", result["all"])]
    for name, row in rows:
        print(f"{name:<8}{row['n']:>9}{row['p50_us']:>10.2f}{row['p90_us']:>10.2f}{row['p99_us']:>10.2f}"
              f"{row['p999_us']:>10.2f}{row['mean_us']:>10.2f}")
    print(f"actions: {result['actions']}")
    print(f"targets p50 <= {TARGET_P50_US} us, p99 <= {TARGET_P99_US} us: {'met' if result['met'] else 'MISSED'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
