"""OpenAI's asynchronous endpoints: work done after the request is answered.

Files uploaded for batches and fine-tuning (`POST /v1/files`), batches (`POST /v1/batches`),
Assistants runs (`POST /v1/threads/runs`, `/v1/threads/{id}/runs`, `.../submit_tool_outputs`),
fine-tuning jobs (`POST /v1/fine_tuning/jobs`) and vector stores that embed files
(`POST /v1/vector_stores`, `.../{id}/files`, `.../{id}/file_batches`); every read, list, cancel
and delete of those resources and of responses (`GET /v1/responses/{id}`), threads and
assistants is a free governed step (counted as an iteration, recorded, refused after a halt).
Background Responses (`POST /v1/responses` with `background: true`) are the OpenAI adapter's.

Each submission is a model call reserved up front at what it declares, charged that whole
reservation when its answer accepts the work, and refused when it cannot fit the session's
caps; a later read of the finished resource charges what its usage exceeds (the charge is
never lowered): governor.adapters.deferred. The rules, per endpoint, and why: docs/reference/async.md.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import orjson

from governor.adapters import uploads, withhold
from governor.adapters.base import Adapter, Exchange, Observation, Reply, UNREAD_ANSWER
from governor.adapters.model_calls import estimate_tokens, model_call
from governor.adapters.reading import answered_object, as_dict, as_list, requested_tool_call
from governor.adapters.refusals import describe
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.deferred import DeclaredFile, DeferredWork, count, finished
from governor.adapters.endpoints import FREE, GOVERNED, Endpoint, Probe
from governor.adapters.fitting import requested_limit
from governor.adapters.openai import OpenAIAdapter
from governor.policy.pricing import BATCH_TIER  # a batch's step: `<model>@batch`, at the batch price
from governor.policy.steps import Decision, Step, UsageReport

UPLOAD = "upload"
BATCH = "batch"
RUN = "run"
TOOL_OUTPUTS = "tool_outputs"
FINE_TUNE = "fine_tune"
EMBED = "embed"
ASSISTANT = "assistant"
THREAD = "thread"
READ = "read"
SPENDING = frozenset({BATCH, RUN, TOOL_OUTPUTS, FINE_TUNE, EMBED})

READS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})
# The model vector stores embed files with (OpenAI's file search: text-embedding-3-large).
EMBEDDING_MODEL = "text-embedding-3-large"
TRAINING_PREFIX = "training:"  # a fine-tuning job's step: `training:<model>`, unpriced unless the table names it
RUN_USAGE = ("prompt_tokens", "completion_tokens")
BATCH_USAGE = ("input_tokens", "output_tokens")
TRAINED = ("trained_tokens", "")  # a fine-tuning job reports its trained tokens on the job itself

# The cheap test selection runs on every request no earlier adapter claimed: one regex search
# (in C) for a segment these endpoints have, before any split.
_MARKERS = re.compile(r"/(?:files|batches|responses/|threads|assistants|fine_tuning/|vector_stores)")


def _resource(route: str) -> tuple[str, int] | None:
    """(what a POST to `route` is, where in the route the id of the resource a read there may
    settle stands: -1 its last segment, -2 the one before, 0 none), or None when the route is
    none of these endpoints. `route`: normalized, lower case (the id is read from the route
    with its case kept: ids are case-sensitive)."""
    if _MARKERS.search(route) is None:
        return None
    p = [""] * 4 + route.split("/")  # padded: p[-5] always exists
    last, second, third, fourth = p[-1], p[-2], p[-3], p[-4]
    if second == "messages" and last == "batches" or third == "messages" and second == "batches" \
            or fourth == "messages" and third == "batches":
        return None  # Anthropic's message batches (governor.adapters.anthropic_batches)
    if last == "files":
        if third == "vector_stores":
            return EMBED, 0
        return (READ, 0) if third == "file_batches" else (UPLOAD, 0)
    if second == "files" or third == "files" and last == "content":
        return READ, 0
    if last == "file_batches" and third == "vector_stores":
        return EMBED, 0
    if "file_batches" in (second, third):
        return READ, 0
    if last == "batches":
        return BATCH, 0
    if second == "batches":
        return READ, -1
    if third == "batches" and last == "cancel":
        return READ, 0
    if second == "responses":
        return None if last == "input_tokens" else (READ, -1)
    if third == "responses" and last in ("cancel", "input_items"):
        return READ, 0
    if last == "runs" and (second == "threads" or third == "threads"):
        return RUN, 0
    if second == "runs":
        return READ, -1
    if third == "runs":
        return (TOOL_OUTPUTS, -2) if last == "submit_tool_outputs" else (READ, 0)
    if fourth == "runs":
        return READ, 0
    if last == "threads" or second == "threads" or third == "threads" and last == "messages" \
            or fourth == "threads" and second == "messages":
        return THREAD, 0
    if last == "assistants" or second == "assistants":
        return ASSISTANT, 0
    if last == "jobs" and second == "fine_tuning":
        return FINE_TUNE, 0
    if third == "fine_tuning" and second == "jobs":
        return READ, -1
    if "fine_tuning" in (third, fourth, p[-5]):
        return READ, 0
    if last == "vector_stores":
        return EMBED, 0
    if second == "vector_stores" or third == "vector_stores" and last == "search":
        return READ, 0
    return None


def auto_epochs(examples: int) -> int:
    """The epochs of a job whose `n_epochs` is "auto", as OpenAI's fine-tuning data
    preparation guide computes them: 3, raised for small files (at most 25) so that about
    100 examples are trained, lowered for large ones so that at most about 25,000 are."""
    examples = max(examples, 1)
    if examples * 3 < 100:
        return min(25, 100 // examples)
    if examples * 3 > 25_000:
        return max(1, 25_000 // examples)
    return 3


def _epochs(body: dict[str, Any], examples: int) -> int:
    """`hyperparameters.n_epochs`, or the method's (`method.{supervised,dpo,reinforcement}`):
    an integer from 1 to 50, or "auto"/absent (auto_epochs)."""
    found: Any = as_dict(body.get("hyperparameters")).get("n_epochs")
    method = as_dict(body.get("method"))
    for name in ("supervised", "dpo", "reinforcement"):
        value = as_dict(as_dict(method.get(name)).get("hyperparameters")).get("n_epochs")
        if value is not None:
            found = value
    if found is None or found == "auto":
        return auto_epochs(examples)
    if type(found) is int and 1 <= found <= 50:
        return found
    raise BadRequest(f"'n_epochs' must be an integer from 1 to 50 or \"auto\", got {found!r}")


def _embedded_files(body: dict[str, Any]) -> list[Any]:
    """File ids a thread or assistant creation asks to embed in new vector stores
    (`tool_resources.file_search.vector_stores[].file_ids`, also under `thread`)."""
    ids: list[Any] = []
    for holder in (body, as_dict(body.get("thread"))):
        search = as_dict(as_dict(holder.get("tool_resources")).get("file_search"))
        for store in as_list(search.get("vector_stores")):
            ids.extend(as_list(as_dict(store).get("file_ids")))
    return ids


def _run_object(body: bytes) -> dict[str, Any] | None:
    """The run an answer carries: a JSON run object, or the last `thread.run` object of a
    streamed run's events (the answer is read whole)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        return data
    run = None
    for line in body.split(b"\n"):
        if line.startswith(b"data:") and b'"thread.run"' in line:
            try:
                event = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict) and event.get("object") == "thread.run":
                run = event
    return run


class OpenAIAsyncAdapter(Adapter):
    name = "openai-async"
    provider = "openai"

    remembers = True  # uploaded files' declarations, submissions charged at once (deferred.py)

    def __init__(self, config: Any = None, memory: DeferredWork | None = None) -> None:
        super().__init__(config)
        self.memory = DeferredWork() if memory is None else memory
        # a call carried in another request's body (a batch file's line) is estimated as the
        # OpenAI adapter estimates that call, and errors are rendered as it renders them
        self.calls = OpenAIAdapter(self.config, self.memory)

    def claims(self, route: str) -> bool:
        return _resource(route) is not None

    def match(self, request: RequestView) -> bool:
        return request.method == "POST" or request.method in READS

    # --- the request ---------------------------------------------------------------------

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        found = _resource(request.match_route)
        if found is None:
            raise BadRequest(f"not an OpenAI asynchronous endpoint: {request.method} {request.route}")
        kind, at = found
        resource = request.normal_route.split("/")[at] if at else ""
        state: dict[str, Any] = {"kind": kind if request.method == "POST" else READ, "route_kind": kind,
                                 "resource": resource, "expected_input": 0, "expected_output": 0}
        exchange = Exchange(adapter=self, method=request.method, host=request.host, path=request.path, body=None,
                            session=session, persona=persona, state=state)
        if request.method != "POST":
            if request.match_route.endswith("/content"):  # a file's bytes (a batch's results): relayed unread
                state[UNREAD_ANSWER] = True
            charged = self.memory.charged(request.host, resource) if resource else None
            exchange.model = charged.model if charged is not None else ""
            return exchange
        if kind == UPLOAD:
            state["declared"] = self._declared(request)
            return exchange
        body = request.json() if kind in SPENDING else request.json_or_none()
        if kind in SPENDING and not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        exchange.body = body
        if not isinstance(body, dict):  # a free step: the upstream judges its body
            return exchange
        if kind == BATCH:
            self._batch(exchange, body)
        elif kind == RUN:
            self._run(exchange, body, request)
        elif kind == TOOL_OUTPUTS:
            self._tool_outputs(exchange, request)
        elif kind == FINE_TUNE:
            self._fine_tune(exchange, body)
        elif kind == EMBED:
            self._embed(exchange, self._file_ids(body))
        elif files := _embedded_files(body):  # a thread or assistant that creates vector stores
            self._embed(exchange, files)
        return exchange

    def _declared(self, request: RequestView) -> DeclaredFile | None:
        """What an upload declares; None when it is no OpenAI file upload (nothing is
        remembered, so no batch or job can name it). A batch file it cannot read is refused."""
        content_type = request.headers.get("content-type") or ""
        if not content_type.lower().lstrip().startswith("multipart/form-data"):
            return None
        try:
            return uploads.declare(content_type, request.content, self._estimate_line)
        except BadRequest as exc:
            if "batch file" in exc.message:
                raise
            return None

    def _estimate_line(self, url: str, body: bytes) -> tuple[str, str, int, int]:
        view = uploads.request_view("batch", url, body)
        route = view.match_route
        if not self.calls.claims(route):
            raise BadRequest(f"'url' {url!r} is not a model endpoint the governor can estimate")
        line = self.calls.open(view, session="", persona=None)
        return line.model, route, line.state["expected_input"], line.state["expected_output"]

    def _known_file(self, host: str, file_id: Any, what: str) -> DeclaredFile:
        if not isinstance(file_id, str) or not file_id:
            raise BadRequest(f"'{what}' must be a file id")
        declared = self.memory.file(host, file_id)
        if declared is None:
            raise BadRequest(f"file {file_id!r} was not uploaded through this governor (or is no longer remembered), "
                             "so the work it declares is unknown: upload it through the governor, then name it",
                             status=403)
        return declared

    def _batch(self, exchange: Exchange, body: dict[str, Any]) -> None:
        declared = self._known_file(exchange.host, body.get("input_file_id"), "input_file_id")
        if declared.purpose != uploads.BATCH:
            raise BadRequest(f"file {body['input_file_id']!r} was uploaded with purpose {declared.purpose!r}, not 'batch'")
        endpoint = body.get("endpoint")
        if not isinstance(endpoint, str) or uploads.request_view("", endpoint, b"").match_route != declared.endpoint:
            raise BadRequest(f"'endpoint' {endpoint!r} is not the endpoint the file's requests name ({declared.endpoint})")
        exchange.model = declared.model + BATCH_TIER
        exchange.state.update(expected_input=declared.input_tokens, expected_output=declared.output_tokens)

    def _run(self, exchange: Exchange, body: dict[str, Any], request: RequestView) -> None:
        model = body.get("model")
        assistant = body.get("assistant_id")
        if model is None and isinstance(assistant, str):
            model = self.memory.model_of(exchange.host, assistant)
        if not isinstance(model, str) or not model:
            raise BadRequest(f"the run names no 'model' and the governor has not seen assistant {assistant!r} "
                             "created or read through it, so the run's model is unknown: name the model in the run, "
                             "or create or retrieve the assistant through the governor", status=403)
        if _embedded_files(body):
            raise BadRequest("a run whose new thread creates vector stores is not governed: create the vector store "
                             "first (POST /v1/vector_stores), then name it")
        if body.get("tools") is not None:  # the run's own tools (those set on its assistant cannot be cut)
            exchange.state["tools"] = withhold.read_tools(body["tools"], "tools", withhold.openai_names)
        exchange.model = model
        exchange.stream = False  # a streamed run is read whole: its last run object carries the usage
        prompt = requested_limit(body, "max_prompt_tokens")
        estimate = estimate_tokens(len(request.content), self.config.bytes_per_token)
        exchange.state.update(expected_input=max(prompt, estimate),
                              expected_output=requested_limit(body, "max_completion_tokens")
                              or self.config.default_output_tokens)

    def _tool_outputs(self, exchange: Exchange, request: RequestView) -> None:
        run = exchange.state["resource"]
        charged = self.memory.charged(exchange.host, run)
        if charged is None:
            raise BadRequest(f"run {run!r} was not started through this governor (or is finished, or no longer "
                             "remembered): its tool outputs would continue work it cannot charge", status=403)
        exchange.model = charged.model
        exchange.state.update(expected_input=estimate_tokens(len(request.content), self.config.bytes_per_token),
                              expected_output=self.config.default_output_tokens)

    def _fine_tune(self, exchange: Exchange, body: dict[str, Any]) -> None:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' is required and must be a string")
        declared = self._known_file(exchange.host, body.get("training_file"), "training_file")
        epochs = _epochs(body, declared.lines)
        exchange.model = TRAINING_PREFIX + model
        exchange.state.update(expected_input=estimate_tokens(declared.size, self.config.bytes_per_token) * epochs,
                              epochs=epochs)

    def _file_ids(self, body: dict[str, Any]) -> list[Any]:
        if "file_id" in body:
            return [body["file_id"]]
        ids = list(as_list(body.get("file_ids")))
        ids.extend(as_dict(item).get("file_id") for item in as_list(body.get("files")))
        return ids

    def _embed(self, exchange: Exchange, file_ids: list[Any]) -> None:
        size = sum(self._known_file(exchange.host, file_id, "file_id").size for file_id in file_ids)
        exchange.model = EMBEDDING_MODEL
        exchange.state.update(kind=EMBED, expected_input=estimate_tokens(size, self.config.bytes_per_token))

    def output_limit_fields(self, exchange: Exchange) -> tuple[str, ...]:
        return ("max_completion_tokens",) if exchange.state["kind"] == RUN else ()

    async def steps(self, exchange: Exchange) -> list[Step]:
        tools = exchange.state.get("tools")
        return [model_call(self, exchange, withhold.flat(tools) if tools else ())]

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        state, body = exchange.state, exchange.body
        if decision.allowed_tools is None or state["kind"] != RUN or ("tools" not in state and "tool_choice" not in body):
            return None
        withheld = withhold.withhold_openai(body, decision.allowed_tools, state.get("tools"), None)
        if withheld is None:
            return None
        state["withheld"] = withheld  # offered tools the run may not use: the model never sees them
        return orjson.dumps(body)

    # --- the answer ----------------------------------------------------------------------

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        state = exchange.state
        kind = state["kind"]
        if kind in (RUN, TOOL_OUTPUTS):
            run = _run_object(body) if status == 200 else None
            return Observation(usage=self._run_answer(exchange, status, run), steps=self._asked(exchange, run))
        data = answered_object(status, body)
        if data is None:
            return Observation()
        host, persona = exchange.host, exchange.persona
        resource_id = data.get("id") if isinstance(data.get("id"), str) else None
        if state["route_kind"] == ASSISTANT:
            self._remember_models(host, data)
        if kind == UPLOAD:
            if state["declared"] is not None and resource_id:
                self.memory.remember_file(host, resource_id, state["declared"])
            return Observation()
        if kind == READ:
            resource = state["resource"]
            if resource and self.memory.charged(host, resource) is not None:
                if self.memory.charged(host, resource).usage_names == TRAINED:  # type: ignore[union-attr]
                    data = {**data, "status": "completed" if data.get("status") == "succeeded" else data.get("status"),
                            "usage": {"trained_tokens": data.get("trained_tokens")}}
                return Observation(usage=self.memory.settle(host, resource, data, persona),
                                   steps=self._asked(exchange, data))
            return Observation(steps=self._asked(exchange, data))
        expected_in, expected_out = state["expected_input"], state["expected_output"]
        if not expected_in and not expected_out:
            return Observation()  # a free step (a thread, an assistant, an empty vector store)
        if kind in (BATCH, FINE_TUNE) and resource_id:
            names = BATCH_USAGE if kind == BATCH else TRAINED
            return Observation(usage=self.memory.submitted(host, resource_id, exchange.model, expected_in, expected_out,
                                                           names, persona))
        return Observation(usage=UsageReport(exchange.model, expected_in, expected_out, persona=persona, final=True))

    def _asked(self, exchange: Exchange, run: dict[str, Any] | None) -> list[Step]:
        """The tool calls a run waiting for tool outputs asks the agent to run (admitted as a
        chat answer's are: an undeclared tool is refused there)."""
        if not isinstance(run, dict) or run.get("object") != "thread.run" or run.get("status") != "requires_action":
            return []
        calls = as_dict(as_dict(run.get("required_action")).get("submit_tool_outputs")).get("tool_calls")
        steps: list[Step] = []
        for call in as_list(calls)[:128]:
            function = as_dict(as_dict(call).get("function"))
            if step := requested_tool_call(function.get("name"), function.get("arguments"), exchange.persona):
                steps.append(step)
        return steps

    def _run_answer(self, exchange: Exchange, status: int, run: dict[str, Any] | None) -> UsageReport | None:
        """A run's (or its tool outputs') answer: its reservation charged, the run remembered;
        a run already finished in the answer (a streamed one) also charged its usage past all
        that was charged for it."""
        if status != 200:
            return None
        state, host, persona = exchange.state, exchange.host, exchange.persona
        run_id = run.get("id") if isinstance(run, dict) and isinstance(run.get("id"), str) else None
        if run_id is None:  # accepted but unreadable: the reservation is what it may have cost
            return UsageReport(exchange.model, state["expected_input"], state["expected_output"], persona=persona)
        report = self.memory.submitted(host, run_id, exchange.model, state["expected_input"],
                                       state["expected_output"], RUN_USAGE, persona)
        extra = self.memory.settle(host, run_id, run, persona) if finished(run.get("status")) else None  # type: ignore[union-attr]
        if extra is None:
            return report
        return UsageReport(report.model, report.input_tokens + extra.input_tokens,
                           report.output_tokens + extra.output_tokens, persona=persona)

    def _remember_models(self, host: str, data: dict[str, Any]) -> None:
        """Assistants' models, from an assistant object or a list of them."""
        items = as_list(data.get("data")) if data.get("object") == "list" else [data]
        for item in items[:100]:
            item = as_dict(item)
            if item.get("object") == "assistant" and isinstance(item.get("id"), str) \
                    and isinstance(item.get("model"), str) and item["model"]:
                self.memory.remember_model(host, item["id"], item["model"])

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        return self.calls.error_response(status, message, governor)

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        # no answer of these endpoints can stand in for the work: the refusal, as an error
        return self.error_response(403, describe(governor), governor, exchange)


ADAPTERS = (OpenAIAsyncAdapter,)

__all__ = ["OpenAIAsyncAdapter", "ADAPTERS", "auto_epochs"]


def _multipart(fields: tuple[tuple[str, str, bytes], ...]) -> tuple[bytes, str]:
    """A multipart/form-data body as httpx (the openai SDK) encodes it: (body, Content-Type)."""
    boundary = "governor-probe-boundary"
    out = b""
    for name, filename, value in fields:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        extra = "\r\nContent-Type: application/octet-stream" if filename else ""
        out += f"--{boundary}\r\nContent-Disposition: {disposition}{extra}\r\n\r\n".encode() + value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


_BATCH_LINE = (b'{"custom_id":"1","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini",'
               b'"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}}\n')
_UPLOAD_BODY, _UPLOAD_TYPE = _multipart((("purpose", "", b"batch"), ("file", "batch.jsonl", _BATCH_LINE)))

ENDPOINTS = (
    Endpoint("OpenAI", "files (upload)", "POST", "/v1/files", FREE, "openai-async",
             Probe("POST", "/v1/files", _UPLOAD_BODY, _UPLOAD_TYPE),
             "free step; a batch file's requests are read and estimated (a malformed one refused), remembered by "
             "the answer's id for the batch that names it"),
    Endpoint("OpenAI", "files (read, list, delete)", "GET", "/v1/files/{file_id}", FREE, "openai-async",
             Probe("GET", "/v1/files/file-abc"), "free step"),
    Endpoint("OpenAI", "batches", "POST", "/v1/batches", GOVERNED, "openai-async",
             Probe("POST", "/v1/batches", b'{"input_file_id":"file-never-uploaded","endpoint":"/v1/chat/completions",'
                                          b'"completion_window":"24h"}'),
             "the file's declared requests reserved up front (at the batch price, `<model>@batch`), charged at once; a file "
             "the governor never saw uploaded is refused"),
    Endpoint("OpenAI", "batches (read, list, cancel)", "GET", "/v1/batches/{batch_id}", FREE, "openai-async",
             Probe("GET", "/v1/batches/batch_abc"), "free step; a completed batch's usage past its charge is charged"),
    Endpoint("OpenAI", "responses (read, cancel, delete)", "GET", "/v1/responses/{response_id}", FREE,
             "openai-async", Probe("GET", "/v1/responses/resp_abc"),
             "free step; a finished background response's usage past its charge is charged"),
    Endpoint("OpenAI", "assistants runs", "POST", "/v1/threads/{thread_id}/runs", GOVERNED, "openai-async",
             Probe("POST", "/v1/threads/thread_abc/runs", b'{"assistant_id":"asst_abc","model":"gpt-4o-mini"}'),
             "reserved at the run's model (or its assistant's, seen through the governor) and "
             "max_completion_tokens (fitted), charged at once; usage past it charged when the run is read"),
    Endpoint("OpenAI", "assistants create thread and run", "POST", "/v1/threads/runs", GOVERNED, "openai-async",
             Probe("POST", "/v1/threads/runs", b'{"assistant_id":"asst_abc","model":"gpt-4o-mini",'
                                               b'"thread":{"messages":[{"role":"user","content":"hi"}]}}'),
             "as a run"),
    Endpoint("OpenAI", "assistants run tool outputs", "POST",
             "/v1/threads/{thread_id}/runs/{run_id}/submit_tool_outputs", GOVERNED, "openai-async",
             Probe("POST", "/v1/threads/thread_abc/runs/run_abc/submit_tool_outputs",
                   b'{"tool_outputs":[{"tool_call_id":"call_1","output":"42"}]}'),
             "reserved and charged as the run's continuation; a run the governor did not start is refused"),
    Endpoint("OpenAI", "assistants runs (read, list, cancel)", "GET", "/v1/threads/{thread_id}/runs/{run_id}", FREE,
             "openai-async", Probe("GET", "/v1/threads/thread_abc/runs/run_abc"),
             "free step; a finished run's usage past its charges is charged"),
    Endpoint("OpenAI", "assistants, threads, messages", "POST", "/v1/assistants", FREE, "openai-async",
             Probe("POST", "/v1/assistants", b'{"model":"gpt-4o-mini","name":"probe"}'),
             "free step (the assistant's model is remembered for its runs); inline vector stores charged as embeddings"),
    Endpoint("OpenAI", "fine-tuning jobs", "POST", "/v1/fine_tuning/jobs", GOVERNED, "openai-async",
             Probe("POST", "/v1/fine_tuning/jobs", b'{"model":"gpt-4o-mini-2024-07-18","training_file":"file-abc"}'),
             "training file's tokens (bytes / bytes_per_token) x epochs at `training:<model>`, charged at once; "
             "a file not uploaded through the governor is refused"),
    Endpoint("OpenAI", "fine-tuning jobs (read, list, cancel)", "GET", "/v1/fine_tuning/jobs/{job_id}", FREE,
             "openai-async", Probe("GET", "/v1/fine_tuning/jobs/ftjob-abc"), "free step"),
    Endpoint("OpenAI", "vector store file batches", "POST", "/v1/vector_stores/{vector_store_id}/file_batches",
             GOVERNED, "openai-async",
             Probe("POST", "/v1/vector_stores/vs_abc/file_batches", b'{"file_ids":["file-abc"]}'),
             "the files' tokens (bytes / bytes_per_token) at text-embedding-3-large, charged at once; a file not "
             "uploaded through the governor is refused"),
    Endpoint("OpenAI", "vector store files", "POST", "/v1/vector_stores/{vector_store_id}/files", GOVERNED,
             "openai-async", Probe("POST", "/v1/vector_stores/vs_abc/files", b'{"file_id":"file-abc"}'),
             "as file batches"),
    Endpoint("OpenAI", "vector stores (read, list, delete)", "GET", "/v1/vector_stores/{vector_store_id}", FREE,
             "openai-async", Probe("GET", "/v1/vector_stores/vs_abc"), "free step"),
)
