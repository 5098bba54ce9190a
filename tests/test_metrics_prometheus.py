"""The governor's /metrics scraped by a real Prometheus (Debian's), read back through its
HTTP API, and linted by `promtool check metrics`.

Needs the `prometheus` and `promtool` binaries (`.ci/dev test` installs Debian's package
when it can); the tests skip with that reason where they are missing."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time

import aiohttp
import orjson
import pytest

from governor.proxy.server import Settings, serve
from tests.proxy_harness import AGENT_NAMED, RawClient
from tests.upstreams import Behaviour, MockLLM, make_tls

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                      reason="prometheus/promtool not installed (apt-get install prometheus)")
CHAT = "/v1/chat/completions"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send(running, mock, headers: dict[str, str], max_tokens: int = 50, answers: int = 1) -> int:
    client = RawClient(running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
    try:
        body = {"model": "gpt-4o-mini", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
        if answers > 1:
            body["n"] = answers
        client.send("POST", CHAT, orjson.dumps(body), headers)
        return client.read_response()[0]
    finally:
        client.close()


async def _query(http: aiohttp.ClientSession, base: str, promql: str, deadline: float) -> list[dict]:
    """The query's result once it is non-empty (Prometheus has scraped), else [] at the deadline."""
    while True:
        async with http.get(f"{base}/api/v1/query", params={"query": promql}) as resp:
            answer = await resp.json()
        assert answer["status"] == "success", answer
        if answer["data"]["result"] or time.monotonic() > deadline:
            return answer["data"]["result"]
        await asyncio.sleep(0.5)


@needs_prometheus
@pytest.mark.asyncio
async def test_a_real_prometheus_scrapes_the_governor_and_promtool_accepts_the_scrape(tmp_path):
    tls = make_tls(tmp_path / "tls")
    mock = MockLLM(tls)
    await mock.start()
    settings = Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path / "data",
                        upstream_ca=tls.ca_file)
    running = await serve(settings)
    prometheus = None
    try:
        assert await asyncio.to_thread(_send, running, mock, {"ADL-Session": "ok"}) == 200
        # a persona the passport does not declare: never a label value
        assert await asyncio.to_thread(_send, running, mock, {"ADL-Session": "p", "ADL-Persona": "intruder"}) == 200
        # refused: more output than the session's whole token budget (20,000)
        assert await asyncio.to_thread(_send, running, mock, {"ADL-Session": "big"}, 50_000, 100) in (403, 429)
        mock.script(Behaviour(status=503))
        assert await asyncio.to_thread(_send, running, mock, {"ADL-Session": "ok"}) == 503

        host, port = running.control_address
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: governor\n    static_configs: [{{targets: ['{host}:{port}']}}]\n")
        web_port = _free_port()
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{web_port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
        base = f"http://127.0.0.1:{web_port}"
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as http:
            while True:  # ready within the deadline
                try:
                    async with http.get(f"{base}/-/ready") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()
                assert time.monotonic() < deadline, "prometheus not ready within 60 s"
                await asyncio.sleep(0.3)
            up = await _query(http, base, 'up{job="governor"} == 1', deadline)
            assert up, "prometheus never scraped the governor: " + (tmp_path / "prometheus.log").read_text()[-2000:]
            refused = await _query(http, base, 'governor_decisions_total{cause="on_budget_exhausted"}', deadline)
            assert [(r["metric"]["action"], r["value"][1]) for r in refused] == [("halt", "1")], refused
            # the undeclared persona's call went on, labelled by its (closed) cause
            sub_agent = await _query(http, base, 'governor_decisions_total{cause="on_sub_agent_denied"}', deadline)
            assert sub_agent, "the undeclared persona's decision was not counted"
            permitted = await _query(http, base, 'governor_decisions_total{cause="none",action="permit"}', deadline)
            assert float(permitted[0]["value"][1]) >= 2
            info = await _query(http, base, "governor_build_info", deadline)
            assert len(info) == 1 and info[0]["metric"]["passport_digest"] == running.runtime.limits.passport_digest
            errors = await _query(http, base, 'governor_upstream_errors_total{code="503",protocol="openai"}', deadline)
            assert [float(r["value"][1]) for r in errors] == [1.0]
            sessions = await _query(http, base, 'governor_sessions{state="active"}', deadline)
            assert float(sessions[0]["value"][1]) >= 2
            rss = await _query(http, base, 'process_resident_memory_bytes{job="governor"}', deadline)
            assert float(rss[0]["value"][1]) > 1e6
            # no series carries the agent's session or persona names
            leaked = await _query(http, base, '{job="governor", session=~".+"} or {job="governor", persona="intruder"}',
                                  time.monotonic())
            assert leaked == []
            async with http.get(f"http://{host}:{port}/metrics") as resp:
                scrape = await resp.read()
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=scrape, capture_output=True, timeout=60)
        assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
    finally:
        if prometheus is not None:
            prometheus.terminate()
            try:
                prometheus.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prometheus.kill()
                prometheus.wait()
        await running.stop()
        await mock.stop()
