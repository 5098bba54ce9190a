"""A hostile ADL-Passport header through the real governor (issue #20 finding 1).

Before: a 560-byte billion-laughs header (base64url of nested YAML aliases) froze the
whole governor: a second session waited 1.8 s at 10^6 expansions, 20 s at 10^7, over
85 s at 10^8, /healthz timed out and memory grew to 1.37 GiB. Now the header is read
within bounds, off the event loop, and refused with a 400 that says why; the refusal
is recorded (the session's integrity fault), and other sessions and /healthz are not
held up.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time

import httpx
import orjson
import pytest

from governor.demo.mock_llm import MockLLM
from governor.passport import load_passport, passport_digest
from governor.passport.resources import example_passport_path
from governor.proxy.presented import MAX_PRESENTED_BYTES
from governor.proxy.server import Settings, serve
from tests.hostile_documents import alias_bomb, header_value, nested_json
from tests.proxy_harness import AGENT_NAMED

ANSWER_BOUND = 3.0  # seconds: a hang bound for each answer, not a speed check
# the honest session shares the machine with 40 hostile requests being admitted and recorded at
# once (4 sessions halted, their journals written): a looser hang bound, still far under the
# 20 s (10^7) and 85 s (10^8) the old code held every request for
BUSY_BOUND = 5.0
MOCK_LLM_USAGE = (10, 5)  # the `llm` fixture (tests/conftest.py)
CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
async def running(tmp_path, llm):
    governor = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path / "data"))
    yield governor
    await governor.stop()


def rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def timed(coro, bound: float = ANSWER_BOUND) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = await asyncio.wait_for(coro, bound)
    return response, time.monotonic() - start


async def chat(client: httpx.AsyncClient, llm: MockLLM, session: str, passport: str | None = None) -> httpx.Response:
    headers = {"ADL-Session": session}
    if passport is not None:
        headers["ADL-Passport"] = passport
    return await client.post(f"{llm.url}/chat/completions", headers=headers, json=CHAT)


def refusal(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    error = orjson.loads(response.content)["error"]
    assert error["message"].startswith("governor: ADL-Passport header refused: ")
    return error


@pytest.mark.parametrize("levels", [6, 7, 8])
async def test_a_billion_laughs_header_is_refused_at_once_and_recorded(running, llm, levels):
    header = header_value(alias_bomb(levels))  # 10^levels expansions
    assert len(header) < 700
    async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30) as agent:
        response, _ = await timed(chat(agent, llm, "bomb", header))
    error = refusal(response)
    assert "YAML anchors (&a0) are not accepted" in error["message"]
    assert error["governor"]["cause"] == "on_governor_session_integrity"  # recorded as a presented, unmatched passport
    assert llm.served == 0
    async with httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30) as control:
        view = (await control.get("/v1/sessions/bomb")).json()
    assert view["state"] == "halted"


async def test_other_sessions_and_healthz_answer_while_bombs_arrive(running, llm):
    bomb = header_value(alias_bomb(8))
    deep = header_value(nested_json(30_000))  # 180 KB before the cap: the size bound answers
    deep_small = header_value(b"[" * 60_000)  # under the cap: the depth bound answers
    before = rss_mib()
    async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30,
                                 limits=httpx.Limits(max_connections=64)) as agent, \
            httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30) as control:
        assert (await chat(agent, llm, "honest")).status_code == 200  # the honest session exists before
        hostile = [asyncio.create_task(chat(agent, llm, f"hostile-{i % 4}", (bomb, deep_small)[i % 2]))
                   for i in range(40)]
        honest_times, health_times = [], []
        for round_ in range(5):
            answer, took = await timed(chat(agent, llm, "honest"), BUSY_BOUND)
            assert answer.status_code == 200, answer.text
            honest_times.append(took)
            health, took = await timed(control.get("/healthz"), BUSY_BOUND)
            assert health.status_code == 200
            health_times.append(took)
        answers = await asyncio.wait_for(asyncio.gather(*hostile), 30)
        oversized = await chat(agent, llm, "hostile-big", deep)
    refused = [a for a in answers if a.status_code == 400]
    busy = [a for a in answers if a.status_code == 503]  # more at once than the reader takes: fail closed
    assert len(refused) + len(busy) == len(answers)
    assert all("being read already" in a.json()["error"]["message"] for a in busy)
    messages = [refusal(a)["message"] for a in refused]
    assert any("YAML anchors" in m for m in messages) and any("nesting deeper than 64 levels" in m for m in messages)
    assert "more than the 65536 bytes" in refusal(oversized)["message"]
    grown = rss_mib() - before
    print(f"{len(refused)} refused (400), {len(busy)} busy (503); honest max {max(honest_times) * 1000:.0f} ms, healthz max {max(health_times) * 1000:.0f} ms, "
          f"rss +{grown:.0f} MiB under 40 hostile headers")
    assert grown < 256  # before: +620 MiB and climbing
    assert llm.served == 6


async def test_the_pinned_passport_presented_whole_still_passes(running, llm):
    document = load_passport(example_passport_path())
    assert passport_digest(document) == running.runtime.limits.passport_digest
    as_yaml = header_value(example_passport_path().read_bytes())
    as_json = header_value(orjson.dumps(document))
    async with httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30) as agent:
        for header in (as_yaml, as_json, as_yaml):  # the third from the cache
            response, _ = await timed(chat(agent, llm, "whole", header))
            assert response.status_code == 200, response.text
        not_base64 = await chat(agent, llm, "junk", "not base64 at all!")
        assert "neither sha256=<digest> nor base64url" in refusal(not_base64)["message"]
        not_a_passport = await chat(agent, llm, "list", header_value(b"- a\n- b\n"))
        assert "must be a JSON object" in refusal(not_a_passport)["message"]
        surrogate = await chat(agent, llm, "surrogate", header_value(b'{"a": "\\ud800"}'))
        assert "lone surrogate" in refusal(surrogate)["message"]  # before: the digest raised, a 503
    assert llm.served == 3


def test_the_cap_is_stated():
    assert MAX_PRESENTED_BYTES == 64 * 1024
    assert len(base64.urlsafe_b64encode(bytes(MAX_PRESENTED_BYTES))) < 90_000
