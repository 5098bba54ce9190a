"""Anthropic wire protocol: Messages (POST .../v1/messages), plain and streamed (SSE).

Usage: input tokens are `input_tokens + cache_creation_input_tokens +
cache_read_input_tokens` (Anthropic reports them apart; the budget counts them
all), cached = `cache_read_input_tokens`, output = `output_tokens`. In a stream,
`message_start` carries the input usage and each `message_delta` carries
CUMULATIVE usage: the latest figure replaces the previous one, never adds to it.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from governor.adapters import sse, withhold
from governor.adapters.counting import OutputCounter, measured
from governor.adapters.fitting import requested_limit
from governor.adapters.endpoints import GOVERNED, Endpoint, Probe
from governor.adapters.base import Adapter, UnreadableAnswer, Exchange, Observation, Reply, StreamEvent, StreamWatcher
from governor.adapters.model_calls import estimate_tokens, model_call, within_admission
from governor.adapters.reading import (
    LENIENT_EVENT,
    as_dict,
    as_key,
    as_list,
    requested_tool_call,
    lenient_only,
    readable_answer,
)
from governor.adapters.refusals import fallback_text
from governor.adapters.request_view import BadRequest, RequestView
from governor.policy.steps import Decision, Step, UsageReport

ERROR_TYPES = {
    400: "invalid_request_error",
    403: "permission_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
}

USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _report(usage: Mapping[str, int], model: str, persona: str | None, final: bool) -> UsageReport:
    return UsageReport(
        model=model,
        input_tokens=usage.get("input_tokens", 0)
        + usage.get("cache_creation_input_tokens", 0)
        + usage.get("cache_read_input_tokens", 0),
        output_tokens=usage.get("output_tokens", 0),
        cached_input_tokens=usage.get("cache_read_input_tokens", 0),
        persona=persona,
        final=final,
    )


def _usage_fields(usage: Any) -> dict[str, int]:
    """The usage figures that are counts (non-negative integers); a string or a negative one is
    left out, as if absent (the input is then the admission's estimate, the output the
    governor's count), never read as 0."""
    if not isinstance(usage, dict):
        return {}
    return {key: value for key in USAGE_FIELDS if type(value := usage.get(key)) is int and value >= 0}


def _count_block(counter: OutputCounter, block: Mapping[str, Any]) -> None:
    """A tool-use block's name and input, counted (adapters.counting): the input as compact
    JSON, no longer than the JSON the model generated for it."""
    if block.get("type") in ("tool_use", "server_tool_use"):
        counter.add_value(block.get("name"))
        if block.get("input") not in (None, {}):
            try:
                counter.add_separate(orjson.dumps(block["input"]).decode())
            except TypeError:  # not JSON-serializable as parsed (e.g. an integer past 64 bits)
                pass


class AnthropicAdapter(Adapter):
    name = "anthropic"
    provider = "anthropic"

    def claims(self, route: str) -> bool:
        # /v1/messages/count_tokens is free (it generates nothing) and /v1/messages/batches
        # is refused by selection (shapes): neither is a Messages call
        return route.endswith("/v1/messages")

    def match(self, request: RequestView) -> bool:
        return request.method == "POST" and request.match_route.endswith("/v1/messages")

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        body = request.json_object()
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' is required and must be a string")
        if not isinstance(body.get("messages"), list):
            raise BadRequest("'messages' must be an array")
        state: dict[str, Any] = {
            "expected_input": estimate_tokens(len(request.content), self.config.bytes_per_token),
            "expected_output": requested_limit(body, "max_tokens") or self.config.default_output_tokens,
        }
        if body.get("tools") is not None:  # each offered tool's name (withhold.py); a 400 for one without
            state["tools"] = withhold.read_tools(body["tools"], "tools", withhold.named_only)
        if body.get("mcp_servers") is not None:  # the MCP connector: tools the provider runs, named `mcp`
            state["mcp_servers"] = withhold.read_tools(body["mcp_servers"], "mcp_servers", withhold.mcp_server)
        return Exchange(
            adapter=self,
            method=request.method,
            host=request.host,
            path=request.path,
            body=body,
            session=session,
            persona=persona,
            stream=body.get("stream") is True,
            model=model,
            state=state,
        )

    def output_limit_fields(self, exchange: Exchange) -> tuple[str, ...]:
        return ("max_tokens",)

    async def steps(self, exchange: Exchange) -> list[Step]:
        offered = (exchange.state.get("tools") or ()) + (exchange.state.get("mcp_servers") or ())
        return [model_call(self, exchange, withhold.flat(offered) if offered else ())]

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        body = exchange.body
        state = exchange.state
        allowed = decision.allowed_tools
        if allowed is None or ("tools" not in state and "tool_choice" not in body and "mcp_servers" not in state):
            return None
        withheld = withhold.withhold_anthropic(body, allowed, state.get("tools"), state.get("mcp_servers"))
        if withheld is None:
            return None
        state["withheld"] = withheld  # offered tools the step may not use: the model never sees them
        return orjson.dumps(body)

    def observe_response(
        self, exchange: Exchange, status: int, headers: Mapping[str, str], body: bytes
    ) -> Observation:
        data = readable_answer(status, body)
        if data is None:
            return Observation()
        model = data.get("model") if isinstance(data.get("model"), str) else exchange.model
        fields = _usage_fields(data.get("usage"))
        counter = OutputCounter()
        for block in as_list(data.get("content")):
            if isinstance(block, dict):
                _count_block(counter, block)
                counter.add_value(block.get("text"))
                counter.add_value(block.get("thinking"))
        reported = _report(fields, model, exchange.persona, final=True) if "output_tokens" in fields else None
        usage = measured(reported, counter.tokens, model=model, persona=exchange.persona,
                         expected_input=_report(fields, model, None, True).input_tokens if "input_tokens" in fields
                         else exchange.state["expected_input"])
        steps: list[Step] = []
        for block in as_list(data.get("content")):
            if isinstance(block, dict) and block.get("type") == "tool_use":
                if step := requested_tool_call(block.get("name"), block.get("input"), exchange.persona):
                    steps.append(step)
        return Observation(usage=usage, steps=steps)

    def stream_watcher(
        self, exchange: Exchange, status: int, headers: Mapping[str, str]
    ) -> StreamWatcher | None:
        if status != 200 or "text/event-stream" not in (headers.get("content-type") or ""):
            return None
        return MessagesStreamWatcher(exchange, self.config.bytes_per_token)

    def error_response(
        self, status: int, message: str, governor: Mapping[str, Any] | None, exchange: Exchange | None = None
    ) -> Reply:
        body: dict[str, Any] = {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}
        if governor is not None:
            body["governor"] = dict(governor)
        return Reply.json(status, body)

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        text = fallback_text(decision)
        usage = {"input_tokens": 0, "output_tokens": 0}
        message = {"id": "msg_governor_fallback", "type": "message", "role": "assistant", "model": exchange.model,
                   "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                   "usage": usage}
        if not exchange.stream:
            return Reply.json(200, {**message, "governor": dict(governor)})
        events = [
            sse.encode({"type": "message_start", "message": {**message, "content": [], "stop_reason": None}},
                       "message_start"),
            sse.encode({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                       "content_block_start"),
            sse.encode({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
                       "content_block_delta"),
            sse.encode({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            sse.encode({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                        "usage": {"output_tokens": 0}}, "message_delta"),
            sse.encode({"type": "message_stop"}, "message_stop"),
        ]
        return Reply(200, {"content-type": "text/event-stream"}, b"".join(events))


class MessagesStreamWatcher(sse.SSEStreamWatcher):
    def __init__(self, exchange: Exchange, bytes_per_token: float) -> None:
        self.exchange = exchange
        self.bpt = bytes_per_token
        self.decoder = sse.SSEDecoder()
        self.model = exchange.model
        self.fields: dict[str, int] = {}  # latest cumulative usage per field
        self.counter = OutputCounter()  # the output relayed so far: text, thinking, tool names and input
        self.blocks: dict[int, dict[str, Any]] = {}  # open tool_use blocks by index
        self.completed = False  # message_stop seen
        self._last: UsageReport | None = None

    @property
    def usage(self) -> UsageReport | None:
        return self._last

    @property
    def generated_bytes(self) -> int:
        """Bytes of text, thinking and tool input relayed so far."""
        return self.counter.nbytes

    def _current(self, final: bool) -> UsageReport:
        """The provider's figures once the message completed, its output raised to the
        governor's count of what was relayed when that is larger (adapters.counting); until
        then (and after a cut) the provider's cumulative output or our estimate from the
        text, whichever is larger."""
        fields = dict(self.fields)
        fields.setdefault("input_tokens", self.exchange.state["expected_input"])
        counted = self.counter.tokens
        reported = _report(fields, self.model, self.exchange.persona, final) if "output_tokens" in self.fields else None
        if final and self.completed:
            return measured(reported, counted, model=self.model, persona=self.exchange.persona,
                            expected_input=_report(fields, self.model, None, True).input_tokens)
        estimate = max(estimate_tokens(self.generated_bytes, self.bpt), counted)
        fields["output_tokens"] = max(fields.get("output_tokens", 0), estimate)
        report = _report(fields, self.model, self.exchange.persona, final)
        if final:
            report = UsageReport(report.model, report.input_tokens, report.output_tokens, report.cached_input_tokens,
                                 report.persona, True, reported_output_tokens=reported.output_tokens if reported
                                 else None, counted_output_tokens=counted)
        return report

    def _closed(self, out: list[StreamEvent]) -> None:
        out.append(self._current(final=True))

    def _event(self, event: sse.SSEEvent, out: list[StreamEvent]) -> None:
        data = event.json()
        if not isinstance(data, dict):
            if data is None and lenient_only(event.data):
                raise UnreadableAnswer(LENIENT_EVENT)
            return
        kind = data.get("type") or event.event
        if kind == "content_block_delta":
            delta = as_dict(data.get("delta"))
            index = as_key(data.get("index"))
            for key in ("text", "partial_json", "thinking"):
                piece = delta.get(key)
                if isinstance(piece, str):
                    self.counter.add(piece)
                    if key == "partial_json" and index in self.blocks:
                        self.blocks[index]["args"].append(piece)
        elif kind == "content_block_start":
            block = as_dict(data.get("content_block"))
            _count_block(self.counter, block)  # a tool's name (its input follows as partial_json)
            if block.get("type") == "tool_use":
                self.blocks[as_key(data.get("index"))] = {"name": block.get("name"), "input": block.get("input"), "args": []}
        elif kind == "content_block_stop":
            block = self.blocks.pop(as_key(data.get("index")), None)
            if block is not None:
                args = "".join(block["args"]) if block["args"] else block["input"]
                if step := requested_tool_call(block["name"], args, self.exchange.persona):
                    out.append(step)
        elif kind == "message_start":
            message = as_dict(data.get("message"))
            if isinstance(message.get("model"), str):
                self.model = message["model"]
            self.fields.update(_usage_fields(message.get("usage")))
        elif kind == "message_delta":
            # cumulative: each figure present replaces the previous one
            self.fields.update(_usage_fields(data.get("usage")))
        elif kind == "message_stop":
            self.completed = True
            return
        else:
            return
        current = self._current(final=False)
        if current != self._last and not within_admission(self.exchange, current.model, current.input_tokens,
                                                          current.output_tokens):
            self._last = current
            out.append(current)

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        status = 429 if governor.get("cause") in ("on_budget_exhausted", "on_iteration_limit") else 403
        body = {"type": "error", "error": {"type": ERROR_TYPES[status], "message": message}, "governor": dict(governor)}
        return sse.encode(body, "error")


ADAPTERS = (AnthropicAdapter,)

__all__ = ["AnthropicAdapter", "MessagesStreamWatcher", "ADAPTERS"]


ENDPOINTS = (
    Endpoint("Anthropic", "messages", "POST", "/v1/messages", GOVERNED, "anthropic",
             Probe("POST", "/v1/messages", b'{"model":"claude-3-5-haiku-latest","max_tokens":64,'
                                           b'"messages":[{"role":"user","content":"hi"}]}'),
             "usage.input_tokens / output_tokens (+ cache reads and writes); max_tokens fitted"),
    Endpoint("Anthropic", "messages", "POST", "/v1/messages", GOVERNED, "anthropic",
             Probe("POST", "/v1/messages", b'{"model":"claude-3-5-haiku-latest","max_tokens":64,"stream":true,'
                                           b'"messages":[{"role":"user","content":"hi"}]}'),
             "SSE: message_start and message_delta usage", stream=True),
)
