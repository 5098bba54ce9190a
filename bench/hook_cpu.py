"""The governor's hooks and runtime calls, timed inside `governor run` under load.

    .venv/bin/python bench/hook_cpu.py [--kind plain|stream] [--concurrency 1] [--duration 8]
                                       [--tree PATH] [--time module:Class.method ...] [--gc-threshold N]

One mock upstream, one load generator and one `governor run` (tier R3, the overhead
benchmark's passport and request), started through bench/hook_cpu_probe.py, which wraps
the addon's hooks (request, responseheaders, response, the stream relay) and the
runtime's calls (admit, usage, finish; they run inside the hooks) so that each call adds
its thread CPU time (`time.thread_time`) to a table. After a warm-up segment the table is
cleared; after the measured segment the process writes it out. The report gives, for each
function, its calls and CPU per request and per call, beside the process's CPU per request
(utime + stime, as the overhead benchmark reads it) and each thread's share.

Why: the `code` part times the same functions warm, where they cost a third to a quarter
of what they cost here (caches stay warm there, not in the process); this says which of
them the process pays for. No bare proxy is run: compare with the overhead benchmark or
`bench/ab.py` for ratios. Each wrapper adds two clock reads (~0.2-0.5 us a call here);
the figures include them. `--tree` times another source tree's `governor` package (as
`bench/ab.py` does); `--time` adds functions to time. Writes bench/results/hook_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BENCH,
    CA_FILE,
    HOST,
    PYTHON,
    Governor,
    Role,
    chat_body,
    machine,
    scratch,
    table,
    thread_cpu,
    upstream_url,
    write_passport,
    write_result,
)
from overhead import STREAM_CHUNKS  # noqa: E402

HOOKS = (  # the governor's addon chain (governor/proxy/chain.py), hook by hook
    "governor.proxy.binding:SessionBinding.request",
    "governor.proxy.admission:Admission.request",
    "governor.proxy.unknown:UnknownTraffic.request",
    "governor.proxy.in_flight:InFlight.request",
    "governor.proxy.answers:Answers.responseheaders",
    "governor.proxy.answers:Answers.response",
    "governor.proxy.in_flight:InFlight.response",
    "governor.proxy.relay:StreamRelay.__call__",
)
GC = ("gc:0", "gc:1", "gc:2")  # the cyclic collector's passes, by generation (in the hooks or not)
RUNTIME = (  # called from inside the hooks
    "governor.runtime.core:Runtime.admit",
    "governor.runtime.core:Runtime.usage",
    "governor.runtime.core:Runtime.finish",
)
# Trees from before the rooms (issue #28): one mixin addon and a top-level runtime module.
# `--tree` with such a tree times these instead, so that today's tree can be compared with
# the ones "The floor" (bench/FINDINGS.md) was measured on.
LEGACY_HOOKS = (
    "governor.proxy.addon:Governor.request",
    "governor.proxy.addon:Governor.responseheaders",
    "governor.proxy.addon:Governor.response",
    "governor.proxy.addon:StreamRelay.__call__",
)
LEGACY_RUNTIME = (
    "governor.runtime:Runtime.admit",
    "governor.runtime:Runtime.usage",
    "governor.runtime:Runtime.finish",
)
_BOOT = ("import os, sys, hook_cpu_probe; hook_cpu_probe.install(os.environ['HOOK_CPU_TARGETS'].split(',')); "
         "from governor.cli import main; sys.exit(main(sys.argv[1:]))")


class TimedGovernor(Governor):
    """`governor run`, started with the probe installed (the same arguments and start-up lines)."""

    def command(self, role: str, args: Sequence[str]) -> list[str]:
        # -P: not the working directory (the repository) first on sys.path, so that
        # PYTHONPATH decides which tree's governor package runs (--tree)
        return [PYTHON, "-P", "-c", _BOOT, "run", *args]


def hooks_of(tree: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The hooks and runtime calls to time in a tree: today's, or a tree's from before the rooms."""
    if tree and not (Path(tree) / "governor" / "proxy" / "chain.py").exists():
        return LEGACY_HOOKS, LEGACY_RUNTIME
    return HOOKS, RUNTIME


def run(kind: str, concurrency: int, duration: float, tree: str | None, extra: Sequence[str],
        gc_threshold: int | None = None, warmup: float = 2.0) -> dict[str, Any]:
    hooks, runtime = hooks_of(tree)
    targets = [*hooks, *runtime, *extra]
    with scratch("hook-cpu") as work:
        out = work / "table.json"
        path = [str(BENCH)] + ([str(Path(tree).resolve())] if tree else [])
        env = {"PYTHONPATH": os.pathsep.join(path), "HOOK_CPU_TARGETS": ",".join(targets), "HOOK_CPU_OUT": str(out)}
        if gc_threshold is not None:
            env["HOOK_CPU_GC_THRESHOLD"] = str(gc_threshold)
        with Role("upstream") as upstream, \
                TimedGovernor(write_passport(work / "passport.json"), work / "governor", env=env) as governor, \
                Role("load") as load:
            def segment(seconds: float, warmup: float) -> dict[str, Any]:
                answer = load.ask({
                    "op": "segment", "url": upstream_url(upstream.port), "proxy": f"{HOST}:{governor.port}",
                    "ca_file": str(work / "governor" / CA_FILE), "concurrency": concurrency,
                    "body": chat_body(stream=kind == "stream", chunks=STREAM_CHUNKS, gap_ms=0),
                    "duration": seconds, "warmup": warmup, "watch_pid": governor.pid,
                    "stream_chunks": STREAM_CHUNKS if kind == "stream" else None,
                })
                if not answer["count"] or set(answer["statuses"]) != {"200"}:
                    raise RuntimeError(f"the governor answered {answer['statuses']}")
                return answer

            segment(warmup, 0.3)  # warm-up: sessions opened, caches and the pricing memo filled
            os.kill(governor.pid, signal.SIGUSR1)
            time.sleep(0.2)  # the handler runs on the governor's next bytecode
            before = thread_cpu(governor.pid)
            measured = segment(duration, 0.0)  # every request it answers is in the table
            after = thread_cpu(governor.pid)
            os.kill(governor.pid, signal.SIGUSR2)
            deadline = time.monotonic() + 10
            while not out.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("governor run did not write its table")
                time.sleep(0.05)
            timed = json.loads(out.read_text())
    requests = measured["count"]
    main_thread = governor.pid
    threads = {("main" if tid == main_thread else f"thread {tid}"): (after[tid] - before.get(tid, 0.0)) / requests * 1e6
               for tid in after if after[tid] - before.get(tid, 0.0) > 0}
    rows = {}
    for target in [*targets, *GC]:
        seconds, calls = timed[target]["seconds"], timed[target]["calls"]
        rows[target] = {"calls_per_request": round(calls / requests, 2),
                        "us_per_request": round(seconds / requests * 1e6, 1),
                        "us_per_call": round(seconds / calls * 1e6, 2) if calls else None}
        if target in GC:
            rows[target]["collected_per_request"] = round(timed[target]["collected"] / requests, 1)
    return {
        "benchmark": "the governor's hooks and runtime calls, timed inside governor run under load",
        "machine": machine(), "kind": kind, "concurrency": concurrency, "duration": duration, "tree": tree,
        "gc_threshold": gc_threshold,
        "requests": requests,
        "process_cpu_us_per_request": round(measured["cpu_seconds"] / requests * 1e6, 1),
        "threads_us_per_request": {k: round(v, 1) for k, v in threads.items()},
        "timed": rows,
        "hooks": list(hooks), "runtime_calls": list(runtime),
        "hooks_us_per_request": round(sum(rows[t]["us_per_request"] for t in hooks), 1),
    }


def report(result: dict[str, Any]) -> str:
    rows = []
    for target, r in result["timed"].items():
        if target in GC:
            name = f"garbage collection, generation {target[-1]}"
        else:
            name = target.partition(":")[2] + ("  (inside the hooks)" if target in result["runtime_calls"] else "")
        rows.append([name, r["calls_per_request"], r["us_per_call"], r["us_per_request"]])
    threads = ", ".join(f"{k} {v}" for k, v in result["threads_us_per_request"].items())
    garbage = sum(result["timed"][g].get("collected_per_request", 0) for g in GC)
    return "\n".join([
        f"{result['kind']} c{result['concurrency']}, {result['requests']:,} requests in {result['duration']:g} s"
        + (f", tree {result['tree']}" if result["tree"] else "")
        + (f", gc threshold {result['gc_threshold']}" if result.get("gc_threshold") else ""),
        table(rows, ["function", "calls per request", "us per call", "us per request"]),
        f"the hooks: {result['hooks_us_per_request']} us per request, of the process's "
        f"{result['process_cpu_us_per_request']} (by thread: {threads})",
        f"garbage collection freed {garbage:g} objects in reference cycles per request",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("plain", "stream"), default="plain")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds (default 8)")
    parser.add_argument("--tree", help="a source tree holding the governor package to time (default: this one)")
    parser.add_argument("--time", action="append", default=[], metavar="MODULE:QUALNAME",
                        help="another function to time, e.g. governor.runtime.local_steps:LocalSteps.admit")
    parser.add_argument("--gc-threshold", type=int, metavar="N",
                        help="run with the youngest GC generation's threshold at N (Python's default: 700)")
    args = parser.parse_args()
    if args.concurrency < 1 or args.duration <= 0:
        parser.error("--concurrency must be at least 1 and --duration positive")
    if args.gc_threshold is not None and args.gc_threshold < 1:
        parser.error("--gc-threshold must be at least 1")
    result = run(args.kind, args.concurrency, args.duration, args.tree, args.time, args.gc_threshold)
    print(report(result))
    print(f"wrote {write_result('hook_cpu.json', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
