"""What the proxy buffers of one body is bounded (issue 20, hostile agent and upstream): the
real proxy and runtime, an agent's real HTTP client, the mock upstream.

mitmproxy reads every request body, and every answer the governor reads whole, into memory
before the governor sees it. Without a bound, one request (or one plain answer) of any size
was held whole: a hostile agent uploading gigabytes, or an upstream answering with them, ran
the governor out of memory. The bound is max(max_body_bytes, max_response_bytes): nothing the
governor reads is larger. Past it mitmproxy refuses the body (413 to the agent for a request,
502 for an answer) without reading the rest. Streams are relayed, not buffered, so not bound.
"""

from __future__ import annotations

import pytest

from governor.adapters import AllowEntry
from tests.proxy_harness import agent_named_world
from tests.upstreams import Behaviour

MIB = 1024 * 1024
CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def world(tmp_path):
    # the uploads path spends nothing: the operator's allow-list lets it through (default deny)
    async with agent_named_world(tmp_path, max_body_bytes=1 * MIB, max_response_bytes=2 * MIB,
                                 allow=(AllowEntry.parse("127.0.0.1/uploads/**"),)) as world:
        yield world


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_request_body_past_the_bound_is_refused_and_never_forwarded(world, chunked):
    running, mock, agent = world
    body = b"u" * (3 * MIB)  # an upload to an allowed path no adapter governs: forwarded when small enough

    async def pieces():
        for start in range(0, len(body), 64 * 1024):
            yield body[start:start + 64 * 1024]

    answer = await agent.post(f"{mock.base_url}/uploads/blob", content=pieces() if chunked else body,
                              headers={"content-type": "application/octet-stream", "ADL-Session": "big"})
    assert answer.status_code == 413, answer.text
    assert not any(r.path == "/uploads/blob" for r in mock.requests)
    small = await agent.post(f"{mock.base_url}/uploads/blob", content=b"u" * MIB,
                             headers={"content-type": "application/octet-stream", "ADL-Session": "big"})
    assert small.status_code == 200  # within the bound: allowed traffic passes


async def test_a_plain_answer_past_the_bound_is_refused_with_a_502(world):
    running, mock, agent = world
    mock.default = Behaviour(text="y" * (3 * MIB))
    answer = await agent.post(f"{mock.base_url}/v1/chat/completions", json=CHAT, headers={"ADL-Session": "flood"})
    assert answer.status_code == 502, answer.text[:200]
    assert b"y" * 1024 not in answer.content
    mock.default = Behaviour(text="fine")
    ok = await agent.post(f"{mock.base_url}/v1/chat/completions", json=CHAT, headers={"ADL-Session": "flood"})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "fine"
