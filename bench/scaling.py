"""Scaling on Redis (issue #30): one governor on the embedded store against one on a local
Redis, several governor processes sharing budgets through Redis, and LiteLLM's proxy with the
same number of workers, side by side in one run.

    .venv/bin/python bench/scaling.py [--quick] [--rounds N] [--duration S] [--concurrency C]
                                      [--workers 1,2,4] [--litellm PATH] [--paths embedded,redis,...]

Paths (plain chat completions, closed loop, C kept-alive connections in all, default 32):
- `embedded`: one `governor run` on its embedded store (SQLite, counters written behind);
- `redis`: one `governor run --store redis://…` on a local redis-server (this run's own),
  sessions shared on Redis (the default);
- `redis-local`, `redis-local-xN` (N the widest of --workers): the same with `?sessions=local`
  (each process its own sessions, budgets shared);
- `redis-xN`: `governor run --workers N` on that Redis: N worker processes on one port
  (SO_REUSEPORT), sharing budgets through the store;
- `redis@base`, `redis-local@base`: `redis` and `redis-local` with another tree's governor
  (--base: its venv's `governor` executable, e.g. a `git worktree` of main), measured in the
  same rounds, for a comparison of two revisions on one load;
- `litellm-xN`: LiteLLM's proxy (`litellm --num_workers N`, under gunicorn for N > 1) in front of the same mock
  upstream, when a LiteLLM is given (--litellm: its `litellm` executable; bench/setup of
  one: `python -m venv bench/.venv-litellm && bench/.venv-litellm/bin/pip install 'litellm[proxy]'`).

Each governor drives a session of its own (`--session`: `bench` on the embedded store,
`bench-x1` for `redis`, ...): governors sharing one session on one Redis ticked the one being
measured while idle. Two load generator processes split the connections of every path (one alone would be the
bottleneck on a small host). Every path is measured in every round, in an order that alternates between rounds. CPU per
request is the serving processes' own CPU (utime + stime of each process and its children,
from /proc) over the measured part; redis-server's CPU is reported beside it, not in it.
Throughput is requests answered 200 per second. Targets (the issue's): `redis` costs at most
1.3x the CPU per request of `embedded`; `redis-x2` gives at least 1.7x the throughput of
`embedded`. Prints a table and writes bench/results/scaling.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HOST,
    REPO,
    Governor,
    Role,
    chat_body,
    cpu_seconds,
    machine,
    ratio,
    scratch,
    table,
    upstream_url,
    write_passport,
    write_result,
)

TARGETS = {
    "cpu_per_request_redis_over_embedded": 1.3,  # at most
    "throughput_redis_x2_over_embedded": 1.7,  # at least
}
LITELLM_DEFAULT = REPO / "bench" / ".venv-litellm" / "bin" / "litellm"
LITELLM_KEY = "sk-governor-bench"  # LiteLLM's proxy refuses to start without a master key


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and of its live descendants (LiteLLM's workers are children)."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        try:
            total += cpu_seconds(p)
        except OSError:  # exited meanwhile
            pass
    return total


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return found
    for child in map(int, children):
        found += [child, *descendants(child)]
    return found


class LiteLLM(Role):
    """LiteLLM's proxy with `workers` workers, its one model routed to the mock upstream."""

    def __init__(self, executable: Path, work: Path, upstream_port: int, workers: int) -> None:
        import socket

        with socket.socket() as s:
            s.bind((HOST, 0))
            self._port = s.getsockname()[1]
        config = work / f"litellm-{workers}.yaml"
        config.write_text(
            "model_list:\n"
            "  - model_name: gpt-4o-mini\n"
            "    litellm_params:\n"
            "      model: openai/gpt-4o-mini\n"
            f"      api_base: http://{HOST}:{upstream_port}/v1\n"
            "      api_key: bench\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
            "  drop_params: true\n"
            "general_settings:\n"
            f"  master_key: {LITELLM_KEY}\n")
        self._executable, self._config, self._workers = executable, config, workers
        # the model cost map bundled with it, not fetched (loopback only)
        super().__init__(f"litellm-x{workers}", ready_timeout=120.0, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True",
                                                                               # uvicorn's workers read it, not the file
                                                                               "LITELLM_MASTER_KEY": LITELLM_KEY})

    def command(self, role: str, args: Any) -> list[str]:
        # several workers under gunicorn: uvicorn's own workers died at start here (LiteLLM 1.108.7)
        return [str(self._executable), "--config", str(self._config), "--host", HOST, "--port", str(self._port),
                "--num_workers", str(self._workers), *(["--run_gunicorn"] if self._workers > 1 else [])]

    def ready(self, timeout: float) -> dict[str, Any]:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"litellm exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self._port}/health/liveliness", timeout=2):
                    return {"pid": self.pid, "port": self._port}
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("litellm did not answer in time")


SHARED_FAMILIES = ("governor_shared_rounds_total", "governor_shared_retries_total")


def shared_counts(control_urls: list[str]) -> dict[str, float]:
    """The shared sessions' rounds and retries (by label) the governors at `control_urls` counted
    so far, from their /metrics (an older tree's governor has none: {})."""
    import urllib.request

    counts: dict[str, float] = {}
    for url in control_urls:
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
                text = answer.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(SHARED_FAMILIES):
                name, value = line.rsplit(" ", 1)
                key = name.replace("governor_shared_", "").replace("_total", "").replace('"', "")
                counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def redis_reads(url: str | None) -> int:
    """The reads redis-server has processed (a pipelined write of several commands is one):
    the round trips of every client, this path's governor and the idle ones."""
    if url is None:
        return 0
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_reads_processed"])
    finally:
        client.close()


def measure(loads: list[Role], targets: list[tuple[str | None, str]], pids: list[int], concurrency: int,
            duration: float, warmup: float, redis_pid: int | None,
            headers: dict[str, str] | None = None, controls: list[str] | None = None,
            redis_url: str | None = None) -> dict[str, Any]:
    """One segment: the connections split over `targets` ((proxy, url) each), one load
    generator per target, all at once; CPU of `pids` (and their children) around it, and the
    shared sessions' rounds and retries the governors at `controls` counted in it."""
    share = [concurrency // len(targets) + (1 if i < concurrency % len(targets) else 0) for i in range(len(targets))]
    answers: list[dict[str, Any] | None] = [None] * len(targets)
    body = chat_body()

    def run(i: int) -> None:
        proxy, url = targets[i]
        answers[i] = loads[i].ask({"op": "segment", "url": url, "proxy": proxy, "body": body, "headers": headers,
                                   "concurrency": share[i], "duration": duration, "warmup": warmup})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
    # CPU is read around the whole segment, warm-up included (per request of both, below)
    shared_before = shared_counts(controls or [])
    reads_before = redis_reads(redis_url)
    cpu_before, redis_before = sum(tree_cpu(p) for p in pids), tree_cpu(redis_pid) if redis_pid else 0.0
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    cpu = sum(tree_cpu(p) for p in pids) - cpu_before
    redis_cpu = (tree_cpu(redis_pid) - redis_before) if redis_pid else None
    shared = {k: v - shared_before.get(k, 0.0) for k, v in shared_counts(controls or []).items()}
    reads = redis_reads(redis_url) - reads_before - 1 if redis_url else None  # that INFO's own read left out
    ok = sum(a["statuses"].get("200", 0) for a in answers if a)
    other = {s: n for a in answers if a for s, n in a["statuses"].items() if s != "200"}
    elapsed = max(a["elapsed"] for a in answers if a)
    requests_all = ok + sum(other.values()) + sum(a["warmup_count"] for a in answers if a)
    return {"ok": ok, "other": other, "elapsed": elapsed, "wall": wall, "cpu": cpu, "redis_cpu": redis_cpu,
            "requests_all": requests_all, "errors": [e for a in answers if a for e in a["errors"]][:3],
            "load": os.getloadavg()[0],  # the machine's 1-minute load average as the segment ended
            "shared": {k: v for k, v in shared.items() if v}, "redis_reads": reads}


def run(rounds: int, duration: float, warmup: float, concurrency: int, workers: list[int],
        litellm: Path | None, log=print, only: set[str] | None = None, base: Path | None = None) -> dict[str, Any]:
    """`only`: the paths to start and measure (None: all); `base`: another tree's governor executable."""
    from tests.redis_server import RedisServer

    segments: dict[str, list[dict[str, Any]]] = {}
    loaders = 2
    with scratch("scaling") as work:
        server = RedisServer()
        started: list[Role] = []
        try:
            upstream = Role("upstream")
            started.append(upstream)
            passport = write_passport(work / "passport.json")
            url = upstream_url(upstream.port)
            wanted = (lambda name: True) if only is None else only.__contains__
            embedded = Governor(passport, work / "embedded") if wanted("embedded") else None
            if embedded is not None:
                started.append(embedded)
            on_redis = {}
            for n in sorted({1, 2, *workers}):
                if not wanted("redis" if n == 1 else f"redis-x{n}"):
                    continue
                # each its own id: two governors with one id on one store are refused (#32); each
                # its own session: the idle ones ticked the one being measured when they shared it
                g = Governor(passport, work / f"redis-x{n}", session=f"bench-x{n}",
                             extra=["--store", server.url, "--id", f"did:web:localhost:bench-redis-x{n}",
                                    *(["--workers", str(n)] if n > 1 else [])])
                started.append(g)
                on_redis[n] = g
            # sessions each process's own (?sessions=local): budgets shared, one round trip a step;
            # one process, and as many workers as the widest redis-xN
            local_sessions = server.url + ("&" if "?" in server.url else "?") + "sessions=local"
            on_local = {}
            for n in sorted({1, max(workers)}):
                if not wanted("redis-local" if n == 1 else f"redis-local-x{n}"):
                    continue
                g = Governor(passport, work / f"redis-local-x{n}", session=f"bench-local-x{n}",
                             extra=["--store", local_sessions, "--id", f"did:web:localhost:bench-redis-local-x{n}",
                                    *(["--workers", str(n)] if n > 1 else [])])
                started.append(g)
                on_local[n] = g
            on_base = {}
            if base is not None:
                for name, extra in (("redis@base", ["--store", server.url]), ("redis-local@base", ["--store", local_sessions])):
                    if wanted(name):
                        g = Governor(passport, work / name.replace("@", "-"), executable=base,
                                     session=f"bench-{name.replace('@', '-')}",
                                     extra=[*extra, "--id", f"did:web:localhost:bench-{name.replace('@', '-')}"])
                        started.append(g)
                        on_base[name] = g
            loads = []
            for _ in range(loaders):
                load = Role("load")
                started.append(load)
                loads.append(load)
            paths: dict[str, tuple[list[tuple[str | None, str]], list[int]]] = {}
            controls: dict[str, list[str]] = {}  # the governors whose shared rounds and retries are counted
            if embedded is not None:
                paths["embedded"] = ([(f"{HOST}:{embedded.port}", url)] * loaders, [embedded.pid])
            for n, g in on_redis.items():
                paths["redis" if n == 1 else f"redis-x{n}"] = ([(f"{HOST}:{g.port}", url)] * loaders, [g.pid])
                controls["redis" if n == 1 else f"redis-x{n}"] = [g.control_url]
            for n, g in on_local.items():
                paths["redis-local" if n == 1 else f"redis-local-x{n}"] = ([(f"{HOST}:{g.port}", url)] * loaders,
                                                                           [g.pid])
            for name, g in on_base.items():
                paths[name] = ([(f"{HOST}:{g.port}", url)] * loaders, [g.pid])
                controls[name] = [g.control_url]
            if litellm is not None:
                for n in workers:
                    if not wanted(f"litellm-x{n}"):
                        continue
                    try:
                        proxy = LiteLLM(litellm, work, upstream.port, n)
                    except RuntimeError as exc:
                        log(f"  litellm with {n} worker(s) could not start: {exc}")
                        continue
                    started.append(proxy)
                    paths[f"litellm-x{n}"] = ([(None, f"http://{HOST}:{proxy.port}/v1/chat/completions")] * loaders,
                                              [proxy.pid])
            order = list(paths)
            for round_no in range(rounds):
                this = order if round_no % 2 == 0 else order[::-1]
                log(f"  round {round_no + 1}/{rounds}: {' -> '.join(this)}")
                for name in this:
                    targets, pids = paths[name]
                    segment = measure(loads, targets, pids, concurrency, duration, warmup,
                                      server.process.pid if name.startswith("redis") else None,
                                      {"Authorization": f"Bearer {LITELLM_KEY}"} if name.startswith("litellm") else None,
                                      controls.get(name), server.url if name.startswith("redis") else None)
                    segments.setdefault(name, []).append(segment)
                    log(f"    {name}: {segment['ok'] / segment['elapsed']:.0f}/s, "
                        f"{1000 * segment['cpu'] / max(1, segment['requests_all']):.2f} ms CPU/request, "
                        f"load {segment['load']:.1f}"
                        + (f", other {segment['other']}" if segment["other"] else "")
                        + (f", redis reads/request {segment['redis_reads'] / max(1, segment['requests_all']):.2f}"
                           if segment["redis_reads"] is not None else "")
                        + (f", shared {segment['shared']}" if segment["shared"] else ""))
        finally:
            for role in reversed(started):
                role.stop()
            server.stop()
    return aggregate(segments, rounds=rounds, duration=duration, concurrency=concurrency)


def aggregate(segments: dict[str, list[dict[str, Any]]], *, rounds: int, duration: float,
              concurrency: int) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for name, segs in segments.items():
        ok = sum(s["ok"] for s in segs)
        elapsed = sum(s["elapsed"] for s in segs)
        cpu = sum(s["cpu"] for s in segs)
        requests_all = sum(s["requests_all"] for s in segs)
        redis_cpu = [s["redis_cpu"] for s in segs if s["redis_cpu"] is not None]
        paths[name] = {
            "requests": ok,
            "throughput_rps": round(ok / elapsed, 1) if elapsed else None,
            # the CPU was read around warm-up and measured part alike: per request of both
            "cpu_ms_per_request": round(1000 * cpu / requests_all, 3) if requests_all else None,
            "redis_cpu_ms_per_request": round(1000 * sum(redis_cpu) / requests_all, 3) if redis_cpu else None,
            "other_statuses": {k: v for s in segs for k, v in s["other"].items()},
            "errors": [e for s in segs for e in s["errors"]][:3],
            "load": [round(s["load"], 2) for s in segs if "load" in s],
            "redis_reads_per_request": (round(sum(s["redis_reads"] for s in segs) / requests_all, 3)
                                        if requests_all and all(s.get("redis_reads") is not None for s in segs) else None),
            # the shared sessions' decision rounds and retried scripts, per 1,000 requests
            "shared_per_1000": {k: round(1000 * sum(s["shared"].get(k, 0.0) for s in segs) / requests_all, 2)
                                for k in sorted({k for s in segs for k in s["shared"]})} if requests_all else {},
        }
    embedded = paths.get("embedded", {})
    ratios = {
        "cpu_per_request_redis_over_embedded": ratio(paths.get("redis", {}).get("cpu_ms_per_request"),
                                                     embedded.get("cpu_ms_per_request")),
        "cpu_per_request_redis_base_over_embedded": ratio(paths.get("redis@base", {}).get("cpu_ms_per_request"),
                                                          embedded.get("cpu_ms_per_request")),
        "cpu_per_request_redis_local_over_embedded": ratio(paths.get("redis-local", {}).get("cpu_ms_per_request"),
                                                           embedded.get("cpu_ms_per_request")),
        "throughput_redis_over_embedded": ratio(paths.get("redis", {}).get("throughput_rps"),
                                                embedded.get("throughput_rps")),
        "throughput_redis_x2_over_embedded": ratio(paths.get("redis-x2", {}).get("throughput_rps"),
                                                   embedded.get("throughput_rps")),
    }
    for name in paths:
        if name.startswith("litellm-x"):
            ours = paths.get("redis" if name == "litellm-x1" else f"redis-{name.split('-')[1]}", {})
            ratios[f"throughput_{name.replace('litellm', 'governor')}_over_{name}"] = ratio(
                ours.get("throughput_rps"), paths[name]["throughput_rps"])
            ratios[f"cpu_per_request_{name.replace('litellm', 'governor')}_over_{name}"] = ratio(
                ours.get("cpu_ms_per_request"), paths[name]["cpu_ms_per_request"])
    return {"machine": machine(), "rounds": rounds, "duration": duration, "concurrency": concurrency,
            "paths": paths, "ratios": ratios, "targets": TARGETS}


def report(result: dict[str, Any]) -> str:
    rows = [(name, p["throughput_rps"], p["cpu_ms_per_request"], p["redis_cpu_ms_per_request"] or "",
             p.get("redis_reads_per_request") or "", sum(p["other_statuses"].values()) or "")
            for name, p in result["paths"].items()]
    lines = [table(rows, ("path", "req/s", "CPU ms/req", "redis CPU ms/req", "redis reads/req", "not 200"))]
    r = result["ratios"]
    for name, value in r.items():
        target = TARGETS.get(name)
        verdict = ""
        if target is not None and value is not None:
            met = value <= target if name.startswith("cpu") else value >= target
            verdict = f" (target {'<=' if name.startswith('cpu') else '>='} {target}: {'met' if met else 'NOT met'})"
        lines.append(f"{name}: {value}{verdict}")
    for name, p in result["paths"].items():
        if p.get("shared_per_1000"):
            lines.append(f"{name}: shared rounds and retries per 1,000 requests: {p['shared_per_1000']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", default="1,2,4", help="worker counts for the governor-on-Redis and LiteLLM rows")
    parser.add_argument("--litellm", type=Path, help=f"LiteLLM's executable (default {LITELLM_DEFAULT} when present)")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 s")
    parser.add_argument("--base", type=Path, help="another tree's `governor` executable: adds redis@base and "
                                                  "redis-local@base (compare two revisions in one run)")
    parser.add_argument("--paths", help="only these paths, comma-separated (embedded, redis, redis-local, redis-x2, "
                                        "redis-local-x2, litellm-x1, ...): a shorter run")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what it started on the way out
    if shutil.which("redis-server") is None:
        sys.exit("bench/scaling.py needs redis-server (apt-get install redis-server)")
    if args.quick:
        args.rounds, args.duration = 2, 2.0
    litellm = None if args.no_litellm else (args.litellm or (LITELLM_DEFAULT if LITELLM_DEFAULT.exists() else None))
    if litellm is None and not args.no_litellm:
        print("no LiteLLM (see --litellm): its rows are left out")
    workers = sorted({int(w) for w in args.workers.split(",") if w.strip()})
    only = {p.strip() for p in args.paths.split(",") if p.strip()} if args.paths else None
    result = run(args.rounds, args.duration, args.warmup, args.concurrency, workers, litellm, only=only,
                 base=args.base)
    result["paths_measured"] = sorted(only) if only else "all"
    result["litellm"] = str(litellm) if litellm else None
    if litellm:
        result["litellm_version"] = subprocess.run([str(litellm), "--version"], capture_output=True, text=True,
                                                   timeout=60).stdout.strip()[-200:]
    print(report(result))
    print(f"written to {write_result('scaling', result)}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
