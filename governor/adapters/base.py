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
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import orjson

from governor.adapters.request_view import RequestView
from governor.policy.steps import Decision, Step, ToolCall, ToolError, UsageReport

# Only what this module defines: BadRequest, RequestView and RawHeaders live in request_view.py,
# describe and status_for in refusals.py (tests/test_architecture.py keeps it so).
__all__ = ["Adapter", "AdapterConfig", "Exchange", "JSON_HEADERS", "Observation", "Reply", "StreamEvent",
           "StreamWatcher", "SuffixAdapter", "UNREAD_ANSWER", "UnreadableAnswer", "observe_stream_whole"]


JSON_HEADERS: Mapping[str, str] = {"content-type": "application/json"}
# Exchange.state key an adapter sets when the answer carries nothing it reads (a file's
# content, a batch's results): the proxy relays it as it comes instead of buffering it.
UNREAD_ANSWER = "unread_answer"


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
    the registry's one DeferredWork, governor.adapters.deferred, handed to the adapters
    that say they remember in their constructors)."""

    name: ClassVar[str]  # registry key and mapping target: "openai", "anthropic", "mcp", "a2a"
    provider: ClassVar[str] = ""  # ModelCall.provider for LLM adapters
    # True: the constructor takes `memory` (a DeferredWork), the registry's one, after the config
    remembers: ClassVar[bool] = False

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


class SuffixAdapter(Adapter):
    """An adapter whose model-call endpoints are the routes ending with one of `suffixes`
    (Gemini, Ollama, TGI, the media and free endpoints): a POST there is its."""

    suffixes: ClassVar[tuple[str, ...]] = ()

    def claims(self, route: str) -> bool:
        return route.endswith(self.suffixes)

    def match(self, request: RequestView) -> bool:
        return request.method == "POST" and request.match_route.endswith(self.suffixes)


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
