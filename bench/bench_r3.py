"""The R3 anomaly substrate's cost: CPU per step and memory per 1,000 live sessions (#32).

The pure decision point only (`decide` + `advance`, as the runtime calls them), on the
passport of bench_decision.py priced by the governor's price book, with loops tolerated
(`on_detected: continue`, so loops feed §3) and a step mix that also spawns personas (§4),
warns on budgets (§2: a session's token cap sized so that each session of the mix crosses
its 80 % warning and never its cap) and fires monitor-only triggers (§5), so every feed is
exercised; the run stops, saying so, if a session of the mix halts or leaves a feed
unexercised (`premise`). Three configurations over the same steps: R2 (no substrate), R3
without the §2-§5 feeds (the §7 baseline only: the feeds patched out) and R3 (baseline +
feeds). The CPU mix is driven as consecutive sessions of `--session-steps` steps. CPU is
process time (time.process_time_ns) over whole runs, rounds interleaved, the median kept.
Memory: 1,000 sessions, each advanced through one session's mix, their states kept alive;
tracemalloc's count of what they hold.

The statistical envelope (policy/envelope.py, runtime/envelope.py) is the runtime's, not the
PDP's: its configuration "R3 + envelope" adds to the R3 run, per step, the runtime's real
`EnvelopeWatch.observed` (the tally), and every 100 steps its real `flush` into an in-memory
book (the pure feed and judge; with steps 10 ms apart and a 1 s window, a window closes at
every flush: the upper bound). Memory per agent: 1,000 agents' envelopes after 50 windows of
6 tools each.

    .venv/bin/python bench/bench_r3.py [--steps 30000] [--rounds 5] [--sessions 1000]

Prints a table and writes bench/results/r3.json.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import statistics
import sys
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_decision  # noqa: E402
from governor.policy import (  # noqa: E402
    ModelCall, PersonaExit, PersonaSpawn, PolicyConfig, SessionState, StepDone, Tier, ToolCall, UsageReport,
    advance, compile_limits, decide
)
from governor.policy import engine, feeds, transition  # noqa: E402
from governor.policy.envelope import EnvelopeConfig  # noqa: E402
from governor.runtime.envelope import EnvelopeWatch  # noqa: E402
from governor.runtime.prices import price_book  # noqa: E402
from governor.store.envelope_books import EnvelopeBook  # noqa: E402


SESSION_TOKENS = 32_000  # sized to the mix: ~70 % of its 60-step sessions pass the 80 % warning, none the cap (premise)
FEEDS = ("budget", "iteration", "agents", "oversight")  # §2, §3, §4, §5


def passport(session_tokens: float = SESSION_TOKENS) -> dict:
    document = copy.deepcopy(bench_decision.passport())
    document["runtime"]["tool_invocation"]["loop_detection"] = {"window": 10, "on_detected": {"action": "continue"}}
    document["runtime"]["degradation"]["on_anomaly"] = {"action": "continue"}  # keep every session going
    document["human_oversight"]["intervention_model"] = "monitor_only"
    document["human_oversight"]["triggers"].append({"description": "searches", "when": {"tool": "search"}})
    budget = document["permissions"]["resource_limits"]["budget"]
    budget["tokens"]["per_session"] = float(session_tokens)  # each session: a §2 warning, never the cap
    return document


def steps(count: int):
    """bench_decision's reason->act mix, plus a persona spawn and exit every 8th iteration and,
    every 5th, one search repeated three times in a row (the third is a loop: §3)."""
    produced = 0
    for i, (kind, step) in enumerate(bench_decision.steps(count)):
        yield kind, step
        produced += 1
        if kind == "usage" and i % 24 == 1:
            yield "spawn", PersonaSpawn("writer")
            yield "exit", PersonaExit("writer")
            produced += 2
        if kind == "usage" and i % 15 == 1:
            for _ in range(3):
                yield "tool", ToolCall("search", {"query": "the same"}, target_path="/data/docs/0.txt")
            produced += 3
        if produced >= count:
            return


class Envelope:
    """The runtime's envelope collaborator on an in-memory book, flushed every FLUSH_EVERY steps."""

    FLUSH_EVERY = 100

    def __init__(self) -> None:
        self.now = 0.0
        self.watch = EnvelopeWatch(open_book=EnvelopeBook, agent_id="bench", clock=lambda: self.now, remote=False,
                                   apply=None, hold=None, await_approval=None, record_audit=None,  # type: ignore[arg-type]
                                   config=EnvelopeConfig(window_sec=1.0))
        self.loop = asyncio.new_event_loop()
        self.steps = 0

    def step(self, step, decision, limits, now: float) -> None:
        self.now = now
        self.watch.observed(step, decision, limits)
        self.steps += 1
        if self.steps % self.FLUSH_EVERY == 0:
            self.loop.run_until_complete(self.watch.flush(now))


def drive(limits, session: str, mix: list, now: float = 1_760_000_000.0, envelope: Envelope | None = None) -> SessionState:
    state = SessionState.start(session, now)
    counters: dict = {}
    last: tuple = ()
    for kind, step in mix:
        now += 0.01
        if kind == "usage":
            step = UsageReport(step.model, step.input_tokens, step.output_tokens, step.cached_input_tokens,
                               step.persona, True, last)
        snapshot = state.with_counters({k: counters.get(k, 0.0) for k in limits.counter_keys(step)})
        decision = decide(limits, snapshot, step, now)
        if decision.settles:
            for charge in step.reserved:
                counters[(charge.scope, charge.persona, charge.dimension)] -= charge.amount
        if decision.settles or not decision.blocks:
            for charge in decision.charges:
                key = (charge.scope, charge.persona, charge.dimension)
                counters[key] = counters.get(key, 0.0) + charge.amount
        if kind == "model" and not decision.blocks:
            last = decision.charges
        state = advance(limits, snapshot, step, decision, now)
        if envelope is not None:
            envelope.step(step, decision, limits, now)
        if kind in ("usage", "tool") and not decision.blocks:
            done = StepDone("model" if kind == "usage" else "tool", step.persona)
            state = advance(limits, state, done, decide(limits, state, done, now), now)
    return state


@contextmanager
def feeds_off():
    """R3 with the §2-§5 feeds patched out: the §7 baseline alone."""
    monitor, count = engine.feeds.monitor, transition.feeds.count
    feeds.monitor = lambda limits, state, step, decision, now: decision  # type: ignore[assignment]
    feeds.count = lambda step, decision: {}  # type: ignore[assignment]
    try:
        yield
    finally:
        feeds.monitor, feeds.count = monitor, count  # type: ignore[assignment]


CONFIGS = ("R2", "R3 baseline only", "R3 baseline + feeds", "R3 + envelope")


def limits_for(name: str):
    tier = Tier.R2 if name == "R2" else Tier.R3
    return compile_limits(passport(), tier=tier, pricing=price_book(), config=PolicyConfig())


def sessions_of(mix: list, session_steps: int) -> list[list]:
    return [mix[i:i + session_steps] for i in range(0, len(mix), session_steps)]


def premise(mix: list, session_steps: int) -> dict:
    """What the sessions of the mix do at R3: a bench whose sessions halt (an unpriced model, a
    cap reached) or leave a feed unexercised measures something else; the run stops, saying so."""
    limits = limits_for("R3 baseline + feeds")
    fed: dict[str, int] = {}
    for n, steps_of_one in enumerate(sessions_of(mix, session_steps)[:-1] or [mix]):  # the last may be short
        state = drive(limits, f"premise-{n}", steps_of_one)
        if state.halted:
            raise SystemExit(f"bench_r3: session {n} of the mix halted ({state.halt_cause}): fix the mix or the passport")
        for feed in FEEDS:
            if state.feeds.get(feed, 0) > 0:
                fed[feed] = fed.get(feed, 0) + 1
    missing = [feed for feed in FEEDS if feed not in fed]
    if missing:
        raise SystemExit(f"bench_r3: no session of the mix feeds {missing}: the bench would not measure them")
    return fed


@contextmanager
def configured(name: str):
    if name == "R3 baseline only":
        with feeds_off():
            yield
    else:
        yield


def cpu(mix: list, rounds: int, session_steps: int) -> dict:
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    sessions = sessions_of(mix, session_steps)
    for r in range(rounds):
        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        for name in order:
            limits = limits_for(name)
            with configured(name):
                gc.collect()
                envelope = Envelope() if name == "R3 + envelope" else None
                started = time.process_time_ns()
                for n, steps_of_one in enumerate(sessions):
                    drive(limits, f"cpu-{r}-{n}", steps_of_one, envelope=envelope)
                times[name].append((time.process_time_ns() - started) / 1000.0 / len(mix))
    return {name: statistics.median(values) for name, values in times.items()}


def memory(mix: list, sessions: int) -> dict:
    out: dict[str, dict] = {}
    for name in CONFIGS[:-1]:  # the envelope is per agent, not per session: envelope_memory
        limits = limits_for(name)
        with configured(name):
            gc.collect()
            tracemalloc.start()
            kept = [drive(limits, f"mem-{i}", mix) for i in range(sessions)]
            current, _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        out[name] = {"bytes": current, "feeds": dict(kept[0].feeds), "deviations": sorted(kept[0].deviations)}
        del kept
    return out


def envelope_memory(agents: int, windows: int = 50) -> int:
    """Bytes 1,000 agents' envelopes hold after `windows` active windows of 6 tools each."""
    config = EnvelopeConfig(window_sec=1.0)
    tools = {f"tool_{i}": i + 1 for i in range(6)}
    gc.collect()
    tracemalloc.start()
    book = EnvelopeBook()
    for a in range(agents):
        for w in range(windows + 1):
            book.feed(f"agent-{a}", config, w + 0.5, {"requests": 10.0, "tool_calls": 21.0, "tokens": 4000.0,
                                                       "cost_usd": 0.01}, tools)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert book.load("agent-0").closed_windows == windows
    return current


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--session-steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "r3.json")
    args = parser.parse_args()
    mix = list(steps(args.steps))
    fed = premise(mix, args.session_steps)
    per_step = cpu(mix, args.rounds, args.session_steps)
    held = memory(list(steps(args.session_steps)), args.sessions)
    held["R3 + envelope"] = {"bytes": held["R3 baseline + feeds"]["bytes"]}  # sessions hold nothing more
    per_agent = envelope_memory(args.sessions)
    base = per_step["R2"]
    print(f"{'configuration':<22}{'CPU us/step':>12}{'vs R2':>9}{'KiB / ' + str(args.sessions) + ' sessions':>22}")
    for name in CONFIGS:
        print(f"{name:<22}{per_step[name]:>12.2f}{(per_step[name] / base - 1) * 100:>8.1f}%"
              f"{held[name]['bytes'] / 1024:>22.0f}")
    print(f"the envelope: {per_step['R3 + envelope'] - per_step['R3 baseline + feeds']:+.2f} us/step over R3; "
          f"{per_agent / 1024:.0f} KiB for {args.sessions} agents' envelopes ({per_agent / args.sessions:.0f} bytes each)")
    print(f"feeds of one {args.session_steps}-step session at R3: {held['R3 baseline + feeds']['feeds']}; "
          f"deviations: {held['R3 baseline + feeds']['deviations']}")
    print(f"sessions of the CPU mix feeding each feed: {fed} (of {len(sessions_of(mix, args.session_steps))}); "
          "none halted")
    result = {"benchmark": "R3 substrate: decide+advance CPU per step, state memory per live session",
              "steps": len(mix), "rounds": args.rounds, "sessions": args.sessions,
              "session_steps": args.session_steps, "cpu_us_per_step": per_step,
              "memory_bytes": {name: held[name]["bytes"] for name in CONFIGS},
              "r3_session_feeds": held["R3 baseline + feeds"]["feeds"], "sessions_feeding": fed,
              "envelope_bytes_per_agent": per_agent / args.sessions}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
