"""What the proxy says about an exchange, through the real proxy: who answered.

The error a finished step carries (the runtime logs it) names the upstream only
when the upstream answered so; a refusal the governor made says it was the governor's.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from governor.policy.steps import ON_ITERATION_LIMIT, Action, Decision, ToolCall
from tests.proxy_harness import RawClient, scripted_env
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = "/v1/chat/completions"


env = scripted_env("messages")


async def post(running, mock, session: str) -> tuple[int, bytes]:
    client = await asyncio.to_thread(RawClient, running.proxy_address, running.ca_file, ("127.0.0.1", mock.port))
    try:
        body = orjson.dumps({"model": "gpt-test", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]})
        await asyncio.to_thread(client.send, "POST", CHAT, body, {"ADL-Session": session})
        status, _, received = await asyncio.to_thread(client.read_response)
        return status, received
    finally:
        client.close()


def errors_of(runtime, session: str) -> list[str | None]:
    return [error for s, _, error in runtime.finished if s == session]


async def test_a_refusal_of_an_upstream_200_is_not_logged_as_the_upstreams(env):
    running, mock, runtime = env
    mock.reset()
    runtime.rules.append((lambda s, step: isinstance(step, ToolCall) and step.tool == "delete_file",
                          lambda s, step: Decision(action=Action.HALT, cause=ON_ITERATION_LIMIT,
                                                   details={"tool": step.tool})))
    mock.script(Behaviour(tool_calls=(("delete_file", {"path": "/tmp/x"}),)))
    status, body = await post(running, mock, "refused")
    assert status == 429 and orjson.loads(body)["error"]["governor"]["cause"] == ON_ITERATION_LIMIT
    await runtime.wait_for(lambda: errors_of(runtime, "refused"))
    errors = [e for e in errors_of(runtime, "refused") if e]
    assert errors == ["upstream answered 200, governor refused it with 429 (on_iteration_limit)"]
    runtime.rules.clear()


async def test_an_upstream_429_is_logged_as_the_upstreams(env):
    running, mock, runtime = env
    mock.reset()
    mock.script(Behaviour(status=429))
    status, body = await post(running, mock, "upstream-429")
    assert status == 429 and "governor" not in orjson.loads(body).get("error", {})
    await runtime.wait_for(lambda: errors_of(runtime, "upstream-429"))
    assert errors_of(runtime, "upstream-429") == ["upstream answered 429"]
