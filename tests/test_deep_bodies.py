"""A request body nested past what the governor can re-serialize (issue #32 item 8: 256 to
1,023 levels crashed the rewrite of an admitted request, answered 503 with nothing recorded):
a 400 in the provider's format before any step is admitted, recorded in its session; a body
just within the bound is governed as usual. Real HTTP through the real proxy and runtime."""

from __future__ import annotations

import json

import httpx
import pytest

from governor.adapters.shapes import MAX_NESTING, TOO_DEEP
from governor.demo.mock_llm import MockLLM
from governor.proxy.server import Settings, serve

CONTROL = "control-token-for-deep-body-tests-0123456789"


def chat_nested(depth: int, opener: str = "[") -> bytes:
    closer = "]" if opener == "[" else "}"
    inner = "0" if opener == "[" else '{"k": 0}'
    nested = (opener if opener == "[" else '{"k": ') * depth + inner + closer * depth
    return ('{"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}], '
            f'"metadata": {{"deep": {nested}}}}}').encode()


@pytest.fixture
async def world(tmp_path):
    llm = MockLLM(prompt_tokens=10, completion_tokens=5)
    await llm.start()
    running = await serve(Settings(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path / "data",
                                   tick_interval=0, control_token=CONTROL))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30,
                                headers={"Authorization": f"Bearer {CONTROL}"})
    yield llm, agent, control
    await agent.aclose()
    await control.aclose()
    await running.stop()
    await llm.stop()


@pytest.mark.parametrize(("depth", "opener"), [(256, "["), (300, "{"), (700, "["), (1021, "["), (1100, "[")])
async def test_a_body_nested_too_deep_is_a_400_before_any_work_and_recorded(world, depth, opener):
    llm, agent, control = world
    session = (await control.post("/v1/sessions", json={})).json()
    answer = await agent.post(f"{llm.url}/chat/completions", content=chat_nested(depth, opener),
                              headers={"ADL-Session": session["token"], "content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert TOO_DEEP in message or "not valid JSON" in message or "lenient" in message, message
    assert llm.served == 0
    record = (await control.get(f"/v1/sessions/{session['session']}/record")).json()
    refused = [e for e in record["events"] if e["cause"] == "on_governor_request_refused"]
    assert len(refused) == 1 and refused[0]["detail"]["status"] == 400
    assert not [e for e in record["events"] if e["cause"] not in ("on_governor_request_refused",)]  # no step admitted


async def test_a_body_within_the_bound_is_governed_as_usual(world):
    llm, agent, control = world
    session = (await control.post("/v1/sessions", json={})).json()
    body = chat_nested(MAX_NESTING - 4)  # the whole document stays within the bound
    json.loads(body)
    answer = await agent.post(f"{llm.url}/chat/completions", content=body,
                              headers={"ADL-Session": session["token"], "content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert llm.served == 1
