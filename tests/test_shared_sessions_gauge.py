"""`governor_shared_sessions` (issue #30): two governor processes sharing sessions on one real
redis-server each export the true number of shared sessions by state (active, paused, halted,
ended, as `GET /v1/sessions` lists them), where `governor_sessions` counts a session once per
replica that served it; members forged into the store's indexes are not counted; and a real
Prometheus scraping both replicas as one job evaluates the dashboard's "Sessions by state"
query to the true numbers, where the old sum over pods gave twice the active one."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.shared_replicas import Replica, shared_keys

PROMETHEUS = shutil.which("prometheus")
DASHBOARD = Path(__file__).resolve().parent.parent / "helm" / "governor" / "files" / "grafana" / "governor.json"
# a call the example passport's 20,000-token session budget refuses, halting the session
UNFITTABLE = {"max_tokens": 30_000, "answers": 100}
STATES = ("active", "paused", "halted", "ended")

pytestmark = pytest.mark.asyncio


@pytest.fixture
def redis_url():
    from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        pytest.skip(NOT_INSTALLED)
    server = RedisServer()
    try:
        yield server.url
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _samples(replica: Replica, name: str) -> dict[str, float]:
    """The replica's series `name` by state, from its /metrics."""
    text = (await replica.control.get("/metrics")).text
    return {s.labels["state"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}


async def _open(replica: Replica, label: str) -> tuple[str, str]:
    answer = await replica.control.post("/v1/sessions", json={"label": label})
    assert answer.status_code == 201, answer.text
    return answer.json()["session"], answer.json()["token"]


async def _scraped_until(replicas: list[Replica], expected: dict[str, float], timeout: float = 30) -> list[dict]:
    """Each replica's governor_shared_sessions once all equal `expected` (the sweeper counts every
    5 s), else what they were at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        seen = [await _samples(replica, "governor_shared_sessions") for replica in replicas]
        if all(s == expected for s in seen) or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.5)


async def _prometheus_query(http: aiohttp.ClientSession, base: str, promql: str) -> dict[str, float]:
    async with http.get(f"{base}/api/v1/query", params={"query": promql}) as resp:
        answer = await resp.json()
    assert answer["status"] == "success", answer
    return {r["metric"].get("state", ""): float(r["value"][1]) for r in answer["data"]["result"]}


async def test_two_replicas_export_the_true_shared_count_and_the_dashboard_shows_it_once(tmp_path, redis_url, llm):
    from tests.oversight_world import TOOLS, ToolThenText

    tools = ToolThenText()  # a model that asks for delete_note, which needs a reviewer's confirmation
    await tools.start()
    keys = shared_keys(tmp_path)
    started = await asyncio.gather(*[Replica.start(name, tmp_path, keys, redis_url, tick=0.2) for name in "ab"],
                                   return_exceptions=True)
    replicas = [r for r in started if isinstance(r, Replica)]
    prometheus = None
    held = None
    try:
        for failed in started:
            if isinstance(failed, BaseException):
                raise failed
        a, b = replicas
        active, token = await _open(a, "served by both")
        for replica in (a, b, a):
            assert (await replica.chat(llm.url, token)).status_code == 200
        halted, token = await _open(b, "halted on B")
        assert (await a.chat(llm.url, token)).status_code == 200
        assert (await b.chat(llm.url, token, **UNFITTABLE)).status_code in (403, 429)
        ended, token = await _open(a, "ended on B")
        assert (await b.chat(llm.url, token)).status_code == 200
        assert (await a.chat(llm.url, token)).status_code == 200
        assert (await b.control.post(f"/v1/sessions/{ended}/end")).status_code == 200
        paused, token = await _open(a, "held on B")
        assert (await a.chat(llm.url, token)).status_code == 200
        body = {"model": "gpt-4o-mini", "max_tokens": 100, "tools": TOOLS,
                "messages": [{"role": "user", "content": "tidy the notes"}]}
        held = asyncio.ensure_future(b.agent.post(f"{tools.base_url}/v1/chat/completions",
                                                  headers={"ADL-Session": token}, json=body))
        for _ in range(100):  # B holds the step (A lists it)
            approvals = (await a.control.get("/v1/approvals")).json()["approvals"]
            if any(v["session"] == paused for v in approvals) or held.done():
                break
            await asyncio.sleep(0.1)
        assert not held.done(), held.result().text
        # hostile: members forged into the store's indexes (the listing refuses them) are not counted
        server = redis.Redis.from_url(redis_url, decode_responses=True)
        server.zadd("governor:ids", {"forged-in-index": 0})
        server.hset("governor:act", mapping={"forged-no-chain": time.time(), "forged-bad-state": time.time(),
                                             "forged-other-state": time.time()})
        server.hset("governor:chh:forged-bad-state", mapping={"len": 3, "hash": "x"})
        server.set("governor:st:forged-bad-state", "{not a state")
        server.hset("governor:chh:forged-other-state", mapping={"len": 3, "hash": "x"})
        server.set("governor:st:forged-other-state", server.get(f"governor:st:{active}"))  # another session's
        server.close()

        listed = {v["session"]: v["state"] for v in (await b.control.get("/v1/sessions")).json()["sessions"]}
        assert listed == {active: "active", halted: "halted", ended: "ended", paused: "paused"}, listed
        truth = {state: float(list(listed.values()).count(state)) for state in STATES}
        seen = await _scraped_until(replicas, truth)
        assert seen == [truth, truth], seen
        # what each replica holds by itself: the session both served is in both
        local = [await _samples(replica, "governor_sessions") for replica in replicas]
        assert sum(counts["active"] for counts in local) >= 2, local

        if PROMETHEUS is None:
            pytest.skip("prometheus not installed (apt-get install prometheus): the dashboard's query not evaluated")
        targets = ", ".join(f"'{replica.control_url.split('//', 1)[1]}'" for replica in replicas)
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs:\n  - job_name: gateway\n    static_configs: [{{targets: [{targets}]}}]\n")
        port = _free_port()
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
        (panel,) = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == "Sessions by state"]
        (expression,) = [target["expr"] for target in panel["targets"]]
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
        shown: dict[str, float] = {}
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                try:
                    up = await _prometheus_query(http, base, 'count(up{job="gateway"} == 1)')
                    if up.get("") == 2:
                        shown = await _prometheus_query(http, base, expression)
                        if shown == truth:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.5)
            assert shown == truth, (shown, truth, (tmp_path / "prometheus.log").read_text()[-2000:])
            # not vacuous: the sum over pods the panel used to show counts the session both served twice
            summed = await _prometheus_query(http, base, "sum by (state) (governor_sessions)")
            assert summed["active"] >= 2 * truth["active"], summed
    finally:
        if held is not None and not held.done():
            answer = await replicas[0].reviewer.get("/v1/approvals")
            for approval in answer.json().get("approvals", []) if answer.status_code == 200 else []:
                await replicas[0].reviewer.post(f"/v1/approvals/{approval['id']}",
                                                json={"decision": "reject", "reviewer": "the gauge's test"})
            await asyncio.wait([held], timeout=20)
        if prometheus is not None:
            prometheus.terminate()
            try:
                prometheus.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prometheus.kill()
                prometheus.wait()
        await asyncio.gather(*[r.stop() for r in replicas])
        await tools.stop()


async def test_a_store_that_cannot_be_read_leaves_the_gauge_without_samples_not_an_old_count(tmp_path, redis_url):
    """Hostile: the index the count starts from replaced by a value of the wrong type. The
    count fails as a store error (logged, no exception out of the sweeper): no samples rather
    than the last count; once the store is readable again, the count is back. Without a store
    that shares sessions the family is there, empty."""
    from tests.proxy_harness import real_governor

    async with real_governor(tmp_path / "redis", store=redis_url) as (running, mock):
        metrics, sweeper = running.runtime.metrics, running.runtime.sweeper
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{mock.base_url}/v1/chat/completions", proxy=running.proxy_url, ssl=False,
                                 headers={"ADL-Session": "gauge-1"},
                                 json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}) as answer:
                assert answer.status == 200, await answer.text()
        metrics.exposition()  # a scrape: the sweeper counts again
        await sweeper.count_shared()
        assert metrics.shared_sessions.counts == {"active": 1, "paused": 0, "halted": 0, "ended": 0}
        server = redis.Redis.from_url(redis_url, decode_responses=True)
        saved = server.hgetall("governor:act")
        server.delete("governor:act")
        server.set("governor:act", "not a hash")
        await sweeper.count_shared()
        assert metrics.shared_sessions.counts is None
        assert "governor_shared_sessions{" not in metrics.exposition().decode()
        server.delete("governor:act")
        server.hset("governor:act", mapping=saved)
        server.close()
        await sweeper.count_shared()
        assert metrics.shared_sessions.counts == {"active": 1, "paused": 0, "halted": 0, "ended": 0}
        assert 'governor_shared_sessions{state="active"} 1.0' in metrics.exposition().decode()
    async with real_governor(tmp_path / "embedded") as (running, _):
        text = running.runtime.metrics.exposition().decode()
        assert "# TYPE governor_shared_sessions gauge" in text and "governor_shared_sessions{" not in text
