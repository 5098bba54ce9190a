"""The adapter contract: one adapter per wire protocol.

An adapter turns one HTTP exchange into policy steps and turns the runtime's
decisions back into bytes its protocol's clients understand. It never decides
and never does I/O of its own (A2A peer resolution is the one allowed exception,
which is why `steps` is async): the proxy's addons ask the runtime and apply
the answers, the adapter only translates.

Lifecycle of a governed exchange, as the addon drives it:

    adapter.match(view)                 cheap: path (+ body shape when needed)
    exchange = adapter.open(view, ...)  parse the body once; BadRequest -> 400
    steps = await adapter.steps(exchange)
        ... runtime.admit(step) for each; a block answers with
            adapter.error_response(...) or adapter.fallback_response(...)
    body = adapter.rewrite_request(exchange, decision)   None: unchanged
    -- upstream --
    plain:  adapter.observe_response(exchange, status, headers, body)
    stream: watcher = adapter.stream_watcher(exchange, status, headers)
            watcher.feed(chunk) per chunk, watcher.close() at the end,
            watcher.terminal(...) when the governor cuts the stream

Adapters are chosen by path and body shape, never by vendor hostnames, so a
local vLLM or an Azure deployment is governed exactly like api.openai.com.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import orjson

from governor.adapters.deferred import DeferredWork
from governor.adapters.shapes import (LENIENT_PARSE_LIMIT, TOO_DEEP, charset_conflict, json_encoding, json_text,
                                      nests_too_deep, route_forms)
from governor.policy.rates import ON_GOVERNOR_RATE_LIMIT
from governor.policy.steps import (
    ON_BUDGET_EXHAUSTED,
    ON_GOVERNOR_ERROR,
    ON_ITERATION_LIMIT,
    Decision,
    ModelCall,
    Step,
    ToolCall,
    ToolError,
    UsageReport,
)


JSON_HEADERS: Mapping[str, str] = {"content-type": "application/json"}
# Exchange.state key an adapter sets when the answer carries nothing it reads (a file's
# content, a batch's results): the proxy relays it as it comes instead of buffering it.
UNREAD_ANSWER = "unread_answer"


class BadRequest(Exception):
    """The request cannot be understood: answered with a 400 in the protocol's format, never forwarded."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class UnreadableAnswer(ValueError):
    """A 200 answer (or a stream's event) the adapter cannot read where its protocol sends
    JSON: raised by `observe_response` or a watcher's `feed`, so the proxy refuses it (a plain
    answer: 502, charged its reservation; a stream: cut, recorded) rather than deliver what a
    lenient client parser might read as tool calls the governor never saw."""


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    """Knobs shared by the adapters (documented in the README)."""

    # Expected input tokens are estimated as len(serialized prompt) / bytes_per_token.
    bytes_per_token: float = 4.0
    # Expected output tokens when the request names no max_tokens (or equivalent).
    default_output_tokens: int = 4096
    # OpenAI chat streams: ask for a final usage chunk when the client did not.
    inject_stream_usage: bool = True
    # Output fitting (docs/fitting.md): lower a call's output limit to what its caps leave,
    # down to fit_floor tokens per answer (below it the call is refused); a call naming no
    # limit that draws on a cap is sent with its reservation's as its limit.
    fit_output: bool = True
    fit_floor: int = 256
    # Free-form settings for other adapters (e.g. A2A peer resolution).
    extra: Mapping[str, Any] = field(default_factory=dict)
    # What the adapters built from this config remember across exchanges (files uploaded for
    # batches, submissions charged at once: governor.adapters.deferred). Not a knob: one per
    # registry, shared by its adapters.
    memory: DeferredWork = field(default_factory=DeferredWork, compare=False, repr=False)


class RawHeaders(Mapping[str, str]):
    """Request headers as the agent sent them, read from mitmproxy's raw (name, value)
    byte pairs without copying them into a Headers object: case-insensitive, repeats
    joined with ", " as `Headers.get` joins them. Decoded on first use (most requests'
    adapters never look)."""

    __slots__ = ("_fields", "_folded")

    def __init__(self, fields: Sequence[tuple[bytes, bytes]]) -> None:
        self._fields = fields
        self._folded: dict[str, str] | None = None

    def _decoded(self) -> dict[str, str]:
        if self._folded is None:
            folded: dict[str, str] = {}
            for name, value in self._fields:
                key = name.decode("utf-8", "surrogateescape").lower()
                text = value.decode("utf-8", "surrogateescape")
                folded[key] = f"{folded[key]}, {text}" if key in folded else text
            self._folded = folded
        return self._folded

    def __getitem__(self, name: str) -> str:
        return self._decoded()[name.lower()]

    def pairs(self) -> Iterator[tuple[str, str]]:
        """Every (name, value) as sent, repeats kept: for checks that a repeat defeats."""
        for name, value in self._fields:
            yield name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")

    def get_all(self, name: str) -> list[str]:
        wanted = name.lower()
        return [value for key, value in self.pairs() if key.lower() == wanted]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())


class RequestView:
    """A read-only view of an HTTP request for matching; parses the body lazily, once.

    Built by the addon from a mitmproxy request (or by tests from raw parts).
    Matching on the path costs nothing; `json()` parses the body with orjson on
    first use and caches the result (or the failure), so whichever adapter looks
    first pays and the others reuse it.

    The body is read as the receiving servers read it: UTF-8 by orjson (the hot path,
    nothing else is tried when it succeeds); JSON in another Unicode encoding (a byte order
    mark, UTF-16 or UTF-32) as Python's json.loads(bytes) reads it, which is what the `mcp`
    and `a2a` SDK servers do, so such a body is governed, never passed on as unknown
    traffic (`encoding` says which it was). JSON only to Python's json (NaN, 1e400, a lone
    surrogate escape, deeper nesting) is matched on and refused (`json()` raises BadRequest):
    the governor does not decide on values it cannot read as the server will. Anything
    else is not JSON.
    """

    __slots__ = ("method", "scheme", "host", "port", "path", "headers", "content", "encoding", "_json", "_error",
                 "_conflict", "_normal", "_match")

    _UNPARSED: ClassVar[object] = object()

    def __init__(
        self,
        method: str,
        host: str,
        path: str,
        headers: Mapping[str, str],
        content: bytes | None,
        *,
        port: int = 443,
        scheme: str = "https",
    ) -> None:
        self.method = method.upper()
        self.scheme = scheme
        self.host = host
        self.port = port
        self.path = path
        self.headers = headers  # case-insensitive mapping (mitmproxy Headers) or lower-case dict
        self.content = content or b""
        self.encoding: str | None = None  # the body's encoding when not UTF-8 (shapes.json_encoding)
        self._json: Any = self._UNPARSED
        self._error: str | None = None
        self._conflict: str | None = None  # a charset in Content-Type the body is not in
        self._normal: str | None = None
        self._match: str | None = None

    @property
    def route(self) -> str:
        """The path without its query string."""
        return self.path.split("?", 1)[0]

    @property
    def normal_route(self) -> str:
        """The route as a server routes it (shapes.normalize_path: percent-decoded, slashes
        collapsed, dot segments resolved, no trailing slash), letter case kept."""
        if self._normal is None:
            self._normal, self._match = route_forms(self.path)
        return self._normal

    @property
    def match_route(self) -> str:
        """The normalized route in lower case: what adapters and routes match on."""
        if self._match is None:
            self._normal, self._match = route_forms(self.path)
        return self._match

    @property
    def content_type(self) -> str:
        return (self.headers.get("content-type") or "").split(";", 1)[0].strip().lower()

    def json(self) -> Any:
        """The parsed body; raises BadRequest (once computed, cached) when it is not JSON, when
        it is JSON in an encoding its Content-Type's charset contradicts, or when it is JSON
        only to a lenient parser."""
        self._parse()
        if self._error is not None:
            raise BadRequest(self._error)
        if self._conflict is not None:
            raise BadRequest(self._conflict)
        return self._json

    def _parse(self) -> None:
        if self._json is self._UNPARSED and self._error is None:
            try:
                self._json = orjson.loads(self.content)
            except orjson.JSONDecodeError as exc:
                self._reread(exc)
            if self._error is None and self._conflict is None and nests_too_deep(self.content, self._json):
                self._conflict = TOO_DEEP  # matched on, refused by json(): 400 before any step

    def _reread(self, failure: orjson.JSONDecodeError) -> None:
        """Not UTF-8 JSON to orjson. JSON with a BOM or in UTF-16/32 is decoded as Python's
        json reads bytes (shapes.json_text) and parsed: governed like any body. JSON only to
        Python's json (NaN, Infinity, 1e400, a lone surrogate escape, nesting past orjson's
        1024 levels: what the `mcp` SDK server still accepts) is matched on but refused by
        json(), since the governor cannot read its values as the server will. Anything else
        keeps orjson's verdict. The value is kept for matching either way: a body an adapter
        would govern is refused in its protocol (400), never passed on as unknown traffic."""
        content = self.content
        encoding = json_encoding(content)
        text = json_text(content) if encoding is not None else None
        if isinstance(text, str):
            try:
                self._json = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                failure = exc
            else:
                self.encoding = encoding
                self._conflict = charset_conflict(self.headers.get("content-type"), content, encoding)
                return
        if len(content) <= LENIENT_PARSE_LIMIT:
            try:
                self._json = json.loads(content)
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                pass
            else:
                self._conflict = ("request body is JSON only to a lenient parser (NaN, Infinity, a number out of "
                                  "range, a lone surrogate or nesting past 1024 levels): refused, the governor "
                                  "cannot read its values exactly")
                return
        where = f" ({encoding})" if isinstance(text, str) else ""
        self._error = f"request body{where} is not valid JSON: {failure}"

    @property
    def parsed(self) -> bool:
        """The body was parsed already (or found not to be JSON): json_or_none costs nothing."""
        return self._json is not self._UNPARSED or self._error is not None

    @property
    def unparseable(self) -> bool:
        """A parse was tried and failed (not JSON to orjson, nor in another Unicode encoding,
        nor to Python's json)."""
        return self._error is not None

    def json_or_none(self) -> Any:
        """The parsed body, or None when absent or not JSON (for body-shape matching).
        Whatever the Content-Type says: servers that parse JSON regardless of it exist, so a
        JSON body is what it is (its charset is judged by json(), when an adapter opens it)."""
        if not self.content:
            return None
        self._parse()
        return None if self._error is not None else self._json


@dataclass(slots=True)
class Exchange:
    """One governed request/response as its adapter sees it; created by `Adapter.open`.

    `body` is the parsed request body; adapters keep what they learn in `state`
    (e.g. the model name, whether the client asked for usage in its stream).
    The addon sets `decision` to the admitted decision of the exchange's main step
    so `observe_response` can apply it to the answer (e.g. filter a tools/list).
    """

    adapter: "Adapter"
    method: str
    host: str
    path: str
    body: Any
    session: str
    persona: str | None = None
    stream: bool = False  # the client asked for a streamed answer
    model: str = ""
    state: dict[str, Any] = field(default_factory=dict)
    decision: Decision | None = None
    # Headers to set on the request that goes upstream once admitted (e.g. the A2A
    # delegation depth for the peer's own governor); the agent's ADL-* headers are
    # always stripped before these are applied.
    upstream_headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Reply:
    """A response the governor answers with instead of (or in place of) the upstream's."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @classmethod
    def json(cls, status: int, value: Any, headers: Mapping[str, str] | None = None) -> "Reply":
        return cls(status, {**JSON_HEADERS, **(headers or {})}, orjson.dumps(value))


@dataclass(slots=True)
class Observation:
    """What a finished (non-streamed) response tells the governor.

    usage:   the final usage of a model call, or None (no usage in the answer).
    steps:   further steps the answer implies: ToolCall for each tool an LLM asks
             the agent to run, ToolError for a failed tool, ...
    replace_body: a rewritten response body (e.g. tools/list filtered), or None.
    """

    usage: UsageReport | None = None
    steps: list[Step] = field(default_factory=list)
    replace_body: bytes | None = None


StreamEvent = UsageReport | ToolCall | ToolError
"""What a stream watcher reports: cumulative usage (final=False), tool calls, tool errors."""


class StreamWatcher(abc.ABC):
    """An incremental parser for one streamed (SSE) response.

    Fed the raw chunks exactly as they arrive (event boundaries fall anywhere);
    it never changes them. The proxy forwards whole SSE events only, untouched,
    until the governor cuts the stream; then it sends `terminal(...)` and nothing
    else, so the terminal bytes always start on an event boundary.
    """

    # Events end at each newline (NDJSON: Ollama) rather than at a blank line (SSE): the relay
    # frames what it forwards by lines, and sends no keep-alive comment (NDJSON has none).
    line_framed: ClassVar[bool] = False

    @abc.abstractmethod
    def feed(self, chunk: bytes) -> list[StreamEvent]:
        """Parse a chunk; return usage updates (final=False) and tool calls seen in it."""

    @abc.abstractmethod
    def close(self) -> list[StreamEvent]:
        """The upstream ended the stream: return what is left, ending with the final usage
        (a UsageReport with final=True) when any usage was seen."""

    @abc.abstractmethod
    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        """Bytes that end the stream protocol-correctly after a cut, carrying the reason
        (`message` for humans, `governor` the machine-readable object)."""

    @property
    @abc.abstractmethod
    def usage(self) -> UsageReport | None:
        """The latest cumulative usage seen so far (final=False), or None."""

    def framer(self) -> Any:
        """The framing the relay forwards whole units of: None for SSE (sse.EventFramer, and
        SSE keep-alive comments on a held stream); a watcher of another framing (Bedrock's
        binary event stream) returns its own framer (`feed`, `pending`, `take`, `clear`),
        and the relay then sends no keep-alive lines into it."""
        return None


class Adapter(abc.ABC):
    """One wire protocol. Subclasses are stateless: all per-exchange state lives in Exchange
    (what must outlive an exchange, the asynchronous endpoints' files and charges, lives in
    the registry's one `config.memory`: governor.adapters.deferred)."""

    name: ClassVar[str]  # registry key and mapping target: "openai", "anthropic", "mcp", "a2a"
    provider: ClassVar[str] = ""  # ModelCall.provider for LLM adapters

    def __init__(self, config: AdapterConfig | None = None) -> None:
        self.config = config or AdapterConfig()

    def claims(self, route: str) -> bool:
        """True when `route` (RequestView.match_route: normalized, lower case) is one of this
        protocol's model-call endpoints, whatever the method: selection refuses a model
        endpoint reached with a method the adapter does not govern instead of forwarding it.
        Path-matched adapters override it; body-matched (JSON-RPC) ones claim no path."""
        return False

    @abc.abstractmethod
    def match(self, request: RequestView) -> bool:
        """True when this adapter speaks the request's protocol. Must be cheap: decide on
        method and path first; look at `request.json_or_none()` only when the path
        cannot tell (JSON-RPC)."""

    @abc.abstractmethod
    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        """Parse the request (once) into an Exchange; raise BadRequest when it cannot be."""

    @abc.abstractmethod
    async def steps(self, exchange: Exchange) -> list[Step]:
        """The steps this request asks the runtime to admit, in order. The first
        ModelCall's admission is the one whose ticket carries the usage."""

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        """The request body to send upstream once admitted, or None to send it unchanged."""
        return None

    def output_limit_fields(self, exchange: Exchange) -> tuple[str, ...]:
        """The request body's output-limit fields for this exchange's endpoint, the one to
        insert first (governor.adapters.fitting); () when it has no output limit."""
        return ()

    def output_limit_holder(self, exchange: Exchange, create: bool = False) -> dict[str, Any] | None:
        """The object whose keys are `output_limit_fields` (governor.adapters.fitting): the body
        itself, unless the protocol nests them (Gemini's generationConfig, Ollama's options, TGI's
        parameters); with `create`, made when absent. None: absent, and not created."""
        return exchange.body

    def edit_request(self, exchange: Exchange, arguments: Mapping[str, Any]) -> bool:
        """Plan editing (governor.runtime.edit): make the request carry the tool arguments a
        reviewer approved instead of the agent's. False: this protocol cannot (the proxy then
        refuses the request rather than send what was not approved)."""
        return False

    @abc.abstractmethod
    def observe_response(
        self, exchange: Exchange, status: int, headers: Mapping[str, str], body: bytes
    ) -> Observation:
        """Read a complete (non-streamed) upstream response. Never raises on bad bodies:
        unparseable upstream output yields an Observation without usage (an adapter may
        instead raise UnreadableAnswer, refused by the proxy)."""

    def stream_watcher(
        self, exchange: Exchange, status: int, headers: Mapping[str, str]
    ) -> StreamWatcher | None:
        """A watcher when this response is a stream the adapter understands, else None
        (the response is then buffered and given to observe_response)."""
        return None

    @abc.abstractmethod
    def error_response(
        self, status: int, message: str, governor: Mapping[str, Any] | None, exchange: Exchange | None = None
    ) -> Reply:
        """An error in the protocol's own format, carrying the machine-readable governor object."""

    @abc.abstractmethod
    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        """A §6 fallback: the declared value/message in the protocol's normal response shape."""


def observe_stream_whole(adapter: Adapter, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation | None:
    """A stream the adapter watches, read whole: for one that could not be relayed event by
    event (the upstream compressed it although the governor asked for identity), so its
    usage and tool calls still count. None when the adapter has no watcher for the answer.
    Raises sse.EventTooLarge (the caller fails closed)."""
    watcher = adapter.stream_watcher(exchange, status, headers)
    if watcher is None:
        return None
    observation = Observation()
    for event in watcher.feed(body) + watcher.close():
        if isinstance(event, UsageReport):
            observation.usage = event  # the last is the final figure
        else:
            observation.steps.append(event)
    return observation


# --- mapping decisions to HTTP ---------------------------------------------------------


def status_for(decision: Decision) -> int:
    """HTTP status of a refusal: 429 exhausted budget or iteration limit, 503 governor
    failure (fail closed), 403 anything else the policy denies."""
    if decision.cause == ON_GOVERNOR_ERROR:
        return 503
    if decision.cause in (ON_BUDGET_EXHAUSTED, ON_ITERATION_LIMIT, ON_GOVERNOR_RATE_LIMIT):
        return 429
    return 403


def describe(governor: Mapping[str, Any]) -> str:
    """A one-line human reason for an error message, from a governor object."""
    cause = governor.get("cause") or "governor"
    parts = [f"governor: {governor.get('action', 'halt')} ({cause})"]
    if "dimension" in governor:
        scope = governor.get("scope")
        parts.append(f"{governor['dimension']}{' ' + scope if scope else ''}")
    unpriced = governor.get("reason") in ("unpriced_model", "unpriced_unit")
    if governor.get("loop") is True:
        parts.append(f"loop: {governor.get('tool')} called again with the same arguments after "
                     f"{governor.get('repeats_in_window')} identical calls in the last {governor.get('window')} "
                     f"tool calls (loop threshold {governor.get('threshold')})")
    elif unpriced and governor.get("reason") == "unpriced_unit":
        limit = f" (limit {governor['limit']} USD)" if "limit" in governor else ""
        parts.append(f"model {governor.get('model')!r} has no price for {governor.get('unit')!r}, so the cost of "
                     f"this call cannot be checked{limit}: price it in the pricing file, under the model's "
                     f"family: units: {{{governor.get('unit')}: USD per unit}} (governor run --pricing FILE, "
                     f"overrides over genai-prices; docs/reference/pricing.md)")
    elif unpriced:
        limit = f" (limit {governor['limit']} USD)" if "limit" in governor else ""
        parts.append(f"model {governor.get('model')!r} has no price, so its cost cannot be checked{limit}: "
                     f"price it in a pricing file (governor run --pricing FILE, overrides over genai-prices: "
                     f"models: {{{str(governor.get('model')).lower()}: {{input: USD, output: USD}}}} per million "
                     f"tokens, or fallback: MODEL to price every unpriced model as MODEL; docs/reference/pricing.md)")
    elif "call_used" in governor and "projected" in governor and "limit" in governor:
        # a call's actual usage crossed (mid-stream or at its end): the session's use with it,
        # and the call's own part against what it had reserved
        so_far = "" if governor.get("final") else " so far"
        parts.append(f"used {_figure(governor['projected'])} > limit {_figure(governor['limit'])} "
                     f"(this call {_figure(governor['call_used'])}{so_far}, "
                     f"{_figure(governor.get('call_reserved', 0))} reserved for it; "
                     f"the rest of the session {_figure(governor.get('observed', 0))})")
    elif "projected" in governor and "limit" in governor:
        parts.append(f"projected {governor['projected']} > limit {governor['limit']}"
                     + (f" (used {governor['observed']})" if "observed" in governor else ""))
    elif "observed" in governor and "limit" in governor:
        parts.append(f"observed {governor['observed']} > limit {governor['limit']}")
    if "fit_floor" in governor:  # output fitting could not fit the call (docs/fitting.md)
        parts.append(f"at most {governor.get('fit_room')} output tokens would fit, under the fitting floor of "
                     f"{governor['fit_floor']} (--fit-floor)")
    if governor.get("reason") and not unpriced:
        parts.append(str(governor["reason"]))
    if governor.get("message"):  # the passport's declared message for this degradation
        parts.append(str(governor["message"]))
    return "; ".join(parts)


def _figure(value: Any) -> str:
    """A budget figure for people: whole numbers without a fraction, costs to 6 digits."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.6g}"
    return str(value)


def tool_names(tools: Sequence[Any], key_path: Sequence[str]) -> tuple[str, ...]:
    """Names of offered tools: each tool's name found by following key_path
    (e.g. ("function", "name") for OpenAI chat, ("name",) for Anthropic)."""
    names = []
    for tool in tools:
        value: Any = tool
        for key in key_path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str):
            names.append(value)
    return tuple(names)


def fallback_text(decision: Decision) -> str:
    """The text a fallback answers with: the declared value (JSON when not a string),
    else the declared message."""
    value = decision.fallback_value
    if isinstance(value, str):
        return value
    if value is not None:
        return orjson.dumps(value).decode()
    return decision.fallback_message or ""


def answered_object(status: int, body: bytes) -> dict[str, Any] | None:
    """A 200 answer's JSON object, or None (another status, not JSON, not an object): an
    answer with nothing in it to observe."""
    if status != 200:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


LENIENT_EVENT = ("the upstream sent a stream event that is JSON only to a lenient parser (NaN, Infinity, a lone "
                 "surrogate); the stream was cut rather than relayed unread")


def lenient_only(raw: bytes | str) -> bool:
    """Whether `raw` is JSON to Python's json but not to orjson: NaN, Infinity, 1e400, a lone
    surrogate escape, a BOM or UTF-16/32, nesting past orjson's 1024 levels. The official SDKs
    parse answers with Python's json (httpx's Response.json, json.loads of each SSE event's
    data), so such an answer could carry tool calls the governor never read: the adapter
    refuses it (UnreadableAnswer). Called only where orjson already failed or gave no object
    (off the common path); past LENIENT_PARSE_LIMIT it is not tried and counts as readable
    (fail closed)."""
    try:
        orjson.loads(raw)
        return False
    except orjson.JSONDecodeError:
        pass
    if len(raw) > LENIENT_PARSE_LIMIT:
        return True
    try:
        json.loads(raw)
    except (ValueError, RecursionError):  # not JSON to Python either: the SDK raises, nothing is read
        return False
    return True


def as_dict(value: Any) -> dict[str, Any]:
    """A JSON field the parser expects to be an object, or {} when it is anything else
    (an upstream's or agent's bytes: a list where a dict belongs must not raise)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """A JSON field expected to be an array, or [] when it is anything else."""
    return value if isinstance(value, list) else []


def as_key(value: Any) -> int | str | None:
    """A JSON value used as a dict key (a stream's block or tool-call index): None unless
    an int or a string (a list would be unhashable)."""
    return value if isinstance(value, (int, str)) else None


def positive_int(value: Any) -> int:
    """A token count or limit from a body: a positive integer, else 0 (absent, bad, bool)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def model_call(adapter: Adapter, exchange: Exchange, offered: tuple[str, ...]) -> ModelCall:
    """The step an LLM request is: its model, expected consumption and offered tools."""
    config = adapter.config
    return ModelCall(
        model=exchange.model,
        expected_input_tokens=exchange.state["expected_input"],
        expected_output_tokens=exchange.state["expected_output"],
        tools_offered=offered,
        persona=exchange.persona,
        provider=adapter.provider,
        output_floor=config.fit_floor if config.fit_output and adapter.output_limit_fields(exchange) else None,
        output_choices=exchange.state.get("choices", 1),
    )


def within_admission(exchange: Exchange, model: str, input_tokens: int, output_tokens: int) -> bool:
    """A running usage figure no larger, term by term, than the model call was admitted with
    (model_call() above: the same model, the exchange's expected input and output).

    The runtime reserved exactly that expectation and the decision point does not re-judge
    usage within its reservation, so stream watchers do not report such figures: asking
    about them on every chunk would cost a report, a decision and a store round trip each,
    for nothing. Figures past it are reported at once (and can cut the stream); the final
    figure always is."""
    state = exchange.state
    return (model == exchange.model and input_tokens <= state["expected_input"]
            and output_tokens <= state["expected_output"])


def requested_tool_call(name: Any, arguments: Any, persona: str | None) -> ToolCall | None:
    """A tool call an LLM response asks the agent to run (announced, see ToolCall.origin)."""
    if not isinstance(name, str) or not name:
        return None
    args = parse_arguments(arguments)
    return ToolCall(tool=name, arguments=args, target_path=target_path(args), persona=persona, origin="model")


def estimate_tokens(nbytes: int, bytes_per_token: float) -> int:
    """ceil(nbytes / bytes_per_token): the governor's token estimate for text it has not
    seen counted by the provider (request prompts, stream text before usage arrives)."""
    return int(-(-nbytes // bytes_per_token)) if nbytes > 0 else 0


def parse_arguments(raw: Any) -> dict[str, Any]:
    """Tool-call arguments as a mapping: JSON text is parsed; anything unparseable is kept
    under "_raw" so the step (and a loop signature) still sees it."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {"_raw": raw}
        return value if isinstance(value, dict) else {"_value": value}
    return {} if raw is None else {"_value": raw}


# Argument names taken as the path a tool call targets (oversight's path_matches).
TARGET_PATH_KEYS = ("path", "file_path", "filepath", "filename", "file", "url", "uri", "target")


def target_path(arguments: Mapping[str, Any]) -> str | None:
    for key in TARGET_PATH_KEYS:
        value = arguments.get(key)
        if isinstance(value, str) and value:
            return value
    return None
