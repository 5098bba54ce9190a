"""Refusals a person can act on, as the official `openai` SDK sees them through the real
proxy on the real runtime (the bundled example passport: tokens 20000 per session,
on_budget_exhausted halt with a declared message; loop window 3, on_detected halt with
a declared message)."""

from __future__ import annotations

import pytest

from governor.adapters.refusals import describe
from tests.proxy_harness import real_sdk_env, run_python
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

PRELUDE = """
import json, openai
client = openai.OpenAI(max_retries=0)
out = {}
def record(name, fn):
    try:
        out[name] = fn()
    except openai.APIStatusError as e:
        out[name] = {"raised": type(e).__name__, "status": e.status_code, "message": e.message, "body": e.body}
"""


env = real_sdk_env("messages-sdk")


async def test_a_loop_halt_names_the_loop_its_tool_count_and_window(env):
    running, mock, sdk_env = env
    mock.reset()
    same = (("search_papers", {"query": "agents"}),)
    mock.script(*[Behaviour(tool_calls=same) for _ in range(3)])
    code = PRELUDE + """
def call():
    r = client.chat.completions.create(model="gpt-4o-mini", max_tokens=64,
        messages=[{"role": "user", "content": "find papers"}], extra_headers={"ADL-Session": "loop"})
    return r.choices[0].message.tool_calls[0].function.name
for i in range(3):
    record(f"call{i}", call)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    assert out["call0"] == out["call1"] == "search_papers"
    refused = out["call2"]
    assert refused["raised"] == "RateLimitError" and refused["status"] == 429, refused
    governor = refused["body"]["governor"]
    assert governor["cause"] == "on_iteration_limit" and governor["loop"] is True
    assert (governor["tool"], governor["repeats_in_window"], governor["window"]) == ("search_papers", 2, 3)
    assert governor["message"] == "The same tool call repeated; stopping the loop."
    assert refused["message"].endswith(describe(governor))
    assert ("loop: search_papers called again with the same arguments after 2 identical calls "
            "in the last 3 tool calls (loop threshold 3)") in refused["message"]
    assert "The same tool call repeated; stopping the loop." in refused["message"]


async def test_a_declared_degradation_message_reaches_the_client(env):
    # 100 answers: fitted, each could have 199 tokens, under the fitting floor (256), so refused
    running, mock, sdk_env = env
    mock.reset()
    code = PRELUDE + """
record("big", lambda: client.chat.completions.create(model="gpt-4o-mini", max_tokens=30000, n=100,
    messages=[{"role": "user", "content": "hello"}], extra_headers={"ADL-Session": "declared"}).id)
print(json.dumps(out))
"""
    out = await run_python(code, sdk_env)
    refused = out["big"]
    assert refused["status"] == 429 and refused["body"]["governor"]["cause"] == "on_budget_exhausted", refused
    assert refused["body"]["governor"]["message"] == "Budget exhausted; the session ends here."
    assert refused["message"].endswith("; Budget exhausted; the session ends here.")
    assert "limit 20000" in refused["message"]
    assert mock.requests == []


async def test_an_unpriced_model_says_how_to_price_it():
    text = describe({"cause": "on_budget_exhausted", "action": "halt", "dimension": "cost", "scope": "per_session",
                     "reason": "unpriced_model", "model": "acme-1", "observed": 0, "limit": 1})
    assert "observed 0 > limit 1" not in text
    assert "model 'acme-1' has no price" in text and "--pricing FILE" in text and "(limit 1 USD)" in text
