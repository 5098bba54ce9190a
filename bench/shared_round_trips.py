"""Redis round trips per model call in shared mode (issue #30): one governor replica on this
run's own redis-server, sessions opened through the control plane, N plain calls through the
proxy (8 a session, after one warm-up call each); the commands Redis served for those calls
divided by N, as MONITOR sees them from clients (commands a Lua script runs are not round
trips and are left out). With sequential calls each command is one round trip. With
--parallel P, P sessions call at once (each its calls in turn): the asyncio client's
pipeline (governor/store/redis_pipeline.py) then sends the commands of one loop turn in one
write, and the reads redis-server processed per call (INFO stats' total_reads_processed: a
pipelined write is one read) show the round trips the commands took.

With --hot C, ONE session (the bench's passport: nothing fires) takes N calls from C
connections at once, with the proxy's in-flight ticks every --tick s (`governor run`'s 1 s):
issue #30's hot session. Its one-round-trip scripts per call above 1 (SHARED_ADMIT,
SHARED_SETTLE) are the conflicts and the "a round holds the session" answers, each a retry;
BEGIN_ROUND per call counts the decision rounds (the ticks', the sweeper's and the steps that
fell back to a full round).

    .venv/bin/python bench/shared_round_trips.py [--calls N] [--sessions local] [--parallel P]
                                                 [--hot C [--tick S]]

Prints the per-command counts, the total per call, the replica's shared-session rounds and
retried scripts per call (its governor_shared_*_total), and the replica process's CPU per call
(utime + stime from /proc over the measured calls; sequential calls, so a loaded machine
inflates it less than it does throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import AsyncIterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import redis  # noqa: E402

from governor.demo.mock_llm import MockLLM  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402
from tests.shared_replicas import Replica, shared_keys  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def script_names() -> dict[str, str]:
    """sha1 -> the name of each Lua script the Redis store and its shared sessions run."""
    import hashlib

    from governor.store import redis_scripts, redis_sessions, redis_shared_scripts

    names = {}
    for module in (redis_scripts, redis_sessions, redis_shared_scripts):
        for name, text in vars(module).items():
            if name.isupper() and isinstance(text, str) and "redis.call" in text:
                for body in (text, redis_scripts.PRELUDE + text):
                    names[hashlib.sha1(body.encode()).hexdigest()] = name
    return names


SCRIPTS = script_names()


class Monitor:
    """Client commands as MONITOR reports them (a Lua script's own commands left out)."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.counts: dict[str, int] = {}
        self.counting = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self.client.monitor() as monitor:
            for seen in monitor.listen():
                if self._stop.is_set():
                    return
                if not self.counting or seen.get("client_type") == "lua":
                    continue
                words = seen["command"].split(" ")
                name = words[0].strip('"').lower()
                if name == "evalsha":  # which script: its Lua's first line names it (SCRIPTS below)
                    name = f"evalsha {SCRIPTS.get(words[1].strip(chr(34)), words[1].strip(chr(34))[:10])}"
                if name == "ping":
                    continue
                self.counts[name] = self.counts.get(name, 0) + 1

    def stop(self) -> None:
        self._stop.set()  # the thread (a daemon) returns at the next command it sees


async def shared_counts(replica: Replica) -> dict[str, float]:
    """The replica's governor_shared_rounds_total and governor_shared_retries_total, by label."""
    answer = await replica.control.get("/metrics")
    counts = {}
    for line in answer.text.splitlines():
        if line.startswith(("governor_shared_rounds_total", "governor_shared_retries_total")):
            name, value = line.rsplit(" ", 1)
            counts[name.replace("governor_shared_", "").replace("_total", "").replace('"', "")] = float(value)
    return counts


def reads_processed(client: redis.Redis) -> int:
    return int(client.info("stats")["total_reads_processed"])


@contextlib.asynccontextmanager
async def one_replica(sessions: str | None, *, tick: float = 0.0, bench_passport: bool = False
                      ) -> AsyncIterator[tuple[MockLLM, Replica, Monitor, redis.Redis]]:
    """A redis-server, a mock upstream (its replies count 5 tokens: believed, settled quietly),
    one replica on them (on the bench passport, where nothing fires: every call quiet; else the
    example passport), a monitor of the commands Redis serves and a client for its stats; all
    stopped on the way out."""
    from common import write_passport

    server = RedisServer()
    mock = MockLLM(prompt_tokens=100, completion_tokens=5)
    await mock.start()
    url = server.url + (f"?sessions={sessions}" if sessions else "")
    with tempfile.TemporaryDirectory() as tmp:
        extra = {"passport": str(write_passport(Path(tmp) / "passport.json"))} if bench_passport else None
        replica = await Replica.start("a", Path(tmp), shared_keys(Path(tmp)), url, tick=tick, extra=extra)
        monitor = Monitor(server.url)
        stats = redis.Redis.from_url(server.url)
        try:
            yield mock, replica, monitor, stats
        finally:
            monitor.stop()
            await replica.stop()
            await mock.stop()
            stats.close()
            server.stop()


async def measure(calls: int, sessions: str | None, parallel: int = 1) -> tuple[dict[str, float], float, float]:
    async with one_replica(sessions) as (mock, replica, monitor, stats):
        measured, cpu, reads = 0, 0.0, 0
        shared: dict[str, float] = {}
        while measured < calls:  # sessions of 9 calls: the example passport allows 12 iterations
            tokens = []
            for _ in range(parallel):
                opened = await replica.control.post("/v1/sessions", json={"label": "round trips"})
                tokens.append(opened.json()["token"])
            answers = await asyncio.gather(*(replica.chat(mock.url, token) for token in tokens))
            assert all(a.status_code == 200 for a in answers)  # warm-up: opens, loads

            async def eight(token: str) -> None:
                for _ in range(8):
                    answer = await replica.chat(mock.url, token)
                    assert answer.status_code == 200, answer.text

            shared_before = await shared_counts(replica)
            monitor.counting = True
            before, read_before = cpu_seconds(replica.process.pid), reads_processed(stats)
            await asyncio.gather(*(eight(token) for token in tokens))
            measured += 8 * parallel
            reads += reads_processed(stats) - read_before - 1  # this INFO's own read left out
            cpu += cpu_seconds(replica.process.pid) - before
            monitor.counting = False
            for name, n in (await shared_counts(replica)).items():
                shared[name] = shared.get(name, 0.0) + n - shared_before.get(name, 0.0)
        calls = measured
        counts = dict(monitor.counts)
        counts.update({f"shared {k}": v for k, v in shared.items() if v})
    return {name: n / calls for name, n in sorted(counts.items())}, 1000 * cpu / calls, reads / calls


async def measure_hot(calls: int, connections: int, tick: float,
                      sessions: str | None = None) -> tuple[dict[str, float], float, float]:
    """`calls` calls on one session from `connections` at once (after a warm-up of one call
    each): per call, the commands Redis served and the reads it processed, and the replica's CPU."""
    async with one_replica(sessions, tick=tick, bench_passport=True) as (mock, replica, monitor, stats):
        replica.agent = httpx.AsyncClient(proxy=replica.proxy, trust_env=False, timeout=30,
                                          limits=httpx.Limits(max_connections=connections))
        opened = await replica.control.post("/v1/sessions", json={"label": "hot"})
        token = opened.json()["token"]
        answers = await asyncio.gather(*(replica.chat(mock.url, token) for _ in range(connections)))
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200][:1]
        left = calls

        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                answer = await replica.chat(mock.url, token)
                assert answer.status_code == 200, answer.text

        shared_before = await shared_counts(replica)
        monitor.counting = True
        before, read_before = cpu_seconds(replica.process.pid), reads_processed(stats)
        await asyncio.gather(*(caller() for _ in range(connections)))
        reads = reads_processed(stats) - read_before - 1
        cpu = cpu_seconds(replica.process.pid) - before
        monitor.counting = False
        counts = dict(monitor.counts)
        counts.update({f"shared {k}": v - shared_before.get(k, 0.0)
                       for k, v in (await shared_counts(replica)).items() if v - shared_before.get(k, 0.0)})
    return {name: n / calls for name, n in sorted(counts.items())}, 1000 * cpu / calls, reads / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--sessions", choices=("local",), default=None, help="?sessions=local (not shared)")
    parser.add_argument("--parallel", type=int, default=1, help="sessions calling at once (each in turn)")
    parser.add_argument("--hot", type=int, default=0, help="C connections calling ONE session at once")
    parser.add_argument("--tick", type=float, default=1.0, help="with --hot: the in-flight tick interval (0: none)")
    args = parser.parse_args()
    if args.hot:
        per_call, cpu_ms, reads = asyncio.run(measure_hot(args.calls, args.hot, args.tick, args.sessions))
    else:
        per_call, cpu_ms, reads = asyncio.run(measure(args.calls, args.sessions, args.parallel))
    for name, n in per_call.items():
        if not name.startswith("shared "):
            print(f"{name:24} {n:6.2f}")
    print(f"{'commands per call':24} {sum(n for k, n in per_call.items() if not k.startswith('shared ')):6.2f}"
          "  (book polls every 0.5 s included)")
    for name, n in per_call.items():  # the replica's own counters (governor_shared_*_total), per call
        if name.startswith("shared "):
            print(f"{name:40} {n:8.4f}")
    print(f"{'server reads per call':24} {reads:6.2f}  (round trips: a pipelined write is one read; MONITOR's "
          "and the book polls' included)")
    print(f"{'replica CPU ms per call':24} {cpu_ms:6.2f}")


if __name__ == "__main__":
    main()
