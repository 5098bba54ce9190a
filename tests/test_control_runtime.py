"""The control plane over real HTTP in front of the REAL runtime: readiness, session
views, nonce-bound records that pass the offline verifier (§8.5/§8.6), the final
record at session end, and the metrics the runtime feeds."""

from __future__ import annotations

from datetime import datetime, timezone

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from governor.control import ControlContext, control_url, create_app, start_control
from governor.evidence import verify_record
from governor.runtime.metrics import Metrics
from governor.policy.steps import ToolCall
from governor.runtime.core import Runtime
from tests.control_harness import real_runtime

PASSPORT = {
    "adl_spec": "0.4.0", "name": "notes-agent", "description": "keeps research notes", "version": "1.0.0",
    "id": "https://example.com/agents/notes-agent", "data_classification": {"sensitivity": "internal"},
    "lifecycle": {"status": "active"},
    "tools": [{"name": "read_note", "description": "read a note",
               "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}],
    "permissions": {"resource_limits": {"budget": {"tokens": {"per_session": 5000, "per_day": 50000}}}},
}


@pytest.fixture
async def world(tmp_path):
    metrics = Metrics()
    runtime, passport = real_runtime(PASSPORT, tmp_path, metrics=metrics)
    app = create_app(ControlContext.build(runtime, reviewer_tokens=["reviewer-token-abcdefghijklmnop"], metrics=metrics,
                                          nonce_ttl=60))
    runner = await start_control(app, "127.0.0.1", 0)
    http = aiohttp.ClientSession()
    try:
        yield runtime, passport, control_url(runner), http, metrics
    finally:
        await http.close()
        await runner.cleanup()
        await runtime.close()


async def _step(runtime: Runtime, session: str, tool: str) -> None:
    admission = await runtime.admit(session, ToolCall(tool=tool, arguments={"path": "/n.md"}, target_path="/n.md"))
    await runtime.finish(session, admission.ticket)


async def test_ready_with_the_pinned_passport(world):
    runtime, passport, url, http, _ = world
    async with http.get(f"{url}/readyz") as resp:
        body = await resp.json()
    assert resp.status == 200 and body["ready"] is True and body["passport_digest"] == runtime.limits.passport_digest


async def test_session_view_and_a_nonce_bound_record_that_verifies(world):
    runtime, passport, url, http, metrics = world
    await _step(runtime, "s1", "read_note")
    await _step(runtime, "s1", "shell")  # undeclared: refused, recorded, session halted
    async with http.get(f"{url}/v1/sessions/s1") as resp:
        view = await resp.json()
    assert view["state"] == "halted" and view["tool_calls"] == 1
    issued_at = datetime.now(timezone.utc)
    async with http.post(f"{url}/v1/nonces") as resp:
        nonce = (await resp.json())["nonce"]
    async with http.get(f"{url}/v1/sessions/s1/record", params={"nonce": nonce}) as resp:
        assert resp.status == 200
        record = await resp.json()
    report = verify_record(record, public_key=runtime.key.public_key(), passport=passport, expected_nonce=nonce,
                           nonce_issued_at=issued_at, nonce_ttl=60)
    assert report.ok, report.summary()
    assert record["nonce"] == nonce and record["outcome"] == "halted"
    assert any(e["detail"].get("tool") == "shell" for e in record["events"])
    async with http.get(f"{url}/v1/sessions/s1/record", params={"nonce": nonce}) as resp:
        assert resp.status == 409
    # Tampering with the bound nonce breaks the signature.
    record["nonce"] = "A" * 24
    assert not verify_record(record, public_key=runtime.key.public_key(), passport=passport).ok


async def test_ending_a_session_returns_its_final_record_and_metrics_follow(world):
    runtime, passport, url, http, metrics = world
    await _step(runtime, "s2", "read_note")
    async with http.get(f"{url}/v1/sessions/s2") as resp:  # the view refreshes the budget gauges
        assert resp.status == 200
    text = (await (await http.get(f"{url}/metrics")).read()).decode()
    budgets = {tuple(sorted(s.labels.items())) for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "governor_budget_used_tokens"}
    assert (("persona", ""), ("scope", "per_session")) in budgets  # the highest among live sessions
    async with http.post(f"{url}/v1/sessions/s2/end") as resp:
        assert resp.status == 200
        final = await resp.json()
    assert final["outcome"] == "completed" and "nonce" not in final
    assert verify_record(final, public_key=runtime.key.public_key(), passport=passport).ok
    text = (await (await http.get(f"{url}/metrics")).read()).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("governor_records_signed_total", (("kind", "final"), ("nonce", "false")))] == 1
    assert samples[("governor_decisions_total", (("action", "permit"), ("cause", "none"), ("enforced", "true")))] >= 1
    assert ("governor_budget_used_tokens", (("persona", ""), ("scope", "per_session"))) not in samples  # none live
    async with http.get(f"{url}/v1/sessions/nope/record") as resp:
        assert resp.status == 404
