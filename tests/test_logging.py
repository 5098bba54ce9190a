"""`governor run --log-format json` and the control plane's access log, on a real child process."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import orjson

from governor.common.logjson import JSONFormatter
from tests.governor_process import GovernorProcess
from tests.proxy_harness import RawClient
from tests.upstreams import MockLLM, make_tls


def _over_budget(proxy, ca_file, port: int) -> int:
    client = RawClient(proxy, ca_file, ("127.0.0.1", port))
    try:
        # 100 answers: even fitted (docs/fitting.md) each would get under the floor, so refused
        body = {"model": "gpt-4o-mini", "max_tokens": 50_000, "n": 100, "messages": [{"role": "user", "content": "hi"}]}
        client.send("POST", "/v1/chat/completions", orjson.dumps(body), {"ADL-Session": 'odd "name"\\n'})
        return client.read_response()[0]
    finally:
        client.close()


async def test_json_logs_one_event_per_line_and_probes_are_not_logged_at_info(tmp_path):
    tls = make_tls(tmp_path / "tls")
    mock = MockLLM(tls)
    await mock.start()
    governor = GovernorProcess(tmp_path / "data", ["--log-format", "json", "--upstream-ca", str(tls.ca_file)])
    await governor.start()
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(3):  # what a kubelet and a Prometheus do all day
                for path in ("/healthz", "/readyz", "/metrics"):
                    async with http.get(governor.control_url + path) as resp:
                        assert resp.status == 200
            # /v1 reads need the control token governor run wrote (docs/sessions.md)
            auth = {"Authorization": f"Bearer {(governor.data_dir / 'control-token').read_text().strip()}"}
            async with http.get(governor.control_url + "/v1/sessions", headers=auth) as resp:
                assert resp.status == 200
            async with http.get(governor.control_url + "/v1/sessions/nope", headers=auth) as resp:
                assert resp.status == 404
        status = await asyncio.to_thread(_over_budget, governor.proxy, governor.ca_file, mock.port)
        assert status in (403, 429)
    finally:
        assert await governor.stop() == 0
        await mock.stop()
    lines = governor.log.read_text().splitlines()
    assert lines, "nothing was logged"
    events = []
    for line in lines:
        event = json.loads(line)  # every line is one JSON event
        assert {"timestamp", "level", "logger", "message"} <= event.keys(), event
        assert event["timestamp"].endswith("Z") and event["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        events.append(event)
    access = [e for e in events if e["logger"] == "governor.control.access"]
    assert {e["path"] for e in access} == {"/v1/sessions", "/v1/sessions/nope"}, access  # no probe, no scrape
    assert {e["status"] for e in access} == {200, 404}
    refused = [e for e in events if e.get("cause") == "on_budget_exhausted"]
    assert refused and refused[0]["session"] == 'odd "name"\\n' and refused[0]["level"] == "INFO"


def test_the_json_formatter_keeps_extras_exceptions_and_one_line():
    logger = logging.getLogger("governor.test")
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        import sys

        record = logger.makeRecord("governor.test", logging.ERROR, __file__, 1, "multi\nline %s", ("x",),
                                   sys.exc_info(), extra={"session": "s1", "when": object()})
    text = JSONFormatter().format(record)
    assert "\n" not in text
    event = json.loads(text)
    assert event["message"] == "multi\nline x" and event["session"] == "s1" and event["logger"] == "governor.test"
    assert "ValueError: bad" in event["exception"] and event["when"].startswith("<object")
