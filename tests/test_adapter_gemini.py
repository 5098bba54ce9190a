"""The Gemini adapter alone: matching (every spelling a Google front end routes), parsing,
output limits and candidates, tools withheld, answers and streams read (lying, missing and
malformed usage included), errors in Google's format."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.adapters import AdapterRegistry, Refusal
from governor.adapters.base import AdapterConfig
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.counting import count_text
from governor.adapters.fitting import fit_request
from governor.adapters.gemini import GeminiAdapter
from governor.adapters.gemini_answers import GeminiStreamWatcher
from governor.policy.fitting import FITTED_KEY
from governor.policy.steps import Decision, ModelCall, ToolCall, UsageReport

ADAPTER = GeminiAdapter(AdapterConfig(default_output_tokens=1000))
GEN = "/v1beta/models/gemini-2.5-flash:generateContent"
STREAM = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
VERTEX = "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:generateContent"
HI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def view(path: str, body: object, method: str = "POST") -> RequestView:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return RequestView(method, "generativelanguage.googleapis.com", path, {"content-type": "application/json"}, raw)


def open_(path: str, body: object):
    return ADAPTER.open(view(path, body), session="s", persona=None)


@pytest.mark.parametrize("path, model", [
    (GEN, "gemini-2.5-flash"),
    ("/v1/models/gemini-2.0-flash:generateContent", "gemini-2.0-flash"),
    (STREAM, "gemini-2.5-flash"),
    ("/v1beta/models/gemini-2.5-flash:streamGenerateContent", "gemini-2.5-flash"),
    (VERTEX, "gemini-2.5-pro"),
    ("/v1beta1/projects/p/locations/l/publishers/google/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
     "gemini-2.5-flash"),
    ("/v1beta/models/gemini-2.5-flash%3AgenerateContent", "gemini-2.5-flash"),  # the colon percent-encoded
    ("/v1beta/models/gemini-2.5-flash%3agenerateContent", "gemini-2.5-flash"),
    ("/V1BETA/Models/Gemini-2.5-Flash:GENERATECONTENT/", "Gemini-2.5-Flash"),  # case and a trailing slash
    ("/v1beta//models/./gemini-2.5-flash:generateContent", "gemini-2.5-flash"),
    ("/v1beta/models%2Fgemini-2.5-flash:generateContent", "gemini-2.5-flash"),
    ("/v1beta/tunedModels/my-model:generateContent", "my-model"),
    ("/v1beta/models/gemini-2.5-flash:countTokens", "gemini-2.5-flash"),
])
def test_every_spelling_is_claimed_and_the_model_is_the_paths(path, model):
    assert ADAPTER.claims(view(path, HI).match_route)
    registry = AdapterRegistry.default()
    assert registry.select(view(path, HI)).name == "gemini"
    assert open_(path, HI).model == model


@pytest.mark.parametrize("path", [
    "/v1beta/models/gemini-2.5-flash", "/v1beta/models", "/v1beta/models/gemini-2.5-flash:generateContentX",
    "/v1beta/models/gemini-2.5-flash:generate", "/v1/chat/completions", "/v1beta/models/x%253AgenerateContent",
])
def test_other_paths_are_not_claimed(path):
    assert not ADAPTER.claims(view(path, HI).match_route)


def test_another_method_with_a_body_is_refused_in_googles_format_and_a_bodiless_read_is_not_claimed():
    registry = AdapterRegistry.default()
    refusal = registry.select(view(GEN, HI, method="PUT"))
    assert isinstance(refusal, Refusal) and refusal.status == 405 and refusal.adapter.name == "gemini"
    assert registry.select(RequestView("GET", "h", GEN, {}, b"")) is None


@pytest.mark.parametrize("path, body, message", [
    ("/v1beta/models/:generateContent", HI, "names no model"),
    # no model segment: "models" stands where the model would (governed as such; unpriced, so refused
    # under a cost cap), never passed on as unknown traffic
    ("/v1beta/models%3AgenerateContent", HI, None),
    (GEN, b"not json", "not valid JSON"),
    (GEN, b"[1, 2]", "must be a JSON object"),
    (GEN, {}, "'contents' is required"),
    (GEN, {"contents": "hi"}, "'contents' is required"),
    (GEN, {**HI, "generationConfig": []}, "must be an object"),
    (GEN, {**HI, "generationConfig": {"maxOutputTokens": "100"}}, "positive integer"),
    (GEN, {**HI, "generationConfig": {"maxOutputTokens": 0}}, "positive integer"),
    (GEN, {**HI, "generationConfig": {"candidateCount": 2.0}}, "positive integer"),
    (GEN, {**HI, "generationConfig": {"candidateCount": True}}, "positive integer"),
    (GEN, {**HI, "generationConfig": {}, "generation_config": {}}, "the same field twice"),
    (GEN, {**HI, "generationConfig": {"maxOutputTokens": 5, "max_output_tokens": 5000}}, "the same field twice"),
    (GEN, {**HI, "tools": {}}, "'tools' must be an array"),
    (GEN, {**HI, "tools": [{}]}, "non-empty object"),
    (GEN, {**HI, "tools": ["googleSearch"]}, "non-empty object"),
    (GEN, {**HI, "tools": [{"functionDeclarations": [{"description": "no name"}]}]}, "non-empty string 'name'"),
    (GEN, {**HI, "tools": [{"functionDeclarations": [{"name": ""}]}]}, "non-empty string 'name'"),
    (GEN, {**HI, "tools": [{"functionDeclarations": {"name": "x"}}]}, "must be an array"),
    (GEN, {**HI, "tools": [{"functionDeclarations": [], "function_declarations": []}]}, "the same field twice"),
    ("/v1beta/models/e:embedContent", {"contents": []}, "'content' is required"),
    ("/v1beta/models/e:batchEmbedContents", {"requests": {}}, "'requests' is required"),
])
def test_malformed_requests_are_refused_with_a_clear_reason(path, body, message):
    if message is None:
        assert open_(path, body).model == "models"
        return
    with pytest.raises(BadRequest) as refused:
        open_(path, body)
    assert message in refused.value.message


def test_output_limit_and_candidates_make_the_reservation():
    exchange = open_(GEN, {**HI, "generationConfig": {"maxOutputTokens": 300, "candidateCount": 4}})
    step = asyncio.run(ADAPTER.steps(exchange))[0]
    assert isinstance(step, ModelCall) and step.model == "gemini-2.5-flash" and step.provider == "google"
    assert step.expected_output_tokens == 1200 and step.output_choices == 4 and step.output_floor == 256
    snake = open_(GEN, {**HI, "generation_config": {"max_output_tokens": 50, "candidate_count": 2}})
    assert snake.state["expected_output"] == 100
    assert open_(GEN, HI).state["expected_output"] == 1000  # the configured default
    huge = open_(GEN, {**HI, "generationConfig": {"candidateCount": 1_000_000}})
    assert huge.state["expected_output"] == 1000 * 1_000_000  # reserved as asked: no cap can hold it
    count = open_("/v1beta/models/gemini-2.5-flash:countTokens", HI)
    step = asyncio.run(ADAPTER.steps(count))[0]
    assert (step.expected_input_tokens, step.expected_output_tokens, step.output_floor) == (0, 0, None)
    embed = open_("/v1beta/models/gemini-embedding-001:embedContent", {"content": {"parts": [{"text": "x" * 400}]}})
    assert embed.state["expected_output"] == 0 and embed.state["expected_input"] >= 100 and not embed.stream


def _capped_decision(fitted: int | None) -> Decision:
    from governor.policy.steps import CounterCharge
    return Decision(charges=(CounterCharge("per_session", "tokens", 10.0, 20_000.0),),
                    details={FITTED_KEY: fitted} if fitted is not None else None)


def test_fitting_lowers_or_inserts_max_output_tokens_in_generation_config():
    lowered = open_(GEN, {**HI, "generation_config": {"max_output_tokens": 5000, "candidate_count": 2}})
    assert fit_request(lowered, _capped_decision(700))
    assert lowered.body["generation_config"] == {"max_output_tokens": 700, "candidate_count": 2}
    assert lowered.state["expected_output"] == 1400
    inserted = open_(GEN, HI)
    assert fit_request(inserted, _capped_decision(None))
    assert inserted.body["generationConfig"] == {"maxOutputTokens": 1000}
    kept = open_(GEN, {**HI, "generationConfig": {"temperature": 0.1}})
    assert fit_request(kept, _capped_decision(300))
    assert kept.body["generationConfig"] == {"temperature": 0.1, "maxOutputTokens": 300}
    assert not fit_request(open_("/v1beta/models/m:countTokens", HI), _capped_decision(None))


TOOLS = [
    {"functionDeclarations": [{"name": "search_papers"}, {"name": "run_shell"}], "googleSearch": {}},
    {"code_execution": {}},
    {"function_declarations": [{"name": "delete_everything"}]},
]


def test_tools_are_withheld_one_declaration_and_one_built_in_at_a_time():
    body = {**HI, "tools": orjson.loads(orjson.dumps(TOOLS)),
            "toolConfig": {"functionCallingConfig": {"mode": "ANY",
                                                     "allowedFunctionNames": ["run_shell", "search_papers"]}}}
    exchange = open_(GEN, body)
    step = asyncio.run(ADAPTER.steps(exchange))[0]
    assert step.tools_offered == ("search_papers", "run_shell", "googleSearch", "codeExecution", "delete_everything")
    rewritten = ADAPTER.rewrite_request(exchange, Decision(allowed_tools=frozenset({"search_papers", "codeExecution"})))
    sent = orjson.loads(rewritten)
    assert sent["tools"] == [{"functionDeclarations": [{"name": "search_papers"}]}, {"code_execution": {}}]
    assert sent["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["search_papers"]}}
    assert exchange.state["withheld"] == ["run_shell", "googleSearch", "delete_everything"]
    # all withheld: tools and toolConfig go
    exchange = open_(GEN, {**HI, "tools": orjson.loads(orjson.dumps(TOOLS)), "tool_config": {"x": 1}})
    sent = orjson.loads(ADAPTER.rewrite_request(exchange, Decision(allowed_tools=frozenset())))
    assert "tools" not in sent and "tool_config" not in sent
    # nothing withheld: the body goes as sent
    exchange = open_(GEN, {**HI, "tools": [{"functionDeclarations": [{"name": "search_papers"}]}]})
    assert ADAPTER.rewrite_request(exchange, Decision(allowed_tools=frozenset({"search_papers"}))) is None
    assert ADAPTER.rewrite_request(exchange, Decision()) is None  # no restriction


def _answer(text="hello", calls=(), usage=None, finish="STOP"):
    parts = ([{"text": text}] if text else []) + [{"functionCall": {"name": n, "args": a}} for n, a in calls]
    answer = {"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}]}
    if finish:
        answer["candidates"][0]["finishReason"] = finish
    if usage is not None:
        answer["usageMetadata"] = usage
    return answer


USAGE = {"promptTokenCount": 100, "cachedContentTokenCount": 40, "candidatesTokenCount": 20,
         "thoughtsTokenCount": 7, "toolUsePromptTokenCount": 3, "totalTokenCount": 130}


def _observe(body, path=GEN, status=200, request=HI):
    exchange = open_(path, request)
    return exchange, ADAPTER.observe_response(exchange, status, {"content-type": "application/json"},
                                              body if isinstance(body, bytes) else orjson.dumps(body))


def test_plain_usage_and_function_calls():
    _, seen = _observe(_answer(calls=[("search_papers", {"query": "x"})], usage=USAGE))
    assert seen.usage == UsageReport(model="gemini-2.5-flash", input_tokens=103, output_tokens=27,
                                     cached_input_tokens=40)
    assert seen.steps == [ToolCall(tool="search_papers", arguments={"query": "x"}, origin="model")]
    # a JSON-array stream read whole: usage from its elements (the largest figure), calls from each
    _, seen = _observe([_answer("a", usage={"promptTokenCount": 100}, finish=None),
                        _answer("b", calls=[("fetch_paper", {"id": 1})], usage=USAGE)],
                       path="/v1beta/models/gemini-2.5-flash:streamGenerateContent")
    assert (seen.usage.input_tokens, seen.usage.output_tokens) == (103, 27)
    assert [s.tool for s in seen.steps] == ["fetch_paper"]
    _, seen = _observe(_answer(), status=500)
    assert seen.usage is None and not seen.steps
    _, seen = _observe({"totalTokens": 999}, path="/v1beta/models/m:countTokens")
    assert (seen.usage.input_tokens, seen.usage.output_tokens) == (0, 0)  # free, whatever it says
    _, seen = _observe({"embedding": {"values": [0.1]}, "usageMetadata": {"promptTokenCount": 9}},
                       path="/v1beta/models/e:embedContent", request={"content": {"parts": [{"text": "x"}]}})
    assert (seen.usage.input_tokens, seen.usage.output_tokens) == (9, 0)


@pytest.mark.parametrize("usage, inputs, outputs", [
    ({"promptTokenCount": 100, "candidatesTokenCount": 2, "totalTokenCount": 5000}, 100, 4900),  # total says more
    # not counts: read as none, so the input is the request's estimate (never 0 for an unreadable figure)
    ({"promptTokenCount": -5, "candidatesTokenCount": "9999", "totalTokenCount": None}, None, 0),
    ({"promptTokenCount": True, "candidatesTokenCount": 1.5e9, "thoughtsTokenCount": [1]}, None, 0),
    ({"promptTokenCount": 10, "cachedContentTokenCount": 10_000}, 10, 0),  # cached never exceeds the input
])
def test_lying_usage_is_read_as_numbers_and_a_total_the_parts_do_not_explain_is_charged(usage, inputs, outputs):
    exchange, seen = _observe(_answer(text="", usage=usage))
    inputs = exchange.state["expected_input"] if inputs is None else inputs
    assert (seen.usage.input_tokens, seen.usage.output_tokens) == (inputs, outputs)
    assert seen.usage.cached_input_tokens <= seen.usage.input_tokens


def test_missing_usage_charges_the_estimated_input_and_the_output_seen_and_unreadable_the_reservation():
    exchange, seen = _observe(_answer(text="x" * 4000))
    assert seen.usage.input_tokens == exchange.state["expected_input"] > 0
    # the governor's count of the text (adapters.counting): one word, 4000 bytes of at most 128 a token
    assert seen.usage.output_tokens == count_text("x" * 4000) == 32
    assert (seen.usage.reported_output_tokens, seen.usage.counted_output_tokens) == (None, 32)
    for body in (b"not json", b"{\"candidates\": [", b"42", b"\"text\""):
        exchange, seen = _observe(body)
        assert (seen.usage.input_tokens, seen.usage.output_tokens) == (exchange.state["expected_input"], 1000)
    _, seen = _observe([{"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}])
    assert seen.usage is None  # the upstream's own error in a 200: nothing generated


PROSE = "The quick brown fox jumps over the lazy dog. " * 20  # 180 words, 900 bytes


@pytest.mark.parametrize("candidates, charged, said", [
    (200, 200, 200),  # honest (at least the words, below bytes / 4 = 225): charged exactly
    (3, count_text(PROSE) + 1 + 2, 3),  # lying low: the count (the text, the call's name and arguments)
])
def test_plain_and_streamed_output_is_at_least_the_count(candidates, charged, said):
    usage = {"promptTokenCount": 6, "candidatesTokenCount": candidates, "totalTokenCount": 6 + candidates}
    answer = _answer(PROSE, calls=[("search_papers", {"query": "fox dog"})], usage=usage)
    _, seen = _observe(answer)
    assert (seen.usage.input_tokens, seen.usage.output_tokens) == (6, charged)
    assert (seen.usage.reported_output_tokens, seen.usage.counted_output_tokens) == (said, count_text(PROSE) + 3)
    pieces = [_answer(PROSE[i:i + 50], finish=None) for i in range(0, len(PROSE), 50)]
    watcher, events = _watch(_sse(*pieces, _answer("", calls=[("search_papers", {"query": "fox dog"})],
                                                   usage=usage)), [7, 300])
    final = [e for e in events if isinstance(e, UsageReport)][-1]
    assert final.final and (final.input_tokens, final.output_tokens) == (6, charged)
    assert (final.reported_output_tokens, final.counted_output_tokens) == (said, count_text(PROSE) + 3)


def test_a_stream_without_usage_is_charged_the_count_and_the_estimated_input():
    watcher, events = _watch(_sse(_answer(PROSE[:450], finish=None), _answer(PROSE[450:])), [100])
    final = [e for e in events if isinstance(e, UsageReport)][-1]
    assert final.output_tokens == count_text(PROSE) and final.reported_output_tokens is None
    assert final.input_tokens == watcher.exchange.state["expected_input"]


def _sse(*chunks: object, end: bytes = b"\r\n\r\n") -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else orjson.dumps(c)) + end for c in chunks)


STREAMED = _sse(_answer("Hel", usage={"promptTokenCount": 100, "totalTokenCount": 100}, finish=None),
                _answer("lo", usage={"promptTokenCount": 100, "candidatesTokenCount": 1, "totalTokenCount": 101},
                        finish=None),
                _answer("", calls=[("search_papers", {"q": "a"})], usage=USAGE))


def _watch(stream: bytes, cuts: list[int], path: str = STREAM):
    exchange = open_(path, HI)
    watcher = ADAPTER.stream_watcher(exchange, 200, {"content-type": "text/event-stream"})
    events = []
    previous = 0
    for cut in sorted(set(cuts)) + [len(stream)]:
        events += watcher.feed(stream[previous:cut])
        previous = cut
    return watcher, events + watcher.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAMED)), max_size=8))
def test_the_stream_watcher_reads_the_same_stream_however_it_is_cut(cuts):
    watcher, events = _watch(STREAMED, cuts)
    assert [e for e in events if isinstance(e, ToolCall)] == [
        ToolCall(tool="search_papers", arguments={"q": "a"}, origin="model")]
    final = events[-1]
    assert isinstance(final, UsageReport) and final.final
    assert (final.input_tokens, final.output_tokens, final.cached_input_tokens) == (103, 27, 40)


def test_a_stream_whose_last_usage_says_less_is_charged_the_most_it_said():
    stream = _sse(_answer("a" * 40, usage={"promptTokenCount": 100, "candidatesTokenCount": 500}, finish=None),
                  _answer("", usage={"promptTokenCount": 1, "candidatesTokenCount": 1}))
    _, events = _watch(stream, [])
    assert (events[-1].input_tokens, events[-1].output_tokens) == (100, 500)


def test_malformed_and_missing_usage_in_a_stream_still_counts_what_was_relayed():
    stream = _sse(b"{not json", b"[1,2]", b"\xff\xfe", _answer("x" * 4000, finish=None), b"\"str\"",
                  _answer("", finish="STOP"))
    watcher, events = _watch(stream, [7, 50])
    final = events[-1]
    # finished without usage: the governor's count of the text relayed (one word of 4000 bytes: 32)
    assert final.final and final.output_tokens == count_text("x" * 4000) == 32
    assert final.input_tokens == watcher.exchange.state["expected_input"] and final.reported_output_tokens is None
    # finished with usage that names no prompt: the input is the request's estimate, not 0
    stream = _sse(_answer("x" * 40, usage={"candidatesTokenCount": 10}))
    watcher, events = _watch(stream, [])
    assert (events[-1].input_tokens, events[-1].output_tokens) == (watcher.exchange.state["expected_input"], 10)
    # cut before the end: the estimate, never the provider's smaller figure
    stream = _sse(_answer("y" * 8000, usage={"promptTokenCount": 5, "candidatesTokenCount": 1}, finish=None))
    _, events = _watch(stream, [])
    assert events[-1].output_tokens == 2000
    # usage past what the call reserved is reported as it arrives (it can cut the stream)
    stream = _sse(_answer("z", usage={"promptTokenCount": 5, "candidatesTokenCount": 50_000}, finish=None))
    exchange = open_(STREAM, HI)
    watcher = ADAPTER.stream_watcher(exchange, 200, {"content-type": "text/event-stream"})
    running = [e for e in watcher.feed(stream) if isinstance(e, UsageReport)]
    assert running and not running[0].final and running[0].output_tokens == 50_000


def test_a_stream_watcher_only_for_sse_answers():
    exchange = open_(STREAM, HI)
    assert isinstance(ADAPTER.stream_watcher(exchange, 200, {"content-type": "text/event-stream"}), GeminiStreamWatcher)
    assert ADAPTER.stream_watcher(exchange, 200, {"content-type": "application/json"}) is None  # read whole
    assert ADAPTER.stream_watcher(exchange, 429, {"content-type": "text/event-stream"}) is None


def test_errors_and_the_cut_event_are_googles_carrying_the_governor_object():
    governor = {"cause": "on_budget_exhausted", "action": "halt", "limit": 10, "session": "s"}
    reply = ADAPTER.error_response(429, "governor: halt", governor)
    body = orjson.loads(reply.body)
    assert reply.status == 429 and body["error"]["status"] == "RESOURCE_EXHAUSTED" and body["error"]["code"] == 429
    assert body["error"]["governor"] == governor
    assert body["error"]["details"][0]["metadata"]["limit"] == "10"  # ErrorInfo metadata is strings only
    assert orjson.loads(ADAPTER.error_response(400, "bad", None).body) == {
        "error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}
    watcher, _ = _watch(b"", [])
    terminal = watcher.terminal("governor: cut", governor)
    assert terminal.startswith(b"data: {\"error\":") and terminal.endswith(b"\r\n\r\n")
    assert orjson.loads(terminal[6:])["error"]["status"] == "RESOURCE_EXHAUSTED"
    denied = watcher.terminal("governor: denied", {"cause": "on_governor_tool_denied"})
    assert orjson.loads(denied[6:])["error"]["code"] == 403


def test_fallbacks_answer_in_each_methods_shape():
    decision = Decision(fallback_value="enough for now")
    governor = {"cause": "on_iteration_limit", "action": "fallback"}
    plain = orjson.loads(ADAPTER.fallback_response(open_(GEN, HI), decision, governor).body)
    assert plain["candidates"][0]["content"]["parts"][0]["text"] == "enough for now"
    sse_reply = ADAPTER.fallback_response(open_(STREAM, HI), decision, governor)
    assert sse_reply.headers["content-type"] == "text/event-stream" and sse_reply.body.startswith(b"data: {")
    array = ADAPTER.fallback_response(open_(STREAM.split("?")[0], HI), decision, governor)
    assert isinstance(orjson.loads(array.body), list)
    embed = ADAPTER.fallback_response(open_("/v1beta/models/e:embedContent", {"content": {}}), decision, governor)
    assert embed.status == 403


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                         st.sampled_from(["candidates", "content", "parts", "text", "functionCall", "name", "args",
                                          "usageMetadata", "promptTokenCount", "candidatesTokenCount",
                                          "totalTokenCount", "finishReason", "error", "promptFeedback",
                                          "blockReason", "x"]), inner, max_size=5), max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(_json)
def test_any_json_answer_is_read_without_raising(answer):
    for path in (GEN, STREAM, "/v1beta/models/gemini-2.5-flash:countTokens"):
        exchange, seen = _observe(orjson.dumps(answer), path=path)
        assert seen.usage is None or (seen.usage.input_tokens >= 0 and seen.usage.output_tokens >= 0)
    _, events = _watch(_sse(answer, [answer]), [3])
    assert isinstance(events[-1], UsageReport) and events[-1].final


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(min_value=0, max_value=400), max_size=5))
def test_any_bytes_in_a_stream_are_read_without_raising(data, cuts):
    _, events = _watch(data, [c for c in cuts if c <= len(data)])
    assert isinstance(events[-1], UsageReport) and events[-1].final
