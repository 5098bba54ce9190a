"""Scaling on Redis (issue #30): one governor on the embedded store against one on a local
Redis, several governor processes sharing budgets through Redis, and LiteLLM's proxy with the
same number of workers, side by side in one run.

    .venv/bin/python bench/scaling.py [--quick] [--rounds N] [--duration S] [--concurrency C]
                                      [--workers 1,2,4] [--litellm PATH]
                                      [--load python|wrk] [--upstream aiohttp|lean]
                                      [--paths embedded,redis,...] [--base GOVERNOR]

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

Two load generator processes split the connections of every path (one alone would be the
bottleneck on a small host); `--load wrk`: one wrk (bench/wrk_load.py) holds them all, at a
fraction of their CPU. `--upstream lean`: bench/lean_upstream.py in place of the aiohttp
mock. Every path is measured in every round, in an order that alternates between rounds. CPU
per request is the serving processes' own CPU (utime + stime of each process and its children,
from /proc) over the measured part; redis-server's CPU is reported beside it, not in it, with
the harness's (load generator, upstream) and the host's busy cores, and each path's bound:
the most throughput over the embedded store's this host allows beside the harness. For the
governors with one session `bench` (all but `redis-local-xN`), the steps the session counted
are compared with the requests sent: a request through the proxy must be governed.
Each governor drives a session of its own (`bench` on the embedded store and for `redis`,
`bench-x2` for `redis-x2`, ...): governors sharing one session on one Redis ticked the one
being measured while idle. For the governors on Redis the shared sessions' rounds and retried
scripts (their governor_shared_*_total) and redis-server's reads per request are reported,
and the host's load average beside each segment. `--paths` measures a subset.
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
    http_get_json,
    machine,
    ratio,
    scratch,
    table,
    upstream_url,
    write_passport,
    write_result,
)
from lean_upstream import LeanUpstream  # noqa: E402
from wrk_load import WrkLoad  # noqa: E402

TARGETS = {
    "cpu_per_request_redis_over_embedded": 1.3,  # at most
    "throughput_redis_x2_over_embedded": 1.7,  # at least
}
LITELLM_DEFAULT = REPO / "bench" / ".venv-litellm" / "bin" / "litellm"
LITELLM_KEY = "sk-governor-bench"  # LiteLLM's proxy refuses to start without a master key
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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


def machine_busy_seconds() -> float:
    """CPU seconds every core of the host spent busy (not idle or waiting on I/O), from /proc/stat:
    ours and whatever else the host runs."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def session_steps(counter: tuple[Governor, str]) -> int:
    """Model calls a governor's session has counted (0 before its first): (governor, session)."""
    import urllib.error

    governor, session = counter
    try:
        return int(http_get_json(f"{governor.control_url}/v1/sessions/{session}",
                                 token=governor.control_token).get("iterations") or 0)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return 0
        raise


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


def measure(loads: list[Any], targets: list[tuple[str | None, str]], pids: list[int], concurrency: int,
            duration: float, warmup: float, harness: dict[str, list[int]],
            headers: dict[str, str] | None = None,
            counted_by: tuple[Governor, str] | None = None, controls: list[str] | None = None,
            redis_url: str | None = None) -> dict[str, Any]:
    """One segment: the connections split over `targets` ((proxy, url) each), one load
    generator per target, all at once; CPU of `pids` (and their children) around it, and of
    the harness's processes (`harness`: load, upstream, redis -> pids; wrk reports its own).
    `counted_by`: (governor, session): the session that must count every request sent;
    `controls`: the control planes whose shared-session rounds and retries are counted;
    `redis_url`: the redis-server whose reads are counted."""
    share = [concurrency // len(targets) + (1 if i < concurrency % len(targets) else 0) for i in range(len(targets))]
    answers: list[dict[str, Any] | None] = [None] * len(targets)
    failures: list[BaseException] = []
    body = chat_body()

    def run(i: int) -> None:
        proxy, url = targets[i]
        try:
            answers[i] = loads[i].ask({"op": "segment", "url": url, "proxy": proxy, "body": body, "headers": headers,
                                       "concurrency": share[i], "duration": duration, "warmup": warmup})
        except BaseException as exc:  # raised below, in the orchestrator's thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
    steps_before = session_steps(counted_by) if counted_by else None
    shared_before = shared_counts(controls or [])
    reads_before = redis_reads(redis_url)
    # CPU is read around the whole segment, warm-up included (per request of both, below)
    cpu_before = sum(tree_cpu(p) for p in pids)
    harness_before = {name: sum(tree_cpu(p) for p in ps) for name, ps in harness.items()}
    busy_before = machine_busy_seconds()
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    cpu = sum(tree_cpu(p) for p in pids) - cpu_before
    harness_cpu = {name: sum(tree_cpu(p) for p in ps) - harness_before[name] for name, ps in harness.items()}
    busy = machine_busy_seconds() - busy_before
    shared = {k: v - shared_before.get(k, 0.0) for k, v in shared_counts(controls or []).items()}
    reads = redis_reads(redis_url) - reads_before - 1 if redis_url else None  # that INFO's own read left out
    if failures:
        raise failures[0]
    if any("load_cpu_seconds" in a for a in answers if a):  # wrk: its own, from its exit
        harness_cpu["load"] = harness_cpu.get("load", 0.0) + sum(a.get("load_cpu_seconds", 0.0)
                                                                 for a in answers if a)
    ok = sum(a["statuses"].get("200", 0) for a in answers if a)
    other: dict[str, int] = {}
    for a in answers:
        for status, n in (a or {}).get("statuses", {}).items():
            if status != "200":
                other[status] = other.get(status, 0) + n
    elapsed = max(a["elapsed"] for a in answers if a)
    requests_all = ok + sum(other.values()) + sum(a["warmup_count"] for a in answers if a)
    return {"ok": ok, "other": other, "elapsed": elapsed, "wall": wall, "cpu": cpu,
            "redis_cpu": harness_cpu.get("redis"), "harness_cpu": harness_cpu, "machine_busy": busy,
            "steps_counted": session_steps(counted_by) - steps_before if counted_by else None,
            "requests_all": requests_all, "errors": [e for a in answers if a for e in a["errors"]][:3],
            "load": os.getloadavg()[0],  # the host's 1-minute load average as the segment ended
            "shared": {k: v for k, v in shared.items() if v}, "redis_reads": reads}


def run(rounds: int, duration: float, warmup: float, concurrency: int, workers: list[int],
        litellm: Path | None, log=print, *, load: str = "python", upstream_kind: str = "aiohttp",
        wrk_threads: int = 1, only: set[str] | None = None, base: Path | None = None) -> dict[str, Any]:
    """load: "python" (two of common.py's load generators) or "wrk" (one wrk run a segment);
    upstream_kind: "aiohttp" (common.py's) or "lean" (bench/lean_upstream.py); `only`: the
    paths to start and measure (None: all); `base`: another tree's governor executable."""
    from tests.redis_server import RedisServer

    segments: dict[str, list[dict[str, Any]]] = {}
    # one Python load generator alone would be the bottleneck on a small host; one wrk is not
    loaders = 1 if load == "wrk" else 2
    with scratch("scaling") as work:
        server = RedisServer()
        started: list[Role] = []
        try:
            upstream = LeanUpstream() if upstream_kind == "lean" else Role("upstream")
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
                # its own session: idle workers ticked the one being measured when they shared it
                g = Governor(passport, work / f"redis-x{n}", session="bench" if n == 1 else f"bench-x{n}",
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
                # a session name of their own, for the reader: a process-local session "bench"
                # beside the shared one would be another session anyway (store/redis.py
                # LOCAL_SESSIONS; before, it wrote over the shared one's count of steps)
                g = Governor(passport, work / f"redis-local-x{n}", session=f"bench-local-x{n}",
                             extra=["--store", local_sessions, "--id", f"did:web:localhost:bench-redis-local-x{n}",
                                    *(["--workers", str(n)] if n > 1 else [])])
                started.append(g)
                on_local[n] = g
            on_base = {}
            if base is not None:
                for name, store in (("redis@base", server.url), ("redis-local@base", local_sessions)):
                    if wanted(name):
                        own = f"bench-{name.replace('@', '-')}"  # its directory, session and id
                        g = Governor(passport, work / own, executable=base, session=own,
                                     extra=["--store", store, "--id", f"did:web:localhost:{own}"])
                        started.append(g)
                        on_base[name] = g
            loads: list[Any] = []
            for _ in range(loaders):
                generator = WrkLoad(wrk_threads) if load == "wrk" else Role("load")
                started.append(generator)
                loads.append(generator)
            load_pids = [g.pid for g in loads if isinstance(g, Role)]  # wrk reports its own CPU
            # the session that must count every request sent through a path: one process's, or
            # one its workers share (with ?sessions=local each worker has its own: not checked)
            counters: dict[str, tuple[Governor, str]] = {}
            if embedded is not None:
                counters["embedded"] = (embedded, "bench")
            if 1 in on_local:
                counters["redis-local"] = (on_local[1], "bench-local-x1")
            counters.update({"redis" if n == 1 else f"redis-x{n}": (g, "bench" if n == 1 else f"bench-x{n}")
                             for n, g in on_redis.items()})
            counters.update({name: (g, f"bench-{name.replace('@', '-')}") for name, g in on_base.items()})
            # the governors whose shared-session rounds and retries are counted
            controls = {("redis" if n == 1 else f"redis-x{n}"): [g.control_url] for n, g in on_redis.items()}
            controls.update({name: [g.control_url] for name, g in on_base.items()})
            paths: dict[str, tuple[list[tuple[str | None, str]], list[int]]] = {}
            if embedded is not None:
                paths["embedded"] = ([(f"{HOST}:{embedded.port}", url)] * loaders, [embedded.pid])
            for n, g in on_redis.items():
                paths["redis" if n == 1 else f"redis-x{n}"] = ([(f"{HOST}:{g.port}", url)] * loaders, [g.pid])
            for n, g in on_local.items():
                paths["redis-local" if n == 1 else f"redis-local-x{n}"] = ([(f"{HOST}:{g.port}", url)] * loaders,
                                                                           [g.pid])
            for name, g in on_base.items():
                paths[name] = ([(f"{HOST}:{g.port}", url)] * loaders, [g.pid])
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
                    harness = {"load": load_pids, "upstream": [upstream.pid]}
                    if name.startswith("redis"):
                        harness["redis"] = [server.process.pid]
                    auth = {"Authorization": f"Bearer {LITELLM_KEY}"} if name.startswith("litellm") else None
                    segment = measure(loads, targets, pids, concurrency, duration, warmup, harness, auth,
                                      counted_by=counters.get(name), controls=controls.get(name),
                                      redis_url=server.url if name.startswith("redis") else None)
                    segments.setdefault(name, []).append(segment)
                    cores = ", ".join(f"{k} {v / segment['wall']:.2f}" for k, v in segment["harness_cpu"].items())
                    log(f"    {name}: {segment['ok'] / segment['elapsed']:.0f}/s, "
                        f"{1000 * segment['cpu'] / max(1, segment['requests_all']):.2f} ms CPU/request, "
                        f"cores: governor {segment['cpu'] / segment['wall']:.2f}, {cores}, "
                        f"host busy {segment['machine_busy'] / segment['wall']:.2f}, load {segment['load']:.1f}"
                        + (f", redis reads/request {segment['redis_reads'] / max(1, segment['requests_all']):.2f}"
                           if segment["redis_reads"] is not None else "")
                        + (f", other {segment['other']}" if segment["other"] else "")
                        + (f", shared {segment['shared']}" if segment["shared"] else ""))
        finally:
            for role in reversed(started):
                role.stop()
            server.stop()
    result = aggregate(segments, rounds=rounds, duration=duration, concurrency=concurrency)
    result.update(load=load, upstream=upstream_kind, wrk_threads=wrk_threads if load == "wrk" else None)
    return result


def aggregate(segments: dict[str, list[dict[str, Any]]], *, rounds: int, duration: float,
              concurrency: int, nproc: int | None = None) -> dict[str, Any]:
    nproc = nproc or os.cpu_count() or 1
    paths: dict[str, Any] = {}
    for name, segs in segments.items():
        ok = sum(s["ok"] for s in segs)
        elapsed = sum(s["elapsed"] for s in segs)
        wall = sum(s["wall"] for s in segs)
        cpu = sum(s["cpu"] for s in segs)
        requests_all = sum(s["requests_all"] for s in segs)
        redis_cpu = [s["redis_cpu"] for s in segs if s["redis_cpu"] is not None]
        other: dict[str, int] = {}
        for s in segs:
            for status, n in s["other"].items():
                other[status] = other.get(status, 0) + n
        harness = {k: sum(s["harness_cpu"].get(k, 0.0) for s in segs) for k in ("load", "upstream", "redis")}
        counted = [s for s in segs if s.get("steps_counted") is not None]
        paths[name] = {
            "requests": ok,
            "throughput_rps": round(ok / elapsed, 1) if elapsed else None,
            # the CPU was read around warm-up and measured part alike: per request of both
            "cpu_ms_per_request": round(1000 * cpu / requests_all, 3) if requests_all else None,
            "redis_cpu_ms_per_request": round(1000 * sum(redis_cpu) / requests_all, 3) if redis_cpu else None,
            "harness_cpu_ms_per_request": {k: round(1000 * v / requests_all, 3) if requests_all else None
                                           for k, v in harness.items()},
            # CPU seconds over wall seconds: how much of the host each part used while this path ran
            "cores": {"governor": round(cpu / wall, 3), **{k: round(v / wall, 3) for k, v in harness.items()},
                      "host_busy": round(sum(s["machine_busy"] for s in segs) / wall, 3)} if wall else {},
            # steps the governor's session counted, and the requests sent to it (warm-ups and
            # any status included); wrk cuts the requests in flight at the end of each run: the
            # governor counted those, wrk did not
            "governed": {"steps_counted": sum(s["steps_counted"] for s in counted),
                         "requests_answered": sum(s["requests_all"] for s in counted)} if counted else None,
            "other_statuses": other,
            "errors": [e for s in segs for e in s["errors"]][:3],
            "load": [round(s["load"], 2) for s in segs if "load" in s],
            "redis_reads_per_request": (round(sum(s["redis_reads"] for s in segs) / requests_all, 3)
                                        if requests_all and all(s.get("redis_reads") is not None for s in segs)
                                        else None),
            # the shared sessions' decision rounds and retried scripts, per 1,000 requests
            "shared_per_1000": {k: round(1000 * sum(s.get("shared", {}).get(k, 0.0) for s in segs) / requests_all, 2)
                                for k in sorted({k for s in segs for k in s.get("shared", {})})}
                               if requests_all else {},
        }
    embedded = paths.get("embedded", {})
    bounds(paths, embedded.get("throughput_rps"), embedded.get("cpu_ms_per_request"), nproc)
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
        "throughput_redis_local_x2_over_embedded": ratio(paths.get("redis-local-x2", {}).get("throughput_rps"),
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


def bounds(paths: dict[str, Any], embedded_rps: float | None, embedded_ms: float | None, nproc: int) -> None:
    """The most throughput each path could have over the embedded store's if the host's cores
    were all this run's (docs/reference/benchmarks.md, "The bound"):

    - `bound_as_measured`: (cores - the harness's cores while it ran) / its CPU per request,
      over the embedded store's measured throughput;
    - `bound_per_request`: cores / (its CPU per request + the harness's per request), over the
      same: the harness's share grows with the throughput it drives;
    - `bound_over_one_core`: the same over what the embedded store serves on the one core its
      one process can use (1 / its CPU per request): CPU per request only, so the host's other
      load moves it least.

    The harness is the load generator, the upstream and redis-server."""
    for p in paths.values():
        governor_ms = p["cpu_ms_per_request"]
        harness_ms = sum(v or 0.0 for v in p["harness_cpu_ms_per_request"].values())
        harness_cores = sum(v for k, v in p["cores"].items() if k in ("load", "upstream", "redis"))
        p["bound_as_measured"] = p["bound_per_request"] = p["bound_over_one_core"] = None
        if governor_ms and embedded_rps:
            p["bound_as_measured"] = round((nproc - harness_cores) * 1000 / governor_ms / embedded_rps, 3)
            p["bound_per_request"] = round(nproc * 1000 / (governor_ms + harness_ms) / embedded_rps, 3)
        if governor_ms and embedded_ms:
            p["bound_over_one_core"] = round(nproc * embedded_ms / (governor_ms + harness_ms), 3)


def report(result: dict[str, Any]) -> str:
    rows = [(name, p["throughput_rps"], p["cpu_ms_per_request"], p["redis_cpu_ms_per_request"] or "",
             p.get("redis_reads_per_request") or "", sum(p["other_statuses"].values()) or "")
            for name, p in result["paths"].items()]
    lines = [table(rows, ("path", "req/s", "CPU ms/req", "redis CPU ms/req", "redis reads/req", "not 200"))]
    rows = []
    for name, p in result["paths"].items():
        c, h, g = p["cores"], p["harness_cpu_ms_per_request"], p["governed"]
        rows.append((name, c["governor"], c["load"], c["upstream"], c["redis"] or "", c["host_busy"],
                     h["load"], h["upstream"], p["bound_as_measured"], p["bound_per_request"],
                     p["bound_over_one_core"],
                     f"{g['steps_counted']}/{g['requests_answered']}" if g else "",
                     "FEWER STEPS THAN REQUESTS" if g and g["steps_counted"] < g["requests_answered"] else ""))
    lines += ["", f"cores used (CPU s / wall s) with load {result.get('load', 'python')}, upstream "
              f"{result.get('upstream', 'aiohttp')}; bound: the most throughput over embedded's this host "
              f"allows beside the harness",
              table(rows, ("path", "governor", "load", "upstream", "redis", "host busy", "load ms/req",
                           "upstream ms/req", "bound: as measured", "per request", "over one core",
                           "steps/requests", ""))]
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
    parser.add_argument("--load", choices=("python", "wrk"), default="python",
                        help="the load generator: two of bench/common.py's, or wrk (bench/wrk_load.py)")
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--upstream", choices=("aiohttp", "lean"), default="aiohttp",
                        help="the mock upstream: bench/common.py's (aiohttp) or bench/lean_upstream.py")
    parser.add_argument("--paths", help="only these paths, comma-separated (embedded, redis, redis-local, redis-x2, "
                                        "redis-local-x2, redis@base, litellm-x1, ...): a shorter run")
    parser.add_argument("--base", type=Path, help="another tree's `governor` executable: adds redis@base and "
                                                  "redis-local@base (compare two revisions in one run)")
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
    if args.load == "wrk" and shutil.which("wrk") is None:
        sys.exit("bench/scaling.py --load wrk needs wrk (apt-get install wrk)")
    only = {p.strip() for p in args.paths.split(",") if p.strip()} if args.paths else None
    result = run(args.rounds, args.duration, args.warmup, args.concurrency, workers, litellm,
                 load=args.load, upstream_kind=args.upstream, wrk_threads=args.wrk_threads, only=only, base=args.base)
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
