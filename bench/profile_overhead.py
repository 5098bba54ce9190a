"""Where a governed request's CPU goes: py-spy samples of the bare proxy and the governor
under the same load, turned into microseconds per request.

    .ci/dev profile [--kind plain|stream] [--concurrency 16] [--duration 12] [--rounds 4] [--rate 100]
    (= .venv/bin/python bench/profile_overhead.py ...; needs py-spy, which `.ci/dev profile`
    installs, and permission to attach to a process: root, or ptrace allowed)

One upstream and one load generator; the bare proxy and `governor run` (the overhead
benchmark's, tier R3) take turns under load (A B B A ...) while py-spy samples both. Each
path's CPU time per request comes from the process's own accounting, per thread. The
event loop thread's samples split its time by where they were taken:

  governor code    a frame of the governor package is on the stack (its hooks, adapters,
                   runtime, policy engine, store), with a line per module and the
                   functions that take the most
  mitmproxy        everything else under mitmproxy's connection handlers and hooks
  event loop       asyncio and socket work outside mitmproxy's frames
  other            the rest of the Python frames
  no Python frame  samples py-spy took with no Python frame on the thread (native code
                   outside any Python function, or a sample torn by --nonblocking)

Other threads (the write-behind store's flusher, worker threads) are one row, their CPU
time as the kernel counted it: py-spy also samples a thread while it waits for the GIL,
so its samples would overstate them.

py-spy stops a proxy for each sample, so that every stack is whole (with --nonblocking
it reads a running process: cheaper for it, but many stacks come out cut short, and a
cut stack counts where its innermost frames are, mostly against mitmproxy). Stopping
costs the sampled process CPU time, more at higher rates: the totals here run above the
overhead benchmark's; read the split, not the totals.

Garbage collection shows up inside whichever frame allocated when it ran. The
difference between the two paths' columns is what governing costs, part by part.
Writes bench/results/profile.json and the raw stacks (profile-bare.txt,
profile-governor.txt) beside it. Samples are statistical: the report says how many
microseconds one sample stands for, and a row of n samples moves by about sqrt(n) of them
between runs; sample longer (--duration) for finer rows.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HOST,
    PYTHON,
    RESULTS,
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

# py-spy raw output: one line per distinct stack, "frame;frame;...;frame COUNT", root
# first, each frame "function (path/to/file.py:LINE)" with paths relative to sys.path
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_ENTRY_POINTS = ("governor/cli/__init__.py", "governor/cli/run.py", "governor/__main__.py")
CATEGORIES = ("governor code", "mitmproxy", "event loop", "other", "no Python frame")
_THREAD = re.compile(r"^thread \((?P<tid>\d+)\)")

def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(PYTHON).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: `.ci/dev profile` installs it "
                         "(or: .venv/bin/python -m pip install py-spy)")
    return found


def parse_stacks(lines: Iterable[str], thread: int | None = None) -> list[tuple[list[tuple[str, str]], int]]:
    """py-spy raw lines -> [(frames as (function, file), root first), samples]; with
    `thread`, only that thread's stacks (recorded with --threads)."""
    stacks = []
    for line in lines:
        line = line.rstrip("\n")
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        texts = stack.split(";")
        match = _THREAD.match(texts[0])
        if match:
            texts = texts[1:]
            if thread is not None and int(match["tid"]) != thread:
                continue
        frames = []
        for text in texts:
            match = _FRAME.match(text)
            frames.append((match["function"], match["file"]) if match else (text, ""))
        stacks.append((frames, int(count)))
    return stacks


def _governor_frame(file: str) -> bool:
    """A frame of the governor package's own code (not its command-line entry points,
    which are at the root of every stack of `governor run`)."""
    return file.startswith("governor/") and file not in _ENTRY_POINTS


def categorize(frames: list[tuple[str, str]]) -> str:
    if not frames:
        return "no Python frame"
    if any(_governor_frame(file) for _, file in frames):
        return "governor code"
    if any(file.startswith("mitmproxy/") for _, file in frames):
        return "mitmproxy"
    if any(file.startswith(("asyncio/", "selectors")) for _, file in frames):
        return "event loop"
    return "other"


def breakdown(stacks: list[tuple[list[tuple[str, str]], int]], cpu_us_per_request: float,
              other_threads_us: float = 0.0, top: int = 15) -> dict[str, Any]:
    """The path's CPU per request: the sampled thread's (`cpu_us_per_request` of it) split by
    category, governor module and governor function (inclusive: a function's time includes
    what it calls), and the other threads' as one figure."""
    total = sum(count for _, count in stacks) or 1
    scale = cpu_us_per_request / total  # microseconds per request that one sample stands for
    by_category: collections.Counter[str] = collections.Counter()
    by_module: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    elsewhere: collections.Counter[str] = collections.Counter()  # the rest, by function (its own time)
    for frames, count in stacks:
        category = categorize(frames)
        by_category[category] += count
        if category != "governor code":
            if frames:
                function, file = frames[-1]
                elsewhere[f"{function} ({file})"] += count
            continue
        own = [(function, file) for function, file in frames if _governor_frame(file)]
        by_module[own[-1][1].removesuffix(".py")] += count  # the innermost governor frame
        for name in {f"{function} ({file})" for function, file in own}:
            by_function[name] += count
    us = lambda n: round(n * scale, 1)  # noqa: E731
    return {
        "samples": total,
        "us_per_sample": round(scale, 2),  # the resolution of every row below
        "cpu_us_per_request": round(cpu_us_per_request + other_threads_us, 1),
        "categories": {**{c: us(by_category[c]) for c in CATEGORIES}, "other threads": round(other_threads_us, 1)},
        "governor_modules": {m: us(n) for m, n in by_module.most_common()},
        "governor_functions": {f: us(n) for f, n in by_function.most_common(top)},
        "other_functions": {f: us(n) for f, n in elsewhere.most_common(200)},
    }


def _is_idle(frames: list[tuple[str, str]]) -> bool:
    """A sample of the event loop in epoll: py-spy takes such samples from a proxy waiting
    while the other path is loaded, which are no request's CPU time. The loop's own epoll
    calls under load go with them (a few percent of a path's samples, in both paths alike):
    the rest of the split is scaled to the whole CPU time."""
    return bool(frames) and frames[-1][1].startswith("selectors")


def profile(paths: dict[str, Role], upstream: Role, load: Role, args: argparse.Namespace) -> dict[str, Any]:
    """Sample every path while the paths take turns under load (A B B A ...), as the
    overhead benchmark alternates them, so that both see the same machine."""
    stream = args.kind == "stream"
    body = chat_body(stream=True, chunks=20, gap_ms=0) if stream else chat_body()

    def segment(proxy: Role, duration: float) -> dict[str, Any]:
        result = load.ask({"op": "segment", "url": upstream_url(upstream.port), "proxy": f"{HOST}:{proxy.port}",
                           "body": body, "concurrency": args.concurrency, "duration": duration, "warmup": 0.3,
                           "watch_pid": proxy.pid, "stream_chunks": 20 if stream else None})
        failed = {status: n for status, n in result["statuses"].items() if status != "200"}
        if failed:
            raise SystemExit(f"a proxy answered {failed} under load: not a profile of governed requests")
        return result

    for proxy in paths.values():
        segment(proxy, 1.0)  # warm both up before sampling
    spies = {}
    for name, proxy in paths.items():
        (RESULTS / f"profile-{name}.txt").unlink(missing_ok=True)  # never read a previous run's stacks
        spies[name] = subprocess.Popen(
            [py_spy(), "record", "--pid", str(proxy.pid), "--rate", str(args.rate), "--format", "raw",
             "--output", str(RESULTS / f"profile-{name}.txt"), "--threads",
             *(["--nonblocking"] if args.nonblocking else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # attached before the first measured segment
    for name, spy in spies.items():
        if spy.poll() is not None:  # py-spy could not attach: say so now, not after the rounds
            _, errors = spy.communicate()
            for other in spies.values():
                if other.poll() is None:
                    other.kill()
            raise SystemExit(f"py-spy could not sample the {name} proxy (exit {spy.returncode}): "
                             f"{errors.strip()[-500:]}\n(attaching needs root or ptrace permission)")
    totals = {name: {"count": 0, "cpu": 0.0, "main": 0.0, "all": 0.0} for name in paths}
    try:
        for round_no in range(args.rounds):
            order = list(paths) if round_no % 2 == 0 else list(paths)[::-1]
            for name in order:
                proxy = paths[name]
                before = thread_cpu(proxy.pid)
                result = segment(proxy, args.duration / args.rounds)
                after = thread_cpu(proxy.pid)
                spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
                total = totals[name]
                total["count"] += result["count"]
                total["cpu"] += result["cpu_seconds"]
                total["main"] += spent.get(proxy.pid, 0.0)
                total["all"] += sum(spent.values())
    finally:
        for spy in spies.values():
            if spy.poll() is None:
                spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
    out = {}
    for name, spy in spies.items():
        _, errors = spy.communicate(timeout=60)
        raw = RESULTS / f"profile-{name}.txt"
        if not raw.exists() or raw.stat().st_size == 0:
            raise SystemExit(f"py-spy could not sample the {name} proxy (exit {spy.returncode}): "
                             f"{errors.strip()[-500:]}\n(attaching needs root or ptrace permission)")
        total = totals[name]
        if not total["count"]:
            raise SystemExit(f"the {name} proxy completed no request while it was sampled")
        # the load generator's figure covers exactly the measured requests; /proc, read
        # around each segment, says which share of it the event loop's thread took
        cpu_us = total["cpu"] / total["count"] * 1e6
        main_share = total["main"] / (total["all"] or 1.0)
        with raw.open() as lines:
            stacks = [(frames, n) for frames, n in parse_stacks(lines, thread=paths[name].pid)
                      if not _is_idle(frames)]
        out[name] = {"requests": total["count"], **breakdown(stacks, cpu_us * main_share, cpu_us * (1 - main_share))}
    return out


def report(paths: dict[str, dict[str, Any]]) -> str:
    bare, gov = paths["bare"], paths["governor"]
    rows = [["CPU per request (process accounting)", bare["cpu_us_per_request"], gov["cpu_us_per_request"],
             round(gov["cpu_us_per_request"] - bare["cpu_us_per_request"], 1)]]
    for category in (*CATEGORIES, "other threads"):
        b, g = bare["categories"][category], gov["categories"][category]
        rows.append([f"  {category}", b, g, round(g - b, 1)])
    out = [f"event-loop samples: bare {bare['samples']}, governor {gov['samples']}; one sample stands for "
           f"{bare['us_per_sample']} and {gov['us_per_sample']} us per request (a row's resolution: "
           f"a row of n samples moves by about sqrt(n) samples between runs)", "",
           table(rows, ["us per request", "bare", "governor", "governor - bare"]), "",
           "governor code by module (innermost governor frame):"]
    out.append(table([[m, v] for m, v in gov["governor_modules"].items()], ["module", "us per request"]))
    out += ["", "governor functions (inclusive):"]
    out.append(table([[f, v] for f, v in gov["governor_functions"].items()], ["function", "us per request"]))
    # outside the governor's frames: the same code (mitmproxy, asyncio) taking longer in the
    # governor's process than in the bare one
    grown = sorted(gov["other_functions"], key=lambda f: bare["other_functions"].get(f, 0.0) - gov["other_functions"][f])
    out += ["", "outside governor code, most grown (own time, not what it calls):"]
    out.append(table([[f, bare["other_functions"].get(f, 0.0), gov["other_functions"][f],
                       round(gov["other_functions"][f] - bare["other_functions"].get(f, 0.0), 1)] for f in grown[:12]],
                     ["function", "bare", "governor", "governor - bare"]))
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("plain", "stream"), default="plain")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=12.0, help="measured seconds per path (default 12)")
    parser.add_argument("--rounds", type=int, default=4, help="turns per path (default 4)")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second (default 100)")
    parser.add_argument("--nonblocking", action="store_true",
                        help="sample without stopping the proxies (cheaper for them, but stacks can be cut short)")
    args = parser.parse_args()
    if args.concurrency < 1 or args.rounds < 1 or args.rate < 1 or not args.duration > 0:
        parser.error("--concurrency, --rounds and --rate must be at least 1, --duration above 0")
    py_spy()
    RESULTS.mkdir(parents=True, exist_ok=True)
    with scratch("profile") as work, Role("upstream") as upstream, Role("load") as load, \
            Role("bare", "--data-dir", str(work / "bare")) as bare, \
            Governor(write_passport(work / "passport.json"), work / "governor") as governor:
        paths = profile({"bare": bare, "governor": governor}, upstream, load, args)
    print(f"profile: {args.kind}, concurrency {args.concurrency}, {args.duration:g} s per path in "
          f"{args.rounds} turns, {args.rate} samples/s{', nonblocking' if args.nonblocking else ''}\n")
    print(report(paths))
    write_result("profile.json", {"machine": machine(), "kind": args.kind, "concurrency": args.concurrency,
                                  "duration": args.duration, "rounds": args.rounds, "rate": args.rate,
                                  "nonblocking": args.nonblocking,
                                  "paths": paths})
    return 0


if __name__ == "__main__":
    sys.exit(main())
