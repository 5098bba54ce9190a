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
from governor.adapters.deferred import DeferredWork, finished
from governor.adapters.counting import measured
from governor.adapters.fitting import requested_limit
from governor.adapters.endpoints import GOVERNED, Endpoint, Probe
from governor.adapters.base import Adapter, AdapterConfig, Exchange, Observation, Reply, StreamWatcher
from governor.adapters.model_calls import estimate_tokens, model_call
from governor.adapters.openai_streams import ChatStreamWatcher, CompletionsStreamWatcher, ResponsesStreamWatcher
from governor.adapters.openai_usage import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, answer_count, provider_usage
from governor.adapters.reading import as_dict, as_list, readable_answer, requested_tool_call
from governor.adapters.refusals import describe, fallback_text
from governor.adapters.request_view import BadRequest, RequestView
from governor.policy.steps import Decision, Step

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


class OpenAIAdapter(Adapter):
    name = "openai"
    provider = "openai"

    remembers = True  # background responses: charged when accepted, settled when read (deferred.py)

    def __init__(self, config: AdapterConfig | None = None, memory: DeferredWork | None = None) -> None:
        super().__init__(config)
        self.memory = DeferredWork() if memory is None else memory
        # Azure OpenAI deployment name -> the model it serves (the config file's `deployments`):
        # a deployment is admitted and priced as that model (docs/reference/compat.md)
        self.deployments: Mapping[str, str] = self.config.extra.get("deployments") or {}

    def claims(self, route: str) -> bool:
        return _kind(route) is not None

    def match(self, request: RequestView) -> bool:
        return request.method == "POST" and _kind(request.match_route) is not None

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        kind = _kind(request.match_route)
        body = request.json_object()
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
        data = readable_answer(status, body)
        if data is None:
            return Observation()
        kind = exchange.state["kind"]
        model = data.get("model") if isinstance(data.get("model"), str) and data["model"] else exchange.model
        usage = measured(provider_usage(kind, data.get("usage"), model, exchange.persona, final=True,
                                   expected_input=exchange.state["expected_input"]), answer_count(kind, data),
                         model=model, expected_input=exchange.state["expected_input"], persona=exchange.persona)
        if "background" in exchange.state and isinstance(data.get("id"), str) and not finished(data.get("status")):
            state = exchange.state  # accepted, not done: its reservation now, whatever usage it claims so far
            usage = self.memory.submitted(exchange.host, data["id"], exchange.model, state["expected_input"],
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
                return BackgroundStream(watcher, exchange, self.memory)
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


ADAPTERS = (OpenAIAdapter,)

__all__ = ["OpenAIAdapter", "ADAPTERS"]


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
