"""The benchmark suite's own machinery (bench/): what it makes of its measurements, its
load generator against a real server, and one short run of the overhead benchmark against
the real processes (mock upstreams, a bare mitmproxy, `governor run`).

The numbers themselves are not asserted (targets are reported by the suite, never timed
in tests); what is asserted is that the suite measures what it says it measures: every
request through the governor's path was governed, none of the others were, every stream
arrived whole, and the ratios and verdicts are the ones its measurements give.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import ab  # noqa: E402
import bench_r3  # noqa: E402
import common  # noqa: E402
import hook_cpu  # noqa: E402
import overhead  # noqa: E402
import profile_overhead  # noqa: E402
import run_all  # noqa: E402


# --- what the suite makes of its measurements -------------------------------------------


def test_each_round_measures_the_paths_in_the_order_of_the_round_before_reversed() -> None:
    orders = [overhead.round_order(n) for n in range(4)]
    assert orders[0] == ("direct", "bare", "governor")
    for before, after in zip(orders, orders[1:]):
        assert after == before[::-1]
    # over an even number of rounds, each path runs first (and last) equally often
    assert sorted(order[0] for order in orders) == ["direct", "direct", "governor", "governor"]


def _segments(cpu: dict[str, float], p50: dict[str, float], rps: dict[str, float],
              rounds: int = 2) -> dict[tuple[str, str], list[dict]]:
    """Every workload and path, `rounds` segments each of 100 requests in 1 s with the given
    per-request CPU (ms) and latency."""
    segments: dict[tuple[str, str], list[dict]] = {}
    for tls, kind, concurrency in overhead.WORKLOADS:
        key = overhead.workload_key(tls, kind, concurrency)
        for path in overhead.PATHS:
            count = int(rps[path])
            segments[(key, path)] = [{
                "latencies_ms": [p50[path]] * count, "statuses": {"200": count}, "count": count,
                "elapsed": 1.0, "round": r, "warmup_count": 3, "short_streams": 0,
                "cpu_seconds": None if path == "direct" else cpu[path] * count / 1000,
            } for r in range(rounds)]
    return segments


def test_the_ratios_are_the_governors_figures_over_the_bare_proxys() -> None:
    result = overhead.aggregate(
        _segments(cpu={"bare": 2.0, "governor": 2.4}, p50={"direct": 0.5, "bare": 2.0, "governor": 2.2},
                  rps={"direct": 400, "bare": 200, "governor": 180}),
        {"peak_rss_mb": 90.0}, {"session": "bench", "iterations": 0}, rounds=2, duration=1.0)
    for key, w in result["workloads"].items():
        gov, bare, direct = (w["paths"][p] for p in ("governor", "bare", "direct"))
        assert gov["requests"] == 360 and gov["warmup_requests"] == 6
        assert gov["cpu_ms_per_request"] == 2.4 and bare["cpu_ms_per_request"] == 2.0
        assert direct["cpu_ms_per_request"] is None
        assert gov["throughput_rps"] == 180.0
        r = w["ratios"]
        assert r["cpu_per_request_governor_over_bare"] == 1.2
        assert r["p50_latency_governor_over_bare"] == 1.1
        assert r["throughput_governor_over_bare"] == 0.9
        assert r["p50_latency_governor_over_direct"] == 4.4
        assert w["verdicts"] == {"p50_latency_governor_over_bare": "PASS", "throughput_governor_over_bare": "PASS",
                                 "cpu_per_request_governor_over_bare": "PASS"}
        assert w["per_round_ratio_spread"]["cpu_per_request_governor_over_bare"] == {
            "min": 1.2, "median": 1.2, "max": 1.2}
        assert w["failures"] == {}


def test_a_target_met_exactly_passes_and_one_missed_by_a_little_does_not() -> None:
    at = overhead.aggregate(
        _segments(cpu={"bare": 2.0, "governor": 2.5}, p50={"direct": 1.0, "bare": 2.0, "governor": 2.3},
                  rps={"direct": 400, "bare": 200, "governor": 170}),
        {}, {}, rounds=2, duration=1.0)
    past = overhead.aggregate(
        _segments(cpu={"bare": 2.0, "governor": 2.51}, p50={"direct": 1.0, "bare": 2.0, "governor": 2.31},
                  rps={"direct": 400, "bare": 200, "governor": 169}),
        {}, {}, rounds=2, duration=1.0)
    for w in at["workloads"].values():
        assert set(w["verdicts"].values()) == {"PASS"}
    for w in past["workloads"].values():
        assert set(w["verdicts"].values()) == {"MISS"}
    rows = run_all.verdicts({"overhead": past})
    overhead_rows = [row for row in rows if row["target"].startswith("overhead ")]
    assert len(overhead_rows) == len(overhead.WORKLOADS) * len(overhead.TARGETS)
    assert {row["verdict"] for row in overhead_rows} == {"MISS"}
    assert "cpu per request governor over bare <= 1.25" in overhead_rows[2]["target"]


def test_failed_answers_and_streams_cut_short_are_reported_as_failures_of_the_run() -> None:
    segments = _segments(cpu={"bare": 2.0, "governor": 2.0}, p50={"direct": 1.0, "bare": 2.0, "governor": 2.0},
                         rps={"direct": 100, "bare": 100, "governor": 100})
    key = overhead.workload_key(False, "stream", 1)
    segments[(key, "governor")][0]["short_streams"] = 2
    segments[(key, "bare")][1]["statuses"] = {"200": 99, "502": 1}
    result = overhead.aggregate(segments, {}, {}, rounds=2, duration=1.0)
    assert result["workloads"][key]["failures"] == {"governor": {"short stream": 2}, "bare": {"502": 1}}
    assert "WARNING stream-c1" in overhead.report(result)
    validity = [row for row in run_all.verdicts({"overhead": result}) if "every request answered 200" in row["target"]]
    assert [row["verdict"] for row in validity] == ["MISS"]
    assert "stream-c1" in validity[0]["measured"] and "short stream" in validity[0]["measured"]


def _summary(results: dict, failures: dict | None = None) -> dict:
    return {"machine": common.machine(), "quick": False, "wall_seconds": 1.0,
            "verdicts": run_all.verdicts(results), "failures": failures or {}, "results": results}


def _table_rows(page: str, title: str) -> list[list[str]]:
    """The cells of the rows of the Markdown table under `## {title}...` in `page`."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"## {title}"))
    rows = []
    for line in lines[start + 3:]:  # the title, a blank line, the header; then the rule
        if not line.startswith("|"):
            break
        if not line.startswith("|-"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_results_page_shows_every_verdict_and_every_workloads_numbers() -> None:
    result = overhead.aggregate(
        _segments(cpu={"bare": 2.0, "governor": 2.6}, p50={"direct": 0.5, "bare": 2.0, "governor": 2.2},
                  rps={"direct": 400, "bare": 200, "governor": 180}),
        {"peak_rss_mb": 90.0}, {}, rounds=2, duration=1.0)
    summary = _summary({"overhead": result}, failures={"store": "RuntimeError: redis-server is not installed"})
    page = run_all.readme(summary)
    assert page.startswith("# Benchmark results\n")
    assert f"{summary['machine']['nproc']} cores" in page and "intercepted HTTPS" in page
    verdicts = _table_rows(page, "Verdicts")
    assert [row[0] for row in verdicts] == [v["target"] for v in summary["verdicts"]]
    assert [row[2] for row in verdicts] == [v["verdict"] for v in summary["verdicts"]]
    cpu = [row for row in verdicts if "cpu per request" in row[0]]
    assert len(cpu) == len(overhead.WORKLOADS) and {(row[1], row[2]) for row in cpu} == {("1.3", "MISS")}
    assert [row[1:] for row in verdicts if "peak RSS" in row[0]] == [["90.0", "PASS"]]
    numbers = _table_rows(page, "Overhead (2 rounds x 1 s")
    assert len(numbers) == len(overhead.WORKLOADS) * len(overhead.PATHS)
    for row in numbers:
        workload, path, p50, _p99, rps, cpu_ms = row
        expected = {"direct": ("0.5", "400.0", ""), "bare": ("2.0", "200.0", "2.0"), "governor": ("2.2", "180.0", "2.6")}
        assert (p50, rps, cpu_ms) == expected[path], row
    ratios = _table_rows(page, "Ratios")
    assert sorted(row[0] for row in ratios) == sorted(overhead.workload_key(*w) for w in overhead.WORKLOADS)
    assert {tuple(row[1:5]) for row in ratios} == {("1.1", "1.1", "0.9", "1.3")}
    # a part that did not run is named, with why
    assert "## Parts that did not run\n\n- store: RuntimeError: redis-server is not installed" in page


def test_the_committed_results_page_is_one_the_suite_made() -> None:
    """bench/README-results.md, which the README points to, comes from a full run of the
    current suite: its sections and verdict rows are the ones run_all writes for the targets
    and workloads the code states now (a stale page, or one from a partial run, fails)."""
    page = (BENCH / "README-results.md").read_text()
    assert page.startswith("# Benchmark results\n\nGenerated by `.ci/dev bench`")
    titles = [line for line in page.splitlines() if line.startswith("## ")]
    full = run_all.OVERHEAD_FULL
    assert titles[:3] == ["## Verdicts", f"## Overhead ({full['rounds']} rounds x {full['duration']:g} s per path and workload)",
                          "## Ratios"]
    targets = [row[0] for row in _table_rows(page, "Verdicts")]
    for tls, kind, concurrency in overhead.WORKLOADS:
        for name, target in overhead.TARGETS.items():
            sign = ">=" if name.startswith("throughput") else "<="
            assert f"overhead {overhead.workload_key(tls, kind, concurrency)}: {name.replace('_', ' ')} {sign} {target}" \
                in targets
    assert "overhead: every request answered 200 and every stream whole, on every path" in targets
    assert "## Parts that did not run" not in page


def test_the_r3_bench_exercises_every_feed_in_sessions_that_never_halt() -> None:
    """bench_r3's figure is the R3 substrate's cost only if its sessions run (a model the price
    book does not price halts a session at its first step) and feed §2-§5 (#32's bench)."""
    mix = list(bench_r3.steps(1200))
    fed = bench_r3.premise(mix, 60)
    assert set(fed) == set(bench_r3.FEEDS) and all(count > 0 for count in fed.values()), fed


def test_the_r3_bench_refuses_to_measure_sessions_that_halt(monkeypatch) -> None:
    original = bench_r3.passport
    monkeypatch.setattr(bench_r3, "passport", lambda: original(session_tokens=1_000))  # the cap is hit at once
    with pytest.raises(SystemExit, match="halted"):
        bench_r3.premise(list(bench_r3.steps(600)), 60)


def test_percentiles_and_ratios_of_nothing_are_none_not_errors() -> None:
    assert common.percentile([], 50) is None
    assert common.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert common.ratio(1.0, None) is None and common.ratio(None, 1.0) is None
    assert common.ratio(1.0, 0) is None
    assert common.ratio(3.0, 2.0) == 1.5


# --- the load generator, against a real server -------------------------------------------

SSE_PIECES = [b"data: 1\n", b"\ndata: 2\n\n", b"data: 3\n\ndata: 4\n\n", b"data: [DONE]\n\n"]


@pytest.fixture
async def sse_server() -> str:
    """Loopback: /plain answers JSON with a Content-Length, /stream four events and [DONE]
    in chunks that split an event's terminator, /short two events only."""

    async def plain(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        pieces = SSE_PIECES if request.path == "/stream" else [b"data: 1\n\n", b"data: 2\n\n"]
        for piece in pieces:
            await response.write(piece)
            await asyncio.sleep(0.002)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/plain", plain)
    app.router.add_post("/stream", stream)
    app.router.add_post("/short", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_the_load_generator_counts_requests_warm_ups_and_this_process_cpu(sse_server: str) -> None:
    segment = await common.load_segment({
        "url": f"{sse_server}/plain", "body": "{}", "requests": 7, "concurrency": 2, "warmup": 0,
        "warmup_body": "{}", "watch_pid": os.getpid()})
    assert segment.statuses == {"200": 7} and len(segment.latencies_ms) == 7
    assert segment.warmup_count == 2  # one per connection
    assert segment.cpu_seconds is not None and segment.cpu_seconds >= 0  # /proc: 10 ms ticks
    assert segment.errors == [] and segment.ttft_ms == []


async def test_the_load_generator_timestamps_each_event_even_when_a_chunk_splits_it(sse_server: str) -> None:
    segment = await common.load_segment({
        "url": f"{sse_server}/stream", "body": "{}", "requests": 3, "concurrency": 1, "warmup": 0,
        "stream_chunks": 4})
    assert segment.statuses == {"200": 3}
    assert len(segment.ttft_ms) == 3
    assert len(segment.gaps_ms) == 3 * 3  # the gaps between the four content events
    # events 1 and 2 end in the second chunk, 3 and 4 in the third, sent at least 2 ms later
    for first in range(0, 9, 3):
        same, apart, same_again = segment.gaps_ms[first:first + 3]
        assert same == 0.0 and same_again == 0.0 and apart >= 1.0
    assert segment.short_streams == 0


async def test_a_stream_that_ends_early_is_counted_short(sse_server: str) -> None:
    segment = await common.load_segment({
        "url": f"{sse_server}/short", "body": "{}", "requests": 2, "concurrency": 1, "warmup": 0,
        "stream_chunks": 4})
    assert segment.statuses == {"200": 2}
    assert segment.short_streams == 2


# --- one short run of the overhead benchmark ---------------------------------------------


def test_a_short_overhead_run_governs_every_request_on_the_governors_path_and_no_other() -> None:
    result = overhead.run(rounds=2, duration=0.1, warmup=0.05, log=lambda *_: None)
    governed = 0
    for key, w in result["workloads"].items():
        for path in overhead.PATHS:
            p = w["paths"][path]
            assert p["requests"] > 0, (key, path)
            assert p["statuses"] == {"200": p["requests"]}, (key, path, p["statuses"])
            assert p["short_streams"] == 0, (key, path)
            if path == "direct":
                assert p["cpu_ms_per_request"] is None
            else:  # read from the proxy process's own accounting
                assert p["cpu_ms_per_request"] > 0, (key, path)
        governed += w["paths"]["governor"]["requests"] + w["paths"]["governor"]["warmup_requests"]
        assert w["failures"] == {}
        assert all(value is not None for value in w["ratios"].values()), key
        assert set(w["verdicts"].values()) <= {"PASS", "MISS"}
    # every model call through the governor was admitted in its session, and only those
    # (the bare proxy's and the direct path's requests never reached it); no cap fired
    session = result["governor_session"]
    assert session["session"] == "bench" and session["state"] == "active"
    assert session["iterations"] == governed
    assert session["halt_cause"] is None
    assert result["governor_memory_mb"]["peak_rss_mb"] > 0
    printed = overhead.report(result)  # the table the suite prints
    for key in result["workloads"]:
        for path in overhead.PATHS:
            assert any(line.startswith(f"| {key} ") and f"| {path} " in line for line in printed.splitlines()), (key, path)
    assert "WARNING" not in printed
    rows = run_all.verdicts({"overhead": result})
    assert len(rows) == len(overhead.WORKLOADS) * len(overhead.TARGETS) + 2  # the run's validity, the memory
    assert [row["verdict"] for row in rows if "every request answered 200" in row["target"]] == ["PASS"]


# --- the hooks, timed inside the process ---------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "stream"])
def test_the_hook_timer_times_each_hook_once_per_request_and_the_collector(kind: str) -> None:
    """bench/hook_cpu.py, briefly: the probe inside `governor run` saw every measured request
    pass through each hook and runtime call once (none before the table was cleared, none
    missed), the relay for each chunk of a stream, and the collector's passes."""
    result = hook_cpu.run(kind, 2, 0.3, None, [], gc_threshold=50, warmup=0.3)
    timed = result["timed"]
    assert result["requests"] > 0
    for target in ("governor.proxy.binding:SessionBinding.request", "governor.proxy.admission:Admission.request",
                   "governor.proxy.in_flight:InFlight.request", "governor.proxy.answers:Answers.response",
                   "governor.proxy.in_flight:InFlight.response",
                   "governor.runtime.core:Runtime.usage", "governor.runtime.core:Runtime.finish"):
        assert timed[target]["calls_per_request"] == 1.0, (target, timed[target])
        assert timed[target]["us_per_call"] > 0
    # admit: each request's model call, and the session's wall-clock tick (one a second at most)
    admits = timed["governor.runtime.core:Runtime.admit"]["calls_per_request"]
    assert 1.0 <= admits <= round((result["requests"] + 2) / result["requests"], 2)
    relay = timed["governor.proxy.relay:StreamRelay.__call__"]["calls_per_request"]
    if kind == "stream":  # 20 chunks, the [DONE] event, the end: spread over a few chunks
        assert 2 <= relay <= hook_cpu.STREAM_CHUNKS + 2
    else:
        assert relay == 0
    # a threshold of 50 makes the youngest generation collect several times per request
    assert timed["gc:0"]["calls_per_request"] >= 1 and timed["gc:0"]["us_per_call"] > 0
    assert result["gc_threshold"] == 50
    assert 0 < result["hooks_us_per_request"] < result["process_cpu_us_per_request"]
    printed = hook_cpu.report(result)
    assert "garbage collection, generation 0" in printed and "gc threshold 50" in printed
    # what the collector freed: at least the flows (mitmproxy's are reference cycles)
    assert sum(timed[g]["collected_per_request"] for g in hook_cpu.GC) >= 1


def test_the_hook_timer_times_a_tree_from_before_the_rooms_by_its_own_names(tmp_path) -> None:
    """--tree with a tree whose addon was one class (no governor/proxy/chain.py) times that
    addon's hooks and the top-level runtime module's calls; today's tree, the chain's."""
    (tmp_path / "governor" / "proxy").mkdir(parents=True)
    assert hook_cpu.hooks_of(str(tmp_path)) == (hook_cpu.LEGACY_HOOKS, hook_cpu.LEGACY_RUNTIME)
    assert hook_cpu.hooks_of(None) == (hook_cpu.HOOKS, hook_cpu.RUNTIME)
    assert hook_cpu.hooks_of(str(BENCH.parent)) == (hook_cpu.HOOKS, hook_cpu.RUNTIME)


# --- two revisions side by side ---------------------------------------------------------


def test_two_trees_side_by_side_each_read_per_round() -> None:
    """bench/ab.py, briefly, with this tree as both A and B: every segment on every proxy
    answered 200 (run() refuses otherwise) with its CPU read, and each round gives the three
    ratios of its own figures."""
    tree = str(BENCH.parent)
    result = ab.run(tree, tree, ["plain-c1", "tls-stream-c1"], rounds=2, duration=0.1, log=lambda *_: None)
    assert set(result["workloads"]) == {"plain-c1", "tls-stream-c1"}
    for key, w in result["workloads"].items():
        us = w["cpu_us_per_request"]
        assert set(us) == {"bare", "A", "B"} and all(v > 0 for v in us.values()), (key, us)
        assert set(w["ratios"]) == {"A/bare", "B/bare", "B/A"}
        for label, q in w["ratios"].items():
            assert 0 < q["min"] <= q["median"] <= q["max"], (key, label, q)
    printed = ab.report(result)
    assert all(any(line.startswith(f"| {key} ") for line in printed.splitlines()) for key in result["workloads"])


# --- where the CPU goes: py-spy's samples, split -----------------------------------------

_MAIN = "thread (100): MainThread;<module> (governor:6);main (governor/cli/__init__.py:51);run (asyncio/runners.py:194)"
# py-spy's raw format (record --format raw --threads): one line per distinct stack, root first
RAW_STACKS = [
    f"{_MAIN};Governor.request (governor/proxy/addon.py:270);Runtime.admit (governor/runtime.py:250);"
    "quiet_model_call (governor/policy/engine.py:540) 6",
    f"{_MAIN};Governor.response (governor/proxy/addon.py:300);Runtime.usage (governor/runtime.py:270) 3",
    f"{_MAIN};ConnectionHandler.server_event (mitmproxy/proxy/server.py:300);"
    "validate_headers (mitmproxy/net/http/validate.py:10) 8",
    f"{_MAIN};BaseEventLoop._run_once (asyncio/base_events.py:1900);Handle._run (asyncio/events.py:84) 2",
    f"{_MAIN};BaseEventLoop._run_once (asyncio/base_events.py:1900);EpollSelector.select (selectors.py:468) 40",
    "thread (100): MainThread;<module> (governor:6);main (governor/cli/__init__.py:51) 1",
    "thread (200): governor-store-flush;_flush_behind (governor/store/writebehind.py:300) 9",
    "not a stack line",
]


def test_the_profile_splits_the_event_loops_samples_by_where_they_were_taken() -> None:
    """bench/profile_overhead.py's arithmetic on py-spy's raw stacks: one thread's samples,
    idle ones (the loop in epoll) left out, each category and governor module and function
    given its share of the CPU per request, the command-line entry points (at the root of
    every stack of `governor run`) not counted as governor code."""
    stacks = profile_overhead.parse_stacks(RAW_STACKS, thread=100)
    assert len(stacks) == 6  # the flusher's stack is another thread's; the junk line is skipped
    assert len(profile_overhead.parse_stacks(RAW_STACKS)) == 7
    busy = [(frames, n) for frames, n in stacks if not profile_overhead._is_idle(frames)]
    assert sum(n for _, n in busy) == 20
    split = profile_overhead.breakdown(busy, cpu_us_per_request=200.0, other_threads_us=5.0)
    assert split["us_per_sample"] == 10.0 and split["samples"] == 20
    assert split["cpu_us_per_request"] == 205.0
    assert split["categories"] == {"governor code": 90.0, "mitmproxy": 80.0, "event loop": 20.0, "other": 10.0,
                                   "no Python frame": 0.0, "other threads": 5.0}
    assert split["governor_modules"] == {"governor/policy/engine": 60.0, "governor/runtime": 30.0}
    assert split["governor_functions"] == {  # inclusive: a function's time includes what it calls
        "Governor.request (governor/proxy/addon.py)": 60.0, "Runtime.admit (governor/runtime.py)": 60.0,
        "quiet_model_call (governor/policy/engine.py)": 60.0,
        "Governor.response (governor/proxy/addon.py)": 30.0, "Runtime.usage (governor/runtime.py)": 30.0}
    assert split["other_functions"] == {"validate_headers (mitmproxy/net/http/validate.py)": 80.0,
                                        "Handle._run (asyncio/events.py)": 20.0, "main (governor/cli/__init__.py)": 10.0}
    bare = profile_overhead.breakdown([(frames, n) for frames, n in busy
                                       if profile_overhead.categorize(frames) != "governor code"], 110.0)
    printed = profile_overhead.report({"bare": bare, "governor": split})
    assert any(line.startswith("| governor/policy/engine ") and "| 60.0 " in line for line in printed.splitlines())
    assert any(line.startswith("|   governor code ") and "| 90.0 " in line for line in printed.splitlines())


def _py_spy_cannot_attach() -> str | None:
    """Why py-spy cannot sample a process here (not installed; no permission to attach), or None."""
    try:
        spy = profile_overhead.py_spy()
    except SystemExit as exc:
        return str(exc)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        probe = subprocess.run([spy, "dump", "--pid", str(sleeper.pid)], capture_output=True, text=True, timeout=30)
    finally:
        sleeper.kill()
        sleeper.wait()
    if probe.returncode != 0:
        return f"py-spy cannot attach to a process here (needs root or ptrace permission): {probe.stderr.strip()[-300:]}"
    return None


def test_a_short_profile_samples_both_proxies_and_finds_the_governors_code_in_one_only(tmp_path, monkeypatch) -> None:
    """bench/profile_overhead.py, briefly, against the real processes under load: py-spy
    sampled both proxies, every measured request was counted, and governor code (its request
    hook, at least) shows in the governor's split and nowhere in the bare proxy's."""
    reason = _py_spy_cannot_attach()
    if reason is not None:
        pytest.skip(reason)
    monkeypatch.setattr(profile_overhead, "RESULTS", tmp_path)  # its raw stacks go here, not in bench/results
    args = argparse.Namespace(kind="plain", concurrency=2, duration=1.0, rounds=2, rate=200, nonblocking=False)
    with common.scratch("profile-test") as work, common.Role("upstream") as upstream, common.Role("load") as load, \
            common.Role("bare", "--data-dir", str(work / "bare")) as bare, \
            common.Governor(common.write_passport(work / "passport.json"), work / "governor") as governor:
        paths = profile_overhead.profile({"bare": bare, "governor": governor}, upstream, load, args)
    for name, split in paths.items():
        assert split["requests"] > 0 and split["samples"] > 0, name
        assert split["cpu_us_per_request"] > 0, name
        shares = sum(split["categories"].values())
        assert abs(shares - split["cpu_us_per_request"]) < 1.0, (name, shares, split["cpu_us_per_request"])
        assert (tmp_path / f"profile-{name}.txt").stat().st_size > 0
    assert paths["bare"]["categories"]["governor code"] == 0 and not paths["bare"]["governor_modules"]
    assert paths["governor"]["categories"]["governor code"] > 0
    assert "Admission.request (governor/proxy/admission.py)" in paths["governor"]["governor_functions"]
    assert "governor code by module" in profile_overhead.report(paths)
