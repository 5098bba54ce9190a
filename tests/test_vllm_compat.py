"""vLLM's OpenAI-compatible server: nothing vLLM reads differently from OpenAI escapes the
openai adapter (real proxy, real runtime, the loopback OpenAI mock of tests/upstreams.py).

vLLM's request models are pydantic in lax mode: `"stream": "true"` streams there, so the
governor refuses a `stream` that is not a boolean rather than read it as a plain call; it
reads both `max_tokens` and `max_completion_tokens`, so both are fitted; its
`stream_options.continuous_usage_stats` (usage in every chunk) is charged exactly. Its
pooling endpoints (`/pooling`, `/classify`, `/score`, `/rerank`) are claimed by no adapter:
the model-shaped ones are refused by selection, the rest left to the default-deny rule."""

from __future__ import annotations

import asyncio

import orjson
import pytest
import pytest_asyncio

from governor.adapters import AdapterRegistry, Refusal
from governor.adapters.request_view import RequestView
from tests.compat_harness import http_client, used
from tests.proxy_harness import real_governor
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "gpt-4o-mini"  # a priced name: the example passport caps cost too


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    async with real_governor(tmp_path_factory.mktemp("vllm")) as parts:
        yield parts


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


async def post(env, path: str, body, session: str):
    running, mock = env
    async with http_client(running) as http:
        return await http.post(mock.base_url + path, content=body if isinstance(body, bytes) else orjson.dumps(body),
                               headers={"content-type": "application/json", "ADL-Session": session})


@pytest.mark.parametrize("stream", ["true", 1, "yes"])
async def test_a_stream_flag_that_is_not_a_boolean_is_refused(env, stream):
    running, mock = env
    answer = await post(env, "/v1/chat/completions", {"model": MODEL, "stream": stream,
                                                       "messages": [{"role": "user", "content": "hi"}]}, "vllm-stream")
    assert answer.status_code == 400
    assert "'stream' must be a boolean" in answer.json()["error"]["message"]
    assert mock.requests == []


async def test_max_tokens_and_max_completion_tokens_are_both_fitted(env):
    running, mock = env
    answer = await post(env, "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 50_000, "max_completion_tokens": 40_000, "min_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]}, "vllm-fit")
    assert answer.status_code == 200
    sent = mock.requests[0].body
    fitted = int(answer.headers["ADL-Fitted-Output-Tokens"])
    assert sent["max_tokens"] == sent["max_completion_tokens"] == fitted < 20_000
    assert sent["min_tokens"] == 10


async def test_continuous_usage_stats_are_charged_exactly(env):
    running, mock = env
    mock.script(Behaviour(text="streamed by vllm", chunks=4, input_tokens=30, output_tokens=8, progressive_usage=True))
    answer = await post(env, "/v1/chat/completions", {
        "model": MODEL, "stream": True, "max_tokens": 64,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "messages": [{"role": "user", "content": "hi"}]}, "vllm-usage")
    assert answer.status_code == 200 and answer.text.rstrip().endswith("data: [DONE]")
    assert mock.requests[0].body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    await asyncio.sleep(0.1)
    assert await used(running, "vllm-usage") == 38


@pytest.mark.parametrize("path, body, refused", [
    ("/pooling", {"model": "intfloat/e5-small", "input": "hi"}, True),
    ("/classify", {"model": "jason9693/Qwen2.5-1.5B-apeach", "input": ["hi"]}, True),
    ("/v1/score", {"model": "BAAI/bge-reranker-v2-m3", "text_1": "a", "text_2": "b"}, False),
    ("/v1/rerank", {"model": "BAAI/bge-reranker-v2-m3", "query": "a", "documents": ["b"]}, False),
    ("/tokenize", {"model": "m", "prompt": "hi"}, True),
])
async def test_the_pooling_endpoints_are_claimed_by_no_adapter(path, body, refused):
    registry = AdapterRegistry.default()
    selected = registry.select(RequestView("POST", "vllm.internal", path, {"content-type": "application/json"},
                                           orjson.dumps(body)))
    # model-shaped bodies ('model' with 'input' or 'prompt') are refused here; the others are
    # unknown traffic, which the default-deny rule refuses
    assert isinstance(selected, Refusal) if refused else selected is None
