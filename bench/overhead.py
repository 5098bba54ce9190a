"""What governing costs: latency, throughput and proxy CPU, direct vs bare mitmproxy vs governor.

    .venv/bin/python bench/overhead.py [--quick] [--rounds N] [--duration S]

One mock upstream, one load generator, one bare mitmproxy and one `governor run` (tier
R3, the bench passport: every governed member declared, caps that never fire), each in
its own process. Four workloads: plain and streamed (20 chunks, no gaps) chat
completions, at concurrency 1 and 16 (closed loop, kept-alive connections), each over
two transports:
- plain HTTP to the proxy (absolute-form requests, the HTTP_PROXY way): no TLS in the
  way, so this isolates what governing adds (the strictest comparison);
- HTTPS through a CONNECT tunnel the proxy intercepts, trusting the proxy's CA, to an
  HTTPS upstream (`tls-*`): how agents reach LLM APIs (HTTPS_PROXY and the proxy's CA).
  TLS interception costs both proxies the same, so it adds to both sides of the ratio.

Each round measures every workload on every path for a few seconds; the order of the
paths alternates between rounds (direct, bare, governor, then governor, bare, direct),
since whichever runs first in a round is favoured or penalised on a shared machine.
Latency percentiles are pooled over the rounds; CPU time per request is the proxy
process's own utime + stime (/proc/<pid>/stat) over the measured part of each segment.
Prints a table and writes bench/results/overhead.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    CA_FILE,
    HOST,
    scratch,
    Governor,
    Role,
    chat_body,
    http_get_json,
    machine,
    memory_mb,
    percentile,
    ratio,
    summarize,
    table,
    upstream_url,
    write_passport,
    write_result,
)

PATHS = ("direct", "bare", "governor")
WORKLOADS = tuple((tls, kind, concurrency) for tls in (False, True)
                  for kind, concurrency in (("plain", 1), ("plain", 16), ("stream", 1), ("stream", 16)))
STREAM_CHUNKS = 20

TARGETS = {
    "p50_latency_governor_over_bare": 1.15,  # at most
    "throughput_governor_over_bare": 0.85,  # at least
    "cpu_per_request_governor_over_bare": 1.25,  # at most
}


def workload_key(tls: bool, kind: str, concurrency: int) -> str:
    return f"{'tls-' if tls else ''}{kind}-c{concurrency}"


def round_order(round_no: int) -> tuple[str, ...]:
    """The paths in the order round `round_no` measures them: each round mirrors the one
    before (A B C, then C B A), since whichever runs first is favoured or penalised here."""
    return PATHS if round_no % 2 == 0 else PATHS[::-1]


def run(rounds: int = 4, duration: float = 2.5, warmup: float = 0.3, log=print) -> dict[str, Any]:
    """Measure, and return the results (also what run_all puts in the summary)."""
    segments: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with (
        scratch("overhead") as work,
        Role("upstream") as upstream,
        Role("upstream", "--tls-dir", str(work / "upstream-tls")) as tls_upstream,
        Role("bare", "--data-dir", str(work / "bare"), "--upstream-ca", tls_upstream.info["ca_file"]) as bare,
        Governor(write_passport(work / "passport.json"), work / "governor",
                 extra=["--upstream-ca", tls_upstream.info["ca_file"]]) as governor,
        Role("load") as load,
    ):
        # path -> (proxy, process to watch, the CA an HTTPS client trusts on that path)
        via = {"direct": (None, None, tls_upstream.info["ca_file"]),
               "bare": (f"{HOST}:{bare.port}", bare.pid, str(work / "bare" / CA_FILE)),
               "governor": (f"{HOST}:{governor.port}", governor.pid, str(work / "governor" / CA_FILE))}
        urls = {False: upstream_url(upstream.port), True: upstream_url(tls_upstream.port, tls=True)}
        bodies = {"plain": chat_body(), "stream": chat_body(stream=True, chunks=STREAM_CHUNKS, gap_ms=0)}
        for round_no in range(rounds):
            order = round_order(round_no)
            log(f"  round {round_no + 1}/{rounds}: {' -> '.join(order)}")
            for tls, kind, concurrency in WORKLOADS:
                for path in order:
                    proxy, pid, ca_file = via[path]
                    segment = load.ask({
                        "op": "segment", "url": urls[tls], "proxy": proxy, "ca_file": ca_file, "body": bodies[kind],
                        "concurrency": concurrency, "duration": duration, "warmup": warmup, "watch_pid": pid,
                        "stream_chunks": STREAM_CHUNKS if kind == "stream" else None,
                    })
                    segment["round"] = round_no
                    segments.setdefault((workload_key(tls, kind, concurrency), path), []).append(segment)
        governor_memory = memory_mb(governor.pid)
        session = http_get_json(f"{governor.control_url}/v1/sessions/bench", token=governor.control_token)
    return aggregate(segments, governor_memory, session, rounds=rounds, duration=duration)


def aggregate(segments: dict[tuple[str, str], list[dict[str, Any]]], governor_memory: dict[str, float],
              session: dict[str, Any], *, rounds: int, duration: float) -> dict[str, Any]:
    workloads: dict[str, Any] = {}
    for tls, kind, concurrency in WORKLOADS:
        key = workload_key(tls, kind, concurrency)
        paths: dict[str, Any] = {}
        for path in PATHS:
            segs = segments[(key, path)]
            latencies = [v for s in segs for v in s["latencies_ms"]]
            count = sum(s["count"] for s in segs)
            warmup_count = sum(s["warmup_count"] for s in segs)
            short_streams = sum(s["short_streams"] for s in segs)
            elapsed = sum(s["elapsed"] for s in segs)
            statuses: dict[str, int] = {}
            for s in segs:
                for status, n in s["statuses"].items():
                    statuses[status] = statuses.get(status, 0) + n
            cpu = [s["cpu_seconds"] for s in segs if s["cpu_seconds"] is not None]
            paths[path] = {
                "requests": count,
                "warmup_requests": warmup_count,  # sent before each measured part, not measured
                "short_streams": short_streams,  # streams that ended before their content chunks
                "statuses": statuses,
                "latency_ms": summarize(latencies),
                "throughput_rps": round(count / elapsed, 1) if elapsed else None,
                "cpu_ms_per_request": round(sum(cpu) / count * 1000, 3) if cpu and count else None,
                "per_round": [{"round": s["round"], "p50_ms": percentile(s["latencies_ms"], 50),
                               "rps": round(s["count"] / s["elapsed"], 1) if s["elapsed"] else None,
                               "cpu_ms_per_request": round(s["cpu_seconds"] / s["count"] * 1000, 3)
                               if s["cpu_seconds"] is not None and s["count"] else None} for s in segs],
            }
        gov, bare, direct = paths["governor"], paths["bare"], paths["direct"]
        ratios = {
            "p50_latency_governor_over_bare": ratio(gov["latency_ms"]["p50"], bare["latency_ms"]["p50"]),
            "p99_latency_governor_over_bare": ratio(gov["latency_ms"]["p99"], bare["latency_ms"]["p99"]),
            "throughput_governor_over_bare": ratio(gov["throughput_rps"], bare["throughput_rps"]),
            "cpu_per_request_governor_over_bare": ratio(gov["cpu_ms_per_request"], bare["cpu_ms_per_request"]),
            "p50_latency_governor_over_direct": ratio(gov["latency_ms"]["p50"], direct["latency_ms"]["p50"]),
            "p99_latency_governor_over_direct": ratio(gov["latency_ms"]["p99"], direct["latency_ms"]["p99"]),
            "throughput_governor_over_direct": ratio(gov["throughput_rps"], direct["throughput_rps"]),
            "p50_latency_bare_over_direct": ratio(bare["latency_ms"]["p50"], direct["latency_ms"]["p50"]),
        }
        # the spread of the per-round ratios says how much to trust the pooled one
        spread = {}
        for name, field in (("p50_latency_governor_over_bare", "p50_ms"), ("throughput_governor_over_bare", "rps"),
                            ("cpu_per_request_governor_over_bare", "cpu_ms_per_request")):
            per_round = [ratio(g[field], b[field]) for g, b in zip(gov["per_round"], bare["per_round"])]
            per_round = [r for r in per_round if r is not None]
            if per_round:
                spread[name] = {"min": min(per_round), "median": round(statistics.median(per_round), 3),
                                "max": max(per_round)}
        verdicts = {
            "p50_latency_governor_over_bare": _at_most(ratios["p50_latency_governor_over_bare"],
                                                       TARGETS["p50_latency_governor_over_bare"]),
            "throughput_governor_over_bare": _at_least(ratios["throughput_governor_over_bare"],
                                                       TARGETS["throughput_governor_over_bare"]),
            "cpu_per_request_governor_over_bare": _at_most(ratios["cpu_per_request_governor_over_bare"],
                                                           TARGETS["cpu_per_request_governor_over_bare"]),
        }
        # answers other than 200, and streams cut short (they would look cheap): failures of the run
        failures = {p: {k: v for k, v in paths[p]["statuses"].items() if k != "200"} for p in PATHS}
        for p in PATHS:
            if paths[p]["short_streams"]:
                failures[p]["short stream"] = paths[p]["short_streams"]
        workloads[key] = {"kind": kind, "concurrency": concurrency, "tls": tls, "paths": paths, "ratios": ratios,
                          "per_round_ratio_spread": spread, "verdicts": verdicts,
                          "failures": {p: f for p, f in failures.items() if f}}
    return {
        "benchmark": "overhead: direct vs bare mitmproxy vs governor (R3), plain HTTP and intercepted HTTPS, loopback",
        "machine": machine(),
        "rounds": rounds,
        "segment_seconds": duration,
        "stream_chunks": STREAM_CHUNKS,
        "targets": TARGETS,
        "workloads": workloads,
        "governor_memory_mb": governor_memory,
        "governor_session": {k: session.get(k) for k in ("session", "state", "iterations", "events", "halt_cause")},
    }


def _at_most(value: float | None, target: float) -> str:
    return "n/a" if value is None else ("PASS" if value <= target else "MISS")


def _at_least(value: float | None, target: float) -> str:
    return "n/a" if value is None else ("PASS" if value >= target else "MISS")


def report(result: dict[str, Any]) -> str:
    rows = []
    for key, w in result["workloads"].items():
        for path in PATHS:
            p = w["paths"][path]
            rows.append([key, path, p["latency_ms"]["p50"], p["latency_ms"]["p99"], p["throughput_rps"],
                         p["cpu_ms_per_request"], p["requests"]])
    out = [table(rows, ["workload", "path", "p50 ms", "p99 ms", "req/s", "proxy CPU ms/req", "requests"]), ""]
    rows = []
    for key, w in result["workloads"].items():
        r, v, s = w["ratios"], w["verdicts"], w["per_round_ratio_spread"]

        def cell(name: str) -> str:
            spread = s.get(name)
            extra = f" [{spread['min']}-{spread['max']}]" if spread else ""
            return f"{r[name]}{extra} {v[name]}"

        rows.append([key, cell("p50_latency_governor_over_bare"), cell("throughput_governor_over_bare"),
                     cell("cpu_per_request_governor_over_bare"), r["p99_latency_governor_over_bare"],
                     r["p50_latency_governor_over_direct"], r["throughput_governor_over_direct"]])
    out.append(table(rows, ["workload", "p50 gov/bare (<=1.15)", "rps gov/bare (>=0.85)", "CPU gov/bare (<=1.25)",
                            "p99 gov/bare", "p50 gov/direct", "rps gov/direct"]))
    out.append("[min-max] of the per-round ratios")
    mem = result["governor_memory_mb"]
    out.append(f"governor process: peak RSS {mem.get('peak_rss_mb')} MiB (target <= 150), now {mem.get('rss_mb')} MiB")
    for key, w in result["workloads"].items():
        if w["failures"]:
            out.append(f"WARNING {key}: answers other than 200 or streams cut short {w['failures']}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 short rounds (about 30 s)")
    parser.add_argument("--rounds", type=int, help="rounds (default 4, quick 2); keep it even")
    parser.add_argument("--duration", type=float, help="measured seconds per segment (default 2.5, quick 1)")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 4)
    duration = args.duration or (1.0 if args.quick else 2.5)
    result = run(rounds=rounds, duration=duration, warmup=0.2 if args.quick else 0.3)
    print(report(result))
    print(f"wrote {write_result('overhead.json', result)}")


if __name__ == "__main__":
    main()
