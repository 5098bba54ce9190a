"""The Ollama and TGI adapters alone (no proxy): selection by path, what they reserve, their
fallback answers as the official clients parse them, and their stream watchers fed an
answer cut at every byte."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from ollama import ChatResponse, GenerateResponse

from governor.adapters import AdapterRegistry
from governor.adapters.base import UnreadableAnswer
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.ollama import OllamaAdapter
from governor.adapters.tgi import TGIAdapter
from governor.policy.steps import Action, Decision, ToolCall, UsageReport

GOVERNOR = {"cause": "on_iteration_limit", "action": "fallback"}


def opened(adapter, path: str, body: dict):
    return adapter.open(RequestView("POST", "h", path, {}, orjson.dumps(body)), session="s", persona=None)


@pytest.mark.parametrize("path, name", [
    ("/api/chat", "ollama"), ("/ollama/API/Chat/", "ollama"), ("/api/generate", "ollama"), ("/api/embed", "ollama"),
    ("/api/embeddings", "ollama"), ("/v1/embeddings", "openai"), ("/generate", "tgi"), ("/tgi/generate_stream", "tgi"),
    ("/openai/deployments/d/embeddings", "openai"),
])
def test_selection_by_path(path, name):
    selected = AdapterRegistry.default().select(RequestView("POST", "h", path, {}, b"{}"))
    assert selected.name == name


def test_what_an_ollama_call_reserves():
    adapter = OllamaAdapter()
    chat = opened(adapter, "/api/chat", {"model": "llama3.2", "messages": [], "options": {"num_predict": 300}})
    assert chat.stream is True and chat.state["expected_output"] == 300
    unlimited = opened(adapter, "/api/generate", {"model": "m", "prompt": "hi", "stream": False,
                                                  "options": {"num_predict": -1}})
    assert unlimited.stream is False and unlimited.state["expected_output"] == 4096
    context = opened(adapter, "/api/generate", {"model": "m", "prompt": "", "context": [1] * 5000})
    assert context.state["expected_input"] == 5000  # token ids counted, not estimated from their JSON
    embed = opened(adapter, "/api/embed", {"model": "m", "input": ["a"], "stream": True})
    assert embed.stream is False and embed.state["expected_output"] == 0
    with pytest.raises(BadRequest, match="must be an integer"):
        opened(adapter, "/api/chat", {"model": "m", "options": {"num_predict": 10.5}})


def test_what_a_tgi_call_reserves():
    adapter = TGIAdapter()
    call = opened(adapter, "/generate_stream", {"inputs": "hi", "parameters": {"max_new_tokens": 50, "best_of": 2,
                                                                               "adapter_id": "lora-1"}})
    assert call.stream and call.model == "tgi:lora-1" and call.state["expected_output"] == 100


def test_ollama_fallbacks_parse_as_the_sdk_parses_them():
    adapter = OllamaAdapter()
    decision = Decision(action=Action.FALLBACK, fallback_message="no more calls")
    plain = adapter.fallback_response(opened(adapter, "/api/chat", {"model": "m", "stream": False}), decision, GOVERNOR)
    assert ChatResponse(**orjson.loads(plain.body)).message.content == "no more calls"
    streamed = adapter.fallback_response(opened(adapter, "/api/generate", {"model": "m", "prompt": "x"}), decision,
                                         GOVERNOR)
    assert streamed.headers["content-type"] == "application/x-ndjson"
    parts = [GenerateResponse(**orjson.loads(line)) for line in streamed.body.splitlines()]
    assert "".join(p.response for p in parts) == "no more calls" and parts[-1].done
    embed = adapter.fallback_response(opened(adapter, "/api/embed", {"model": "m", "input": "x"}), decision, GOVERNOR)
    assert embed.status == 403 and "error" in orjson.loads(embed.body)


def test_tgi_fallbacks():
    adapter = TGIAdapter()
    decision = Decision(action=Action.FALLBACK, fallback_message="stop")
    plain = adapter.fallback_response(opened(adapter, "/generate", {"inputs": "x"}), decision, GOVERNOR)
    assert orjson.loads(plain.body)["generated_text"] == "stop"
    streamed = adapter.fallback_response(opened(adapter, "/generate_stream", {"inputs": "x"}), decision, GOVERNOR)
    assert orjson.loads(streamed.body[5:])["generated_text"] == "stop"


STREAM = b"".join(orjson.dumps(line) + b"\n" for line in [
    {"model": "llama3.2", "message": {"role": "assistant", "content": "Hel"}, "done": False},
    {"model": "llama3.2", "message": {"role": "assistant", "content": "lo", "tool_calls": [
        {"function": {"name": "search_papers", "arguments": {"query": "q"}}}]}, "done": False},
    {"model": "llama3.2", "message": {"role": "assistant", "content": ""}, "done": True, "prompt_eval_count": 12,
     "eval_count": 3},
])


@pytest.mark.parametrize("size", [1, 7, 64, len(STREAM)])
def test_the_ollama_watcher_reads_a_stream_however_it_is_cut(size):
    adapter = OllamaAdapter()
    exchange = opened(adapter, "/api/chat", {"model": "llama3.2", "messages": []})
    watcher = adapter.stream_watcher(exchange, 200, {"content-type": "application/x-ndjson"})
    seen = []
    for i in range(0, len(STREAM), size):
        seen += watcher.feed(STREAM[i:i + size])
    seen += watcher.close()
    calls = [e for e in seen if isinstance(e, ToolCall)]
    [final] = [e for e in seen if isinstance(e, UsageReport) and e.final]
    assert [(c.tool, dict(c.arguments)) for c in calls] == [("search_papers", {"query": "q"})]
    assert (final.input_tokens, final.output_tokens, final.model) == (12, 3, "llama3.2")
    with pytest.raises(UnreadableAnswer):
        watcher.feed(b"[1, 2]\n")


def test_a_plain_answer_that_is_not_an_object_is_unreadable():
    for adapter, path, body in ((OllamaAdapter(), "/api/chat", {"model": "m"}), (TGIAdapter(), "/generate",
                                                                                {"inputs": "x"})):
        exchange = opened(adapter, path, body)
        with pytest.raises(UnreadableAnswer):
            adapter.observe_response(exchange, 200, {}, b"[]")
        assert adapter.observe_response(exchange, 500, {}, b"oops").usage is None  # an error answer: nothing used


def test_tgi_counts_from_headers_details_and_candidates():
    adapter = TGIAdapter()
    exchange = opened(adapter, "/generate", {"inputs": "x", "parameters": {"best_of": 2, "details": True}})
    body = orjson.dumps({"generated_text": "ab", "details": {"generated_tokens": 5, "best_of_sequences": [
        {"generated_text": "cd", "generated_tokens": 4}]}})
    usage = adapter.observe_response(exchange, 200, {"x-prompt-tokens": "9", "x-generated-tokens": "5"}, body).usage
    assert (usage.input_tokens, usage.output_tokens, usage.model) == (9, 9, "tgi")
    bad = adapter.observe_response(exchange, 200, {"x-prompt-tokens": "-3", "x-generated-tokens": "1e9"},
                                   orjson.dumps({"generated_text": "abcdefgh"})).usage
    # counts not believed: the input estimated, the output the governor's count of "abcdefgh" (one word)
    assert bad.input_tokens == exchange.state["expected_input"] and bad.output_tokens == 1
    assert (bad.reported_output_tokens, bad.counted_output_tokens) == (None, 1)


def test_the_steps_offer_the_named_tools():
    adapter = OllamaAdapter()
    exchange = opened(adapter, "/api/chat", {"model": "m", "tools": [
        {"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}]})
    [call] = asyncio.run(adapter.steps(exchange))
    assert call.tools_offered == ("a", "b") and call.provider == "ollama" and call.output_floor == 256
    with pytest.raises(BadRequest):
        opened(adapter, "/api/chat", {"model": "m", "tools": [{"type": "function"}]})


def test_azure_deployments_come_from_the_config_file(tmp_path):
    import argparse

    from governor.cli import UsageError
    from governor.cli.run import OPTIONS, resolve
    from governor.proxy.server import build_chain

    config = tmp_path / "governor.yaml"
    args = argparse.Namespace(**{**{name: None for name in OPTIONS}, "config": str(config)})
    config.write_text("deployments:\n  chat-prod: gpt-4o-mini\n")
    settings = resolve(args, {})
    chain, _ = build_chain(settings, object())
    openai = chain.registry.by_name["openai"]
    exchange = opened(openai, "/openai/deployments/chat-prod/chat/completions?api-version=2024-10-21",
                      {"messages": []})
    assert exchange.model == "gpt-4o-mini" and exchange.state["deployment"] == "chat-prod"
    assert opened(openai, "/openai/deployments/other/chat/completions", {"messages": []}).model == "other"
    for bad in ("[a]", "{a: 1}", "{'': b}"):
        config.write_text(f"deployments: {bad}\n")
        with pytest.raises(UsageError, match="deployments must map Azure deployment names"):
            resolve(args, {})


@pytest.mark.parametrize("body", [
    {"Model": "llama3", "messages": []},
    {"model": "llama3", "messages": [], "STREAM": False},
    {"model": "llama3", "messages": [], "options": {"Num_Predict": 100000}},
])
def test_an_ollama_key_in_another_letter_case_is_refused(body):
    """Go's encoding/json (Ollama) reads keys in any case: one the governor would not read is refused."""
    with pytest.raises(BadRequest, match="letter case"):
        opened(OllamaAdapter(), "/api/chat", body)
