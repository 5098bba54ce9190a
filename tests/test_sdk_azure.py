"""The official `openai.AzureOpenAI` client through the real proxy on the real runtime (the
example passport: 20000 tokens and 0.5 USD per session), against a loopback upstream that
answers as Azure OpenAI does (tests/compat_upstreams.py): deployment paths with the
`api-version` query and the `api-key` header, `prompt_filter_results` and
`content_filter_results` in answers and chunks, a stream's first chunk with empty `choices`,
`id` and `model`; and the v1 API (`/openai/v1/...`, the body's model a deployment).

A deployment is priced as the model the config's `deployments` maps it to, else as its own
name (a deployment named after its model is priced as that model); an unpriced one is
refused under the cost cap with a message saying how to price it."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from governor.runtime.prices import price_book
from governor.policy import load_pricing
from tests.compat_harness import client_environment, compat_governor, events, used, verified_record
from tests.compat_upstreams import REAL_MODEL, Answer
from tests.proxy_harness import run_python

pytestmark = pytest.mark.asyncio(loop_scope="module")

API_VERSION = "2024-10-21"
PRELUDE = f"""
import json, os, openai
def azure(session):
    return openai.AzureOpenAI(azure_endpoint=os.environ["AZURE_TARGET"], api_key="azure-key",
        api_version="{API_VERSION}", max_retries=0, default_headers={{"ADL-Session": session}})
def v1(session):
    return openai.OpenAI(base_url=os.environ["AZURE_TARGET"] + "/openai/v1/", api_key="azure-key", max_retries=0,
        default_headers={{"api-key": "azure-key", "ADL-Session": session}})
out = {{}}
def record(name, fn):
    try:
        out[name] = fn()
    except openai.APIStatusError as e:
        out[name] = {{"raised": type(e).__name__, "status": e.status_code, "message": e.message, "body": e.body}}
    except openai.APIError as e:
        out[name] = {{"raised": type(e).__name__, "message": e.message, "body": e.body}}
msgs = [{{"role": "user", "content": "hi"}}]
"""
TOOLS = """[{"type": "function", "function": {"name": "search_papers", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object"}}}]"""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sdk-azure")
    async with compat_governor(tmp, deployments={"chat-prod": "gpt-4o-mini"}) as (running, upstream):
        environment = {**client_environment(running), "AZURE_TARGET": upstream.base_url}
        yield running, upstream, environment, tmp


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


def price(running, input_tokens: int, output_tokens: int) -> float:
    return price_book(running.settings.pricing).cost(REAL_MODEL, input_tokens, output_tokens)


async def test_chat_plain_and_streamed_on_a_deployment_path(env):
    running, upstream, environment, tmp = env
    upstream.script(Answer(text="plain", input_tokens=31, output_tokens=12,
                           tool_calls=(("search_papers", {"query": "agents"}),)),
                    Answer(text="a streamed answer", chunks=3, input_tokens=23, output_tokens=9))
    code = PRELUDE + f"""
c = azure("azure-chat")
tools = {TOOLS}
def plain():
    r = c.chat.completions.create(model="gpt-4o-mini-prod", messages=msgs, tools=tools, max_tokens=64)
    return {{"text": r.choices[0].message.content, "tool": r.choices[0].message.tool_calls[0].function.name,
             "model": r.model, "usage": r.usage.total_tokens}}
def streamed():
    chunks = list(c.chat.completions.create(model="gpt-4o-mini-prod", messages=msgs, stream=True, max_tokens=64))
    return {{"text": "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices),
             "first_choices": len(chunks[0].choices), "usage": chunks[-1].usage.total_tokens}}
record("plain", plain)
record("streamed", streamed)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    assert out["plain"] == {"text": "plain", "tool": "search_papers", "model": REAL_MODEL, "usage": 43}, out
    # the first chunk (prompt_filter_results, no choices) reached the client as Azure sent it
    assert out["streamed"] == {"text": "a streamed answer", "first_choices": 0, "usage": 32}, out
    for seen in upstream.requests:
        assert seen.path == "/openai/deployments/gpt-4o-mini-prod/chat/completions"
        assert seen.query == {"api-version": API_VERSION} and seen.headers["api-key"] == "azure-key"
        assert not any(h.lower().startswith("adl-") for h in seen.headers)
    assert [t["function"]["name"] for t in upstream.requests[0].body["tools"]] == ["search_papers"]  # run_shell withheld
    assert upstream.requests[1].body["stream_options"] == {"include_usage": True}
    await asyncio.sleep(0.1)
    assert await used(running, "azure-chat") == 43 + 32
    # charged at the price of the model the answers name (the stream's empty first model is not taken)
    assert await used(running, "azure-chat", "cost_usd") == pytest.approx(price(running, 31, 12) + price(running, 23, 9))
    record = await verified_record(running, "azure-chat", tmp)
    assert [cause for cause, _ in events(record) if cause != "on_anomaly"] == ["on_governor_tools_withheld"]


async def test_a_mapped_deployment_is_priced_as_its_model_and_an_unpriced_one_refused(env):
    running, upstream, environment, tmp = env
    upstream.script(Answer(input_tokens=40, output_tokens=10), Answer(input_tokens=20, output_tokens=5, chunks=2))
    code = PRELUDE + """
c = azure("azure-mapped")
record("mapped", lambda: c.chat.completions.create(model="chat-prod", messages=msgs, max_tokens=32).usage.total_tokens)
def streamed():
    return [ch.usage.total_tokens for ch in c.chat.completions.create(model="chat-prod", messages=msgs, stream=True,
            stream_options={"include_usage": True}) if ch.usage][-1]
record("mapped_stream", streamed)
record("unpriced", lambda: azure("azure-unpriced").chat.completions.create(model="mystery", messages=msgs).id)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    assert out["mapped"] == 50 and out["mapped_stream"] == 25, out
    assert upstream.requests[0].path == "/openai/deployments/chat-prod/chat/completions"
    await asyncio.sleep(0.1)
    assert await used(running, "azure-mapped", "cost_usd") == pytest.approx(price(running, 40, 10) + price(running, 20, 5))
    refused = out["unpriced"]
    assert refused["raised"] == "RateLimitError" and refused["status"] == 429, refused
    assert "'mystery' has no price" in refused["message"] and "`deployments`" in refused["message"], refused
    assert refused["body"]["governor"]["reason"] == "unpriced_model"
    assert len(upstream.requests) == 2


async def test_completions_embeddings_and_the_v1_api(env):
    running, upstream, environment, tmp = env
    upstream.script(Answer(text="done", input_tokens=5, output_tokens=2), Answer(input_tokens=3),
                    Answer(text="v1 chat", input_tokens=7, output_tokens=3),
                    Answer(text="v1 response", input_tokens=9, output_tokens=4))
    code = PRELUDE + """
c = azure("azure-more")
record("completion", lambda: c.completions.create(model="gpt-35-turbo-instruct", prompt="hi", max_tokens=8).choices[0].text)
record("embedding", lambda: len(c.embeddings.create(model="text-embedding-3-small", input="hi").data[0].embedding))
record("v1_chat", lambda: v1("azure-more").chat.completions.create(model="gpt-4o-mini-prod", messages=msgs,
                                                                  max_tokens=16).choices[0].message.content)
record("v1_responses", lambda: v1("azure-more").responses.create(model="gpt-4o-mini-prod", input="hi",
                                                                max_output_tokens=16).output_text)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    assert out == {"completion": "done", "embedding": 2, "v1_chat": "v1 chat", "v1_responses": "v1 response"}, out
    assert [r.path for r in upstream.requests] == [
        "/openai/deployments/gpt-35-turbo-instruct/completions", "/openai/deployments/text-embedding-3-small/embeddings",
        "/openai/v1/chat/completions", "/openai/v1/responses"]
    assert await used(running, "azure-more") == 7 + 3 + 10 + 13


async def test_the_cap_refuses_with_a_readable_error_and_the_record_verifies(env):
    running, upstream, environment, tmp = env
    code = PRELUDE + """
c = azure("azure-capped")
record("big", lambda: c.chat.completions.create(model="gpt-4o-mini-prod", messages=msgs, max_tokens=30000, n=100).id)
record("after", lambda: c.chat.completions.create(model="gpt-4o-mini-prod", messages=msgs, max_tokens=10).id)
print(json.dumps(out))
"""
    out = await run_python(code, environment)
    big, after = out["big"], out["after"]
    assert big["raised"] == "RateLimitError" and big["status"] == 429, big
    assert "governor: halt (on_budget_exhausted)" in big["message"] and "limit 20000" in big["message"]
    assert big["body"]["governor"]["cause"] == "on_budget_exhausted"
    assert after["status"] == 429 and "halted" in after["message"], after
    assert upstream.requests == []
    record = await verified_record(running, "azure-capped", tmp)
    assert ("on_budget_exhausted", "halt") in events(record)
