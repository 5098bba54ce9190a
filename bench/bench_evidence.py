"""Evidence benchmark: journal appends per second and verification time of a large record.

    .venv/bin/python bench/bench_evidence.py [--events 10000] [--appends 2000] [--dir DATA_DIR]

Measures
  * durable appends (write + fsync before append returns) per second,
  * the same without fsync, for comparison (what the disk's flush costs),
  * building + signing, and verifying (§8.6 steps 1-6), a record of --events events,
    with the verification time split by step family (schema, canonical bytes + chain + signature).
Prints a table and writes bench/results/evidence.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from governor.evidence import Journal, SessionHeader, SessionRecord, generate_key, sign_record, verify_record  # noqa: E402
from governor.evidence.verify import record_validator  # noqa: E402

START = 1_795_000_000.0
CAUSES = [
    ("on_budget_exhausted", "halt", lambda i: {"dimension": "tokens", "scope": "per_session", "observed": 1000 + i, "limit": 1000}),
    ("on_tool_error", "continue", lambda i: {"tool": "search", "message": "upstream 503", "persona": "doc-reviewer"}),
    ("on_governor_oversight_trigger", "pause", lambda i: {"approval": f"ap-{i}", "cost_usd": 0.0125 * (i % 97)}),
    ("on_iteration_limit", "fallback", lambda i: {"observed": i % 13, "limit": 12}),
]


def header() -> SessionHeader:
    return SessionHeader(
        governor="did:web:localhost:governor", subject_id="https://agents.example/agents/bench",
        passport_digest="n4bQgYhMfWWaL-qgxVrQFaO_TxsrC4Is0V1sFbDwCgg", session="bench", tier="R2", start=START,
        limits={"resource_limits": {"budget": {"tokens": {"per_session": 1000}}}},
    )


def event(i: int):
    cause, action, detail = CAUSES[i % len(CAUSES)]
    return cause, action, START + i * 0.01, detail(i)


def appends_per_second(count: int, sync: bool, directory: str | None) -> float:
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        journal = Journal.create(Path(tmp) / "j.jsonl", header(), sync=sync)
        began = time.perf_counter()
        for i in range(count):
            journal.append(*event(i))
        elapsed = time.perf_counter() - began
        journal.close()
    return count / elapsed


def best_of(runs: int, fn):
    times = []
    result = None
    for _ in range(runs):
        began = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - began)
    return min(times), statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--appends", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", help="where to write the journals (fsync cost depends on the disk; default: the temp dir)")
    args = parser.parse_args()

    durable = appends_per_second(args.appends, sync=True, directory=args.dir)
    unsynced = appends_per_second(args.appends * 5, sync=False, directory=args.dir)

    key = generate_key()
    session = SessionRecord(header())
    for i in range(args.events):
        session.add(*event(i))
    record_validator()  # compiled once per process, as in the verifier

    build_best, build_median, record = best_of(
        args.runs, lambda: sign_record(session.build(outcome="halted", end=START + 10**5, iat=START + 10**5, nonce="n"), key)
    )
    # what an auditor does: parse the file, then verify
    text = json.dumps(record)
    public = key.public_key()
    verify_best, verify_median, report = best_of(
        args.runs, lambda: verify_record(json.loads(text), public_key=public, expected_nonce="n")
    )
    assert report.ok, report.summary()
    schema_best, _, _ = best_of(args.runs, lambda: record_validator().is_valid(record))

    results = {
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "appends_per_second_fsync": round(durable, 1),
        "appends_per_second_no_fsync": round(unsynced, 1),
        "events": args.events,
        "record_bytes": len(text.encode()),
        "build_and_sign_seconds": {"best": round(build_best, 4), "median": round(build_median, 4)},
        "verify_seconds": {"best": round(verify_best, 4), "median": round(verify_median, 4)},
        "verify_schema_step_seconds_best": round(schema_best, 4),
        "verify_target_seconds": 1.0,
    }
    rows = [
        ("journal appends/s (write+fsync)", f"{durable:,.0f}"),
        ("journal appends/s (no fsync)", f"{unsynced:,.0f}"),
        (f"build+sign {args.events:,}-event record", f"{build_best * 1000:,.0f} ms (median {build_median * 1000:,.0f})"),
        (f"verify {args.events:,}-event record", f"{verify_best * 1000:,.0f} ms (median {verify_median * 1000:,.0f})"),
        ("  of which schema (step 1)", f"{schema_best * 1000:,.0f} ms"),
        ("record size", f"{len(text.encode()) / 1e6:.1f} MB"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    out = Path(__file__).resolve().parent / "results" / "evidence.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
