"""A bounded soak: honest traffic at a steady rate through a real `governor run`, beside
hostile clients, for minutes; reports what the honest clients saw and what the governor
held (docs/operations.md).

    python bench/soak.py                   # 150 s, the full soak (results in bench/results/soak.json)
    python bench/soak.py --duration 20     # the short variant (tests/test_soak.py runs it)

The governor runs as users run it, under `nofile=1024` (the limit that ran out in
issue 20), with the bench passport (caps that never fire) and short client deadlines
so hostile connections cycle within the run. Beside it, all at once:

- honest: RATE governed chat completions a second, over kept-alive connections, a few
  sessions opened by the principal (POST /v1/sessions); every answer must be a 200 within 10 s;
- half-open: HALF_OPEN connections that send half a request line and wait, reopened
  as the governor closes them;
- dribblers: DRIBBLERS connections sending one byte of a request line every 2 s;
- oversized: a request declaring a 100 MiB body, of which 256 KiB is sent, every 2 s;
- bad ADL headers: a request with a garbage ADL-Passport, an oversized ADL-Session or
  a malformed ADL-Persona, 4 a second;
- control-plane flood: a client walking `GET /v1/sessions` pages back to back.

Open files and RSS come from /proc/<pid>: at the start (after a warm-up with honest
traffic only) and at the end (after the hostile clients stopped and their connections'
deadlines passed), and the most seen while the soak ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HOST, Governor, HttpConnection, Role, chat_body, memory_mb, open_session, percentile, request_bytes, scratch,
    table, upstream_url, write_passport, write_result,
)

NOFILE = 1024
RATE = 20.0  # honest requests a second
HONEST_WORKERS = 4
HONEST_SESSIONS = 4
HALF_OPEN = 300
DRIBBLERS = 100
HEADER_TIMEOUT = 4.0
BODY_TIMEOUT = 6.0
IDLE_TIMEOUT = 10.0
DEADLINE = 10.0  # an honest request not answered in this long is an error
SETTLE = HEADER_TIMEOUT + 3.0  # after the hostile clients stop: their connections' deadlines pass


class CappedGovernor(Governor):
    """`governor run` under a file-descriptor limit (prlimit execs it: same pid)."""

    def command(self, role: str, args: Any) -> list[str]:
        return ["prlimit", f"--nofile={NOFILE}:{NOFILE}", *super().command(role, args)]


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Soak:
    def __init__(self, governor: Governor, upstream: Role, duration: float) -> None:
        self.governor, self.upstream, self.duration = governor, upstream, duration
        self.proxy_port = governor.port
        self.control_port = int(governor.info["control"])
        # the honest sessions are opened by the principal; the hostile clients hold no token
        self.control_token = governor.control_token
        self.sessions = [open_session(governor.control_url, self.control_token, f"honest-{n}")
                         for n in range(HONEST_SESSIONS)]
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.hostile: dict[str, dict[str, int]] = {}
        self.samples: list[tuple[int, float]] = []
        self.stop = asyncio.Event()

    def count(self, kind: str, outcome: str) -> None:
        bucket = self.hostile.setdefault(kind, {})
        bucket[outcome] = bucket.get(outcome, 0) + 1

    # --- honest ----------------------------------------------------------------------

    async def honest(self, worker: int, rate: float, record: bool = True) -> None:
        connection = HttpConnection(HOST, self.proxy_port)
        period = HONEST_WORKERS / rate
        next_at = time.monotonic() + random.random() * period
        n = 0
        while not self.stop.is_set():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += period
            session = self.sessions[(worker + n) % HONEST_SESSIONS]
            n += 1
            request = request_bytes(upstream_url(self.upstream.port), chat_body(max_tokens=16), via_proxy=True,
                                    headers={"ADL-Session": session})
            started = time.perf_counter()
            try:
                status, _, body = await asyncio.wait_for(connection.exchange(request), DEADLINE)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                connection.close()
                if record:
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            if not record:
                continue
            if status == 200:
                self.latencies.append(time.perf_counter() - started)
            else:
                self.errors.append(f"HTTP {status}: {body[:120]!r}")

    # --- hostile ---------------------------------------------------------------------

    async def _hold(self, kind: str, first: bytes, more: bytes | None, every: float) -> None:
        """One hostile connection after another: send `first`, then `more` every `every`
        seconds (None: nothing), until the governor closes it."""
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, self.proxy_port), 10)
            except (OSError, asyncio.TimeoutError):
                self.count(kind, "connect_failed")
                await asyncio.sleep(1.0)
                continue
            opened = time.monotonic()
            writer.write(first)
            closed = asyncio.ensure_future(reader.read())
            while not self.stop.is_set() and not closed.done():
                await asyncio.wait([closed], timeout=every)
                if more is not None and not closed.done() and not writer.is_closing():
                    writer.write(more)
            if closed.done():
                self.count(kind, "closed_by_governor")
                self.count(kind, f"held_{min(int(time.monotonic() - opened), 60)}s")
            closed.cancel()
            writer.close()

    async def oversized(self) -> None:
        head = (f"POST {upstream_url(self.upstream.port)} HTTP/1.1\r\nHost: {HOST}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {100 * 1024 * 1024}\r\n\r\n").encode()
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, self.proxy_port), 10)
                writer.write(head + b"[" + b" " * (256 * 1024))
                answer = await asyncio.wait_for(reader.read(200), 2.0)
                self.count("oversized", answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else "closed")
                writer.close()
            except (OSError, asyncio.TimeoutError, IndexError):
                self.count("oversized", "no_answer_in_2s")
            await asyncio.sleep(2.0)

    async def bad_headers(self) -> None:
        connection = HttpConnection(HOST, self.proxy_port)
        bad = [{"ADL-Passport": "eyJ" + "A" * 3000}, {"ADL-Passport": "!!not base64!!"},
               {"ADL-Session": "s" * 5000}, {"ADL-Session": "../../etc/passwd"}, {"ADL-Persona": "\x7f" * 10}]
        n = 0
        while not self.stop.is_set():
            headers = bad[n % len(bad)]
            n += 1
            request = request_bytes(upstream_url(self.upstream.port), chat_body(max_tokens=8), via_proxy=True,
                                    headers=headers)
            try:
                status, _, _ = await asyncio.wait_for(connection.exchange(request), DEADLINE)
                self.count("bad_adl_headers", str(status))
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                connection.close()
                self.count("bad_adl_headers", "closed")
            await asyncio.sleep(0.25)

    async def listing_flood(self) -> None:
        connection = HttpConnection(HOST, self.control_port)
        after = None
        while not self.stop.is_set():
            query = "limit=1000" + (f"&after={after}" if after else "")
            request = (f"GET /v1/sessions?{query} HTTP/1.1\r\nHost: {HOST}:{self.control_port}\r\n"
                       f"Authorization: Bearer {self.control_token}\r\n\r\n").encode()
            try:
                status, _, body = await asyncio.wait_for(connection.exchange(request), DEADLINE)
                after = json.loads(body).get("next") if status == 200 else None
                self.count("listing_flood", str(status))
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                connection.close()
                self.count("listing_flood", "failed")
                await asyncio.sleep(0.5)

    async def sample(self) -> None:
        while not self.stop.is_set():
            pid = self.governor.pid
            self.samples.append((open_files(pid), memory_mb(pid).get("rss_mb", 0.0)))
            try:
                await asyncio.wait_for(self.stop.wait(), 2.0)
            except asyncio.TimeoutError:
                pass

    # --- the run ---------------------------------------------------------------------

    async def run(self, warmup: float = 3.0) -> dict[str, Any]:
        pid = self.governor.pid
        warm = [asyncio.create_task(self.honest(w, RATE, record=False)) for w in range(HONEST_WORKERS)]
        await asyncio.sleep(warmup)  # sessions opened, journals and connections in place
        self.stop.set()
        await asyncio.gather(*warm)
        self.stop.clear()
        start = {"open_files": open_files(pid), **memory_mb(pid)}
        began = time.monotonic()
        tasks = [asyncio.create_task(self.honest(w, RATE)) for w in range(HONEST_WORKERS)]
        tasks += [asyncio.create_task(self._hold("half_open", b"POST /v1/chat/completions HTT", None, 5.0))
                  for _ in range(HALF_OPEN)]
        tasks += [asyncio.create_task(self._hold("dribbler", b"P", b"O", 2.0)) for _ in range(DRIBBLERS)]
        tasks += [asyncio.create_task(self.oversized()), asyncio.create_task(self.bad_headers()),
                  asyncio.create_task(self.listing_flood()), asyncio.create_task(self.sample())]
        await asyncio.sleep(self.duration)
        self.stop.set()
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - began
        await asyncio.sleep(SETTLE)
        end = {"open_files": open_files(pid), **memory_mb(pid)}
        ms = sorted(x * 1000 for x in self.latencies)
        return {
            "duration_s": round(elapsed, 1), "nofile": NOFILE, "rate_per_s": RATE,
            "honest": {"answered": len(ms), "answered_per_s": round(len(ms) / elapsed, 1), "errors": len(self.errors), "error_samples": self.errors[:5],
                       "p50_ms": _round(percentile(ms, 50)), "p99_ms": _round(percentile(ms, 99)),
                       "max_ms": _round(ms[-1] if ms else None)},
            "hostile": self.hostile,
            "governor": {"start": start, "end": end,
                         "max_open_files": max((s[0] for s in self.samples), default=None),
                         "max_rss_mb": max((s[1] for s in self.samples), default=None)},
            "settings": {"half_open": HALF_OPEN, "dribblers": DRIBBLERS, "client_header_timeout": HEADER_TIMEOUT,
                         "client_body_timeout": BODY_TIMEOUT, "client_idle_timeout": IDLE_TIMEOUT},
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def run(duration: float = 150.0) -> dict[str, Any]:
    with scratch("soak") as tmp:
        passport = write_passport(tmp / "passport.json")
        with Role("upstream") as upstream, CappedGovernor(passport, tmp / "data", tier="R2", extra=[
                "--client-header-timeout", str(HEADER_TIMEOUT), "--client-body-timeout", str(BODY_TIMEOUT),
                "--client-idle-timeout", str(IDLE_TIMEOUT)],
                env={"GOVERNOR_LOG_LEVEL": "WARNING"}) as governor:  # no access-log line per flood request
            return asyncio.run(Soak(governor, upstream, duration).run())


def report(result: dict[str, Any]) -> str:
    honest, gov = result["honest"], result["governor"]
    rows = [
        ["honest requests answered", f"{honest['answered']} ({honest['answered_per_s']}/s)"],
        ["honest errors", honest["errors"]],
        ["honest p50 / p99 / max (ms)", f"{honest['p50_ms']} / {honest['p99_ms']} / {honest['max_ms']}"],
        ["open files start / end / max", f"{gov['start']['open_files']} / {gov['end']['open_files']} / "
                                         f"{gov['max_open_files']} (nofile {result['nofile']})"],
        ["RSS MiB start / end / max", f"{gov['start'].get('rss_mb')} / {gov['end'].get('rss_mb')} / "
                                      f"{gov['max_rss_mb']}"],
    ]
    for kind, outcomes in sorted(result["hostile"].items()):
        shown = {k: v for k, v in outcomes.items() if not k.startswith("held_")}
        rows.append([f"hostile {kind}", ", ".join(f"{k} {v}" for k, v in sorted(shown.items()))])
    return (f"soak: {result['duration_s']} s, {result['rate_per_s']:g} honest requests/s, "
            f"{result['settings']['half_open']} half-open + {result['settings']['dribblers']} dribbling connections\n"
            + table(rows, ["", "figure"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of hostile load (default 150)")
    parser.add_argument("--json", help="write the result here ('-': stdout) instead of bench/results/soak.json")
    args = parser.parse_args()
    result = run(args.duration)
    print(report(result), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json == "-":
        print(json.dumps(result))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    else:
        print(f"written to {write_result('soak.json', result)}")


if __name__ == "__main__":
    main()
