"""Transparency-log benchmark (docs/transparency-log.md): what anchoring costs.

    .venv/bin/python bench/bench_tlog.py [--entries 100000] [--ends 300] [--dir DIR]

Measures
  * opening a log of --entries entries (reading `entries`, rebuilding the tree, writing
    every tile and bundle: what a start after a kill costs),
  * inclusion proof generation (a C2SP tlog-proof of a random entry at the latest
    checkpoint) and its offline verification (checkpoint signature + inclusion proof +
    the entry against its record), per proof; target: both under 5 ms,
  * what logging adds to ending a session: the final record written as today
    (temp file, fsync, rename, directory fsync) against the same through the log
    (pending file, entry appended + fsync, rename), p50 and p99 of --ends ends on the
    disk of --dir,
  * tiles served per second by the control plane's /log/tile/ route (aiohttp, loopback,
    8 concurrent clients, random full tiles of the 100,000-entry log).
Prints a table and writes bench/results/tlog.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from common import table, write_result  # noqa: E402
from governor.common.canonical import canonicalize  # noqa: E402
from governor.evidence.logproof import verify_logged_record  # noqa: E402
from governor.evidence.record import write_record  # noqa: E402
from governor.evidence.translog import TransparencyLog, entry_statement  # noqa: E402
from governor.evidence.tlog.note import parse_vkey  # noqa: E402

ORIGIN = "bench.example/governor/log"
PROOF_TARGET_MS = 5.0


def record(i: int, events: int = 20) -> dict:
    """A final record's shape: the header, `events` events, a signature (not checked here)."""
    return {
        "adl_enforcement_record": "1.0", "governor": "did:web:localhost:governor",
        "subject": {"id": "https://agents.example/bench", "passport_digest": f"digest-{i % 7}"},
        "session": f"bench-{i}", "tier": "R2",
        "window": {"start": "2026-11-27T10:00:00.000Z", "end": "2026-11-27T10:05:00.000Z"},
        "iat": "2026-11-27T10:05:00.000Z",
        "events": [{"seq": n, "cause": "on_budget_exhausted", "action": "continue", "at": "2026-11-27T10:01:00.000Z",
                    "prev_hash": "x" * 43, "detail": {"observed": n, "limit": 100}} for n in range(events)],
        "outcome": "completed", "signature": {"algorithm": "Ed25519", "value": "s" * 86, "signed_content": "canonical"},
    }


def seed_entries(log_dir: Path, count: int) -> list[dict]:
    """Writes `count` entries as the log would have appended them; returns their records."""
    log_dir.mkdir(parents=True, exist_ok=True)
    records, last, lines = [], {}, []
    import hashlib

    for i in range(count):
        rec = record(i, events=1)
        digest = rec["subject"]["passport_digest"]
        seq, prev = (0, None) if digest not in last else (last[digest][0] + 1, last[digest][1])
        entry = canonicalize(entry_statement(rec, seq, prev))
        last[digest] = (seq, hashlib.sha256(entry).hexdigest())
        lines.append(entry)
        records.append(rec)
    (log_dir / "entries").write_bytes(b"\n".join(lines) + b"\n")
    return records


async def tiles_per_second(log: TransparencyLog, requests: int = 2000, clients: int = 8) -> float:
    import aiohttp
    from aiohttp import web

    from governor.control.app import create_app
    from governor.control.context import ControlContext
    from governor.evidence.tlog.tiles import tiles_for_size

    class LogOnly:  # the control plane's log routes need only the runtime's log
        transparency_log = log
        session_book = None

    app = create_app(ControlContext.build(LogOnly()))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    paths = ["/log/" + t.path() for t in tiles_for_size(log.size) if not t.partial]
    rng = random.Random(7)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            async def client(n: int) -> None:
                for _ in range(n):
                    async with http.get(rng.choice(paths)) as answer:
                        assert answer.status == 200
                        await answer.read()

            began = time.perf_counter()
            await asyncio.gather(*(client(requests // clients) for _ in range(clients)))
            return (requests // clients * clients) / (time.perf_counter() - began)
    finally:
        await runner.cleanup()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--ends", type=int, default=300)
    parser.add_argument("--proofs", type=int, default=500)
    parser.add_argument("--dir", default=None, help="where the log and records are written (its disk is measured)")
    args = parser.parse_args()
    key = Ed25519PrivateKey.generate()
    results: dict = {"entries": args.entries}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        data = Path(tmp) / "big"
        records = seed_entries(data / "log", args.entries)
        began = time.perf_counter()
        log = TransparencyLog(data, key, ORIGIN)
        results["open_seconds"] = time.perf_counter() - began
        vkey = parse_vkey(log.signer.vkey())
        rng = random.Random(31)
        picks = [rng.randrange(args.entries) for _ in range(args.proofs)]
        generate, verify = [], []
        for i in picks:
            t0 = time.perf_counter()
            proof = log.prove(records[i])
            t1 = time.perf_counter()
            verify_logged_record(records[i], proof, vkey)
            t2 = time.perf_counter()
            generate.append((t1 - t0) * 1000)
            verify.append((t2 - t1) * 1000)
        results["proof_generation_ms"] = {"p50": statistics.median(generate), "p99": percentile(generate, 0.99)}
        results["proof_verification_ms"] = {"p50": statistics.median(verify), "p99": percentile(verify, 0.99)}
        results["tiles_per_second"] = asyncio.run(tiles_per_second(log))

        # ending a session: the final record written as today, and through the log
        plain_dir, logged_dir = Path(tmp) / "plain", Path(tmp) / "logged"
        small = TransparencyLog(logged_dir, key, ORIGIN)
        plain, logged = [], []
        for i in range(args.ends):
            rec = record(i)
            t0 = time.perf_counter()
            write_record(plain_dir / "records" / f"s{i}.json", rec)
            t1 = time.perf_counter()
            small.write_record(logged_dir / "records" / f"s{i}.json", rec)
            t2 = time.perf_counter()
            plain.append((t1 - t0) * 1000)
            logged.append((t2 - t1) * 1000)
        results["end_plain_ms"] = {"p50": statistics.median(plain), "p99": percentile(plain, 0.99)}
        results["end_logged_ms"] = {"p50": statistics.median(logged), "p99": percentile(logged, 0.99)}
        results["end_added_ms"] = {q: results["end_logged_ms"][q] - results["end_plain_ms"][q] for q in ("p50", "p99")}
    rows = [
        (f"open a log of {args.entries} entries (rebuild tree, write tiles)", f"{results['open_seconds']:.2f} s", ""),
        ("inclusion proof generation (tlog-proof)", f"{results['proof_generation_ms']['p50']:.3f} ms",
         f"{results['proof_generation_ms']['p99']:.3f} ms"),
        ("inclusion proof verification (offline)", f"{results['proof_verification_ms']['p50']:.3f} ms",
         f"{results['proof_verification_ms']['p99']:.3f} ms"),
        ("final record written, no log", f"{results['end_plain_ms']['p50']:.3f} ms", f"{results['end_plain_ms']['p99']:.3f} ms"),
        ("final record written through the log", f"{results['end_logged_ms']['p50']:.3f} ms",
         f"{results['end_logged_ms']['p99']:.3f} ms"),
        ("tiles served per second (/log/tile/, 8 clients, loopback)", f"{results['tiles_per_second']:.0f}/s", ""),
        ("added to ending a session", f"{results['end_added_ms']['p50']:.3f} ms", f"{results['end_added_ms']['p99']:.3f} ms"),
    ]
    print(table(rows, ("transparency log", "p50", "p99")))
    # the target is on the median: a p99 on a shared machine measures its neighbours as much
    ok = all(results[k]["p50"] < PROOF_TARGET_MS for k in ("proof_generation_ms", "proof_verification_ms"))
    results["target_met"] = ok
    print(f"target (proof generation and verification under {PROOF_TARGET_MS} ms, p50): {'met' if ok else 'MISSED'}")
    write_result("tlog.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
