"""Series count against the number of sessions, through the real proxy and runtime.

The agent names its sessions (ADL-Session) and personas (ADL-Persona): neither may become a
label value unless opted in (sessions, capped) or declared in the passport (personas). On the
old metrics, 200 sessions gave 2,174 series."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from governor.proxy.server import Settings, serve
from tests.proxy_harness import AGENT_NAMED, RawClient
from tests.upstreams import MockLLM, make_tls

CHAT = "/v1/chat/completions"
PER_SESSION_CAP = 5


def _series(text: str) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for f in text_string_to_metric_families(text) for s in f.samples]


def _drive(running, mock, sessions: range, tag: str) -> None:
    """One request per session on a keep-alive connection; every third names a persona the
    passport does not declare, every fifth a declared one."""
    client = RawClient(running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
    try:
        for n in sessions:
            headers = {"ADL-Session": f"{tag}-{n}-{uuid.uuid4()}"}
            if n % 3 == 0:
                headers["ADL-Persona"] = f"made-up-{n}"
            elif n % 5 == 0:
                headers["ADL-Persona"] = "searcher"
            body = {"model": "gpt-4o-mini", "max_tokens": 20 + n % 50,  # 1,000 of them stay within the per-day budget
                    "messages": [{"role": "user", "content": "hello " * (n % 7)}]}
            client.send("POST", CHAT, orjson.dumps(body), headers)
            status, _, _ = client.read_response()
            assert status in (200, 403, 429), status  # 429: the per-day budget ran out
    finally:
        client.close()


@pytest.mark.asyncio
async def test_series_count_does_not_grow_with_sessions(tmp_path):
    tls = make_tls(tmp_path / "tls")
    mock = MockLLM(tls)
    await mock.start()
    settings = Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path / "data",
                        upstream_ca=tls.ca_file, tick_interval=3600, metrics_per_session=PER_SESSION_CAP)
    running = await serve(settings)
    counts = {}
    try:
        done = 0
        for total in (100, 1000, 1200):
            await asyncio.to_thread(_drive, running, mock, range(done, total), "agent")
            done = total
            for _ in range(total // 50 + 1):  # the sweeper refreshes 50 sessions' gauges a pass
                await running.runtime.sweep()
            series = _series(running.runtime.metrics.exposition().decode())
            counts[total] = series
            by_session = {labels["session"] for _, labels in series if "session" in labels}
            assert len(by_session) == PER_SESSION_CAP  # the opt-in, capped
            values = {v for name, labels in series for k, v in labels.items() if k != "session"}
            assert not any(v.startswith(("agent-", "made-up")) for v in values), values
            personas = {labels["persona"] for _, labels in series if "persona" in labels}
            assert personas <= {"", "searcher", "summarizer", "undeclared"}, personas
    finally:
        await running.stop()
        await mock.stop()
    print(f"series at 100 / 1,000 / 1,200 sessions: {len(counts[100])} / {len(counts[1000])} / {len(counts[1200])}")
    # As sessions accrue, the per-day budgets are fitted, then run out (sessions accrue
    # wall-clock together, so when depends on the machine's pace): that adds the series of a
    # cause that had not fired yet, from closed sets only, never one per session.
    for before, after in ((100, 1000), (1000, 1200)):
        grown = [s for s in counts[after] if s not in counts[before] and "session" not in s[1]]
        assert all(name.startswith(("governor_decisions", "governor_threshold_warnings")) for name, _ in grown), grown
        assert {labels.get("cause") for name, labels in grown if "cause" in labels} <= \
            {"on_budget_exhausted", "on_governor_output_fitted"}, grown
        assert {labels.get("dimension") for name, labels in grown} <= {None, "tokens", "cost_usd", "wall_clock_sec"}
    # and nothing else: every series of 1,200 sessions but those is one of 1,000 sessions'
    assert len(counts[1200]) <= len(counts[1000]) + len(grown)
