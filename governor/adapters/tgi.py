"""Hugging Face Text Generation Inference (TGI): `/generate` and `/generate_stream` (SSE).

(TGI's OpenAI-compatible `/v1/chat/completions` and `/v1/completions` are the openai
adapter's. Its `POST /` and `/invocations` take the same body as /generate, on paths the
governor cannot claim for every host: they are refused by the default-deny rule.)

A request: `inputs` (the prompt) and `parameters` (`max_new_tokens`, the output limit, fitted
in place; `best_of`, candidates that are all generated; `details`). TGI serves one model and
the request names none: the call's model is `tgi` (`tgi:{adapter_id}` when it names a LoRA
adapter), which the pricing file prices as the family `tgi` (under a cost cap an unpriced
one is refused, as any model).

Usage: a plain answer's `x-prompt-tokens` and `x-generated-tokens` headers (TGI sets them
on every /generate answer), or its `details.generated_tokens` (plus each
`best_of_sequences[].generated_tokens`) when larger; a stream's last event carries
`details.generated_tokens` and `details.input_length` only when the request asked for
details, so the governor asks (`parameters.details: true`; the client then sees `details`
in that event). A count missing, or an output count below the governor's count of the text relayed, is
replaced by it (governor.adapters.running, adapters.counting).
Errors: `{"error": "...", "error_type": "..."}` (`error_type` "governor" for the governor's
own), in a stream as a `data:` event, which `huggingface_hub`'s InferenceClient raises.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from governor.adapters import sse
from governor.adapters.base import (
    Exchange, Observation, Reply, StreamEvent, StreamWatcher, SuffixAdapter, UnreadableAnswer,
)
from governor.adapters.model_calls import estimate_tokens, model_call
from governor.adapters.reading import answered_object, as_dict, as_list
from governor.adapters.refusals import fallback_text
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.endpoints import GOVERNED, Endpoint, Probe
from governor.adapters.fitting import requested_limit
from governor.adapters.counting import OutputCounter
from governor.adapters.running import RunningUsage, count, counted
from governor.policy.steps import Decision, Step, UsageReport

_SUFFIXES = ("/generate", "/generate_stream")
LIMIT_FIELD = "max_new_tokens"
ERROR_TYPE = "governor"


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object")
    return parameters


def _header_count(headers: Mapping[str, str], name: str) -> int | None:
    value = (headers.get(name) or "").strip()
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 12 else None


class TGIAdapter(SuffixAdapter):
    name = "tgi"
    provider = "tgi"
    suffixes = _SUFFIXES

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        body = request.json_object()
        if not isinstance(body.get("inputs"), str):
            raise BadRequest("'inputs' is required and must be a string (a TGI generate request)")
        parameters = _parameters(body)
        stream = body.get("stream")
        if stream is not None and type(stream) is not bool:
            raise BadRequest(f"'stream' must be a boolean, got {repr(stream)[:40]}")
        stream = request.match_route.endswith("/generate_stream") or stream is True
        adapter_id = parameters.get("adapter_id")
        if adapter_id is not None and not isinstance(adapter_id, str):
            raise BadRequest("'parameters.adapter_id' must be a string")
        choices = max(requested_limit(parameters, "best_of"), 1)
        expected_output = (requested_limit(parameters, LIMIT_FIELD) or self.config.default_output_tokens) * choices
        return Exchange(
            adapter=self, method=request.method, host=request.host, path=request.path, body=body,
            session=session, persona=persona, stream=stream, model=f"tgi:{adapter_id}" if adapter_id else "tgi",
            state={"expected_input": estimate_tokens(len(request.content), self.config.bytes_per_token),
                   "expected_output": expected_output, "choices": choices},
        )

    def output_limit_fields(self, exchange: Exchange) -> tuple[str, ...]:
        return (LIMIT_FIELD,)

    def output_limit_holder(self, exchange: Exchange, create: bool = False) -> dict[str, Any]:
        # always made: an empty object there means what its absence means
        body = exchange.body
        if not isinstance(body.get("parameters"), dict):
            body["parameters"] = {}
        return body["parameters"]

    async def steps(self, exchange: Exchange) -> list[Step]:
        return [model_call(self, exchange, ())]

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        if not exchange.stream:
            return None  # a plain answer's counts are in its headers
        parameters = self.output_limit_holder(exchange)
        if parameters.get("details") is True:
            return None
        parameters["details"] = True  # the last event then carries generated_tokens and input_length
        exchange.state["details_injected"] = True
        return orjson.dumps(exchange.body)

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        if status != 200:
            return Observation()
        data = answered_object(status, body)
        if data is None:
            raise UnreadableAnswer("the upstream's answer is not a JSON object the governor can read")
        details = as_dict(data.get("details"))
        generated = count(details.get("generated_tokens"))
        candidates = as_list(details.get("best_of_sequences"))
        if generated is not None and candidates:
            generated += sum(count(as_dict(c).get("generated_tokens")) or 0 for c in candidates)
        header = _header_count(headers, "x-generated-tokens")
        output = header if generated is None else generated if header is None else max(header, generated)
        counter = OutputCounter()
        counter.add_value(data.get("generated_text"))
        for candidate in candidates:
            if type(other := as_dict(candidate).get("generated_text")) is str:
                counter.add_separate(other)
        usage = counted(exchange, "", _header_count(headers, "x-prompt-tokens"), output, counter.tokens)
        return Observation(usage=usage)

    def stream_watcher(self, exchange: Exchange, status: int, headers: Mapping[str, str]) -> StreamWatcher | None:
        if status != 200 or "text/event-stream" not in (headers.get("content-type") or ""):
            return None
        return TGIStreamWatcher(exchange, self.config.bytes_per_token)

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        error: dict[str, Any] = {"error": message, "error_type": ERROR_TYPE}
        if governor is not None:
            error["governor"] = dict(governor)
        return Reply.json(status, error)

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        text = fallback_text(decision)
        details = {"finish_reason": "stop_sequence", "generated_tokens": 0, "seed": None}
        if not exchange.stream:
            return Reply.json(200, {"generated_text": text, "details": {**details, "prefill": [], "tokens": []},
                                    "governor": dict(governor)})
        event = {"index": 1, "token": {"id": 0, "text": text, "logprob": 0.0, "special": False},
                 "generated_text": text, "details": {**details, "input_length": 0}, "governor": dict(governor)}
        return Reply(200, {"content-type": "text/event-stream"}, b"data:" + orjson.dumps(event) + b"\n\n")


class TGIStreamWatcher(sse.SSEStreamWatcher):
    """/generate_stream events: a token's text in each, the counts in the last one's
    `details` (it has `generated_text`); an `{"error"}` event ends a failed one."""

    def __init__(self, exchange: Exchange, bytes_per_token: float) -> None:
        self.exchange = exchange
        self.decoder = sse.SSEDecoder()
        self.running = RunningUsage(exchange, bytes_per_token)

    def _event(self, event: sse.SSEEvent, out: list[StreamEvent]) -> None:
        running = self.running
        data = event.json()
        if not isinstance(data, dict):  # a lenient client might read what the governor cannot: cut
            raise UnreadableAnswer("the upstream sent a stream event that is not a JSON object; the stream was cut")
        token = data.get("token")
        if isinstance(token, dict) and isinstance(token.get("text"), str):
            running.counter.add(token["text"])
        if isinstance(data.get("generated_text"), str) and "error" not in data:
            details = as_dict(data.get("details"))
            running.input_tokens = count(details.get("input_length"))
            running.output_tokens = count(details.get("generated_tokens"))
            running.completed = True
        running.progress(out)

    def _closed(self, out: list[StreamEvent]) -> None:
        out.append(self.running.report(final=True))

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        return b"data:" + orjson.dumps({"error": message, "error_type": ERROR_TYPE, "governor": dict(governor)}) + b"\n\n"

    @property
    def usage(self) -> UsageReport | None:
        return self.running.last


ADAPTERS = (TGIAdapter,)

ENDPOINTS = (
    Endpoint("TGI", "generate", "POST", "/generate", GOVERNED, "tgi",
             Probe("POST", "/generate", b'{"inputs":"hi","parameters":{"max_new_tokens":20}}'),
             "x-prompt-tokens / x-generated-tokens headers (details.generated_tokens when larger); "
             "parameters.max_new_tokens fitted; model `tgi`"),
    Endpoint("TGI", "generate", "POST", "/generate_stream", GOVERNED, "tgi",
             Probe("POST", "/generate_stream", b'{"inputs":"hi","parameters":{"max_new_tokens":20}}'),
             "SSE; parameters.details asked for: the last event's details.input_length / generated_tokens",
             stream=True),
)

__all__ = ["TGIAdapter", "TGIStreamWatcher", "ADAPTERS", "ENDPOINTS"]
