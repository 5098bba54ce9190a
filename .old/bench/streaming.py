"""Streaming through each path: time to first token and the gaps between chunks.

    .venv/bin/python bench/streaming.py [--quick] [--streams N] [--rounds N]

The mock upstream streams a chat completion of 200 content chunks spaced 5 ms apart
(an absolute schedule, so its own gaps do not drift), then the finish, usage and
[DONE] events. Streams run one at a time (concurrency 1, a kept-alive connection
warmed by one short stream), directly, through a bare mitmproxy that relays event
streams, and through the governor (which also watches each event: usage, tool calls).
Paths alternate order between rounds (A B C, C B A).

TTFT: request written -> first event received. Gaps: between consecutive content
events as received; the direct path's gaps are the upstream's own. Targets: the
governor adds at most 1 ms to TTFT at p50 over the bare proxy, and its gaps match the
upstream's (p50 within 1 ms of the direct path's). Writes bench/results/streaming.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HOST,
    scratch,
    Governor,
    Role,
    chat_body,
    machine,
    summarize,
    table,
    upstream_url,
    write_passport,
    write_result,
)

PATHS = ("direct", "bare", "governor")
TTFT_TARGET_MS = 1.0  # governor p50 TTFT minus bare p50 TTFT, at most
GAP_TOLERANCE_MS = 1.0  # governor gap p50 minus direct gap p50, at most


def run(rounds: int = 2, streams: int = 8, chunks: int = 200, gap_ms: float = 5.0, log=print) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {p: {"ttft": [], "gaps": [], "total": []} for p in PATHS}
    statuses: dict[str, dict[str, int]] = {p: {} for p in PATHS}
    with (
        scratch("streaming") as work,
        Role("upstream") as upstream,
        Role("bare", "--data-dir", str(work / "bare")) as bare,
        Governor(write_passport(work / "passport.json"), work / "governor") as governor,
        Role("load") as load,
    ):
        via = {"direct": None, "bare": f"{HOST}:{bare.port}", "governor": f"{HOST}:{governor.port}"}
        url = upstream_url(upstream.port)
        body = chat_body(stream=True, chunks=chunks, gap_ms=gap_ms)
        warm = chat_body(stream=True, chunks=2, gap_ms=0)
        for round_no in range(rounds):
            order = PATHS if round_no % 2 == 0 else PATHS[::-1]
            log(f"  round {round_no + 1}/{rounds}: {' -> '.join(order)}")
            for path in order:
                segment = load.ask({"op": "segment", "url": url, "proxy": via[path], "body": body,
                                    "warmup_body": warm, "warmup": 0, "concurrency": 1, "requests": streams,
                                    "stream_chunks": chunks})
                samples[path]["ttft"] += segment["ttft_ms"]
                samples[path]["gaps"] += segment["gaps_ms"]
                samples[path]["total"] += segment["latencies_ms"]
                for status, n in segment["statuses"].items():
                    statuses[path][status] = statuses[path].get(status, 0) + n
    paths = {p: {"ttft_ms": summarize(s["ttft"]), "gap_ms": summarize(s["gaps"]),
                 "stream_ms": summarize(s["total"]), "statuses": statuses[p]} for p, s in samples.items()}
    gov, bare, direct = paths["governor"], paths["bare"], paths["direct"]
    ttft_added = _minus(gov["ttft_ms"]["p50"], bare["ttft_ms"]["p50"])
    gap_added = _minus(gov["gap_ms"]["p50"], direct["gap_ms"]["p50"])
    gap_p99_added = _minus(gov["gap_ms"]["p99"], direct["gap_ms"]["p99"])
    return {
        "benchmark": f"streaming: {chunks} chunks {gap_ms:g} ms apart, concurrency 1",
        "machine": machine(),
        "rounds": rounds,
        "streams_per_path": rounds * streams,
        "chunks": chunks,
        "upstream_gap_ms": gap_ms,
        "paths": paths,
        "ttft_p50_added_over_bare_ms": ttft_added,
        "ttft_p50_added_over_direct_ms": _minus(gov["ttft_ms"]["p50"], direct["ttft_ms"]["p50"]),
        "gap_p50_added_over_direct_ms": gap_added,
        "gap_p99_added_over_direct_ms": gap_p99_added,
        "targets": {"ttft_p50_added_over_bare_ms": TTFT_TARGET_MS, "gap_p50_added_over_direct_ms": GAP_TOLERANCE_MS},
        "verdicts": {
            "ttft_p50_added_over_bare_ms": "n/a" if ttft_added is None else "PASS" if ttft_added <= TTFT_TARGET_MS else "MISS",
            "gap_p50_added_over_direct_ms": "n/a" if gap_added is None else "PASS" if gap_added <= GAP_TOLERANCE_MS else "MISS",
        },
    }


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.3f}"


def report(result: dict[str, Any]) -> str:
    rows = []
    for path in PATHS:
        p = result["paths"][path]
        rows.append([path, p["ttft_ms"]["p50"], p["ttft_ms"]["p99"], p["gap_ms"]["p50"], p["gap_ms"]["p99"],
                     p["gap_ms"]["max"], p["stream_ms"]["p50"], p["ttft_ms"]["n"]])
    out = [table(rows, ["path", "TTFT p50 ms", "TTFT p99 ms", "gap p50 ms", "gap p99 ms", "gap max ms",
                        "stream p50 ms", "streams"])]
    v = result["verdicts"]
    out.append(f"governor TTFT p50 over bare: {_signed(result['ttft_p50_added_over_bare_ms'])} ms (target <= "
               f"{TTFT_TARGET_MS} ms) {v['ttft_p50_added_over_bare_ms']}; gap p50 over the upstream's: "
               f"{_signed(result['gap_p50_added_over_direct_ms'])} ms, p99 "
               f"{_signed(result['gap_p99_added_over_direct_ms'])} ms {v['gap_p50_added_over_direct_ms']}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 streams per path per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, help="streams per path per round (default 8, quick 3)")
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--gap-ms", type=float, default=5.0)
    args = parser.parse_args()
    result = run(rounds=args.rounds, streams=args.streams or (3 if args.quick else 8), chunks=args.chunks,
                 gap_ms=args.gap_ms)
    print(report(result))
    print(f"wrote {write_result('streaming.json', result)}")


if __name__ == "__main__":
    main()
