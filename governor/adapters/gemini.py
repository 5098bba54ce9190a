"""Gemini wire protocol: the Generative Language API and Vertex AI (generateContent, plain
and streamed; countTokens; embedContent and batchEmbedContents).

Matched on the normalized path (shapes.normalize_path), whoever serves it, by the method
after the model: `POST …/models/{model}:generateContent` (`/v1beta/…`, `/v1/…`, and Vertex
AI's `/v1/projects/{p}/locations/{l}/publishers/google/models/{model}:…`, `v1beta1` too),
`:streamGenerateContent` (`?alt=sse`: SSE, what google-genai asks for; without it a JSON
array, read whole), `:countTokens` (free: a governed step that costs nothing),
`:embedContent` and `:batchEmbedContents` (input tokens only). The colon may arrive
percent-encoded (`%3A`): servers decode it, so both spellings are claimed. The model is the
path's (between `models/` and the colon); a path without one is refused (400).

Output limit: `generationConfig.maxOutputTokens`, per candidate; `candidateCount`
multiplies the expected output. Offered tools: governor.adapters.gemini_tools. Usage and
streams: governor.adapters.gemini_answers. Errors: Google's `{"error": {code, message,
status, details}}`, carrying the governor object.
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import parse_qsl

import orjson

from governor.adapters import gemini_tools, sse
from governor.adapters.base import SuffixAdapter, Exchange, Observation, Reply, StreamWatcher
from governor.adapters.model_calls import estimate_tokens, model_call
from governor.adapters.refusals import describe, fallback_text
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.endpoints import FREE, GOVERNED, Endpoint, Probe
from governor.adapters.fitting import requested_limit
from governor.adapters.counting import measured
from governor.adapters.gemini_answers import GeminiStreamWatcher, Reading, error_body, reported
from governor.policy.steps import Decision, Step, UsageReport

GENERATE = "generateContent"
STREAM = "streamGenerateContent"
COUNT = "countTokens"
EMBED = "embedContent"
BATCH_EMBED = "batchEmbedContents"

# (suffix of the normalized, lower-case route, the method it names), colon plain or encoded
_SUFFIXES = tuple((separator + method.lower(), method)
                  for method in (GENERATE, STREAM, COUNT, EMBED, BATCH_EMBED) for separator in (":", "%3a"))
_ANY_SUFFIX = tuple(suffix for suffix, _ in _SUFFIXES)
_CONFIG = ("generationConfig", "generation_config")
LIMIT_FIELDS = ("maxOutputTokens", "max_output_tokens")
_CANDIDATES = ("candidateCount", "candidate_count")
SSE_HEADERS = {"content-type": "text/event-stream"}


def _method(route: str) -> tuple[str, int] | None:
    """The API method a normalized, lower-case route names and the length of its suffix
    (None: not a Gemini call). One C-level suffix test decides every other request."""
    if not route.endswith(_ANY_SUFFIX):
        return None
    for suffix, method in _SUFFIXES:
        if route.endswith(suffix):
            return method, len(suffix)
    return None  # unreachable


def _query_alt(path: str) -> str:
    """The `alt` query parameter (the last one given), lower case; "" when absent."""
    if "?" not in path:
        return ""
    alt = ""
    for key, value in parse_qsl(path.split("?", 1)[1], keep_blank_values=True):
        if key == "alt":
            alt = value.lower()
    return alt


class GeminiAdapter(SuffixAdapter):
    name = "gemini"
    provider = "google"
    suffixes = _ANY_SUFFIX

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        found = _method(request.match_route)
        if found is None:  # a path a `routes` entry gave this adapter
            raise BadRequest(f"not a Gemini call: {request.method} {request.route} (the path must end with "
                             f"':{GENERATE}', ':{STREAM}', ':{COUNT}', ':{EMBED}' or ':{BATCH_EMBED}')")
        method, suffix = found
        segment = request.normal_route.rsplit("/", 1)[-1]
        model = segment[:len(segment) - suffix]
        if not model:
            raise BadRequest(f"the path names no model before ':{method}' ({request.route})")
        body = request.json_object()
        state: dict[str, Any] = {"method": method, "alt": _query_alt(request.path),
                                 "expected_input": estimate_tokens(len(request.content), self.config.bytes_per_token)}
        if method in (GENERATE, STREAM):
            self._read_generation(body, state)
        elif method == COUNT:  # free: counted and recorded, reserves and costs nothing
            state["expected_input"] = 0
            state["expected_output"] = 0
        else:
            key = "content" if method == EMBED else "requests"
            if not isinstance(body.get(key), dict if method == EMBED else list):
                raise BadRequest(f"'{key}' is required and must be {'an object' if method == EMBED else 'an array'}")
            state["expected_output"] = 0
        return Exchange(adapter=self, method=request.method, host=request.host, path=request.path, body=body,
                        session=session, persona=persona, stream=method == STREAM, model=model, state=state)

    def _read_generation(self, body: dict[str, Any], state: dict[str, Any]) -> None:
        if not isinstance(body.get("contents"), list):
            raise BadRequest("'contents' is required and must be an array")
        config_key = gemini_tools.one_of(body, _CONFIG, "the request")
        config: Any = {}
        if config_key is not None:
            config = body[config_key]
            if not isinstance(config, dict):
                raise BadRequest(f"'{config_key}' must be an object")
            gemini_tools.one_of(config, LIMIT_FIELDS, f"'{config_key}'")
            gemini_tools.one_of(config, _CANDIDATES, f"'{config_key}'")
        state["config_key"] = config_key
        # both spellings are refused above; read strictly: a 400 for "5", 5.0, 0, -1 (a count read
        # as 1 here that the server reads as 5 would reserve one answer for five)
        limit = max(requested_limit(config, name) for name in LIMIT_FIELDS)
        choices = max(1, *(requested_limit(config, name) for name in _CANDIDATES))
        state["choices"] = choices
        state["expected_output"] = (limit or self.config.default_output_tokens) * choices
        if body.get("tools") is not None:
            state["tools"] = gemini_tools.read_tools(body["tools"])
        gemini_tools.one_of(body, gemini_tools.TOOL_CONFIG, "the request")

    def output_limit_fields(self, exchange: Exchange) -> tuple[str, ...]:
        return LIMIT_FIELDS if exchange.state["method"] in (GENERATE, STREAM) else ()

    def output_limit_holder(self, exchange: Exchange, create: bool = False) -> dict[str, Any] | None:
        key = exchange.state.get("config_key")
        if key is None:
            if not create:
                return None
            key = exchange.state["config_key"] = "generationConfig"
            exchange.body[key] = {}
        return exchange.body[key]

    async def steps(self, exchange: Exchange) -> list[Step]:
        tools = exchange.state.get("tools")
        return [model_call(self, exchange, gemini_tools.offered(tools) if tools else ())]

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        allowed = decision.allowed_tools
        tools = exchange.state.get("tools")
        if allowed is None or not tools:
            return None
        withheld = gemini_tools.withhold(exchange.body, allowed, tools)
        if withheld is None:
            return None
        exchange.state["withheld"] = withheld  # offered tools the step may not use: the model never sees them
        return orjson.dumps(exchange.body)

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        if status != 200:
            return Observation()
        state = exchange.state
        method = state["method"]
        if method == COUNT:  # free: settled at nothing, whatever the answer says
            return Observation(usage=UsageReport(model=exchange.model, input_tokens=0, output_tokens=0,
                                                 persona=exchange.persona))
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            data = None
        items = data if isinstance(data, list) else [data] if isinstance(data, dict) else None
        if items is None:
            # a 200 the governor cannot read: what it consumed cannot be counted, so it is charged
            # what it reserved (fail closed), as an answer past the governor's bounds is
            return Observation(usage=UsageReport(model=exchange.model, input_tokens=state["expected_input"],
                                                 output_tokens=state["expected_output"], persona=exchange.persona))
        reading = Reading(exchange.persona)
        steps: list[Step] = []
        for item in items:
            reading.read(item, steps)
        if not reading.answers and reading.errors:
            return Observation()  # the upstream's own error, in a 200 (a stream's first item)
        # the provider's figures, the output at least the governor's count of what it relayed;
        # without usage, the count and the request's estimated input (adapters.counting)
        usage = measured(reported(reading.fields, exchange.model, state["expected_input"]), reading.counter.tokens,
                         model=exchange.model, expected_input=state["expected_input"], persona=exchange.persona)
        return Observation(usage=usage, steps=steps)

    def stream_watcher(self, exchange: Exchange, status: int, headers: Mapping[str, str]) -> StreamWatcher | None:
        # decided by the answer, not by the query: a JSON-array stream (no alt=sse) is read whole
        if status != 200 or "text/event-stream" not in (headers.get("content-type") or "") \
                or exchange.state["method"] not in (GENERATE, STREAM):
            return None
        return GeminiStreamWatcher(exchange, self.config.bytes_per_token)

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        return Reply.json(status, error_body(status, message, governor))

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        method = exchange.state["method"]
        if method in (EMBED, BATCH_EMBED):  # no text to substitute for vectors: the refusal, as an error
            return self.error_response(403, describe(governor), governor, exchange)
        if method == COUNT:
            return Reply.json(200, {"totalTokens": 0, "governor": dict(governor)})
        answer = {"candidates": [{"content": {"role": "model", "parts": [{"text": fallback_text(decision)}]},
                                  "finishReason": "STOP", "index": 0}],
                  "usageMetadata": {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0},
                  "modelVersion": exchange.model, "governor": dict(governor)}
        if method == GENERATE:
            return Reply.json(200, answer)
        if exchange.state["alt"] == "sse":
            return Reply(200, SSE_HEADERS, b"data: " + orjson.dumps(answer) + b"\r\n\r\n")
        return Reply.json(200, [answer])


ADAPTERS = (GeminiAdapter,)

__all__ = ["GeminiAdapter", "ADAPTERS", "ENDPOINTS", "LIMIT_FIELDS"]

_HI = b'{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}'
_VERTEX = "/v1/projects/{project}/locations/{location}/publishers/google/models/{model}"
_VERTEX_PROBE = "/v1/projects/demo/locations/us-central1/publishers/google/models/gemini-2.5-flash"

ENDPOINTS = (
    Endpoint("Gemini", "generateContent", "POST", "/v1beta/models/{model}:generateContent", GOVERNED, "gemini",
             Probe("POST", "/v1beta/models/gemini-2.5-flash:generateContent", _HI),
             "usageMetadata (prompt + tool-use prompt in, candidates + thoughts out); maxOutputTokens fitted, "
             "candidateCount multiplies"),
    Endpoint("Gemini", "streamGenerateContent", "POST", "/v1beta/models/{model}:streamGenerateContent?alt=sse",
             GOVERNED, "gemini",
             Probe("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", _HI),
             "SSE, each chunk's cumulative usageMetadata; cut with an error event", stream=True),
    Endpoint("Gemini", "streamGenerateContent (JSON array)", "POST", "/v1beta/models/{model}:streamGenerateContent",
             GOVERNED, "gemini", Probe("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent", _HI),
             "without alt=sse: a JSON array, read whole before it is delivered", stream=True),
    Endpoint("Gemini", "countTokens", "POST", "/v1beta/models/{model}:countTokens", FREE, "gemini",
             Probe("POST", "/v1beta/models/gemini-2.5-flash:countTokens", _HI), "counted, costs nothing"),
    Endpoint("Gemini", "embedContent", "POST", "/v1beta/models/{model}:embedContent", GOVERNED, "gemini",
             Probe("POST", "/v1beta/models/gemini-embedding-001:embedContent",
                   b'{"content":{"parts":[{"text":"hi"}]}}'), "input tokens only"),
    Endpoint("Gemini", "batchEmbedContents", "POST", "/v1beta/models/{model}:batchEmbedContents", GOVERNED,
             "gemini", Probe("POST", "/v1beta/models/gemini-embedding-001:batchEmbedContents",
                             b'{"requests":[{"model":"models/gemini-embedding-001",'
                             b'"content":{"parts":[{"text":"hi"}]}}]}'), "input tokens only"),
    Endpoint("Vertex AI", "generateContent", "POST", _VERTEX + ":generateContent", GOVERNED, "gemini",
             Probe("POST", _VERTEX_PROBE + ":generateContent", _HI), "as Gemini; also v1beta1"),
    Endpoint("Vertex AI", "streamGenerateContent", "POST", _VERTEX + ":streamGenerateContent?alt=sse", GOVERNED,
             "gemini", Probe("POST", _VERTEX_PROBE + ":streamGenerateContent?alt=sse", _HI), "as Gemini",
             stream=True),
    Endpoint("Vertex AI", "countTokens", "POST", _VERTEX + ":countTokens", FREE, "gemini",
             Probe("POST", _VERTEX_PROBE + ":countTokens", _HI), "counted, costs nothing"),
    Endpoint("Vertex AI", "embedContent", "POST", _VERTEX + ":embedContent", GOVERNED, "gemini",
             Probe("POST", _VERTEX_PROBE.replace("gemini-2.5-flash", "gemini-embedding-001") + ":embedContent",
                   b'{"content":{"parts":[{"text":"hi"}]}}'), "input tokens only"),
)
