"""Amazon Bedrock's answers: usage and tool calls read from plain answers and from event
streams, the terminal frame of a cut, and fallbacks (the request side: bedrock.py).

Usage, per shape (input counts cache reads and writes too; cached = cache reads):
- Converse: `usage.inputTokens / outputTokens / cacheReadInputTokens / cacheWriteInputTokens`;
  ConverseStream: the same in the `metadata` event.
- InvokeModel, Anthropic: `usage` as Anthropic's Messages API; Meta Llama:
  `prompt_token_count` / `generation_token_count`; Titan Text: `inputTextTokenCount` /
  `results[].tokenCount`; every family: the `x-amzn-bedrock-input-token-count` /
  `x-amzn-bedrock-output-token-count` response headers.
- InvokeModelWithResponseStream: each `chunk` event's decoded bytes (the family's stream
  shape: Anthropic's stream events, Llama's `generation_token_count`, Titan's
  `totalOutputTextTokenCount`) and the last chunk's `amazon-bedrock-invocationMetrics`.

Where figures disagree the larger is charged. A finished answer's output is never charged
below the governor's count of the text, reasoning and tool calls it relayed (adapters.counting:
a bound below any honest tokenizer's count, so an honest answer is charged exactly its usage):
an answer without usage is charged the count and the reserved input, never 0, one whose
usage is smaller the count; the report carries both figures (reported / counted), so the
record says which was charged. A stream cut before its end is charged the running estimate
(its figures, or bytes / bytes_per_token of what it relayed, whichever is larger).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Mapping

import orjson

from governor.adapters import eventstream
from governor.adapters.counting import OutputCounter, add_arguments
from governor.adapters.base import Exchange, Observation, Reply, StreamEvent, StreamWatcher
from governor.adapters.model_calls import estimate_tokens, within_admission
from governor.adapters.reading import answered_object, as_dict, as_key, as_list, positive_int, requested_tool_call
from governor.adapters.refusals import fallback_text
from governor.policy.steps import ON_BUDGET_EXHAUSTED, ON_ITERATION_LIMIT, Decision, Step, UsageReport

# operations (the route's last segment)
CONVERSE = "/converse"
CONVERSE_STREAM = "/converse-stream"
INVOKE = "/invoke"
INVOKE_STREAM = "/invoke-with-response-stream"
# body families
CONVERSE_BODY = "converse"
ANTHROPIC = "anthropic"
LLAMA = "llama"
TITAN = "titan"

INPUT_HEADER = "x-amzn-bedrock-input-token-count"
OUTPUT_HEADER = "x-amzn-bedrock-output-token-count"
METRICS = "amazon-bedrock-invocationMetrics"


class Tally:
    """What one answer says it used and what the governor saw it deliver."""

    __slots__ = ("input", "output", "cache_read", "cache_write", "counter", "said", "completed")

    def __init__(self) -> None:
        self.input = self.output = self.cache_read = self.cache_write = 0
        self.counter = OutputCounter()  # text, reasoning, tool names and arguments relayed
        self.said = False  # the answer gave an output figure (a non-negative integer)
        self.completed = False  # a plain answer, or a stream that reached its end

    def text(self, value: Any) -> None:
        if isinstance(value, str):
            self.counter.add(value)
        elif isinstance(value, (dict, list)):  # tool arguments delivered as JSON
            add_arguments(self.counter, value)

    def name(self, value: Any) -> None:
        """A tool's name (tokenized apart from what came before)."""
        if type(value) is str:
            self.counter.add_separate(value)

    def counts(self, input_tokens: Any = None, output_tokens: Any = None, cache_read: Any = None,
               cache_write: Any = None) -> None:
        """Figures the answer reports: each kept at the largest seen (cumulative in streams)."""
        if type(output_tokens) is int and output_tokens >= 0:
            self.said = True
        self.input = max(self.input, positive_int(input_tokens))
        self.output = max(self.output, positive_int(output_tokens))
        self.cache_read = max(self.cache_read, positive_int(cache_read))
        self.cache_write = max(self.cache_write, positive_int(cache_write))

    def metrics(self, value: Any) -> None:
        metrics = as_dict(value)
        self.counts(metrics.get("inputTokenCount"), metrics.get("outputTokenCount"))

    def report(self, exchange: Exchange, final: bool, bytes_per_token: float) -> UsageReport:
        """A finished answer: its output figure, raised to the governor's count when that is
        larger (the count alone when it gave none); until then, or cut: the larger of its
        figure, the count and bytes / bytes_per_token of what it relayed."""
        fresh = self.input or (0 if self.cache_read or self.cache_write else exchange.state["expected_input"])
        counted = self.counter.tokens
        output = max(self.output, counted)
        if not (final and self.completed):
            output = max(output, estimate_tokens(self.counter.nbytes, bytes_per_token))
        return UsageReport(
            model=exchange.model,
            input_tokens=fresh + self.cache_read + self.cache_write,
            output_tokens=output,
            cached_input_tokens=self.cache_read,
            persona=exchange.persona,
            final=final,
            reported_output_tokens=self.output if self.said else None,
            counted_output_tokens=counted if final else None,
        )


def _dumped(value: Any) -> bytes:
    """JSON of a parsed value (b"" for one orjson cannot write back, e.g. an integer past 64 bits)."""
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return b""


# --- the shapes' readers (a plain body, or one stream event / chunk) --------------------------------


def _converse_usage(tally: Tally, usage: Any) -> None:
    usage = as_dict(usage)
    tally.counts(usage.get("inputTokens"), usage.get("outputTokens"), usage.get("cacheReadInputTokens"),
                 usage.get("cacheWriteInputTokens"))


def _anthropic_usage(tally: Tally, usage: Any) -> None:
    usage = as_dict(usage)
    tally.counts(usage.get("input_tokens"), usage.get("output_tokens"), usage.get("cache_read_input_tokens"),
                 usage.get("cache_creation_input_tokens"))


def _headers(tally: Tally, headers: Mapping[str, str]) -> None:
    def number(name: str) -> int | None:
        raw = (headers.get(name) or "").strip()
        return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 19 else None
    tally.counts(number(INPUT_HEADER), number(OUTPUT_HEADER))


def _plain(exchange: Exchange, data: dict[str, Any], tally: Tally) -> list[Step]:
    """The usage, text and tool calls of a plain answer's body."""
    family = exchange.state["family"]
    persona = exchange.persona
    steps: list[Step] = []
    if family == CONVERSE_BODY:
        _converse_usage(tally, data.get("usage"))
        message = as_dict(as_dict(data.get("output")).get("message"))
        for block in as_list(message.get("content")):
            block = as_dict(block)
            tally.text(block.get("text"))
            tally.text(as_dict(as_dict(block.get("reasoningContent")).get("reasoningText")).get("text"))
            use = block.get("toolUse")
            if isinstance(use, dict):
                tally.name(use.get("name"))
                tally.text(use.get("input"))
                if step := requested_tool_call(use.get("name"), use.get("input"), persona):
                    steps.append(step)
    elif family == ANTHROPIC:
        _anthropic_usage(tally, data.get("usage"))
        for block in as_list(data.get("content")):
            block = as_dict(block)
            tally.text(block.get("text"))
            tally.text(block.get("thinking"))
            if block.get("type") == "tool_use":
                tally.name(block.get("name"))
                tally.text(block.get("input"))
                if step := requested_tool_call(block.get("name"), block.get("input"), persona):
                    steps.append(step)
    elif family == LLAMA:
        tally.counts(data.get("prompt_token_count"), data.get("generation_token_count"))
        tally.text(data.get("generation"))
    elif family == TITAN:
        output: int | None = None  # said only when a result gives its count
        for result in as_list(data.get("results")):
            result = as_dict(result)
            if type(count := result.get("tokenCount")) is int and count >= 0:
                output = (output or 0) + count
            tally.text(result.get("outputText"))
        tally.counts(data.get("inputTextTokenCount"), output)
    tally.metrics(data.get(METRICS))
    return steps


def observe(exchange: Exchange, status: int, headers: Mapping[str, str], body: bytes,
            bytes_per_token: float) -> Observation:
    """A plain answer: its usage (never absent on a 200: see the module docstring) and tool calls."""
    if status != 200:
        return Observation()
    tally = Tally()
    _headers(tally, headers)
    data = answered_object(status, body)
    if data is None or exchange.stream:  # not the JSON it should be: what it delivered is estimated
        tally.text(body.decode("utf-8", "replace"))
        return Observation(usage=tally.report(exchange, True, bytes_per_token))
    tally.completed = True
    steps = _plain(exchange, data, tally)
    return Observation(usage=tally.report(exchange, True, bytes_per_token), steps=steps)


# --- event streams --------------------------------------------------------------------------------


def watcher_for(exchange: Exchange, status: int, headers: Mapping[str, str],
                bytes_per_token: float) -> StreamWatcher | None:
    if status != 200 or not exchange.stream or eventstream.CONTENT_TYPE not in (headers.get("content-type") or ""):
        return None
    if exchange.state["operation"] == CONVERSE_STREAM:
        return ConverseStreamWatcher(exchange, bytes_per_token)
    return InvokeStreamWatcher(exchange, bytes_per_token)


class FramedWatcher(StreamWatcher):
    """A Bedrock event stream: frames checked (eventstream.FrameDecoder: a bad CRC or an
    oversize frame raises, and the relay cuts the stream), each event given to `_event`."""

    def __init__(self, exchange: Exchange, bytes_per_token: float) -> None:
        self.exchange = exchange
        self.bpt = bytes_per_token
        self.decoder = eventstream.FrameDecoder()
        self.tally = Tally()
        self.blocks: dict[Any, dict[str, Any]] = {}  # tool calls being streamed, by block index
        self._last: UsageReport | None = None
        self.truncated = 0  # bytes of a frame the stream ended inside

    def framer(self) -> eventstream.FrameFramer:
        return eventstream.FrameFramer()

    @property
    def usage(self) -> UsageReport | None:
        return self._last

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for frame in self.decoder.feed(chunk):
            if frame.message_type != "event":
                continue  # the upstream's own exception frame: relayed as it is, the client raises it
            try:
                data = orjson.loads(frame.payload)
            except orjson.JSONDecodeError:
                continue
            if isinstance(data, dict):
                self._event(frame.event_type, data, out)
        current = self.tally.report(self.exchange, False, self.bpt)
        if current != self._last and not within_admission(self.exchange, current.model, current.input_tokens,
                                                          current.output_tokens):
            self._last = current
            out.append(current)
        return out

    def close(self) -> list[StreamEvent]:
        self.truncated = self.decoder.close()
        if self.truncated:  # ended inside a frame: what it said last may not be all it said
            self.tally.completed = False
        out: list[StreamEvent] = []
        for block in self.blocks.values():  # a tool call the stream ended inside is still one the model made
            if step := requested_tool_call(block["name"], "".join(block["args"]), self.exchange.persona):
                out.append(step)
        self.blocks.clear()
        out.append(self.tally.report(self.exchange, True, self.bpt))
        return out

    def _event(self, kind: str, data: dict[str, Any], out: list[StreamEvent]) -> None:
        raise NotImplementedError

    def _tool_start(self, index: Any, name: Any, initial: Any = None) -> None:
        self.tally.name(name)
        if initial not in (None, {}):
            self.tally.text(initial)
        self.blocks[as_key(index)] = {"name": name,
                                      "args": [] if initial in (None, {}) else [_dumped(initial).decode()]}

    def _tool_delta(self, index: Any, piece: Any) -> None:
        if isinstance(piece, str):
            self.tally.text(piece)
            block = self.blocks.get(as_key(index))
            if block is not None:
                block["args"].append(piece)

    def _tool_stop(self, index: Any, out: list[StreamEvent]) -> None:
        block = self.blocks.pop(as_key(index), None)
        if block is not None:
            if step := requested_tool_call(block["name"], "".join(block["args"]), self.exchange.persona):
                out.append(step)

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        budget = governor.get("cause") in (ON_BUDGET_EXHAUSTED, ON_ITERATION_LIMIT)
        message = readable(message, governor)
        body: dict[str, Any] = {"message": message, "governor": dict(governor)}
        if not budget:
            body.update(originalStatusCode=403, originalMessage=message)
        return eventstream.exception("throttlingException" if budget else "modelStreamErrorException",
                                     orjson.dumps(body))


class ConverseStreamWatcher(FramedWatcher):
    def _event(self, kind: str, data: dict[str, Any], out: list[StreamEvent]) -> None:
        if kind == "contentBlockDelta":
            delta = as_dict(data.get("delta"))
            self.tally.text(delta.get("text"))
            self.tally.text(as_dict(delta.get("reasoningContent")).get("text"))
            self._tool_delta(data.get("contentBlockIndex"), as_dict(delta.get("toolUse")).get("input"))
        elif kind == "contentBlockStart":
            use = as_dict(as_dict(data.get("start")).get("toolUse"))
            if use:
                self._tool_start(data.get("contentBlockIndex"), use.get("name"))
        elif kind == "contentBlockStop":
            self._tool_stop(data.get("contentBlockIndex"), out)
        elif kind == "metadata":  # the last event (after messageStop): the stream reached its end
            _converse_usage(self.tally, data.get("usage"))
            self.tally.completed = True


class InvokeStreamWatcher(FramedWatcher):
    """`chunk` events: {"bytes": base64 of the model's own stream chunk (JSON)}."""

    def _event(self, kind: str, data: dict[str, Any], out: list[StreamEvent]) -> None:
        if kind != "chunk" or not isinstance(data.get("bytes"), str):
            return
        try:
            chunk = orjson.loads(base64.b64decode(data["bytes"], validate=True))
        except (binascii.Error, ValueError):
            return
        if not isinstance(chunk, dict):
            return
        family = self.exchange.state["family"]
        tally = self.tally
        if family == ANTHROPIC:
            self._anthropic(chunk, out)
        elif family == LLAMA:
            tally.counts(chunk.get("prompt_token_count"), chunk.get("generation_token_count"))
            tally.text(chunk.get("generation"))
            tally.completed = tally.completed or bool(chunk.get("stop_reason"))
        elif family == TITAN:
            tally.counts(chunk.get("inputTextTokenCount"), chunk.get("totalOutputTextTokenCount"))
            tally.text(chunk.get("outputText"))
            tally.completed = tally.completed or bool(chunk.get("completionReason"))
        tally.metrics(chunk.get(METRICS))

    def _anthropic(self, chunk: dict[str, Any], out: list[StreamEvent]) -> None:
        kind = chunk.get("type")
        if kind == "content_block_delta":
            delta = as_dict(chunk.get("delta"))
            self.tally.text(delta.get("text"))
            self.tally.text(delta.get("thinking"))
            self._tool_delta(chunk.get("index"), delta.get("partial_json"))
        elif kind == "content_block_start":
            block = as_dict(chunk.get("content_block"))
            if block.get("type") == "tool_use":
                self._tool_start(chunk.get("index"), block.get("name"), block.get("input"))
        elif kind == "content_block_stop":
            self._tool_stop(chunk.get("index"), out)
        elif kind == "message_start":
            _anthropic_usage(self.tally, as_dict(chunk.get("message")).get("usage"))
        elif kind == "message_delta":
            _anthropic_usage(self.tally, chunk.get("usage"))
        elif kind == "message_stop":
            self.tally.completed = True


# --- fallbacks (a §6 fallback answered in the answer's own shape) -----------------------------------


def _invoke_body(family: str, exchange: Exchange, text: str) -> dict[str, Any]:
    if family == ANTHROPIC:
        return {"id": "msg_governor_fallback", "type": "message", "role": "assistant", "model": exchange.model,
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0}}
    if family == LLAMA:
        return {"generation": text, "prompt_token_count": 0, "generation_token_count": 0, "stop_reason": "stop"}
    return {"inputTextTokenCount": 0, "results": [{"tokenCount": 0, "outputText": text, "completionReason": "FINISH"}]}


def _anthropic_chunks(exchange: Exchange, text: str) -> list[dict[str, Any]]:
    return [
        {"type": "message_start", "message": {**_invoke_body(ANTHROPIC, exchange, ""), "content": [],
                                              "stop_reason": None}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": 0}},
        {"type": "message_stop"},
    ]


def readable(message: str, governor: Mapping[str, Any] | None) -> str:
    """The message boto3 shows (a ClientError carries only Bedrock's `message`, not the governor
    object the body also holds), with the tool a refusal is about when it does not say it."""
    tool = governor.get("tool") if governor is not None else None
    if isinstance(tool, str) and tool and tool not in message:
        message = f"{message}; tool {tool[:128]!r}"
    return message


def fallback_reply(exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
    text = fallback_text(decision)
    state = exchange.state
    operation, family = state["operation"], state["family"]
    if operation == CONVERSE:
        return Reply.json(200, {"output": {"message": {"role": "assistant", "content": [{"text": text}]}},
                                "stopReason": "end_turn", "usage": {"inputTokens": 0, "outputTokens": 0,
                                                                    "totalTokens": 0},
                                "metrics": {"latencyMs": 0}, "governor": dict(governor)})
    if operation == INVOKE:
        return Reply.json(200, {**_invoke_body(family, exchange, text), "governor": dict(governor)})
    if operation == CONVERSE_STREAM:
        frames = [
            eventstream.event("messageStart", b'{"role":"assistant"}'),
            eventstream.event("contentBlockDelta", orjson.dumps({"contentBlockIndex": 0, "delta": {"text": text}})),
            eventstream.event("contentBlockStop", b'{"contentBlockIndex":0}'),
            eventstream.event("messageStop", b'{"stopReason":"end_turn"}'),
            eventstream.event("metadata", b'{"usage":{"inputTokens":0,"outputTokens":0,"totalTokens":0},'
                                          b'"metrics":{"latencyMs":0}}'),
        ]
    else:
        if family == ANTHROPIC:
            chunks = _anthropic_chunks(exchange, text)
        else:
            chunks = [_invoke_body(family, exchange, text)]
        frames = [eventstream.event("chunk", orjson.dumps({"bytes": base64.b64encode(orjson.dumps(chunk)).decode()}))
                  for chunk in chunks]
    return Reply(200, {"content-type": eventstream.CONTENT_TYPE}, b"".join(frames))


__all__ = ["observe", "watcher_for", "fallback_reply", "readable", "FramedWatcher", "ConverseStreamWatcher",
           "InvokeStreamWatcher", "Tally"]
