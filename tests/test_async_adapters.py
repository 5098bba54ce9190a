"""The asynchronous endpoints' adapters on hostile bytes (governor.adapters.openai_async,
anthropic_batches, uploads, deferred): malformed multipart and batch files, lying or missing
usage in reads, ids at another host, unknown runs and files, wrong types, and a fuzz of every
path with any body and any answer: a clear BadRequest or a governed result, never a crash;
what is charged never goes down."""

from __future__ import annotations

import asyncio
import json

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor.adapters import AdapterRegistry
from governor.adapters.anthropic_batches import AnthropicBatchesAdapter
from governor.adapters.base import AdapterConfig, Observation
from governor.adapters.model_calls import estimate_tokens
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.deferred import DeferredWork
from governor.adapters.openai_async import OpenAIAsyncAdapter, auto_epochs
from governor.adapters.uploads import MAX_BATCH_LINES, form_fields
from governor.policy.pricing import PricingTable, ModelPrice

HOST = "api.openai.com"


def line(i: int = 1, model: str = "gpt-4o-mini", max_tokens: int = 100, url: str = "/v1/chat/completions") -> bytes:
    return orjson.dumps({"custom_id": str(i), "method": "POST", "url": url,
                         "body": {"model": model, "max_tokens": max_tokens,
                                  "messages": [{"role": "user", "content": "hi"}]}})


def upload(data: bytes, purpose: str = "batch") -> RequestView:
    """A file upload as the openai SDK's httpx encodes it."""
    request = httpx.Request("POST", f"https://{HOST}/v1/files", data={"purpose": purpose},
                            files={"file": ("in.jsonl", data)})
    return RequestView("POST", HOST, "/v1/files", dict(request.headers), request.read())


def post(path: str, body: object, host: str = HOST) -> RequestView:
    return RequestView("POST", host, path, {"content-type": "application/json"}, orjson.dumps(body))


def get(path: str, host: str = HOST) -> RequestView:
    return RequestView("GET", host, path, {}, b"")


@pytest.fixture
def adapter() -> OpenAIAsyncAdapter:
    return OpenAIAsyncAdapter(AdapterConfig())


def uploaded(adapter: OpenAIAsyncAdapter, data: bytes, file_id: str = "file-AbC", purpose: str = "batch",
             host: str = HOST) -> None:
    view = upload(data, purpose)
    view.host = host
    exchange = adapter.open(view, session="s", persona=None)
    adapter.observe_response(exchange, 200, {}, orjson.dumps({"id": file_id, "object": "file"}))


# --- uploads and the files they declare -------------------------------------------------


def test_a_batch_file_declares_its_requests_summed_as_the_openai_adapter_estimates_them(adapter):
    uploaded(adapter, line(1) + b"\n" + line(2, max_tokens=50) + b"\n\n")
    declared = adapter.memory.file(HOST, "file-AbC")
    assert declared is not None and declared.lines == 2 and declared.model == "gpt-4o-mini"
    body = orjson.loads(line(1))["body"]
    assert declared.output_tokens == 150
    assert declared.input_tokens == 2 * estimate_tokens(len(orjson.dumps(body)), 4.0)
    assert adapter.memory.file(HOST.upper(), "file-AbC") == declared  # hosts fold case, ids do not
    assert adapter.memory.file(HOST, "file-abc") is None


@pytest.mark.parametrize("data, says", [
    (line(1) + b"\n{broken\n", "line 2 is not JSON"),
    (b"[1, 2]\n", "line 1 is not a JSON object"),
    (orjson.dumps({"custom_id": "1", "method": "GET", "url": "/v1/chat/completions", "body": {}}), "method 'POST'"),
    (orjson.dumps({"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": "x"}), "'body' object"),
    (line(1) + b"\n" + line(2, model="gpt-4o"), "one model and one endpoint"),
    (line(1) + b"\n" + orjson.dumps({"custom_id": "2", "method": "POST", "url": "/v1/embeddings",
                                     "body": {"model": "gpt-4o-mini", "input": "hi"}}), "one model and one endpoint"),
    (line(1, url="/v1/moderations"), "not a model endpoint"),
    (line(1, max_tokens=-5), "'max_tokens' must be a positive integer"),
    (b"\n\n", "has no requests"),
    ("\ufeff".encode("utf-16") + line(1), "line 1 is not JSON"),
])
def test_a_batch_file_the_governor_cannot_read_is_refused_naming_why(adapter, data, says):
    with pytest.raises(BadRequest) as refused:
        adapter.open(upload(data), session="s", persona=None)
    assert says in refused.value.message and "batch file" in refused.value.message


def test_a_batch_file_past_openais_request_limit_is_refused(adapter):
    with pytest.raises(BadRequest, match="more than 50000 requests"):
        adapter.open(upload((line() + b"\n") * (MAX_BATCH_LINES + 1)), session="s", persona=None)


@pytest.mark.parametrize("content_type, body, says", [
    ("multipart/form-data", b"x", "boundary"),
    ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx\r\n", "closing"),
    ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx\r\n"
                                        b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\ny\r\n--b--\r\n",
     "given twice"),
    ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n"
                                        b"Content-Transfer-Encoding: base64\r\n\r\neA==\r\n--b--\r\n",
     "Content-Transfer-Encoding"),
    ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--\r\n",
     "without a field name"),
    ("multipart/form-data; boundary=b", b"--b\r\nno blank line\r\n--b--\r\n", "blank line"),
    ("text/plain", b"x", "multipart/form-data"),
])
def test_malformed_forms_are_refused_clearly(content_type, body, says):
    with pytest.raises(BadRequest, match=says):
        form_fields(content_type, body)


def test_an_upload_that_is_no_openai_form_is_a_free_step_remembering_nothing(adapter):
    for view in (post("/v1/files", {"any": "json"}),
                 RequestView("POST", HOST, "/v1/files", {"content-type": "multipart/form-data; boundary=z"}, b"junk")):
        exchange = adapter.open(view, session="s", persona=None)
        adapter.observe_response(exchange, 200, {}, orjson.dumps({"id": "file-junk"}))
        assert exchange.state["expected_input"] == exchange.state["expected_output"] == 0
    assert adapter.memory.file(HOST, "file-junk") is None


# --- batches ------------------------------------------------------------------------------


def test_a_batch_naming_a_file_seen_only_at_another_host_is_refused(adapter):
    uploaded(adapter, line(), host="relay.example")  # the agent's own server vouches for nothing
    with pytest.raises(BadRequest) as refused:
        adapter.open(post("/v1/batches", {"input_file_id": "file-AbC", "endpoint": "/v1/chat/completions"}),
                     session="s", persona=None)
    assert refused.value.status == 403 and "not uploaded through this governor" in refused.value.message


@pytest.mark.parametrize("body, says", [
    ({"input_file_id": 5, "endpoint": "/v1/chat/completions"}, "must be a file id"),
    ({"input_file_id": "file-AbC", "endpoint": "/v1/embeddings"}, "is not the endpoint"),
    ({"input_file_id": "file-AbC"}, "is not the endpoint"),
    ({"input_file_id": "file-FT", "endpoint": "/v1/chat/completions"}, "purpose 'fine-tune'"),
])
def test_a_batch_request_that_does_not_match_its_file_is_refused(adapter, body, says):
    uploaded(adapter, line())
    uploaded(adapter, b'{"messages": []}\n', "file-FT", purpose="fine-tune")
    with pytest.raises(BadRequest, match=says):
        adapter.open(post("/v1/batches", body), session="s", persona=None)


def test_a_refused_batch_is_not_charged_and_an_accepted_one_is_charged_once(adapter):
    uploaded(adapter, line())
    view = post("/V1//Batches/", {"input_file_id": "file-AbC", "endpoint": "/v1/chat/completions"})
    exchange = adapter.open(view, session="s", persona=None)
    [step] = asyncio.run(adapter.steps(exchange))
    assert step.model == "gpt-4o-mini@batch" and step.output_floor is None  # the file cannot be rewritten
    assert adapter.observe_response(exchange, 400, {}, b'{"error": {}}').usage is None
    assert adapter.observe_response(exchange, 200, {}, b"not json").usage is None
    charged = adapter.observe_response(exchange, 200, {}, b'{"id": "batch_1"}').usage
    assert (charged.input_tokens, charged.output_tokens) == (step.expected_input_tokens, step.expected_output_tokens)


@pytest.mark.parametrize("usage, extra", [
    ({"input_tokens": 10_000, "output_tokens": 0}, (10_000, 0)),  # input past the charge: the excess
    ({"input_tokens": 1, "output_tokens": 1}, None),  # under the charge: nothing back, nothing more
    ({"input_tokens": -50, "output_tokens": "999999"}, None),  # lies of the wrong kind count as nothing
    ({"input_tokens": True, "output_tokens": 10 ** 15}, (0, 10 ** 15)),
    ("lots", None),
    (None, None),
])
def test_a_read_charges_only_the_usage_past_the_charge_and_only_once(adapter, usage, extra):
    memory = adapter.memory
    memory.charge(HOST, "batch_1", "gpt-4o-mini@batch", 20, 100, ("input_tokens", "output_tokens"))
    exchange = adapter.open(get("/v1/batches/batch_1"), session="s", persona=None)
    assert exchange.model == "gpt-4o-mini@batch"
    answer = orjson.dumps({"id": "batch_1", "status": "completed", "usage": usage})
    report = adapter.observe_response(exchange, 200, {}, answer).usage
    if extra is None:
        assert report is None
    else:
        expected = (max(extra[0] - 20, 0) if extra[0] else 0, max(extra[1] - 100, 0))
        assert (report.input_tokens, report.output_tokens) == expected and report.final
        assert adapter.observe_response(exchange, 200, {}, answer).usage is None  # settled once


def test_a_read_of_unfinished_or_unknown_work_charges_nothing(adapter):
    adapter.memory.charge(HOST, "resp_1", "gpt-4o-mini", 10, 10, ("input_tokens", "output_tokens"))
    exchange = adapter.open(get("/v1/responses/resp_1"), session="s", persona=None)
    running = orjson.dumps({"id": "resp_1", "status": "in_progress", "usage": {"input_tokens": 10 ** 6}})
    assert adapter.observe_response(exchange, 200, {}, running).usage is None
    assert adapter.memory.charged(HOST, "resp_1") is not None  # still awaiting its end
    other = adapter.open(get("/v1/responses/resp_2"), session="s", persona=None)
    done = orjson.dumps({"id": "resp_2", "status": "completed", "usage": {"input_tokens": 10 ** 6}})
    assert other.model == "" and adapter.observe_response(other, 200, {}, done).usage is None


def test_the_memory_is_bounded_and_forgets_the_oldest_first():
    memory = DeferredWork(limit=3)
    for i in range(5):
        memory.charge(HOST, f"r{i}", "m", 1, 1, ("a", "b"))
    assert [memory.charged(HOST, f"r{i}") is not None for i in range(5)] == [False, False, True, True, True]


# --- runs, fine-tuning, vector stores -------------------------------------------------------


def test_a_run_without_a_model_takes_its_assistants_if_the_governor_saw_it(adapter):
    with pytest.raises(BadRequest) as refused:
        adapter.open(post("/v1/threads/t/runs", {"assistant_id": "asst_1"}), session="s", persona=None)
    assert refused.value.status == 403
    listing = adapter.open(get("/v1/assistants"), session="s", persona=None)
    adapter.observe_response(listing, 200, {}, orjson.dumps({"object": "list", "data": [
        {"object": "assistant", "id": "asst_1", "model": "gpt-4o"}, {"object": "assistant", "id": 5}, "junk"]}))
    run = adapter.open(post("/v1/threads/t/runs", {"assistant_id": "asst_1", "max_prompt_tokens": 5000}),
                       session="s", persona=None)
    assert run.model == "gpt-4o" and run.state["expected_input"] == 5000
    assert run.state["expected_output"] == 4096 and adapter.output_limit_fields(run) == ("max_completion_tokens",)


def test_a_streamed_run_is_read_whole_and_charged_past_its_reservation(adapter):
    run = adapter.open(post("/v1/threads/runs", {"assistant_id": "a", "model": "gpt-4o-mini", "stream": True,
                                                 "max_completion_tokens": 300}), session="s", persona=None)
    assert run.stream is False
    events = (b"event: thread.run.created\ndata: {\"id\": \"run_9\", \"object\": \"thread.run\", \"status\": \"queued\"}\n\n"
              b"event: thread.message.delta\ndata: {\"object\": \"thread.message.delta\"}\n\n"
              b"event: thread.run.completed\ndata: {\"id\": \"run_9\", \"object\": \"thread.run\", \"status\": "
              b"\"completed\", \"usage\": {\"prompt_tokens\": 5000, \"completion_tokens\": 10}}\n\n"
              b"event: done\ndata: [DONE]\n\n")
    report = adapter.observe_response(run, 200, {"content-type": "text/event-stream"}, events).usage
    assert (report.input_tokens, report.output_tokens) == (5000, 300)  # the input it used; the output reserved
    garbage = adapter.observe_response(run, 200, {}, b"\x00garbage").usage  # accepted, unreadable: the reservation
    assert (garbage.input_tokens, garbage.output_tokens) == (run.state["expected_input"], 300)
    assert adapter.observe_response(run, 500, {}, b"").usage is None


@pytest.mark.parametrize("body, says", [
    ({"assistant_id": "a", "model": "m", "thread": {"tool_resources": {"file_search": {"vector_stores": [
        {"file_ids": ["file-1"]}]}}}}, "creates vector stores"),
    ({"assistant_id": "a", "model": 7}, "names no 'model'"),
    ({"assistant_id": "a", "model": "m", "max_completion_tokens": "lots"}, "positive integer"),
    (["not", "an", "object"], "JSON object"),
])
def test_runs_the_governor_cannot_reserve_are_refused(adapter, body, says):
    with pytest.raises(BadRequest, match=says):
        adapter.open(post("/v1/threads/runs", body), session="s", persona=None)


@pytest.mark.parametrize("examples, epochs", [(1, 25), (10, 10), (50, 3), (1000, 3), (100_000, 1)])
def test_auto_epochs_follow_openais_data_preparation_guide(examples, epochs):
    assert auto_epochs(examples) == epochs


@pytest.mark.parametrize("hyper, says", [
    ({"hyperparameters": {"n_epochs": 0}}, "from 1 to 50"),
    ({"hyperparameters": {"n_epochs": 51}}, "from 1 to 50"),
    ({"method": {"type": "dpo", "dpo": {"hyperparameters": {"n_epochs": "3"}}}}, "from 1 to 50"),
    ({"model": None}, "'model' is required"),
    ({"training_file": "file-unseen"}, "not uploaded through this governor"),
])
def test_fine_tuning_jobs_the_governor_cannot_estimate_are_refused(adapter, hyper, says):
    uploaded(adapter, b'{"messages": []}\n' * 10, "file-FT", purpose="fine-tune")
    body = {"model": "gpt-4o-mini", "training_file": "file-FT", **hyper}
    with pytest.raises(BadRequest, match=says):
        adapter.open(post("/v1/fine_tuning/jobs", body), session="s", persona=None)


def test_a_fine_tuning_job_reserves_tokens_times_epochs_and_settles_on_trained_tokens(adapter):
    data = b'{"messages": [{"role": "user", "content": "hello"}]}\n' * 10
    uploaded(adapter, data, "file-FT", purpose="fine-tune")
    job = adapter.open(post("/v1/fine_tuning/jobs", {"model": "gpt-4o-mini", "training_file": "file-FT"}),
                       session="s", persona=None)
    tokens = estimate_tokens(len(data), 4.0) * auto_epochs(10)
    assert job.model == "training:gpt-4o-mini" and job.state["expected_input"] == tokens
    adapter.observe_response(job, 200, {}, b'{"id": "ftjob-1", "object": "fine_tuning.job"}')
    read = adapter.open(get("/v1/fine_tuning/jobs/ftjob-1"), session="s", persona=None)
    done = orjson.dumps({"id": "ftjob-1", "status": "succeeded", "trained_tokens": tokens + 7})
    report = adapter.observe_response(read, 200, {}, done).usage
    assert (report.model, report.input_tokens, report.output_tokens) == ("training:gpt-4o-mini", 7, 0)


def test_vector_stores_charge_the_embedding_of_files_they_know_and_refuse_others(adapter):
    uploaded(adapter, b"x" * 4000, "file-doc", purpose="assistants")
    for path, body in (("/v1/vector_stores/vs_1/file_batches", {"files": [{"file_id": "file-doc"}]}),
                       ("/v1/vector_stores/vs_1/files", {"file_id": "file-doc"}),
                       ("/v1/vector_stores", {"name": "docs", "file_ids": ["file-doc", "file-doc"]}),
                       ("/v1/assistants", {"model": "gpt-4o", "tool_resources": {"file_search": {
                           "vector_stores": [{"file_ids": ["file-doc"]}]}}})):
        exchange = adapter.open(post(path, body), session="s", persona=None)
        files = 2 if "file_ids" in body and len(body["file_ids"]) == 2 else 1
        assert exchange.model == "text-embedding-3-large" and exchange.state["expected_input"] == 1000 * files
        assert adapter.observe_response(exchange, 200, {}, b'{"id": "x"}').usage.input_tokens == 1000 * files
    for body in ({"file_ids": ["file-doc", "file-nope"]}, {"file_ids": [None]}, {"files": ["junk"]}):
        with pytest.raises(BadRequest):
            adapter.open(post("/v1/vector_stores/vs_1/file_batches", body), session="s", persona=None)
    empty = adapter.open(post("/v1/vector_stores", {"name": "empty"}), session="s", persona=None)
    assert empty.state["expected_input"] == 0 and adapter.observe_response(empty, 200, {}, b'{"id": "v"}').usage is None


def test_a_free_step_costs_nothing_even_for_an_unpriced_model():
    table = PricingTable({"gpt-4o-mini": ModelPrice("gpt-4o-mini", 1, 1, 1)})
    assert table.cost("", 0, 0) == 0.0 and table.cost("unknown", 0, 0) == 0.0
    assert table.cost("unknown", 1, 0) is None


# --- Anthropic message batches ----------------------------------------------------------------


def params(model: str = "claude-3-5-haiku-latest", max_tokens: int = 100) -> dict:
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("body, says", [
    ({"requests": []}, "non-empty array"),
    ({"requests": "x"}, "non-empty array"),
    ([1], "non-empty array"),
    ({"requests": [{"custom_id": "1"}]}, r"requests\[0\].params must be an object"),
    ({"requests": [{"params": params()}, {"params": params("claude-sonnet-4-5")}]}, "one model"),
    ({"requests": [{"params": {"model": "claude-3-5-haiku-latest", "messages": "x"}}]}, r"requests\[0\].params"),
    ({"requests": [{"params": params(max_tokens=0)}]}, "positive integer"),
])
def test_message_batches_the_governor_cannot_reserve_are_refused(body, says):
    adapter = AnthropicBatchesAdapter(AdapterConfig())
    view = post("/v1/messages/batches", body, host="api.anthropic.com")
    with pytest.raises(BadRequest, match=says):
        adapter.open(view, session="s", persona=None)


def test_a_message_batch_reserves_every_request_and_charges_only_when_accepted():
    adapter = AnthropicBatchesAdapter(AdapterConfig())
    body = {"requests": [{"custom_id": str(i), "params": params(max_tokens=100 + i)} for i in range(3)]}
    exchange = adapter.open(post("/v1/messages/batches", body, "api.anthropic.com"), session="s", persona=None)
    assert exchange.model == "claude-3-5-haiku-latest@batch" and exchange.state["expected_output"] == 303
    assert adapter.observe_response(exchange, 529, {}, b"{}").usage is None
    assert adapter.observe_response(exchange, 200, {}, b'{"type": "message_batch"}').usage is None  # no id: not accepted
    assert adapter.observe_response(exchange, 200, {}, b'{"id": "msgbatch_1"}').usage.output_tokens == 303
    read = adapter.open(get("/v1/messages/batches/msgbatch_1/results", "api.anthropic.com"), session="s", persona=None)
    assert read.state["expected_input"] == 0 and adapter.observe_response(read, 200, {}, b"{}").usage is None


# --- selection and a fuzz of every path -----------------------------------------------------------


PATHS = ["/v1/files", "/v1/files/f1", "/v1/files/f1/content", "/v1/batches", "/v1/batches/b1", "/v1/batches/b1/cancel",
         "/v1/responses/r1", "/v1/responses/r1/cancel", "/v1/threads", "/v1/threads/t1", "/v1/threads/t1/messages",
         "/v1/threads/runs", "/v1/threads/t1/runs", "/v1/threads/t1/runs/r1", "/v1/threads/t1/runs/r1/steps/s1",
         "/v1/threads/t1/runs/r1/submit_tool_outputs", "/v1/assistants", "/v1/assistants/a1",
         "/v1/fine_tuning/jobs", "/v1/fine_tuning/jobs/j1", "/v1/fine_tuning/jobs/j1/events",
         "/v1/vector_stores", "/v1/vector_stores/v1", "/v1/vector_stores/v1/files", "/v1/vector_stores/v1/file_batches",
         "/v1/vector_stores/v1/file_batches/b1/files", "/v1/messages/batches", "/v1/messages/batches/m1/results"]


def test_every_path_is_selected_by_its_adapter_whatever_the_method_that_reads():
    registry = AdapterRegistry.default()
    for path in PATHS:
        for method in ("GET", "DELETE", "POST"):
            selected = registry.select(RequestView(method, HOST, path, {}, b"{}" if method == "POST" else b""))
            expected = "anthropic-batches" if "/messages/" in path else "openai-async"
            assert getattr(selected, "name", selected) == expected, (method, path)
    for path in ("/v1/responses/input_tokens", "/v1/models", "/v1/chat/completions"):
        selected = registry.select(RequestView("POST", HOST, path, {}, b"{}"))
        assert getattr(selected, "name", None) not in ("openai-async", "anthropic-batches"), path


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
                        ["input_file_id", "endpoint", "model", "assistant_id", "file_id", "file_ids", "files",
                         "training_file", "requests", "params", "max_tokens", "messages", "tool_resources", "thread",
                         "file_search", "vector_stores", "hyperparameters", "n_epochs", "method", "id", "status",
                         "usage", "object", "data", "input_tokens", "prompt_tokens", "trained_tokens"]) | st.text(max_size=4),
                        inner, max_size=5), max_leaves=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), method=st.sampled_from(["POST", "GET", "DELETE"]), body=JSON, answer=JSON,
       status=st.sampled_from([200, 400, 500]))
def test_any_body_and_any_answer_give_a_clear_refusal_or_a_governed_result(path, method, body, answer, status):
    registry = AdapterRegistry.default()
    registry.by_name["openai-async"].memory.charge(HOST, "r1", "gpt-4o-mini", 1, 1, ("prompt_tokens", "completion_tokens"))
    view = RequestView(method, HOST, path, {"content-type": "application/json"}, json.dumps(body).encode())
    adapter = registry.select(view)
    try:
        exchange = adapter.open(view, session="s", persona=None)
    except BadRequest as exc:
        assert exc.message and exc.status in (400, 403)
        return
    asyncio.run(adapter.steps(exchange))
    observed = adapter.observe_response(exchange, status, {}, json.dumps(answer).encode())
    assert isinstance(observed, Observation)
    if observed.usage is not None:
        assert observed.usage.input_tokens >= 0 and observed.usage.output_tokens >= 0 and observed.usage.final


def test_each_rows_probe_is_governed_or_refused_by_its_adapter():
    from governor.adapters import anthropic_batches, openai_async

    registry = AdapterRegistry.default()
    for row in openai_async.ENDPOINTS + anthropic_batches.ENDPOINTS:
        probe = row.probe
        view = RequestView(probe.method, HOST, probe.path, {"content-type": probe.content_type}, probe.body)
        adapter = registry.select(view)
        assert getattr(adapter, "name", adapter) == row.adapter, row
        try:
            exchange = adapter.open(view, session="s", persona=None)
        except BadRequest as refused:  # refused in the provider's format, never forwarded
            assert row.verdict == "governed" and refused.status == 403, row
        else:
            assert len(asyncio.run(adapter.steps(exchange))) == 1, row


# --- background Responses (governor.adapters.openai) -------------------------------------------


def background(body: dict | None = None):
    from governor.adapters.openai import OpenAIAdapter

    adapter = OpenAIAdapter(AdapterConfig())
    payload = {"model": "gpt-4o-mini", "input": "essay", "background": True, "max_output_tokens": 500, **(body or {})}
    return adapter, adapter.open(post("/v1/responses", payload), session="s", persona=None)


def test_a_queued_background_response_is_charged_its_reservation_whatever_usage_it_claims():
    adapter, exchange = background()
    for claimed in (None, {"input_tokens": 0, "output_tokens": 0}, "junk"):
        answer = orjson.dumps({"id": "resp_Q", "status": "queued", "usage": claimed})
        report = adapter.observe_response(exchange, 200, {}, answer).usage
        assert (report.input_tokens, report.output_tokens) == (exchange.state["expected_input"], 500)
    done = orjson.dumps({"id": "resp_D", "status": "completed", "usage": {"input_tokens": 7, "output_tokens": 9}})
    assert adapter.observe_response(exchange, 200, {}, done).usage.output_tokens == 9  # done at once: its usage
    assert adapter.memory.charged(HOST, "resp_D") is None
    # no id (not accepted as background work), or not asked for in the background: an answer without
    # usage, charged what was measured (its admission's input, nothing relayed), never nothing
    no_id = adapter.observe_response(exchange, 200, {}, b'{"status": "queued"}').usage
    assert (no_id.input_tokens, no_id.output_tokens, no_id.reported_output_tokens) == (
        exchange.state["expected_input"], 0, None)
    _, plain = background({"background": False})
    report = adapter.observe_response(plain, 200, {}, orjson.dumps({"id": "r", "status": "queued"})).usage
    assert (report.input_tokens, report.output_tokens) == (plain.state["expected_input"], 0)
    assert adapter.memory.charged(HOST, "r") is None


def test_a_background_stream_left_before_its_end_is_charged_its_reservation_and_settled_when_read():
    adapter, exchange = background({"stream": True})
    watcher = adapter.stream_watcher(exchange, 200, {"content-type": "text/event-stream"})
    created = orjson.dumps({"type": "response.created", "sequence_number": 0,
                            "response": {"id": "resp_S", "status": "queued"}})
    delta = orjson.dumps({"type": "response.output_text.delta", "sequence_number": 1, "delta": "word " * 20})
    watcher.feed(b"event: response.created\ndata: " + created + b"\n\nevent: response.output_text.delta\ndata: "
                 + delta + b"\n\n")
    final = watcher.close()[-1]  # the client left: the work goes on upstream
    assert final.final and (final.input_tokens, final.output_tokens) == (exchange.state["expected_input"], 500)
    reads = OpenAIAsyncAdapter(adapter.config, adapter.memory)  # the registry hands both its one memory
    read = reads.open(get("/v1/responses/resp_S"), session="s", persona=None)
    answer = orjson.dumps({"id": "resp_S", "status": "completed", "usage": {"input_tokens": 4000, "output_tokens": 500}})
    extra = reads.observe_response(read, 200, {}, answer).usage
    assert (extra.input_tokens, extra.output_tokens) == (4000 - exchange.state["expected_input"], 0)


def test_a_background_stream_that_completes_is_charged_its_usage():
    adapter, exchange = background({"stream": True})
    watcher = adapter.stream_watcher(exchange, 200, {"content-type": "text/event-stream"})
    completed = orjson.dumps({"type": "response.completed", "sequence_number": 2, "response": {
        "id": "resp_C", "model": "gpt-4o-mini", "usage": {"input_tokens": 12, "output_tokens": 30}}})
    watcher.feed(b"event: response.completed\ndata: " + completed + b"\n\n")
    final = watcher.close()[-1]
    assert (final.input_tokens, final.output_tokens) == (12, 30)
    assert adapter.memory.charged(HOST, "resp_C") is None


def test_batch_work_is_priced_at_half_unless_the_table_names_its_batch_price():
    table = PricingTable({"gpt-4o-mini": ModelPrice("gpt-4o-mini", 0.15, 0.60, 0.075),
                          "gpt-4o": ModelPrice("gpt-4o", 2.5, 10, 1.25),
                          "gpt-4o@batch": ModelPrice("gpt-4o@batch", 2.0, 8.0, 1.0)})
    assert table.cost("gpt-4o-mini-2024-07-18@batch", 1_000_000, 1_000_000) == pytest.approx(0.375)
    assert table.cost("gpt-4o-mini", 1_000_000, 1_000_000) == pytest.approx(0.75)
    assert table.cost("gpt-4o@batch", 1_000_000, 0) == pytest.approx(2.0)  # named: its own price
    assert table.cost("unknown@batch", 1, 1) is None


def test_a_message_batchs_tools_are_cut_to_what_the_session_may_use():
    from governor.policy.steps import Decision

    adapter = AnthropicBatchesAdapter(AdapterConfig())
    tool = lambda name: {"name": name, "input_schema": {"type": "object"}}  # noqa: E731
    body = {"requests": [{"custom_id": "1", "params": {**params(), "tools": [tool("search_papers"), tool("run_shell")],
                                                        "tool_choice": {"type": "tool", "name": "run_shell"}}},
                         {"custom_id": "2", "params": params()}]}
    exchange = adapter.open(post("/v1/messages/batches", body, "api.anthropic.com"), session="s", persona=None)
    [step] = asyncio.run(adapter.steps(exchange))
    assert step.tools_offered == ("search_papers", "run_shell")
    assert adapter.rewrite_request(exchange, Decision(allowed_tools=None)) is None  # nothing declared: all stay
    sent = orjson.loads(adapter.rewrite_request(exchange, Decision(allowed_tools=frozenset({"search_papers"}))))
    first = sent["requests"][0]["params"]
    assert [t["name"] for t in first["tools"]] == ["search_papers"] and "tool_choice" not in first
    assert sent["requests"][1]["params"] == params() and exchange.state["withheld"] == ["run_shell"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.binary(max_size=40) | st.sampled_from([
    b"\r\n", b"--b", b"--b--", b"\r\n\r\n", b'Content-Disposition: form-data; name="purpose"', b"batch",
    b'Content-Disposition: form-data; name="file"; filename="x"', b"Content-Transfer-Encoding: base64",
    line(), b"\n", b"{", b'"method":"POST"']), max_size=14))
def test_any_upload_is_read_or_refused_clearly(parts):
    adapter = OpenAIAsyncAdapter(AdapterConfig())
    view = RequestView("POST", HOST, "/v1/files", {"content-type": "multipart/form-data; boundary=b"}, b"".join(parts))
    try:
        exchange = adapter.open(view, session="s", persona=None)
    except BadRequest as exc:
        assert "batch file" in exc.message
        return
    adapter.observe_response(exchange, 200, {}, b'{"id": "file-F"}')
    declared = adapter.memory.file(HOST, "file-F")
    assert declared is None or declared.size >= 0 and declared.input_tokens >= 0
