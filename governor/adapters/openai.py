"""OpenAI wire protocol: Chat Completions, Responses, legacy Completions (plain and
streamed, SSE) and Embeddings.

Matched on the normalized path (shapes.normalize_path), whoever serves it (api.openai.com,
Azure, vLLM, a mock): POST .../chat/completions, .../responses, .../completions, .../embeddings.

Usage: Chat, Completions and Embeddings `usage.prompt_tokens / completion_tokens /
prompt_tokens_details.cached_tokens` (embeddings have no completion tokens); Responses
`usage.input_tokens / output_tokens / input_tokens_details.cached_tokens`. Input tokens
include the cached ones (as OpenAI counts them).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import orjson

from governor.adapters import sse, withhold
from governor.adapters.background import RESPONSE_USAGE, BackgroundStream
from governor.adapters.deferred import finished
from governor.adapters.counting import OutputCounter, measured
from governor.adapters.fitting import requested_limit
from governor.adapters.endpoints import GOVERNED, Endpoint, Probe
from governor.adapters.base import (
    Adapter,
    AdapterConfig,
    UnreadableAnswer,
    Exchange,
    Observation,
    Reply,
    StreamEvent,
    StreamWatcher,
)
from governor.adapters.model_calls import estimate_tokens, model_call, within_admission
from governor.adapters.reading import (
    LENIENT_EVENT,
    answered_object,
    as_dict,
    as_list,
    positive_int,
    requested_tool_call,
    lenient_only,
)
from governor.adapters.refusals import describe, fallback_text
from governor.adapters.request_view import BadRequest, RequestView
from governor.policy.steps import Decision, Step, UsageReport

CHAT = "chat"
RESPONSES = "responses"
COMPLETIONS = "completions"  # the legacy text completions endpoint
EMBEDDINGS = "embeddings"

ERROR_TYPES = {
    400: "invalid_request_error",
    403: "governor_denied",
    429: "governor_limit_reached",
    502: "upstream_error",
    503: "governor_unavailable",
    504: "upstream_timeout",
}


def _kind(route: str) -> str | None:
    """The endpoint a normalized, lower-case route names (None: not a model call)."""
    if route.endswith("/chat/completions"):
        return CHAT
    if route.endswith("/responses"):
        return RESPONSES
    if route.endswith("/completions"):
        return COMPLETIONS
    if route.endswith("/embeddings") and not route.endswith("/api/embeddings"):  # that one is Ollama's
        return EMBEDDINGS
    return None


# The output-limit fields of each endpoint, the one inserted into a request naming none first
# (max_completion_tokens: max_tokens is deprecated for chat and refused by reasoning models).
_LIMIT_FIELDS: dict[str, tuple[str, ...]] = {
    CHAT: ("max_completion_tokens", "max_tokens"),
    RESPONSES: ("max_output_tokens",),
    COMPLETIONS: ("max_tokens",),
    EMBEDDINGS: (),
}


def _choices(body: dict[str, Any]) -> int:
    """How many answers one request generates (`n`, or the legacy `best_of`, which bills
    every candidate): the expected output is per answer. Read as strictly as the output
    limit (a 400 for "5", 5.0, 0, -1): a lenient provider takes "5" as 5, and a count read as 1
    here would reserve one answer for five."""
    return max(requested_limit(body, "n"), requested_limit(body, "best_of"), 1)


def _token_ids(value: Any) -> int:
    """Tokens given as ids (an array of ints, or of arrays of ints): counted, since their
    JSON is shorter per token than bytes_per_token assumes for text."""
    if not isinstance(value, list):
        return 0
    if all(type(item) is int for item in value):
        return len(value)
    return sum(len(item) for item in value if isinstance(item, list))


def _count(value: Any) -> bool:
    """A token count as a provider writes it: a non-negative integer (not a bool, a string, -3)."""
    return type(value) is int and value >= 0


def _usage(kind: str, usage: Any, model: str, persona: str | None, final: bool,
           expected_input: int) -> UsageReport | None:
    """The provider's usage; None when it has no believable output figure (absent, a string,
    negative: the answer is then charged as one without usage). An input figure that is not
    a count is replaced by the admission's `expected_input`, never read as 0."""
    if not isinstance(usage, dict):
        return None
    # the same usage under the Responses API's names and under Chat/Completions' names
    inputs, outputs = ("input_tokens", "output_tokens") if kind == RESPONSES else ("prompt_tokens", "completion_tokens")
    output = usage.get(outputs)
    if not _count(output):
        if kind != EMBEDDINGS:
            return None
        output = 0  # embeddings have no output
    given = usage.get(inputs)
    details = usage.get(inputs + "_details")
    return UsageReport(
        model=model,
        input_tokens=given if _count(given) else expected_input,
        output_tokens=output,
        cached_input_tokens=positive_int(details.get("cached_tokens")) if isinstance(details, dict) else 0,
        persona=persona,
        final=final,
    )



def _answer_count(kind: str, data: dict[str, Any]) -> int:
    """The governor's count (adapters.counting) of the output a plain answer delivers: text,
    refusals, reasoning text, tool-call names and arguments."""
    counter = OutputCounter()
    add = counter.add_value
    if kind == CHAT or kind == COMPLETIONS:
        for choice in as_list(data.get("choices")):
            if not isinstance(choice, dict):
                continue
            add(choice.get("text"))
            message = as_dict(choice.get("message"))
            for key in ("content", "refusal", "reasoning_content", "reasoning"):
                add(message.get(key))
            calls = as_list(message.get("tool_calls")) + [message.get("function_call")]
            for call in calls:
                fn = as_dict(call.get("function")) if isinstance(call, dict) and "function" in call else as_dict(call)
                if type(fn.get("name")) is str:
                    counter.add_separate(fn["name"])
                add(fn.get("arguments"))
    elif kind == RESPONSES:
        for item in as_list(data.get("output")):
            if not isinstance(item, dict):
                continue
            if type(item.get("name")) is str:
                counter.add_separate(item["name"])
            add(item.get("arguments"))
            add(item.get("input"))
            for part in as_list(item.get("content")) + as_list(item.get("summary")):
                if isinstance(part, dict):
                    add(part.get("text"))
                    add(part.get("refusal"))
    return counter.tokens


class OpenAIAdapter(Adapter):
    name = "openai"
    provider = "openai"

    def __init__(self, config: AdapterConfig | None = None) -> None:
        super().__init__(config)
        # Azure OpenAI deployment name -> the model it serves (the config file's `deployments`):
        # a deployment is admitted and priced as that model (docs/reference/compat.md)
        self.deployments: Mapping[str, str] = self.config.extra.get("deployments") or {}

    def claims(self, route: str) -> bool:
        return _kind(route) is not None

    def match(self, request: RequestView) -> bool:
        return request.method == "POST" and _kind(request.match_route) is not None

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        kind = _kind(request.match_route)
        body = request.json()
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        if kind is None:  # a path a `routes` entry gave this adapter: the body says which endpoint
            kind = CHAT if "messages" in body else COMPLETIONS if "prompt" in body else \
                RESPONSES if "input" in body or "previous_response_id" in body else None
            if kind is None:
                raise BadRequest(f"not an OpenAI model call: {request.method} {request.route}")
        model = body.get("model")
        if model is None:  # Azure names the deployment in the path instead
            parts = request.normal_route.split("/")
            lowered = [part.lower() for part in parts]
            model = parts[lowered.index("deployments") + 1] if "deployments" in lowered[:-1] else ""
        if not isinstance(model, str):
            raise BadRequest("'model' must be a string")
        state: dict[str, Any] = {"kind": kind}
        if self.deployments and model in self.deployments:  # an Azure deployment priced as its model
            state["deployment"] = model
            model = self.deployments[model]
        # each offered tool's names (withhold.py): read once here, a 400 for one without a name
        if body.get("tools") is not None:
            state["tools"] = withhold.read_tools(body["tools"], "tools", withhold.openai_names)
        if kind == CHAT and body.get("functions") is not None:  # the legacy form of tools
            state["functions"] = withhold.read_tools(body["functions"], "functions", withhold.named_only)
        if kind == CHAT and body.get("web_search_options") is not None:  # provider-run search, no tools entry
            state["web_search"] = withhold.web_search_options(body["web_search_options"])
        stream = body.get("stream")
        if stream is not None and type(stream) is not bool:  # vLLM's pydantic reads "true" as true
            raise BadRequest(f"'stream' must be a boolean, got {repr(stream)[:40]}")
        stream = stream is True
        expected_input = estimate_tokens(len(request.content), self.config.bytes_per_token)
        choices = 1
        if kind == CHAT:
            if not isinstance(body.get("messages"), list):
                raise BadRequest("'messages' must be an array")
            choices = _choices(body)
            # both named: the larger is reserved (and fitted), whichever one the provider reads
            limit = max(requested_limit(body, "max_completion_tokens"), requested_limit(body, "max_tokens"))
            expected_output = (limit or self.config.default_output_tokens) * choices
        elif kind == RESPONSES:
            if body.get("input") is None and body.get("previous_response_id") is None:
                raise BadRequest("'input' is required")
            expected_output = requested_limit(body, "max_output_tokens") or self.config.default_output_tokens
            if body.get("background") is True:  # answered `queued`: charged at once (adapters/deferred.py)
                state["background"] = True
        elif kind == COMPLETIONS:
            prompt = body.get("prompt")
            if not isinstance(prompt, (str, list)):
                raise BadRequest("'prompt' is required and must be a string or an array")
            expected_input = max(expected_input, _token_ids(prompt))
            choices = _choices(body)
            expected_output = (requested_limit(body, "max_tokens") or self.config.default_output_tokens) * choices
        else:  # embeddings: input tokens only, never streamed
            embedded = body.get("input")
            if not isinstance(embedded, (str, list)):
                raise BadRequest("'input' is required and must be a string or an array")
            expected_input = max(expected_input, _token_ids(embedded))
            expected_output = 0
            stream = False
        return Exchange(
            adapter=self,
            method=request.method,
            host=request.host,
            path=request.path,
            body=body,
            session=session,
            persona=persona,
            stream=stream,
            model=model,
            state={
                **state,
                "expected_input": expected_input,
                "expected_output": expected_output,
                "choices": choices,
            },
        )

    def output_limit_fields(self, exchange: Exchange) -> tuple[str, ...]:
        return _LIMIT_FIELDS[exchange.state["kind"]]

    async def steps(self, exchange: Exchange) -> list[Step]:
        state = exchange.state
        tools, functions, search = state.get("tools"), state.get("functions"), state.get("web_search")
        offered = withhold.flat((tools or ()) + (functions or ()) + (search or ())) if tools or functions or search else ()
        return [model_call(self, exchange, offered)]

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        body = exchange.body
        changed = False
        state = exchange.state
        allowed = decision.allowed_tools
        if allowed is not None and ("tools" in state or "functions" in state or "tool_choice" in body
                                    or "function_call" in body or "web_search" in state):
            withheld = withhold.withhold_openai(body, allowed, state.get("tools"), state.get("functions"),
                                                state.get("web_search"))
            if withheld is not None:  # offered tools the step may not use: the model never sees them
                state["withheld"] = withheld
                changed = True
        if exchange.state["kind"] in (CHAT, COMPLETIONS) and exchange.stream and self.config.inject_stream_usage:
            options = body.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage")):
                body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
                exchange.state["usage_injected"] = True
                changed = True
        return orjson.dumps(body) if changed else None

    def observe_response(
        self, exchange: Exchange, status: int, headers: Mapping[str, str], body: bytes
    ) -> Observation:
        data = answered_object(status, body)
        if data is None:
            if status == 200 and lenient_only(body):
                raise UnreadableAnswer("the upstream's answer is JSON only to a lenient parser (NaN, Infinity, "
                                       "an encoding orjson refuses); it was refused rather than relayed unread")
            return Observation()
        kind = exchange.state["kind"]
        model = data.get("model") if isinstance(data.get("model"), str) and data["model"] else exchange.model
        usage = measured(_usage(kind, data.get("usage"), model, exchange.persona, final=True,
                                expected_input=exchange.state["expected_input"]), _answer_count(kind, data),
                         model=model, expected_input=exchange.state["expected_input"], persona=exchange.persona)
        if "background" in exchange.state and isinstance(data.get("id"), str) and not finished(data.get("status")):
            state = exchange.state  # accepted, not done: its reservation now, whatever usage it claims so far
            usage = self.config.memory.submitted(exchange.host, data["id"], exchange.model, state["expected_input"],
                                                 state["expected_output"], RESPONSE_USAGE, exchange.persona)
        steps: list[Step] = []
        if kind == CHAT:
            for choice in as_list(data.get("choices")):
                message = as_dict(choice.get("message") if isinstance(choice, dict) else None)
                for call in as_list(message.get("tool_calls")):
                    fn = call.get("function") if isinstance(call, dict) else None
                    if isinstance(fn, dict) and (step := requested_tool_call(fn.get("name"), fn.get("arguments"), exchange.persona)):
                        steps.append(step)
        else:
            for item in as_list(data.get("output")):
                if isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call"):
                    if step := requested_tool_call(item.get("name"), item.get("arguments", item.get("input")), exchange.persona):
                        steps.append(step)
        return Observation(usage=usage, steps=steps)

    def stream_watcher(
        self, exchange: Exchange, status: int, headers: Mapping[str, str]
    ) -> StreamWatcher | None:
        if status != 200 or "text/event-stream" not in (headers.get("content-type") or ""):
            return None
        kind = exchange.state["kind"]
        if kind == CHAT:
            return ChatStreamWatcher(exchange, self.config.bytes_per_token)
        if kind == COMPLETIONS:
            return CompletionsStreamWatcher(exchange, self.config.bytes_per_token)
        if kind == RESPONSES:
            watcher = ResponsesStreamWatcher(exchange, self.config.bytes_per_token)
            if "background" in exchange.state:  # work that goes on upstream if the stream ends early
                return BackgroundStream(watcher, exchange, self.config.memory)
            return watcher
        return None  # embeddings are never streamed: a stream is buffered and read whole

    def error_response(
        self, status: int, message: str, governor: Mapping[str, Any] | None, exchange: Exchange | None = None
    ) -> Reply:
        if exchange is not None and governor and governor.get("reason") == "unpriced_model" \
                and "/openai/" in exchange.path.lower():
            message += (f"; {exchange.model!r} is an Azure OpenAI deployment name: map it to the model it serves in "
                        f"the config file's `deployments` ({exchange.model}: gpt-4o), or price the name itself")
        error: dict[str, Any] = {
            "message": message,
            "type": ERROR_TYPES.get(status, "governor_error"),
            "param": None,
            "code": (governor or {}).get("cause"),
        }
        if governor is not None:
            error["governor"] = dict(governor)
        return Reply.json(status, {"error": error})

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        text = fallback_text(decision)
        model = exchange.model
        created = int(time.time())
        kind = exchange.state["kind"]
        if kind == EMBEDDINGS:  # no text to substitute for vectors: the refusal, as an error
            return self.error_response(403, describe(governor), governor, exchange)
        if kind == COMPLETIONS:
            base = {"id": "cmpl-governor-fallback", "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}]}
            zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
            if not exchange.stream:
                return Reply.json(200, {**base, "usage": zero, "governor": dict(governor)})
            return Reply(200, {"content-type": "text/event-stream"}, sse.encode(base) + b"data: [DONE]\n\n")
        if kind == CHAT:
            base = {"id": "chatcmpl-governor-fallback", "created": created, "model": model}
            zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
            if not exchange.stream:
                return Reply.json(200, {
                    **base, "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "stop", "logprobs": None}],
                    "usage": zero, "governor": dict(governor),
                })
            chunk = {**base, "object": "chat.completion.chunk"}
            events = [
                sse.encode({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                                                  "finish_reason": None}]}),
                sse.encode({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ]
            options = exchange.body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):
                events.append(sse.encode({**chunk, "choices": [], "usage": zero}))
            events.append(b"data: [DONE]\n\n")
            return Reply(200, {"content-type": "text/event-stream"}, b"".join(events))
        output = [{"id": "msg_governor_fallback", "type": "message", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        response = {
            "id": "resp_governor_fallback", "object": "response", "created_at": created, "model": model,
            "status": "completed", "output": output, "error": None, "incomplete_details": None,
            "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "governor": dict(governor),
        }
        if not exchange.stream:
            return Reply.json(200, response)
        events = [
            sse.encode({"type": "response.created", "sequence_number": 0,
                        "response": {**response, "status": "in_progress", "output": []}}, "response.created"),
            sse.encode({"type": "response.output_text.delta", "sequence_number": 1, "item_id": output[0]["id"],
                        "output_index": 0, "content_index": 0, "delta": text, "logprobs": []},
                       "response.output_text.delta"),
            sse.encode({"type": "response.completed", "sequence_number": 2, "response": response},
                       "response.completed"),
        ]
        return Reply(200, {"content-type": "text/event-stream"}, b"".join(events))


class _Watcher(sse.SSEStreamWatcher):
    def __init__(self, exchange: Exchange, bytes_per_token: float) -> None:
        self.exchange = exchange
        self.bpt = bytes_per_token
        self.decoder = sse.SSEDecoder()
        self.counter = OutputCounter()  # the output relayed so far: text, tool names and arguments
        self.reported: UsageReport | None = None  # latest provider usage (cumulative)
        self.completed = False  # the upstream finished the response normally
        self._last: UsageReport | None = None
        # our own estimate stays within the admission up to this many generated bytes
        self._quiet_bytes = exchange.state["expected_output"] * bytes_per_token
        self._quiet_words = exchange.state["expected_output"]  # and the count's words within it
        self._quiet_text = min(self._quiet_bytes, 2 * self._quiet_words - 1)  # bytes that cannot hold more words

    @property
    def generated_bytes(self) -> int:
        """Bytes of text and tool arguments relayed so far."""
        return self.counter.nbytes

    def _estimate(self, final: bool) -> UsageReport:
        """The provider's usage once the response completed, its output raised to the
        governor's count of what was relayed when that is larger (adapters.counting; without
        usage, the count and the request's estimated input); until then (and after a cut)
        its latest cumulative output or our estimate from the text, whichever is larger,
        and the request's estimated input when the provider has not said."""
        reported = self.reported
        if final and self.completed:
            return measured(reported, self.counter.tokens, model=self.exchange.model, persona=self.exchange.persona,
                            expected_input=self.exchange.state["expected_input"])
        estimate = max(estimate_tokens(self.generated_bytes, self.bpt), self.counter.tokens)
        return UsageReport(
            model=reported.model if reported else self.exchange.model,
            input_tokens=reported.input_tokens if reported else self.exchange.state["expected_input"],
            output_tokens=max(reported.output_tokens, estimate) if reported else estimate,
            cached_input_tokens=reported.cached_input_tokens if reported else 0,
            persona=self.exchange.persona,
            final=final,
            reported_output_tokens=reported.output_tokens if reported else None,
            counted_output_tokens=self.counter.tokens if final else None,
        )

    def _progress(self, out: list[StreamEvent]) -> None:
        """Append a usage update when the running figure changed and is past the admission
        (within_admission); the figure is checked as numbers before a report is built."""
        reported = self.reported
        if reported is None:
            # our estimate (the exchange's model and expected input) is within the admission
            # while ceil(bytes / bytes_per_token) <= expected output, i.e. bytes <= _quiet_bytes
            if self.generated_bytes <= self._quiet_bytes and self.counter.words_within(self._quiet_words):
                return
        elif within_admission(self.exchange, reported.model, reported.input_tokens,
                              max(reported.output_tokens, estimate_tokens(self.generated_bytes, self.bpt),
                                  self.counter.tokens)):
            return
        current = self._estimate(final=False)
        if current != self._last:
            self._last = current
            out.append(current)

    @property
    def usage(self) -> UsageReport | None:
        return self._last

    def _closed(self, out: list[StreamEvent]) -> None:
        self._finish(out)
        out.append(self._estimate(final=True))

    def _event(self, event: sse.SSEEvent, out: list[StreamEvent]) -> None:
        raise NotImplementedError

    def _finish(self, out: list[StreamEvent]) -> None:
        pass


_NO_ID = "chatcmpl-governor"  # a chat stream's chunk id until the upstream's first chunk gives one


class ChatStreamWatcher(_Watcher):
    """chat.completion.chunk events; tool calls arrive as indexed argument deltas."""

    def __init__(self, exchange: Exchange, bytes_per_token: float) -> None:
        super().__init__(exchange, bytes_per_token)
        self.calls: dict[int, dict[str, Any]] = {}
        self.chunk_id = _NO_ID  # the upstream's chunk id, once a chunk gave one
        self.model = exchange.model
        self.created = int(time.time())

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        # nearly every chunk is one whole `data: {...}` event: its JSON is parsed from the
        # bytes as they came, without the line decoder and its str copies
        # (bytes tests by int: `13 in chunk` is a memchr, `b"\r" in chunk` a substring search)
        if chunk[:7] != b"data: {" or 13 in chunk or chunk.find(10) != len(chunk) - 2 or chunk[-1] != 10 \
                or not self.decoder.idle:
            return super().feed(chunk)
        try:
            data = orjson.loads(chunk[6:-2])
        except orjson.JSONDecodeError:  # e.g. invalid UTF-8: the decoder reads it leniently
            return super().feed(chunk)
        if type(data) is not dict:
            return []
        # the usual chunk past the first: one choice whose delta carries text and nothing
        # else the governor acts on (no usage, tool call or finish), with no tool call
        # being assembled. What _chunk does for it, without its walk: the text is counted,
        # and a report is due only past the admission (_progress)
        choices = data.get("choices")
        if (self.chunk_id != _NO_ID and not self.calls and type(choices) is list and len(choices) == 1
                and type(choice := choices[0]) is dict and not choice.get("finish_reason")
                and type(delta := choice.get("delta")) is dict and not delta.get("tool_calls")
                and not data.get("usage")):
            counter = self.counter
            content = delta.get("content")
            if type(content) is str:
                counter.add(content)
            if len(delta) > 2:  # more than role and content: a refusal or reasoning text
                for key in ("refusal", "reasoning_content", "reasoning"):
                    counter.add_value(delta.get(key))
            # quiet while the bytes, and the words they can hold (one per two bytes), are within it
            if self.reported is None and (counter.nbytes <= self._quiet_text or (
                    counter.nbytes <= self._quiet_bytes and counter.words_within(self._quiet_words))):
                return []
            out: list[StreamEvent] = []
            self._progress(out)
            return out
        out = []
        self._chunk(data, out)
        return out

    def _event(self, event: sse.SSEEvent, out: list[StreamEvent]) -> None:
        if event.data.startswith("[DONE]"):
            self.completed = True
            return
        data = event.json()
        if isinstance(data, dict):
            self._chunk(data, out)
        elif data is None and lenient_only(event.data):
            raise UnreadableAnswer(LENIENT_EVENT)

    def _chunk(self, data: dict[str, Any], out: list[StreamEvent]) -> None:
        # (Azure's first chunk, its prompt_filter_results, has an empty id and model: not taken)
        if self.chunk_id == _NO_ID and isinstance(data.get("id"), str) and data["id"]:
            self.chunk_id = data["id"]
            self.model = data.get("model") if isinstance(data.get("model"), str) and data["model"] else self.model
            self.created = data.get("created") if isinstance(data.get("created"), int) else self.created
        if data.get("usage"):
            if usage := _usage(CHAT, data["usage"], self.model, self.exchange.persona, final=False,
                                expected_input=self.exchange.state["expected_input"]):
                self.reported = usage
        for choice in as_list(data.get("choices")):
            if not isinstance(choice, dict):
                continue
            delta = as_dict(choice.get("delta"))
            counter = self.counter
            for key in ("content", "refusal", "reasoning_content", "reasoning"):
                counter.add_value(delta.get(key))
            for call in as_list(delta.get("tool_calls")):
                if not isinstance(call, dict):
                    continue
                index = call.get("index", 0)  # sorted at the end: ints only
                slot = self.calls.setdefault(index if type(index) is int else -1, {"name": None, "args": []})
                fn = as_dict(call.get("function"))
                if isinstance(fn.get("name"), str):
                    slot["name"] = fn["name"]
                    counter.add_separate(fn["name"])
                if isinstance(fn.get("arguments"), str):
                    slot["args"].append(fn["arguments"])
                    counter.add(fn["arguments"])
            if choice.get("finish_reason"):
                self._finish(out)
        self._progress(out)

    def _finish(self, out: list[StreamEvent]) -> None:
        for index in sorted(self.calls):
            slot = self.calls[index]
            if step := requested_tool_call(slot["name"], "".join(slot["args"]), self.exchange.persona):
                out.append(step)
        self.calls.clear()

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        chunk = {"id": self.chunk_id, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.model, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        error = {"message": message, "type": "governor_stream_cut", "param": None,
                 "code": governor.get("cause"), "governor": dict(governor)}
        return sse.encode(chunk) + sse.encode({"error": error}) + b"data: [DONE]\n\n"


class CompletionsStreamWatcher(ChatStreamWatcher):
    """Legacy text_completion chunks: the text is in each choice's `text`; usage and [DONE]
    as in chat. No tool calls."""

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        return _Watcher.feed(self, chunk)  # chat's single-event fast path reads deltas

    def _chunk(self, data: dict[str, Any], out: list[StreamEvent]) -> None:
        if self.chunk_id == _NO_ID and isinstance(data.get("id"), str) and data["id"]:
            self.chunk_id = data["id"]
            self.model = data.get("model") if isinstance(data.get("model"), str) and data["model"] else self.model
        if data.get("usage"):
            if usage := _usage(COMPLETIONS, data["usage"], self.model, self.exchange.persona, final=False,
                                expected_input=self.exchange.state["expected_input"]):
                self.reported = usage
        for choice in as_list(data.get("choices")):
            text = choice.get("text") if isinstance(choice, dict) else None
            if isinstance(text, str):
                self.counter.add(text)
        self._progress(out)

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        chunk = {"id": self.chunk_id, "object": "text_completion", "created": self.created, "model": self.model,
                 "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]}
        error = {"message": message, "type": "governor_stream_cut", "param": None,
                 "code": governor.get("cause"), "governor": dict(governor)}
        return sse.encode(chunk) + sse.encode({"error": error}) + b"data: [DONE]\n\n"


class ResponsesStreamWatcher(_Watcher):
    """Typed Responses events; usage arrives in response.completed (or .incomplete/.failed)."""

    FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")

    def __init__(self, exchange: Exchange, bytes_per_token: float) -> None:
        super().__init__(exchange, bytes_per_token)
        self.sequence = 0

    def _event(self, event: sse.SSEEvent, out: list[StreamEvent]) -> None:
        data = event.json()
        if not isinstance(data, dict):
            if data is None and lenient_only(event.data):
                raise UnreadableAnswer(LENIENT_EVENT)
            return
        kind = data.get("type") or event.event
        if isinstance(data.get("sequence_number"), int):
            self.sequence = data["sequence_number"]
        if kind in ("response.output_text.delta", "response.function_call_arguments.delta",
                    "response.refusal.delta", "response.reasoning_summary_text.delta",
                    "response.reasoning_text.delta", "response.custom_tool_call_input.delta"):
            self.counter.add_value(data.get("delta"))
        elif kind == "response.output_item.done":
            item = data.get("item")
            if isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call"):
                self.counter.add_value(item.get("name"))
                if step := requested_tool_call(item.get("name"), item.get("arguments", item.get("input")), self.exchange.persona):
                    out.append(step)
        elif kind in self.FINAL_EVENTS:
            self.completed = True
            response = as_dict(data.get("response"))
            model = response.get("model") if isinstance(response.get("model"), str) and response["model"] \
                else self.exchange.model
            if usage := _usage(RESPONSES, response.get("usage"), model, self.exchange.persona, final=False,
                               expected_input=self.exchange.state["expected_input"]):
                self.reported = usage
        self._progress(out)

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        error = {"message": message, "type": "governor_stream_cut", "param": None,
                 "code": governor.get("cause"), "governor": dict(governor)}
        return sse.encode({"type": "error", "sequence_number": self.sequence + 1, "code": governor.get("cause"),
                           "message": message, "param": None, "error": error}, "error")


ADAPTERS = (OpenAIAdapter,)

__all__ = ["OpenAIAdapter", "ChatStreamWatcher", "CompletionsStreamWatcher", "ResponsesStreamWatcher", "ADAPTERS"]


ENDPOINTS = (
    Endpoint("OpenAI", "chat completions", "POST", "/v1/chat/completions", GOVERNED, "openai",
             Probe("POST", "/v1/chat/completions", b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}'),
             "usage.prompt_tokens / completion_tokens; output limit fitted"),
    Endpoint("OpenAI", "chat completions", "POST", "/v1/chat/completions", GOVERNED, "openai",
             Probe("POST", "/v1/chat/completions",
                   b'{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}'),
             "SSE; a final usage chunk is asked for (stream_options.include_usage)", stream=True),
    Endpoint("OpenAI", "responses", "POST", "/v1/responses", GOVERNED, "openai",
             Probe("POST", "/v1/responses", b'{"model":"gpt-4o-mini","input":"hi"}'),
             "usage.input_tokens / output_tokens"),
    Endpoint("OpenAI", "legacy completions", "POST", "/v1/completions", GOVERNED, "openai",
             Probe("POST", "/v1/completions", b'{"model":"gpt-3.5-turbo-instruct","prompt":"hi"}'),
             "n and best_of multiply the expected output"),
    Endpoint("OpenAI", "embeddings", "POST", "/v1/embeddings", GOVERNED, "openai",
             Probe("POST", "/v1/embeddings", b'{"model":"text-embedding-3-small","input":"hi"}'),
             "input tokens only"),
)
