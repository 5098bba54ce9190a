"""The asynchronous money endpoints through the real proxy on the real runtime (the bundled
example passport: tokens 20000 per session, cost 0.5 USD per session, on_budget_exhausted
halts), driven by the official `openai` and `anthropic` SDKs in a subprocess against a loopback
mock of the providers' APIs (tests/async_upstream.py): files uploaded for batches, batches,
Anthropic message batches, background Responses, Assistants runs, fine-tuning jobs and
vector-store file batches are charged (reserved up front, charged at once, the excess at the
read), refused with a readable SDK error when they cannot fit, and each session's signed record
verifies. The pricing table is the bundled one (it prices training and embeddings)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, AsyncIterator

import orjson
import pytest
import pytest_asyncio

from governor.adapters.model_calls import estimate_tokens
from governor.evidence import verify_record
from governor.passport import example_passport_path, load_passport
from tests.async_upstream import AsyncMock
from tests.proxy_harness import AGENT_NAMED, REPO, run_python
from tests.upstreams import make_tls

pytestmark = pytest.mark.asyncio(loop_scope="module")

TRAINING_PRICE = 3.00  # USD per million training tokens: training:gpt-4o-mini, as the bundled table says

PRELUDE = """
import json, openai, anthropic
client = openai.OpenAI(max_retries=0)
claude = anthropic.Anthropic(max_retries=0)
out = {}
def record(name, fn):
    try:
        out[name] = fn()
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        out[name] = {"raised": type(e).__name__, "status": e.status_code, "message": e.message, "body": e.body}
def jsonl(lines):
    return "".join(json.dumps(line) + "\\n" for line in lines).encode()
def chat_line(i, max_tokens, model="gpt-4o-mini"):
    return {"custom_id": str(i), "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi " + str(i)}]}}
"""


@contextlib.asynccontextmanager
async def async_governor(tmp: Path, **settings: Any) -> AsyncIterator[tuple[Any, AsyncMock]]:
    from governor.proxy.server import Settings, serve

    tls = make_tls(tmp / "tls")
    mock = AsyncMock(tls)
    await mock.start()
    pricing = REPO / "policies" / "pricing.yaml"  # the bundled table: training and embeddings priced
    try:
        running = await serve(Settings(listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data",
                                       upstream_ca=tls.ca_file, tick_interval=0, pricing=pricing,
                                       **{**AGENT_NAMED, **settings}))
    except BaseException:
        await mock.stop()
        raise
    try:
        yield running, mock
    finally:
        await running.stop()
        await mock.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory: Any) -> AsyncIterator[tuple[Any, AsyncMock, dict[str, str]]]:
    async with async_governor(tmp_path_factory.mktemp("sdk-async")) as (running, mock):
        sdk_env = {"HTTPS_PROXY": running.proxy_url, "SSL_CERT_FILE": str(running.ca_file),
                   "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{mock.base_url}/v1",
                   "ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": mock.base_url}
        yield running, mock, sdk_env


@pytest.fixture(autouse=True)
def fresh(env):
    env[1].reset()


def session(code: str, name: str) -> str:
    """The SDK code with every request in session `name` (its ADL-Session header)."""
    return (PRELUDE.replace("openai.OpenAI(max_retries=0)",
                            f"openai.OpenAI(max_retries=0, default_headers={{'ADL-Session': '{name}'}})")
            .replace("anthropic.Anthropic(max_retries=0)",
                     f"anthropic.Anthropic(max_retries=0, default_headers={{'ADL-Session': '{name}'}})")
            + code + "\nprint(json.dumps(out))\n")


async def used(running: Any, name: str) -> dict[str, Any]:
    view = await running.runtime.session_view(name)
    assert view is not None, name
    budgets = {(b["dimension"], b["scope"]): b["used"] for b in view["budgets"] if b["persona"] is None}
    return {"tokens": budgets.get(("tokens", "per_session"), 0), "cost": budgets.get(("cost_usd", "per_session"), 0),
            "iterations": view["iterations"], "state": view["state"]}


def verified(running: Any, name: str) -> dict[str, Any]:
    record = running.runtime.record(name)
    report = verify_record(record, public_key=running.runtime.key.public_key(),
                           passport=load_passport(example_passport_path()))
    assert report.ok, report.summary()
    return record


def line_tokens(max_tokens: int, index: int, model: str = "gpt-4o-mini") -> int:
    """One batch line's reservation, as the OpenAI adapter estimates that chat call."""
    body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": f"hi {index}"}]}
    return estimate_tokens(len(orjson.dumps(body)), 4.0) + max_tokens


async def test_a_batch_is_reserved_from_its_uploaded_file_charged_at_once_and_its_excess_at_the_read(env):
    running, mock, sdk_env = env
    mock.finished_usage = (2000, 10)  # the batch says it read far more than the file's estimate
    code = """
def upload():
    f = client.files.create(file=("batch.jsonl", jsonl([chat_line(i, 100) for i in range(3)])), purpose="batch")
    return f.id
record("file", upload)
record("batch", lambda: client.batches.create(input_file_id=out["file"], endpoint="/v1/chat/completions",
                                             completion_window="24h").id)
record("read", lambda: client.batches.retrieve(out["batch"]).status)
record("again", lambda: client.batches.retrieve(out["batch"]).status)
"""
    out = await run_python(session(code, "batch-ok"), sdk_env)
    assert out["file"].startswith("file-") and out["batch"].startswith("batch_"), out
    assert out["read"] == out["again"] == "completed"
    declared_in = sum(line_tokens(100, i) - 100 for i in range(3))
    # charged at once: the declared work; at the read: the input past it (output stayed within)
    figures = await used(running, "batch-ok")
    assert figures["tokens"] == 2000 + 300, figures
    assert figures["cost"] == pytest.approx((2000 * 0.15 + 300 * 0.60) / 2 / 1e6), figures  # at half price
    assert figures["iterations"] == 4  # upload, batch, two reads
    assert declared_in < 2000
    assert mock.posted("/v1/batches")[0].json()["input_file_id"] == out["file"]
    verified(running, "batch-ok")


async def test_a_batch_that_cannot_fit_is_refused_before_it_reaches_the_provider(env):
    running, mock, sdk_env = env
    code = """
record("file", lambda: client.files.create(file=("b.jsonl", jsonl([chat_line(i, 8000) for i in range(3)])),
                                           purpose="batch").id)
record("batch", lambda: client.batches.create(input_file_id=out["file"], endpoint="/v1/chat/completions",
                                             completion_window="24h"))
record("after", lambda: client.batches.retrieve("batch_other").status)
"""
    out = await run_python(session(code, "batch-big"), sdk_env)
    refused = out["batch"]
    assert refused["raised"] == "RateLimitError" and refused["status"] == 429, refused
    governor = refused["body"]["governor"]
    assert governor["cause"] == "on_budget_exhausted" and governor["limit"] == 20000, governor
    assert "projected" in refused["message"] and "limit 20000" in refused["message"]
    assert mock.posted("/v1/batches") == []
    # the session halted: a read is no way around it, and reaches nothing
    assert out["after"]["status"] == 429 and out["after"]["body"]["governor"]["cause"] == "on_budget_exhausted"
    assert [r.path for r in mock.requests] == ["/v1/files"]
    assert (await used(running, "batch-big"))["state"] == "halted"
    verified(running, "batch-big")


async def test_a_batch_naming_a_file_the_governor_never_saw_is_refused_and_recorded(env):
    running, mock, sdk_env = env
    code = """
record("batch", lambda: client.batches.create(input_file_id="file-elsewhere", endpoint="/v1/chat/completions",
                                             completion_window="24h"))
"""
    out = await run_python(session(code, "batch-unseen"), sdk_env)
    refused = out["batch"]
    assert refused["raised"] == "PermissionDeniedError" and refused["status"] == 403, refused
    assert "'file-elsewhere' was not uploaded through this governor" in refused["message"]
    assert mock.requests == []
    record = verified(running, "batch-unseen")
    assert any(e["cause"] == "on_governor_request_refused" and "file-elsewhere" in e["detail"]["message"]
               for e in record["events"])


async def test_a_malformed_batch_file_is_refused_at_upload_naming_its_line(env):
    running, mock, sdk_env = env
    code = """
good = json.dumps(chat_line(1, 10)).encode()
record("not_json", lambda: client.files.create(file=("b.jsonl", good + b"\\n{not json\\n"), purpose="batch"))
record("mixed", lambda: client.files.create(file=("b.jsonl", jsonl([chat_line(1, 10), chat_line(2, 10, "gpt-4o")])),
                                            purpose="batch"))
record("moderation", lambda: client.files.create(file=("b.jsonl", jsonl([{"custom_id": "1", "method": "POST",
    "url": "/v1/moderations", "body": {"input": "hi"}}])), purpose="batch"))
"""
    out = await run_python(session(code, "batch-bad"), sdk_env)
    assert out["not_json"]["status"] == 400 and "batch file line 2 is not JSON" in out["not_json"]["message"]
    assert out["mixed"]["status"] == 400 and "one model and one endpoint" in out["mixed"]["message"]
    assert out["moderation"]["status"] == 400 and "not a model endpoint" in out["moderation"]["message"]
    assert mock.requests == []
    verified(running, "batch-bad")


async def test_an_anthropic_message_batch_is_reserved_whole_and_refused_when_it_cannot_fit(env):
    running, mock, sdk_env = env
    code = """
def batch(max_tokens, count, models=("claude-3-5-haiku-latest",)):
    return claude.messages.batches.create(requests=[
        {"custom_id": str(i), "params": {"model": models[i % len(models)], "max_tokens": max_tokens,
                                          "messages": [{"role": "user", "content": "hi"}]}} for i in range(count)]).id
record("ok", lambda: batch(200, 2))
record("mixed", lambda: batch(10, 2, ("claude-3-5-haiku-latest", "claude-sonnet-4-5")))
record("read", lambda: claude.messages.batches.retrieve(out["ok"]).processing_status)
record("big", lambda: batch(9000, 3))
"""
    out = await run_python(session(code, "msgbatch"), sdk_env)
    assert out["ok"].startswith("msgbatch_") and out["read"] == "in_progress", out
    assert out["mixed"]["raised"] == "BadRequestError" and "one model" in out["mixed"]["message"]
    big = out["big"]
    assert big["raised"] == "RateLimitError" and big["status"] == 429, big
    assert big["body"]["error"]["type"] == "rate_limit_error"
    assert big["body"]["governor"]["cause"] == "on_budget_exhausted"
    assert len(mock.posted("/v1/messages/batches")) == 1
    sent = mock.posted("/v1/messages/batches")[0]
    expected = 2 * (estimate_tokens(len(orjson.dumps(sent.json()["requests"][0]["params"])), 4.0) + 200)
    figures = await used(running, "msgbatch")
    assert figures["tokens"] == expected and figures["state"] == "halted", figures
    verified(running, "msgbatch")


async def test_a_background_response_is_charged_at_submission_and_settled_when_read(env):
    running, mock, sdk_env = env
    mock.finished_usage = (900, 40)
    code = """
def submit():
    r = client.responses.create(model="gpt-4o-mini", input="write a long essay", background=True, max_output_tokens=300)
    return {"id": r.id, "status": r.status}
record("submit", submit)
def read():
    r = client.responses.retrieve(out["submit"]["id"])
    return {"status": r.status, "usage": r.usage.total_tokens, "text": r.output_text}
record("read", read)
record("again", lambda: client.responses.retrieve(out["submit"]["id"]).status)
"""
    out = await run_python(session(code, "background"), sdk_env)
    assert out["submit"]["status"] == "queued" and out["read"] == {"status": "completed", "usage": 940, "text": "done"}
    assert mock.posted("/v1/responses")[0].json()["background"] is True
    # submission: its reservation (estimated input, 300 output); the read: the input past it
    figures = await used(running, "background")
    assert figures["tokens"] == 900 + 300 and figures["iterations"] == 3, figures
    verified(running, "background")


async def test_a_background_response_cannot_be_read_around_a_halt(env):
    running, mock, sdk_env = env
    code = """
record("submit", lambda: client.responses.create(model="gpt-4o-mini", input="x", background=True,
                                                 max_output_tokens=256).id)
record("huge", lambda: client.files.create(file=("b.jsonl", jsonl([chat_line(i, 8000) for i in range(3)])),
                                           purpose="batch").id)
record("halt", lambda: client.batches.create(input_file_id=out["huge"], endpoint="/v1/chat/completions",
                                            completion_window="24h"))
record("read", lambda: client.responses.retrieve(out["submit"]))
"""
    out = await run_python(session(code, "background-halted"), sdk_env)
    assert out["halt"]["status"] == 429 and out["read"]["status"] == 429, out
    assert out["read"]["body"]["governor"]["cause"] == "on_budget_exhausted"
    assert not [r for r in mock.requests if r.method == "GET"]
    verified(running, "background-halted")


async def test_an_assistants_run_is_reserved_at_its_assistants_model_and_settled_when_read(env):
    running, mock, sdk_env = env
    mock.finished_usage = (3000, 100)
    code = """
record("assistant", lambda: client.beta.assistants.create(model="gpt-4o-mini", name="helper").id)
def run():
    r = client.beta.threads.runs.create(thread_id="thread_A1", assistant_id=out["assistant"])
    return {"id": r.id, "status": r.status}
record("run", run)
record("outputs", lambda: client.beta.threads.runs.submit_tool_outputs(run_id=out["run"]["id"], thread_id="thread_A1",
    tool_outputs=[{"tool_call_id": "call_1", "output": "42"}]).status)
record("read", lambda: client.beta.threads.runs.retrieve(run_id=out["run"]["id"], thread_id="thread_A1").usage.total_tokens)
record("unknown", lambda: client.beta.threads.runs.create(thread_id="thread_A1", assistant_id="asst_never_seen"))
record("stray", lambda: client.beta.threads.runs.submit_tool_outputs(run_id="run_never", thread_id="thread_A1",
    tool_outputs=[{"tool_call_id": "call_1", "output": "42"}]))
"""
    out = await run_python(session(code, "runs"), sdk_env)
    assert out["run"]["status"] == "queued" and out["outputs"] == "queued" and out["read"] == 3100, out
    sent = mock.posted("/runs")[0].json()
    assert "model" not in sent and sent["max_completion_tokens"] == 4096  # fitted: what it may generate is what it holds
    assert out["unknown"]["raised"] == "PermissionDeniedError" and "name the model in the run" in out["unknown"]["message"]
    assert out["stray"]["status"] == 403 and "was not started through this governor" in out["stray"]["message"]
    assert len(mock.posted("/runs")) == 1 and len(mock.posted("/submit_tool_outputs")) == 1
    figures = await used(running, "runs")
    # the run and its tool outputs each reserved 4096 output, charged at once; the read: input past both
    assert figures["tokens"] == 3000 + 2 * 4096, figures
    verified(running, "runs")



async def test_a_runs_tools_are_withheld_and_the_tool_calls_it_asks_for_are_governed(env):
    running, mock, sdk_env = env
    mock.asks_tool = "run_shell"  # not among the passport's tools
    code = """
tools = [{"type": "function", "function": {"name": "search_papers", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object"}}}]
record("run", lambda: client.beta.threads.runs.create(thread_id="thread_T", assistant_id="asst_x",
                                                      model="gpt-4o-mini", tools=tools).id)
record("read", lambda: client.beta.threads.runs.retrieve(run_id=out["run"], thread_id="thread_T").status)
"""
    out = await run_python(session(code, "run-tools"), sdk_env)
    sent = mock.posted("/runs")[0].json()
    assert [t["function"]["name"] for t in sent["tools"]] == ["search_papers"]  # the model never sees run_shell
    refused = out["read"]
    assert refused["status"] == 403 and refused["body"]["governor"]["tool"] == "run_shell", refused
    assert (await used(running, "run-tools"))["state"] == "halted"
    record = verified(running, "run-tools")
    assert any(e["detail"].get("tool") == "run_shell" for e in record["events"])

async def test_a_fine_tuning_job_is_charged_its_training_tokens_times_epochs_or_refused_unpriced(env):
    running, mock, sdk_env = env
    code = """
examples = jsonl([{"messages": [{"role": "user", "content": "q" * 50}, {"role": "assistant", "content": "a" * 50}]}
                  for _ in range(20)])
record("file", lambda: client.files.create(file=("train.jsonl", examples), purpose="fine-tune").id)
record("job", lambda: client.fine_tuning.jobs.create(model="gpt-4o-mini-2024-07-18", training_file=out["file"],
    method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}).id)
record("unseen", lambda: client.fine_tuning.jobs.create(model="gpt-4o-mini-2024-07-18", training_file="file-other"))
record("unpriced", lambda: client.fine_tuning.jobs.create(model="davinci-002", training_file=out["file"],
    method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}))
out["size"] = len(examples)
"""
    out = await run_python(session(code, "fine-tune"), sdk_env)
    assert out["job"].startswith("ftjob-"), out
    assert out["unseen"]["status"] == 403 and "not uploaded through this governor" in out["unseen"]["message"]
    unpriced = out["unpriced"]
    assert unpriced["status"] == 429 and "model 'training:davinci-002' has no price" in unpriced["message"]
    assert len(mock.posted("/fine_tuning/jobs")) == 1
    tokens = estimate_tokens(out["size"], 4.0) * 2
    figures = await used(running, "fine-tune")
    assert figures["tokens"] == tokens and figures["cost"] == pytest.approx(tokens * TRAINING_PRICE / 1e6), figures
    verified(running, "fine-tune")


async def test_a_vector_store_file_batch_is_charged_its_files_embedding_tokens(env):
    running, mock, sdk_env = env
    code = """
doc = b"knowledge " * 400
record("file", lambda: client.files.create(file=("doc.txt", doc), purpose="assistants").id)
record("batch", lambda: client.vector_stores.file_batches.create(vector_store_id="vs_1", file_ids=[out["file"]]).status)
record("one", lambda: client.vector_stores.files.create(vector_store_id="vs_1", file_id=out["file"]).status)
record("unseen", lambda: client.vector_stores.file_batches.create(vector_store_id="vs_1", file_ids=["file-other"]))
out["size"] = len(doc)
"""
    out = await run_python(session(code, "vector-store"), sdk_env)
    assert out["batch"] == out["one"] == "in_progress", out
    assert out["unseen"]["status"] == 403 and "file-other" in out["unseen"]["message"]
    assert len(mock.posted("/file_batches")) == 1 and len(mock.posted("/vs_1/files")) == 1
    figures = await used(running, "vector-store")
    assert figures["tokens"] == 2 * estimate_tokens(out["size"], 4.0), figures
    verified(running, "vector-store")



async def test_64_parallel_background_responses_are_charged_and_stay_within_the_cap(env):
    running, mock, sdk_env = env
    code = """
from concurrent.futures import ThreadPoolExecutor
def one(i):
    try:
        return client.responses.create(model="gpt-4o-mini", input=f"essay {i}", background=True).status
    except openai.APIStatusError as e:
        return e.status_code
with ThreadPoolExecutor(64) as pool:
    out["statuses"] = list(pool.map(one, range(64)))
"""
    out = await run_python(session(code, "background-64"), sdk_env)
    accepted = out["statuses"].count("queued")
    # refused at the cap (429), or past max_iterations the passport's fallback (a `completed` stand-in)
    assert accepted >= 1 and set(out["statuses"]) <= {"queued", 429, "completed"}, out
    assert len(mock.posted("/v1/responses")) == accepted
    figures = await used(running, "background-64")
    # every accepted submission was charged at once (its fitted output limit and estimated input): never 0
    sent = sum(r.json()["max_output_tokens"] for r in mock.posted("/v1/responses"))
    assert sent <= figures["tokens"] <= 20000, (figures, sent)
    verified(running, "background-64")
