"""The shapes of issue 20's finding 3 through the real governor (the real runtime on the
bundled example passport, SQLite state), with an agent's real HTTP client: each model call
the agent slips in another spelling is in its session's token budget and iteration count,
each refused one is nowhere (not upstream, not charged).
"""

from __future__ import annotations

import ssl

import httpx
import pytest

from governor.proxy.server import Settings, serve
from tests.upstreams import Behaviour, MockLLM, make_tls
from tests.proxy_harness import AGENT_NAMED

pytestmark = pytest.mark.asyncio

CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def world(tmp_path):
    tls = make_tls(tmp_path / "tls")
    mock = MockLLM(tls)
    await mock.start()
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp_path / "data",
                                   upstream_ca=tls.ca_file, tick_interval=0))
    agent = httpx.AsyncClient(proxy=running.proxy_url, verify=ssl.create_default_context(cafile=str(running.ca_file)),
                              trust_env=False, timeout=30)
    yield running, mock, agent
    await agent.aclose()
    await running.stop()
    await mock.stop()


async def tokens_and_iterations(running, session: str) -> tuple[float, int]:
    view = await running.runtime.session_view(session)
    if view is None:
        return 0.0, 0
    used = next((b["used"] for b in view["budgets"] if b["dimension"] == "tokens" and b["scope"] == "per_session"), 0.0)
    return used, view["iterations"]


async def test_every_spelling_of_a_model_call_is_charged_to_its_session(world):
    running, mock, agent = world
    mock.default = Behaviour(input_tokens=10, output_tokens=5)
    calls = [
        ("POST", "/v1/chat/completions/", CHAT, {}),
        ("POST", "/V1/CHAT/COMPLETIONS", CHAT, {}),
        ("POST", "/v1/chat%2Fcompletions", CHAT, {}),
        ("POST", "/v1/chat/completions", CHAT, {"content-type": "text/plain"}),
        ("POST", "/v1/completions", {"model": "gpt-4o-mini", "prompt": "hi", "max_tokens": 20}, {}),
        ("POST", "/v1/embeddings", {"model": "gpt-4o-mini", "input": "hi"}, {}),
    ]
    for method, path, body, headers in calls:
        answer = await agent.request(method, f"{mock.base_url}{path}", json=body,
                                     headers={"ADL-Session": "spellings", **headers})
        assert answer.status_code == 200, (path, answer.text)
    used, iterations = await tokens_and_iterations(running, "spellings")
    assert iterations == len(calls)
    assert used == 5 * (10 + 5) + 10  # five calls of 10 in + 5 out, the embeddings' 10 in
    assert len(mock.requests) == len(calls)


async def test_refused_shapes_reach_nothing_and_cost_nothing(world):
    running, mock, agent = world
    for method, path in (("PUT", "/v1/chat/completions"), ("PATCH", "/v1/messages"), ("POST", "/gateway/chat")):
        answer = await agent.request(method, f"{mock.base_url}{path}", json=CHAT, headers={"ADL-Session": "refused"})
        assert answer.status_code in (403, 405), (path, answer.text)
        assert answer.headers["adl-governor-action"] == "deny"
    assert mock.requests == []
    assert await tokens_and_iterations(running, "refused") == (0.0, 0)
