"""Ollama's native API: `/api/chat`, `/api/generate` (streamed as NDJSON unless the request
says `"stream": false`), `/api/embed` and the legacy `/api/embeddings`.

(Ollama's OpenAI-compatible `/v1/chat/completions` is the openai adapter's.)

Usage: the final object of an answer (`"done": true`, the last line of a stream) carries
`prompt_eval_count` (input) and `eval_count` (output); `/api/embed` only
`prompt_eval_count`; the legacy `/api/embeddings` no count at all. A count missing or not
a non-negative integer is replaced by the governor's estimate (governor.adapters.running):
Ollama omits `prompt_eval_count` when the whole prompt came from its cache, and an answer
without counts is never charged nothing. Output limit: `options.num_predict` (-1 and -2
mean no limit, and are replaced when the call is fitted). Tools: `tools[].function.name`;
the answer's `message.tool_calls[].function` (arguments an object) are tool-call steps.
Errors: `{"error": "..."}` with the HTTP status, which the `ollama` SDK raises as
`ResponseError`; a stream the governor cuts ends with such an object on its own line (the
SDK raises it too). Local models are priced like any other (governor.policy.pricing): a
token cap counts them; under a cost cap an unpriced one is refused, so price it (even at
0) in the pricing file.
"""

from __future__ import annotations

import datetime
from typing import Any, Mapping

import orjson

from governor.adapters import withhold
from governor.adapters.base import (
    Exchange, Observation, Reply, StreamEvent, StreamWatcher, SuffixAdapter, UnreadableAnswer,
)
from governor.adapters.model_calls import estimate_tokens, model_call
from governor.adapters.reading import answered_object, as_dict, as_list, requested_tool_call
from governor.adapters.refusals import describe, fallback_text
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.endpoints import GOVERNED, Endpoint, Probe
from governor.adapters.ndjson import LineDecoder
from governor.adapters.counting import OutputCounter, add_arguments
from governor.adapters.running import RunningUsage, count, counted
from governor.policy.steps import Decision, Step, ToolCall, UsageReport

CHAT = "chat"
GENERATE = "generate"
EMBED = "embed"
EMBEDDINGS = "embeddings"  # the legacy endpoint: one `prompt`, no counts in the answer

_KINDS = {"/api/chat": CHAT, "/api/generate": GENERATE, "/api/embed": EMBED, "/api/embeddings": EMBEDDINGS}
_SUFFIXES = tuple(_KINDS)
NDJSON = "application/x-ndjson"
LIMIT_FIELD = "num_predict"


def _kind(route: str) -> str | None:
    if not route.endswith(_SUFFIXES):
        return None
    return _KINDS["/" + route.rsplit("/", 2)[-2] + "/" + route.rsplit("/", 1)[-1]]


def _token_ids(value: Any) -> int:
    """`context` (the token ids of an earlier answer, sent back with /api/generate): counted."""
    return len(value) if isinstance(value, list) else 0


def _num_predict(options: dict[str, Any]) -> int:
    """The output limit a request names: options.num_predict when a positive integer; -1
    (until the context is full), -2 (fill the context), 0 or absent: none. Anything not an
    integer is refused (400) rather than reserved as something the server reads otherwise."""
    value = options.get(LIMIT_FIELD)
    if value is None:
        return 0
    if type(value) is not int:
        shown = repr(value)
        raise BadRequest(f"'options.{LIMIT_FIELD}' must be an integer, got {shown[:40]}")
    return max(value, 0)


def _refuse_folded_keys(fields: dict[str, Any], where: str) -> None:
    """Ollama decodes with Go's encoding/json, which matches keys without regard to case
    (`"Model"`, `"NUM_PREDICT"`): a key that is not lower case would be read by Ollama but not
    by the governor (a model or an output limit it never saw), so it is refused."""
    for key in fields:
        if isinstance(key, str) and key != key.lower():
            raise BadRequest(f"'{where}{key[:40]}': Ollama reads JSON keys in any letter case, the governor only "
                             "in lower case; send it as '{}' (refused rather than read differently)".format(
                                 where + key.lower()[:40]))


class OllamaAdapter(SuffixAdapter):
    name = "ollama"
    provider = "ollama"
    suffixes = _SUFFIXES

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        kind = _kind(request.match_route)
        body = request.json_object()
        _refuse_folded_keys(body, "")
        if isinstance(body.get("options"), dict):
            _refuse_folded_keys(body["options"], "options.")
        if kind is None:  # a path a `routes` entry gave this adapter: the body says which endpoint
            kind = CHAT if "messages" in body else GENERATE if "prompt" in body else EMBED if "input" in body else None
            if kind is None:
                raise BadRequest(f"not an Ollama model call: {request.method} {request.route}")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' is required and must be a non-empty string")
        stream = body.get("stream", True)  # Ollama streams unless told not to
        if stream is None:
            stream = True
        if type(stream) is not bool:
            raise BadRequest(f"'stream' must be a boolean, got {repr(stream)[:40]}")
        options = body.get("options")
        if options is not None and not isinstance(options, dict):
            raise BadRequest("'options' must be an object")
        state: dict[str, Any] = {"kind": kind}
        expected_input = estimate_tokens(len(request.content), self.config.bytes_per_token)
        if kind in (CHAT, GENERATE):
            if kind == CHAT and body.get("messages") is not None and not isinstance(body["messages"], list):
                raise BadRequest("'messages' must be an array")
            if kind == GENERATE:
                if body.get("prompt") is not None and not isinstance(body["prompt"], str):
                    raise BadRequest("'prompt' must be a string")
                expected_input = max(expected_input, _token_ids(body.get("context")))
            if kind == CHAT and body.get("tools") is not None:
                state["tools"] = withhold.read_tools(body["tools"], "tools", withhold.openai_names)
            limit = _num_predict(options or {})
            expected_output = limit or self.config.default_output_tokens
        else:
            embedded = body.get("input") if kind == EMBED else body.get("prompt", body.get("input"))
            if not isinstance(embedded, (str, list)):
                field = "input" if kind == EMBED else "prompt"
                raise BadRequest(f"'{field}' is required and must be a string" + (" or an array" if kind == EMBED else ""))
            expected_output = 0
            stream = False
        return Exchange(
            adapter=self, method=request.method, host=request.host, path=request.path, body=body,
            session=session, persona=persona, stream=stream, model=model,
            state={**state, "expected_input": expected_input, "expected_output": expected_output},
        )

    def output_limit_fields(self, exchange: Exchange) -> tuple[str, ...]:
        return (LIMIT_FIELD,) if exchange.state["kind"] in (CHAT, GENERATE) else ()

    def output_limit_holder(self, exchange: Exchange, create: bool = False) -> dict[str, Any]:
        # always made: an empty object there means what its absence means
        body = exchange.body
        if not isinstance(body.get("options"), dict):
            body["options"] = {}
        return body["options"]

    async def steps(self, exchange: Exchange) -> list[Step]:
        tools = exchange.state.get("tools")
        return [model_call(self, exchange, withhold.flat(tools) if tools else ())]

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        allowed = decision.allowed_tools
        if allowed is not None and exchange.state.get("tools"):
            withheld = withhold.withhold_openai(exchange.body, allowed, exchange.state["tools"], None)
            if withheld is not None:  # offered tools the step may not use: the model never sees them
                exchange.state["withheld"] = withheld
                return orjson.dumps(exchange.body)
        return None

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        data = _answer_object(status, body)
        if data is None:
            return Observation()
        steps: list[Step] = []
        counter = OutputCounter()
        _answer(data, exchange, steps, counter)
        model = data.get("model") if isinstance(data.get("model"), str) else ""
        usage = counted(exchange, model, count(data.get("prompt_eval_count")),
                        count(data.get("eval_count")) if exchange.state["expected_output"] else 0,
                        counter.tokens)
        return Observation(usage=usage, steps=steps)

    def stream_watcher(self, exchange: Exchange, status: int, headers: Mapping[str, str]) -> StreamWatcher | None:
        if status != 200 or NDJSON not in (headers.get("content-type") or ""):
            return None
        if exchange.state["kind"] not in (CHAT, GENERATE):
            return None
        return OllamaStreamWatcher(exchange, self.config.bytes_per_token)

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        error: dict[str, Any] = {"error": readable(message, governor)}
        if governor is not None:
            error["governor"] = dict(governor)
        return Reply.json(status, error)

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        kind = exchange.state["kind"]
        if kind in (EMBED, EMBEDDINGS):  # no text to substitute for vectors: the refusal, as an error
            return self.error_response(403, describe(governor), governor, exchange)
        created = _now()
        text = fallback_text(decision)
        said = {"message": {"role": "assistant", "content": text}} if kind == CHAT else {"response": text}
        empty = {"message": {"role": "assistant", "content": ""}} if kind == CHAT else {"response": ""}
        done = {"done": True, "done_reason": "stop", "total_duration": 0, "load_duration": 0,
                "prompt_eval_count": 0, "eval_count": 0, "governor": dict(governor)}
        base = {"model": exchange.model, "created_at": created}
        if not exchange.stream:
            return Reply.json(200, {**base, **said, **done})
        lines = orjson.dumps({**base, **said, "done": False}) + b"\n" + orjson.dumps({**base, **empty, **done}) + b"\n"
        return Reply(200, {"content-type": NDJSON}, lines)


def readable(message: str, governor: Mapping[str, Any] | None) -> str:
    """The error text: the SDK shows only this string, so the tool a refusal is about is named."""
    tool = (governor or {}).get("tool")
    return f"{message}; tool {tool!r}" if isinstance(tool, str) and repr(tool) not in message else message


def _answer_object(status: int, body: bytes) -> dict[str, Any] | None:
    """A 200 answer's object; None for another status; UnreadableAnswer when it is not a
    JSON object (refused: a lenient client could read what the governor cannot)."""
    if status != 200:
        return None
    data = answered_object(status, body)
    if data is None:
        raise UnreadableAnswer("the upstream's answer is not a JSON object the governor can read")
    return data


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _answer(data: dict[str, Any], exchange: Exchange, steps: list[Step], counter: OutputCounter) -> None:
    """One answer object (a whole answer, or a line of a stream): the text and tool calls it
    carries go to `counter` (adapters.counting); the tool calls it asks for to `steps`."""
    kind = exchange.state["kind"]
    if kind == GENERATE:
        counter.add_value(data.get("thinking"))
        counter.add_value(data.get("response"))
        return
    if kind != CHAT:
        return
    message = as_dict(data.get("message"))
    counter.add_value(message.get("thinking"))
    counter.add_value(message.get("content"))
    for call in as_list(message.get("tool_calls")):
        function = as_dict(call.get("function") if isinstance(call, dict) else None)
        arguments = function.get("arguments")
        if type(name := function.get("name")) is str:
            counter.add_separate(name)
        add_arguments(counter, arguments)
        if step := requested_tool_call(function.get("name"), arguments, exchange.persona):
            steps.append(step)


class OllamaStreamWatcher(StreamWatcher):
    """An NDJSON stream of /api/chat or /api/generate: text in each line's `message.content`
    (`response`), whole tool calls in a line's `message.tool_calls`, the counts in the
    `"done": true` line. A line that is not a JSON object cuts the stream (UnreadableAnswer):
    the `ollama` SDK's json.loads reads NaN and the like, which could carry tool calls the
    governor never saw."""

    line_framed = True

    def __init__(self, exchange: Exchange, bytes_per_token: float) -> None:
        self.exchange = exchange
        self.decoder = LineDecoder()
        self.running = RunningUsage(exchange, bytes_per_token)

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for line in self.decoder.feed(chunk):
            self._line(line, out)
        return out

    def _line(self, line: bytes, out: list[StreamEvent]) -> None:
        running = self.running
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise UnreadableAnswer(f"the upstream sent an NDJSON line that is not JSON ({exc}); the stream "
                                   "was cut rather than relayed unread") from None
        if type(data) is not dict:
            raise UnreadableAnswer("the upstream sent an NDJSON line that is not a JSON object; the stream was cut")
        steps: list[Step] = []
        _answer(data, self.exchange, steps, running.counter)
        out.extend(step for step in steps if isinstance(step, ToolCall))
        if isinstance(data.get("model"), str) and data["model"]:
            running.model = data["model"]
        if data.get("done") is True:
            running.input_tokens = count(data.get("prompt_eval_count"))
            running.output_tokens = count(data.get("eval_count"))
            running.completed = "error" not in data
        running.progress(out)

    def close(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for line in self.decoder.close():
            self._line(line, out)
        out.append(self.running.report(final=True))
        return out

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        return orjson.dumps({"error": readable(message, governor), "governor": dict(governor)}) + b"\n"

    @property
    def usage(self) -> UsageReport | None:
        return self.running.last


ADAPTERS = (OllamaAdapter,)

_CHAT = b'{"model":"llama3.2","messages":[{"role":"user","content":"hi"}]'
ENDPOINTS = (
    Endpoint("Ollama", "chat", "POST", "/api/chat", GOVERNED, "ollama",
             Probe("POST", "/api/chat", _CHAT + b',"stream":false}'),
             "prompt_eval_count / eval_count of the final object; options.num_predict fitted; tools withheld"),
    Endpoint("Ollama", "chat", "POST", "/api/chat", GOVERNED, "ollama",
             Probe("POST", "/api/chat", _CHAT + b"}"),
             "NDJSON, streamed unless \"stream\": false; counts in the \"done\": true line; a cut ends with "
             "an {\"error\"} line", stream=True),
    Endpoint("Ollama", "generate", "POST", "/api/generate", GOVERNED, "ollama",
             Probe("POST", "/api/generate", b'{"model":"llama3.2","prompt":"hi","stream":false}'),
             "prompt_eval_count / eval_count; options.num_predict fitted"),
    Endpoint("Ollama", "generate", "POST", "/api/generate", GOVERNED, "ollama",
             Probe("POST", "/api/generate", b'{"model":"llama3.2","prompt":"hi"}'),
             "NDJSON, as chat", stream=True),
    Endpoint("Ollama", "embed", "POST", "/api/embed", GOVERNED, "ollama",
             Probe("POST", "/api/embed", b'{"model":"all-minilm","input":"hi"}'),
             "input tokens only (prompt_eval_count)"),
    Endpoint("Ollama", "embeddings (legacy)", "POST", "/api/embeddings", GOVERNED, "ollama",
             Probe("POST", "/api/embeddings", b'{"model":"all-minilm","prompt":"hi"}'),
             "no count in the answer: charged the governor's estimate of the input"),
)

__all__ = ["OllamaAdapter", "OllamaStreamWatcher", "ADAPTERS", "ENDPOINTS"]
