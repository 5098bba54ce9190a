"""What a Gemini answer says: its usage, the text and function calls of its candidates, and
the stream watcher of `streamGenerateContent?alt=sse`; errors in Google's format.

Usage (`usageMetadata`, the same on the Generative Language API and Vertex AI):
input = `promptTokenCount` + `toolUsePromptTokenCount` (the results of provider-run tools
fed back to the model are billed as input); cached = `cachedContentTokenCount` (part of
the prompt count); output = `candidatesTokenCount` + `thoughtsTokenCount` (thinking is
billed as output). `totalTokenCount` is their sum; when it says more than the parts, the
difference is charged as output (the dearer side: a total the parts do not explain is not
dropped). Every chunk of a stream carries the usage so far: each figure is the largest seen
(an upstream whose last chunk says less than an earlier one does not lower the charge).
Counts that are not positive integers read as 0.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from governor.adapters import sse
from governor.adapters.counting import OutputCounter, add_arguments, measured
from governor.adapters.base import Exchange, StreamEvent
from governor.adapters.model_calls import estimate_tokens, within_admission
from governor.adapters.reading import as_dict, as_list, positive_int, requested_tool_call
from governor.policy.steps import ON_BUDGET_EXHAUSTED, ON_ITERATION_LIMIT, Step, UsageReport

# google.rpc.Code names of the HTTP statuses the governor answers with
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
USAGE_FIELDS = ("promptTokenCount", "cachedContentTokenCount", "candidatesTokenCount", "toolUsePromptTokenCount",
                "thoughtsTokenCount", "totalTokenCount")


def error_body(status: int, message: str, governor: Mapping[str, Any] | None) -> dict[str, Any]:
    """Google's error object (what google-genai raises as `errors.APIError`: `code`, `status`,
    `message`; `details` has the whole body), carrying the governor object under
    `error.governor` and as a google.rpc.ErrorInfo (its reason the cause, in capitals)."""
    error: dict[str, Any] = {"code": status, "message": message, "status": STATUSES.get(status, "UNKNOWN")}
    if governor is not None:
        cause = governor.get("cause") or "governor"
        metadata = {key: value if isinstance(value, str) else orjson.dumps(value).decode()
                    for key, value in governor.items() if value is not None}
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": str(cause).upper(),
                             "domain": "governor", "metadata": metadata}]
        error["governor"] = dict(governor)
    return {"error": error}


def merge_usage(fields: dict[str, int], usage: Any) -> bool:
    """Fold one `usageMetadata` into `fields` (each figure the largest seen); True when it
    was an object."""
    if type(usage) is not dict:
        return False
    for key in USAGE_FIELDS:
        value = positive_int(usage.get(key))
        if value > fields.get(key, 0):
            fields[key] = value
    return True


def report(fields: Mapping[str, int], model: str, persona: str | None, final: bool) -> UsageReport:
    """The usage report `fields` (merge_usage's) stand for."""
    inputs = fields.get("promptTokenCount", 0) + fields.get("toolUsePromptTokenCount", 0)
    outputs = fields.get("candidatesTokenCount", 0) + fields.get("thoughtsTokenCount", 0)
    outputs = max(outputs, fields.get("totalTokenCount", 0) - inputs)
    return UsageReport(model=model, input_tokens=inputs, output_tokens=outputs,
                       cached_input_tokens=min(fields.get("cachedContentTokenCount", 0), inputs),
                       persona=persona, final=final)


def reported(fields: Mapping[str, int], model: str, expected_input: int) -> UsageReport | None:
    """What the answer said it used (None when it said nothing), the request's estimated input
    standing in for a prompt count it did not give."""
    if not fields:
        return None
    said = report(fields, model, None, True)
    if "promptTokenCount" in fields:
        return said
    return UsageReport(model=model, input_tokens=expected_input, output_tokens=said.output_tokens)


class Reading:
    """What one or more answer objects (a plain answer, the items of a JSON-array stream, the
    chunks of an SSE stream) said: the output relayed (counted: adapters.counting), function
    calls, usage, whether it ended."""

    __slots__ = ("persona", "counter", "fields", "finished", "errors", "answers")

    def __init__(self, persona: str | None) -> None:
        self.persona = persona
        self.counter = OutputCounter()  # text, function-call names and arguments relayed
        self.fields: dict[str, int] = {}  # usageMetadata, each figure the largest seen
        self.finished = False  # a candidate's finishReason, or a blocked prompt
        self.errors = 0  # objects that were the upstream's own error
        self.answers = 0  # objects that were answers (candidates, usage or prompt feedback)

    def read(self, data: Any, out: list[Step] | list[StreamEvent]) -> None:
        """Read one GenerateContentResponse; the function calls it asks for go to `out`."""
        if type(data) is not dict:
            return
        if "error" in data and "candidates" not in data:
            self.errors += 1
            return
        self.answers += 1
        merge_usage(self.fields, data.get("usageMetadata"))
        if as_dict(data.get("promptFeedback")).get("blockReason"):
            self.finished = True
        for candidate in as_list(data.get("candidates")):
            if type(candidate) is not dict:
                continue
            if candidate.get("finishReason"):
                self.finished = True
            for part in as_list(as_dict(candidate.get("content")).get("parts")):
                if type(part) is not dict:
                    continue
                self.counter.add_value(part.get("text"))
                call = part.get("functionCall")
                if type(call) is dict:
                    args = call.get("args")
                    if type(name := call.get("name")) is str:
                        self.counter.add_separate(name)
                    add_arguments(self.counter, args)
                    if step := requested_tool_call(call.get("name"), args, self.persona):
                        out.append(step)  # type: ignore[arg-type]


def status_of(governor: Mapping[str, Any]) -> int:
    """The HTTP status a cut stream's error event names (as a refusal would have)."""
    return 429 if governor.get("cause") in (ON_BUDGET_EXHAUSTED, ON_ITERATION_LIMIT) else 403


class GeminiStreamWatcher(sse.SSEStreamWatcher):
    """`streamGenerateContent?alt=sse`: each event's data is a whole GenerateContentResponse
    with the usage so far; function calls arrive whole in a part (reported at once)."""

    def __init__(self, exchange: Exchange, bytes_per_token: float) -> None:
        self.exchange = exchange
        self.bpt = bytes_per_token
        self.decoder = sse.SSEDecoder()
        self.reading = Reading(exchange.persona)
        self._last: UsageReport | None = None

    @property
    def usage(self) -> UsageReport | None:
        return self._last

    def _current(self, final: bool) -> UsageReport:
        """Once the answer finished: the provider's figures, the output raised to the governor's
        count of what was relayed when that is larger (without usage, the count and the
        request's estimated input: adapters.counting.measured); until then (and after a cut)
        its figures or the governor's estimate of the output, whichever is larger, and the
        request's estimated input while the provider has not said."""
        reading = self.reading
        exchange = self.exchange
        fields = reading.fields
        counter = reading.counter
        expected_input = exchange.state["expected_input"]
        if final and reading.finished:
            return measured(reported(fields, exchange.model, expected_input), counter.tokens, model=exchange.model,
                            expected_input=expected_input, persona=exchange.persona)
        current = report(fields, exchange.model, exchange.persona, final)
        estimate = max(estimate_tokens(counter.nbytes, self.bpt), counter.tokens)
        inputs = current.input_tokens if "promptTokenCount" in fields else expected_input
        return UsageReport(model=exchange.model, input_tokens=inputs,
                           output_tokens=max(current.output_tokens, estimate),
                           cached_input_tokens=min(current.cached_input_tokens, inputs),
                           persona=exchange.persona, final=final,
                           reported_output_tokens=current.output_tokens if fields else None,
                           counted_output_tokens=counter.tokens if final else None)

    def _event(self, event: sse.SSEEvent, out: list[StreamEvent]) -> None:
        data = event.json()
        if type(data) is not dict:
            return  # not JSON (a malformed chunk): it counts nothing, the estimate still grows with text
        self.reading.read(data, out)
        current = self._current(final=False)
        if current != self._last and not within_admission(self.exchange, current.model, current.input_tokens,
                                                          current.output_tokens):
            self._last = current
            out.append(current)

    def _closed(self, out: list[StreamEvent]) -> None:
        out.append(self._current(final=True))

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        # an event whose data is {"error": ...}: google-genai raises it as errors.APIError
        return b"data: " + orjson.dumps(error_body(status_of(governor), message, governor)) + b"\r\n\r\n"


__all__ = ["STATUSES", "error_body", "merge_usage", "report", "reported", "Reading", "GeminiStreamWatcher", "status_of"]
