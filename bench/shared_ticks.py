"""What wall-clock ticks cost on shared sessions (issue #30; docs/reference/shared-sessions.md,
"Ticks and approvals"): one governor replica on this run's own redis-server, with the proxy's
in-flight ticker every --tick seconds (`governor run`'s default: 1 s), beside the same with it
off (tick_interval 0). The runtime's sweeper passes every second in both (its interval is not
tick_interval): it ticks each session active since its last pass, an idle one every 30 s.

  idle    --sessions sessions, each served one call, then left alone for --idle seconds: the
          decision rounds (BEGIN_ROUND scripts) and client commands Redis served per second,
          and the replica's CPU per second.
  flight  --sessions concurrent calls that the upstream answers after --latency seconds: the
          rounds and commands per call, and the replica's CPU per call.

    .venv/bin/python bench/shared_ticks.py [--sessions 20] [--idle 32] [--latency 3] [--tick 1]

Commands are counted on MONITOR as in bench/shared_round_trips.py (a script's own commands left
out); the book's polls (every 0.5 s) are in both columns.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared_round_trips import Monitor, cpu_seconds  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402
from tests.shared_replicas import Replica, shared_keys  # noqa: E402
from tests.upstreams import Behaviour, MockLLM  # noqa: E402


def rounds(counts: dict[str, int]) -> int:
    return counts.get("evalsha BEGIN_ROUND", 0)


async def measure(tick: float, sessions: int, idle: float, latency: float) -> dict[str, float]:
    server = RedisServer()
    mock = MockLLM()
    mock.default = Behaviour(input_tokens=100, output_tokens=5)
    await mock.start()
    llm = f"{mock.base_url}/v1"
    with tempfile.TemporaryDirectory() as tmp:
        replica = await Replica.start("a", Path(tmp), shared_keys(Path(tmp)), server.url, tick=tick)
        monitor = Monitor(server.url)
        try:
            tokens = []
            for _ in range(sessions):
                opened = await replica.control.post("/v1/sessions", json={"label": "ticks"})
                tokens.append(opened.json()["token"])
                assert (await replica.chat(llm, tokens[-1])).status_code == 200
            await asyncio.sleep(1.5)  # the sweeper's pass over them (active since its last)
            # idle: the sessions left alone
            monitor.counts.clear()
            monitor.counting = True
            cpu, started = cpu_seconds(replica.process.pid), time.monotonic()
            await asyncio.sleep(idle)
            monitor.counting = False
            elapsed = time.monotonic() - started
            idle_cpu = cpu_seconds(replica.process.pid) - cpu
            idle_counts = dict(monitor.counts)
            # flight: one slow call on each session at once
            mock.default = Behaviour(input_tokens=100, output_tokens=5, hang=latency)
            monitor.counts.clear()
            monitor.counting = True
            cpu = cpu_seconds(replica.process.pid)
            answers = await asyncio.gather(*[replica.chat(llm, token) for token in tokens])
            monitor.counting = False
            flight_cpu = cpu_seconds(replica.process.pid) - cpu
            flight_counts = dict(monitor.counts)
            assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
        finally:
            monitor.stop()
            await replica.stop()
            await mock.stop()
            server.stop()
    return {
        "idle: rounds per second": rounds(idle_counts) / elapsed,
        "idle: commands per second": sum(idle_counts.values()) / elapsed,
        "idle: replica CPU ms per second": 1000 * idle_cpu / elapsed,
        "flight: rounds per call": rounds(flight_counts) / sessions,
        "flight: commands per call": sum(flight_counts.values()) / sessions,
        "flight: replica CPU ms per call": 1000 * flight_cpu / sessions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--idle", type=float, default=32.0)
    parser.add_argument("--latency", type=float, default=3.0)
    parser.add_argument("--tick", type=float, default=1.0)
    args = parser.parse_args()
    ticking = asyncio.run(measure(args.tick, args.sessions, args.idle, args.latency))
    still = asyncio.run(measure(0.0, args.sessions, args.idle, args.latency))
    print(f"{args.sessions} sessions, idle {args.idle:g} s, calls of {args.latency:g} s")
    print(f"{'':34} {'ticker ' + format(args.tick, 'g') + ' s':>12} {'ticker off':>12}")
    for name in ticking:
        print(f"{name:34} {ticking[name]:12.2f} {still[name]:12.2f}")


if __name__ == "__main__":
    main()
