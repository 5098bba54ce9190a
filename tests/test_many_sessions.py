"""Ten thousand live sessions under `nofile=1024` (issue #20: each live session held its
journal open, so session 1,005 and every later one got 503 "Too many open files").

A `governor run` subprocess limited to 1,024 file descriptors serves 10,000 distinct
sessions, each with a governed model call to a mock upstream, over a few keep-alive
connections; `/healthz` answers throughout, and the governor's open descriptors stay far
below the number of sessions.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import httpx

from tests.restartable_governor import CONTROL_HEADERS, GovernorProcess, write_passport
from tests.upstreams import Behaviour, MockLLM

SESSIONS = 10_000
CONNECTIONS = 12
NOFILE = 1024


def _roomy(document: dict) -> None:
    """Per-day caps that 10,000 sessions of one agent do not reach (per-session caps as declared)."""
    budget = document["permissions"]["resource_limits"]["budget"]
    budget["tokens"]["per_day"] = 10**9
    budget["cost_usd"]["per_day"] = 10**6
    budget["wall_clock_sec"]["per_day"] = 10**9


async def test_ten_thousand_sessions_under_nofile_1024(tmp_path):
    llm = MockLLM()
    llm.default = Behaviour(input_tokens=11, output_tokens=7)
    await llm.start()
    passport = write_passport(tmp_path / "passport.json", mutate=_roomy)
    gov = await asyncio.to_thread(GovernorProcess(tmp_path / "data", passport, nofile=NOFILE).start)
    statuses: dict[int, int] = {}
    health: list[tuple[float, int | str]] = []
    fds: list[int] = []
    done = asyncio.Event()

    async def probe() -> None:
        async with httpx.AsyncClient(base_url=gov.control_url, headers=CONTROL_HEADERS, trust_env=False, timeout=10) as control:
            while not done.is_set():
                started = time.monotonic()
                try:
                    status: int | str = (await control.get("/healthz")).status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                health.append((time.monotonic() - started, status))
                fds.append(gov.open_files())
                await asyncio.sleep(0.5)

    async def agent(worker: int, client: aiohttp.ClientSession) -> None:
        for number in range(worker, SESSIONS, CONNECTIONS):
            try:
                async with client.post(
                        f"{llm.base_url}/v1/chat/completions", proxy=gov.proxy_url,
                        headers={"ADL-Session": f"s{number:05d}"},
                        json={"model": "gpt-4o-mini", "max_tokens": 20,
                              "messages": [{"role": "user", "content": "hi"}]}) as answer:
                    await answer.read()
                    statuses[number] = answer.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                statuses[number] = -1
                print(f"session {number}: {type(exc).__name__}: {exc}")

    watcher = asyncio.create_task(probe())
    try:
        # aiohttp rather than httpx for the load: a third of httpx's client CPU per request here
        connector = aiohttp.TCPConnector(limit=CONNECTIONS)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:
            await asyncio.gather(*(agent(w, client) for w in range(CONNECTIONS)))
    finally:
        done.set()
        await watcher
        gov.stop()
        await llm.stop()
    failed = {n: s for n, s in statuses.items() if s != 200}
    assert len(statuses) == SESSIONS and not failed, (len(failed), sorted(failed.items())[:5], gov.log()[-2000:])
    assert len(llm.requests) == SESSIONS
    assert health and all(status == 200 for _, status in health), health
    assert max(fds) < 200, fds  # far below one per session: no descriptor is held per idle session
    print(f"{SESSIONS} sessions; /healthz {len(health)} probes, slowest {max(t for t, _ in health):.2f} s; "
          f"open descriptors at most {max(fds)}")
