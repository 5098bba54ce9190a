"""The proxy's own refusals are evidence (issue 20: selection refusals recorded), end to end:
an agent's real HTTP through the real proxy and runtime (the bundled example passport,
sessions opened by a principal), records fetched from the control plane and checked by
`governor verify`.

A refusal made before any step was decided (a model call on a path no adapter claims:
403; another method at a model endpoint: 405; a body too large: 413; an encoding the
governor cannot read: 415) goes into the record of the session it belongs to, as an
`on_governor_request_refused` / `fallback` event whose detail says why; one that belongs to no
session is counted (`governor_proxy_refusals_total{reason, recorded="false"}`).
"""

from __future__ import annotations

import gzip
import json

import httpx
import pytest

from governor.cli import main as governor_cli
from governor.demo.mock_llm import MockLLM
from governor.evidence import KeyFiles
from governor.proxy.server import Settings, serve

CONTROL = "control-token-for-refusal-tests-0123456789"
CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
LIMIT = 4096  # max_body_bytes: small, so "too large" is cheap to send


@pytest.fixture
async def llm():
    mock = MockLLM(prompt_tokens=100, completion_tokens=50)
    await mock.start()
    yield mock
    await mock.stop()


@pytest.fixture
async def world(tmp_path, llm):
    running = await serve(Settings(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path / "data",
                                   tick_interval=0, control_token=CONTROL, max_body_bytes=LIMIT,
                                   default_session="on"))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30,
                                headers={"Authorization": f"Bearer {CONTROL}"})
    yield running, llm, agent, control
    await agent.aclose()
    await control.aclose()
    await running.stop()


def hostile_requests(base: str) -> list[tuple[str, dict]]:
    """(expected reason, request) for each refusal at selection; the expected status is the
    reason's."""
    body = json.dumps(CHAT).encode()
    bomb = gzip.compress(json.dumps({**CHAT, "pad": "x" * (LIMIT * 4)}).encode())
    return [
        ("unclaimed_model_call", dict(method="POST", url=f"{base}/gateway/chat", content=body)),
        ("method_not_allowed", dict(method="PUT", url=f"{base}/chat/completions", content=body)),
        ("encoding_unsupported", dict(method="POST", url=f"{base}/chat/completions", content=body,
                                      headers={"content-encoding": "x-hostile"})),
        ("body_too_large", dict(method="POST", url=f"{base}/chat/completions", content=bomb,
                                headers={"content-encoding": "gzip"})),
        ("body_too_large", dict(method="POST", url=f"{base}/chat/completions",
                                content=json.dumps({**CHAT, "pad": "x" * LIMIT}).encode())),
    ]


STATUS = {"unclaimed_model_call": 403, "method_not_allowed": 405, "encoding_unsupported": 415,
          "body_too_large": 413}


async def send_all(agent: httpx.AsyncClient, llm, headers: dict) -> list[str]:
    sent = []
    for reason, request in hostile_requests(llm.url):
        answer = await agent.request(**{**request, "headers": {"content-type": "application/json",
                                                               **request.get("headers", {}), **headers}})
        assert answer.status_code == STATUS[reason], (reason, answer.status_code, answer.text)
        assert answer.headers["adl-governor-action"] == "deny"
        sent.append(reason)
    assert llm.served == 0  # nothing refused reached the upstream
    return sent


def verified(running, record: dict, tmp_path, capsys) -> None:
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    capsys.readouterr()
    keys = KeyFiles(running.settings.data_dir / "keys")
    code = governor_cli(["verify", str(path), "--offline", "--key", str(keys.public_key)])
    out = capsys.readouterr().out
    assert code == 3 and "\nINCOMPLETE" in out and "FAIL " not in out, out  # pinned key: not VALID


def refusal_events(record: dict) -> list[dict]:
    return [e for e in record["events"] if e["cause"] == "on_governor_request_refused"]


async def test_refusals_at_selection_are_recorded_in_the_session_of_their_token(world, tmp_path, capsys):
    running, llm, agent, control = world
    opened = (await control.post("/v1/sessions", json={"label": "hostile"})).json()
    sent = await send_all(agent, llm, {"ADL-Session": opened["token"]})
    answer = await control.get(f"/v1/sessions/{opened['session']}/record")
    assert answer.status_code == 200, answer.text
    record = answer.json()
    verified(running, record, tmp_path, capsys)
    events = refusal_events(record)
    assert [e["detail"]["reason"] for e in events] == sent
    assert all(e["action"] == "fallback" for e in events)
    assert [e["detail"]["status"] for e in events] == [STATUS[r] for r in sent]
    assert events[0]["detail"]["route"] == "/v1/gateway/chat" and events[1]["detail"]["method"] == "PUT"
    metrics = (await control.get("/metrics")).text
    assert 'governor_proxy_refusals_total{reason="body_too_large",recorded="true"} 2.0' in metrics
    # the session goes on: a plain call is served after the refusals
    ok = await agent.post(f"{llm.url}/chat/completions", json=CHAT, headers={"ADL-Session": opened["token"]})
    assert ok.status_code == 200, ok.text


async def test_refusals_of_token_less_requests_are_recorded_in_the_default_session(world, tmp_path, capsys):
    running, llm, agent, control = world
    sent = await send_all(agent, llm, {})
    listed = (await control.get("/v1/sessions")).json()["sessions"]
    assert len(listed) == 1, listed  # the default session, nothing else
    record = (await control.get(f"/v1/sessions/{listed[0]['session']}/record")).json()
    verified(running, record, tmp_path, capsys)
    assert [e["detail"]["reason"] for e in refusal_events(record)] == sent


async def test_a_refusal_that_belongs_to_no_session_is_counted_and_opens_nothing(world):
    running, llm, agent, control = world
    for value in ("invented-by-the-agent", "adls_" + "A" * 32):  # malformed, unknown: no session
        answer = await agent.post(f"{llm.url}/gateway/chat", json=CHAT, headers={"ADL-Session": value})
        assert answer.status_code == 403
        assert answer.json()["error"]["governor"]["refusal"] in ("session_token_malformed", "session_unknown")
    assert (await control.get("/v1/sessions")).json()["sessions"] == []
    metrics = (await control.get("/metrics")).text
    assert 'governor_proxy_refusals_total{reason="unclaimed_model_call",recorded="false"} 2.0' in metrics
    assert llm.served == 0
