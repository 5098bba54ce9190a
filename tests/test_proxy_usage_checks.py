"""Which running usage figures of a stream the proxy asks the runtime about.

A figure within what the model call was admitted with (its reservation) is not
re-judged by the decision point, so the proxy does not ask on every chunk; a figure
past it is asked about at once (and can cut the stream); the final figure always is.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from tests.proxy_harness import RawClient, ScriptedRuntime, scripted_env
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = "/v1/chat/completions"


env = scripted_env("usage-checks")


async def stream(env, session: str, max_tokens: int, behaviour: Behaviour) -> bytes:
    running, mock, runtime = env
    mock.reset()
    mock.script(behaviour)
    body = orjson.dumps({"model": "gpt-test", "stream": True, "max_tokens": max_tokens,
                         "messages": [{"role": "user", "content": "hi"}]})
    c = await asyncio.to_thread(RawClient, running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
    try:
        await asyncio.to_thread(c.send, "POST", CHAT, body, {"ADL-Session": session})
        status, _, received = await asyncio.to_thread(c.read_response)
    finally:
        c.close()
    assert status == 200
    await runtime.wait_for(lambda: runtime.final_usage(session))
    return received


def running_reports(runtime: ScriptedRuntime, session: str) -> list:
    return [r for s, _, r in runtime.usage_reports if s == session and not r.final]


async def test_a_stream_within_its_admission_is_not_rechecked_per_chunk(env):
    _, _, runtime = env
    # 20 chunks of 60 characters in all (~15 tokens), max_tokens 50: never past the reservation
    await stream(env, "within", 50, Behaviour(text="abc" * 20, chunks=20, input_tokens=5, output_tokens=15))
    assert running_reports(runtime, "within") == []
    [final] = runtime.final_usage("within")
    assert (final.input_tokens, final.output_tokens) == (5, 15)
    assert not runtime.open_tickets


async def test_a_stream_past_its_admission_is_checked_while_it_flows(env):
    _, _, runtime = env
    # 400 characters (~100 tokens) against max_tokens 5: the running estimate passes the reservation
    await stream(env, "past", 5, Behaviour(text="x" * 400, chunks=20))
    reports = running_reports(runtime, "past")
    assert reports, "running usage past the admitted expectation must reach the runtime"
    admitted = next(step for s, step in runtime.steps if s == "past")
    assert all(r.output_tokens > admitted.expected_output_tokens or r.input_tokens > admitted.expected_input_tokens
               for r in reports)
    assert not runtime.open_tickets
