"""State store benchmark: reserve + commit latency and throughput, per backend.

    .venv/bin/python bench/bench_store.py [--ops 5000] [--threads 4] [--redis URL] [--dir DATA_DIR]

Each operation is what the runtime does for one model call: reserve five charges
(per_session and per_day tokens and cost, capped, plus the persona's tokens) and
commit the actual usage. The agent's per_day counters are first filled with a
full day of per-minute usage (1440 live buckets per counter), so the rolling-day
sums cost what they cost in production. Backends: memory, the write-behind
SQLite store (the embedded default: counters in memory, flushed every 50 ms by a
thread, whose cost the numbers include), the shared SQLite store (a transaction
per step; synchronous=NORMAL and FULL), and Redis (a temporary redis-server
unless --redis is given; skipped when neither is available).

Prints a table and writes bench/results/store.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from governor.policy.steps import CounterCharge  # noqa: E402
from governor.store import MemoryStore, SQLiteStore, Store, WriteBehindStore  # noqa: E402

RESULTS = ROOT / "bench" / "results"
NOW = 1_795_000_000.0
BIG = 1e15  # caps that never refuse: every reservation takes the full path


def summarize(values: list[float]) -> dict[str, Any]:
    """n, p50, p90, p99 (nearest rank), mean and max, in microseconds to 0.1."""
    ordered = sorted(values)

    def rank(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 1)

    return {"n": len(ordered), "p50": rank(50), "p90": rank(90), "p99": rank(99),
            "mean": round(sum(ordered) / len(ordered), 1), "max": round(ordered[-1], 1)}


def expected(tokens: int) -> list[CounterCharge]:
    cost = tokens * 2.5e-6
    return [
        CounterCharge("per_session", "tokens", tokens, BIG),
        CounterCharge("per_session", "cost_usd", cost, BIG),
        CounterCharge("per_day", "tokens", tokens, BIG),
        CounterCharge("per_day", "cost_usd", cost, BIG),
        CounterCharge("per_session", "tokens", tokens, BIG, "researcher"),
    ]


def fill_day(store: Store, agent: str) -> None:
    """A day of per-minute usage behind NOW, on every per_day counter the bench charges."""
    for minute in range(1440, 0, -1):
        store.add(agent, "history", [c for c in expected(100) if c.scope == "per_day"], NOW - 60 * minute)
    if isinstance(store, WriteBehindStore):
        store.flush()  # the day's 2880 bucket rows are written before the clock starts


def reserve_commit(store: Store, agent: str, session: str, now: float) -> None:
    r = store.reserve(agent, session, expected(1200), now)
    if not r.ok:
        raise RuntimeError(f"unexpected refusal: {r}")
    store.commit(r.id, expected(900), now)


def sequential(store: Store, ops: int) -> dict[str, Any]:
    agent, session = f"agent-{uuid.uuid4().hex[:6]}", "s1"
    fill_day(store, agent)
    keys = [(c.scope, c.persona, c.dimension) for c in expected(1)]
    pairs, snapshots = [], []
    cpu_began = time.process_time()  # every thread's: a write-behind store's flusher counts too
    for i in range(ops):
        now = NOW + i * 0.5  # buckets roll over as the run goes on
        began = time.perf_counter_ns()
        reserve_commit(store, agent, session, now)
        pairs.append((time.perf_counter_ns() - began) / 1000)
        if i % 10 == 0:
            began = time.perf_counter_ns()
            store.snapshot(agent, session, now, keys)
            snapshots.append((time.perf_counter_ns() - began) / 1000)
    cpu_us = (time.process_time() - cpu_began) * 1e6 / ops
    return {
        "reserve_commit_us": summarize(pairs),
        "process_cpu_us_per_op": round(cpu_us, 1),
        "ops_per_sec_1_thread": round(1e6 * len(pairs) / sum(pairs)),
        "snapshot_us": summarize(snapshots),
    }


def concurrent(store: Store, threads: int, ops_per_thread: int) -> int:
    """reserve + commit pairs per second from `threads` threads on one agent's counters."""
    agent = f"agent-{uuid.uuid4().hex[:6]}"
    fill_day(store, agent)
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        barrier.wait()
        try:
            for i in range(ops_per_thread):
                reserve_commit(store, agent, f"s{n}", NOW + i * 0.5)
        except BaseException as exc:  # noqa: BLE001 (re-raised below)
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    began = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return round(threads * ops_per_thread / elapsed)


def backends(stack: ExitStack, directory: str, redis_url: str | None) -> list[tuple[str, Callable[[], Store], float]]:
    """(name, open, share of --ops): fsync-per-commit FULL runs fewer operations."""
    found: list[tuple[str, Callable[[], Store], float]] = [
        ("memory", MemoryStore, 1.0),
        ("writebehind", lambda: WriteBehindStore(Path(directory) / f"{uuid.uuid4().hex}.db"), 1.0),
        ("shared (NORMAL)", lambda: SQLiteStore(Path(directory) / f"{uuid.uuid4().hex}.db"), 1.0),
        ("shared (FULL)", lambda: SQLiteStore(Path(directory) / f"{uuid.uuid4().hex}.db", synchronous="FULL"), 0.2),
    ]
    if redis_url is None and shutil.which("redis-server"):
        from tests.redis_server import RedisServer

        server = RedisServer()
        stack.callback(server.stop)
        redis_url = server.url
    if redis_url is not None:
        from governor.store.redis import RedisStore

        found.append(("redis", lambda: RedisStore(redis_url, prefix=f"bench-{uuid.uuid4().hex}:"), 1.0))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=5000, help="reserve+commit pairs per backend (sequential)")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--redis", help="a Redis URL to use instead of a temporary redis-server")
    parser.add_argument("--dir", help="directory for the SQLite files (default: a temporary one)")
    args = parser.parse_args()

    rows: dict[str, Any] = {}
    with ExitStack() as stack:
        directory = stack.enter_context(tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-store-"))
        for name, open_store, share in backends(stack, directory, args.redis):
            ops = max(100, int(args.ops * share))
            store = open_store()
            try:
                row = sequential(store, ops)
                per_thread = max(50, ops // args.threads)
                row[f"ops_per_sec_{args.threads}_threads"] = concurrent(store, args.threads, per_thread)
            finally:
                store.close()
            rows[name] = row
            print(f"  {name}: done", file=sys.stderr)

    header = (f"{'backend':<17}{'p50 us':>9}{'p99 us':>9}{'cpu us':>9}{'ops/s 1T':>10}{f'ops/s {args.threads}T':>10}"
              f"{'snap p50':>10}")
    print("reserve (5 charges) + commit, per-day counters holding 1440 live buckets; "
          "cpu us: the process's CPU per pair, every thread")
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        pair = row["reserve_commit_us"]
        print(
            f"{name:<17}{pair['p50']:>9.1f}{pair['p99']:>9.1f}{row['process_cpu_us_per_op']:>9.1f}"
            f"{row['ops_per_sec_1_thread']:>10}"
            f"{row[f'ops_per_sec_{args.threads}_threads']:>10}{row['snapshot_us']['p50']:>10.1f}"
        )
    if "redis" not in rows:
        print("(redis skipped: no redis-server installed and no --redis given)")

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "store.json"
    out.write_text(json.dumps({
        "benchmark": "store",
        "operation": "reserve 5 charges + commit actual usage",
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "ops": args.ops,
        "threads": args.threads,
        "backends": rows,
    }, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
