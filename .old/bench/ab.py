"""Two revisions of the governor side by side, in the process: is a change visible there?

    .venv/bin/python bench/ab.py --a REV --b REV [--workloads plain-c1,stream-c1] [--rounds 8] [--duration 2]

REV is a git revision of this repository (checked out to a scratch worktree) or a path to
a source tree holding a `governor` package (e.g. `.`, the working tree as it is). One mock
upstream, one load generator, one bare mitmproxy and two `governor run` processes, one
per revision (PYTHONPATH points each at its tree; everything else, the venv included, is
shared). Each round measures each workload on A and B in adjacent segments, A B B A (then
B A A B), so both meet the same neighbours' load and neither always goes first, and on the
bare proxy once, before or after them. The figure is CPU time per request, the proxy
process's own utime + stime, as in the overhead benchmark; each round gives the ratios
A/bare, B/bare and B/A, and the report gives their median and spread over the rounds.

Why: the overhead benchmark compares a governor with a bare proxy, and its ratios move
by about 0.1 between runs with the neighbours' load. A change to the governor is judged
by B/A, measured in one run, round by round.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    CA_FILE,
    HOST,
    REPO,
    Governor,
    Role,
    chat_body,
    machine,
    ratio,
    scratch,
    table,
    upstream_url,
    write_passport,
    write_result,
)
from overhead import STREAM_CHUNKS, WORKLOADS, workload_key  # noqa: E402

ALL_WORKLOADS = {workload_key(*w): w for w in WORKLOADS}  # key -> (tls, kind, concurrency), as overhead runs them


@contextlib.contextmanager
def source_tree(rev: str, work: Path, name: str) -> Iterator[Path]:
    """A tree holding the revision's `governor` package: a path as it is, or a git worktree."""
    path = Path(rev)
    if (path / "governor" / "__init__.py").exists():
        yield path.resolve()
        return
    tree = work / name
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), rev], cwd=REPO, check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)


def governor_from(tree: Path, passport: Path, data_dir: Path, upstream_ca: str) -> Governor:
    """`governor run` importing the governor package from `tree` (PYTHONPATH comes before the
    venv's editable install, which only appends its finder)."""
    return Governor(passport, data_dir, extra=["--upstream-ca", upstream_ca], env={"PYTHONPATH": str(tree)})


def run(a: str, b: str, workloads: list[str], rounds: int, duration: float, log=print) -> dict[str, Any]:
    cpu: dict[tuple[str, str], list[float]] = {}
    with scratch("ab") as work, contextlib.ExitStack() as stack:
        trees = {"A": stack.enter_context(source_tree(a, work, "tree-a")),
                 "B": stack.enter_context(source_tree(b, work, "tree-b"))}
        upstream = stack.enter_context(Role("upstream"))
        tls_upstream = stack.enter_context(Role("upstream", "--tls-dir", str(work / "upstream-tls")))
        ca = tls_upstream.info["ca_file"]
        bare = stack.enter_context(Role("bare", "--data-dir", str(work / "bare"), "--upstream-ca", ca))
        passport = write_passport(work / "passport.json")
        proxies = {"bare": (bare, work / "bare")}
        for name, tree in trees.items():
            data_dir = work / f"governor-{name}"
            proxies[name] = (stack.enter_context(governor_from(tree, passport, data_dir, ca)), data_dir)
        load = stack.enter_context(Role("load"))
        urls = {False: upstream_url(upstream.port), True: upstream_url(tls_upstream.port, tls=True)}
        bodies = {"plain": chat_body(), "stream": chat_body(stream=True, chunks=STREAM_CHUNKS, gap_ms=0)}
        for round_no in range(rounds):
            # A and B in adjacent segments, A B B A (B A A B next round), so that both meet
            # the same neighbours' load; the bare proxy first or last, alternately
            pair = ["A", "B", "B", "A"] if round_no % 2 == 0 else ["B", "A", "A", "B"]
            order = ["bare", *pair] if round_no % 4 < 2 else [*pair, "bare"]
            log(f"  round {round_no + 1}/{rounds}: {' '.join(order)}")
            for key in workloads:
                tls, kind, concurrency = ALL_WORKLOADS[key]
                for name in order:
                    proxy, data_dir = proxies[name]
                    segment = load.ask({
                        "op": "segment", "url": urls[tls], "proxy": f"{HOST}:{proxy.port}",
                        "ca_file": str(data_dir / CA_FILE), "body": bodies[kind], "concurrency": concurrency,
                        "duration": duration, "warmup": 0.3, "watch_pid": proxy.pid,
                        "stream_chunks": STREAM_CHUNKS if kind == "stream" else None,
                    })
                    if segment["cpu_seconds"] is None or not segment["count"]:
                        raise RuntimeError(f"{name} {key}: no CPU reading or no request answered")
                    if set(segment["statuses"]) != {"200"}:
                        raise RuntimeError(f"{name} {key}: answers other than 200: {segment['statuses']}")
                    spent = cpu.setdefault((key, name, round_no), [0.0, 0])
                    spent[0] += segment["cpu_seconds"]
                    spent[1] += segment["count"]
    results: dict[str, Any] = {}
    for key in workloads:
        # CPU per request of each proxy in each round (A and B: over their two segments)
        per = {name: [cpu[(key, name, r)][0] / cpu[(key, name, r)][1] * 1e6 for r in range(rounds)]
               for name in ("bare", "A", "B")}
        ratios = {label: [ratio(x, y) for x, y in zip(per[num], per[den])]
                  for label, num, den in (("A/bare", "A", "bare"), ("B/bare", "B", "bare"), ("B/A", "B", "A"))}
        results[key] = {
            "cpu_us_per_request": {n: round(statistics.median(v), 1) for n, v in per.items()},
            "ratios": {label: {"median": round(statistics.median(v), 3), "min": min(v), "max": max(v)}
                       for label, v in ratios.items()},
        }
    return {"benchmark": "two governor revisions side by side (CPU per request)", "machine": machine(),
            "a": a, "b": b, "rounds": rounds, "segment_seconds": duration, "workloads": results}


def report(result: dict[str, Any]) -> str:
    rows = []
    for key, r in result["workloads"].items():
        us, q = r["cpu_us_per_request"], r["ratios"]
        rows.append([key, us["bare"], us["A"], us["B"],
                     *(f"{q[x]['median']} ({q[x]['min']}-{q[x]['max']})" for x in ("A/bare", "B/bare", "B/A"))])
    head = ["workload", "bare us", "A us", "B us", "A/bare", "B/bare", "B/A"]
    return (f"A = {result['a']}, B = {result['b']}; medians over {result['rounds']} rounds (min-max)\n"
            + table(rows, head))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="revision or source tree (the baseline)")
    parser.add_argument("--b", default=".", help="revision or source tree (default: the working tree)")
    parser.add_argument("--workloads", default="plain-c1,plain-c16,stream-c1,stream-c16",
                        help=f"comma-separated, of {', '.join(ALL_WORKLOADS)}")
    parser.add_argument("--rounds", type=int, default=8, help="rounds (default 8; a multiple of 4 balances the order)")
    parser.add_argument("--duration", type=float, default=1.0, help="measured seconds per segment (default 1)")
    args = parser.parse_args()
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in ALL_WORKLOADS]
    if unknown or not workloads:
        parser.error(f"unknown workload(s) {unknown}; choose from {', '.join(ALL_WORKLOADS)}")
    result = run(args.a, args.b, workloads, args.rounds, args.duration)
    print(report(result))
    print(f"wrote {write_result('ab.json', result)}")


if __name__ == "__main__":
    main()
