"""The OpenAI Realtime WebSocket, event by event: what the governor makes of each message
of one socket (docs/realtime.md).

`RealtimeConversation` is one socket's protocol state. The proxy's WebSocket addon
(governor/proxy/realtime_sockets.py) hands it every message, in order, and applies what it
returns; it decides nothing and does no I/O:

  client -> server  `client(content, is_text)` -> ClientVerdict
      response.create     a ModelCall to admit before the event is forwarded (its expected
                          output: response.max_output_tokens, else the session's, else the
                          default), tools it offers to withhold
      session.update      tools it offers, to withhold (the runtime's allowed tools)
      other known events  forwarded (their text counts toward the next call's input)
      anything else       refused: not text, not a JSON object with a string `type`, a type
                          the governor does not know (a new event could make the upstream
                          spend), tools it cannot name
  server -> client  `server(content, is_text)` -> ServerVerdict
      response.created    the response paired with the admission of the client's
                          response.create; one the server started itself (server VAD) is a
                          ModelCall admitted now, before any of its output is delivered
      output deltas       counted (text, transcripts, tool arguments): past what the call
                          reserved, a running UsageReport
      tool calls          response.function_call_arguments.done / response.output_item.done
                          (a function_call item) / response.done's output: a ToolCall each,
                          once per call_id
      response.done       the final UsageReport: response.usage (input_tokens, output_tokens,
                          input_token_details.cached_tokens; text and audio tokens alike)
      input audio transcription completed
                          a model call of the session's transcription model, admitted and
                          settled at once from its usage
      error               naming the client event of a pending admission: that admission is
                          released (the server refused the response.create)
      not text, not JSON  refused (the socket is cut: the governor does not deliver what it
                          cannot read); unknown server event types are relayed (they cannot
                          make the upstream spend: responses are bracketed by the known
                          response.created / response.done)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import orjson

from governor.adapters import withhold
from governor.adapters.counting import OutputCounter, count_text, measured
from governor.adapters.base import AdapterConfig
from governor.adapters.model_calls import estimate_tokens
from governor.adapters.reading import as_dict, as_list, positive_int, requested_tool_call
from governor.adapters.request_view import BadRequest
from governor.policy.steps import ModelCall, ToolCall, UsageReport

# Client events of the Realtime API (GA and beta): any other type is refused.
CLIENT_EVENTS = frozenset({
    "session.update", "transcription_session.update",
    "input_audio_buffer.append", "input_audio_buffer.commit", "input_audio_buffer.clear",
    "conversation.item.create", "conversation.item.retrieve", "conversation.item.truncate",
    "conversation.item.delete", "response.create", "response.cancel", "output_audio_buffer.clear",
})
# Client events whose text becomes the model's input (an estimate of the next call's input)
_CONTEXT_EVENTS = frozenset({"conversation.item.create", "session.update", "response.create"})
# Server events carrying generated output as text (GA and beta names)
_OUTPUT_DELTAS = frozenset({
    "response.output_text.delta", "response.text.delta",
    "response.output_audio_transcript.delta", "response.audio_transcript.delta",
    "response.function_call_arguments.delta", "response.mcp_call_arguments.delta",
})
_OUTPUT_LIMITS = ("max_output_tokens", "max_response_output_tokens")  # GA, beta
MAX_EVENT_ID = 128  # characters of a client's event_id the governor keeps


class Refused(Exception):
    """A message the governor does not forward (fail closed), with why."""


@dataclass(slots=True)
class ClientVerdict:
    """What a client event asks: `step` to admit before it goes (response.create), tools
    it offers (`tools`, to withhold), `data` its parsed form (rewritten when tools are
    withheld or an event_id is added)."""

    kind: str
    data: dict[str, Any]
    step: ModelCall | None = None
    tools: tuple[withhold.Names, ...] | None = None


@dataclass(slots=True)
class ServerVerdict:
    """What a server event tells: `admit` a response the server started on its own,
    `usage` (running or final) of a response, tool calls it asks for, `release` the
    admission the server refused, `response` the response it belongs to."""

    kind: str
    response: str | None = None
    admit: ModelCall | None = None
    usage: UsageReport | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    release: "Response | None" = None
    done: bool = False  # response.done: the response is over


@dataclass(slots=True, eq=False)
class Response:
    """One model call on the socket: admitted (its ticket is the proxy's), generating, done."""

    step: ModelCall
    event_id: str | None = None  # the client's response.create event_id (None: started by the server)
    id: str | None = None  # the server's response id, from response.created
    ticket: Any = None  # the admission's ticket (the proxy's)
    counter: OutputCounter = field(default_factory=OutputCounter)  # the output text relayed (adapters.counting)
    reported: UsageReport | None = None  # the last running figure reported


class RealtimeConversation:
    """One Realtime socket's protocol state (see the module docstring)."""

    def __init__(self, config: AdapterConfig, model: str, persona: str | None) -> None:
        self.config = config
        self.model = model
        self.persona = persona
        self.session_limit = 0  # the session's output limit per response (0: none named)
        self.transcription_model = ""  # the session's input transcription model (a separate ASR model call)
        self.context_tokens = 0  # the last response's input + output: what the next one re-reads
        self.pending_bytes = 0  # text the client added since
        self.pending: list[Response] = []  # admitted on response.create, awaiting response.created
        self.responses: dict[str, Response] = {}  # by server response id, until response.done
        self.calls_seen: set[str] = set()  # tool calls already admitted (by call_id)
        self._ids = itertools.count(1)

    # --- client events ---------------------------------------------------------------

    def client(self, content: bytes, is_text: bool) -> ClientVerdict:
        data = _event(content, is_text, "client")
        kind = data["type"]
        if kind not in CLIENT_EVENTS:
            raise Refused(f"client event type {kind[:64]!r} is not one the governor knows; refused rather than "
                          "forwarded (an event it cannot read could make the upstream spend)")
        if kind in _CONTEXT_EVENTS:
            self.pending_bytes += len(content)
        if kind in ("session.update", "transcription_session.update"):
            session = data.get("session")
            if session is None:
                return ClientVerdict(kind, data)
            if type(session) is not dict:
                raise Refused(f"{kind}: 'session' must be an object")
            tools = _tools(session, kind)
            limit = _limit(session, kind)
            if limit is not None:
                self.session_limit = limit
            self._transcription(session)
            if isinstance(session.get("model"), str) and session["model"]:
                self.model = session["model"][:256]
            return ClientVerdict(kind, data, tools=tools)
        if kind == "response.create":
            response = data.get("response")
            if response is None:
                response = {}
            elif type(response) is not dict:
                raise Refused("response.create: 'response' must be an object")
            tools = _tools(response, kind)
            limit = _limit(response, kind) or self.session_limit or self.config.default_output_tokens
            step = ModelCall(model=self.model, expected_input_tokens=self.expected_input(),
                             expected_output_tokens=limit, tools_offered=withhold.flat(tools) if tools else (),
                             persona=self.persona, provider="openai")
            return ClientVerdict(kind, data, step=step, tools=tools)
        return ClientVerdict(kind, data)

    def expected_input(self) -> int:
        return self.context_tokens + estimate_tokens(self.pending_bytes, self.config.bytes_per_token)

    def admitted(self, verdict: ClientVerdict, ticket: Any) -> Response:
        """The client's response.create was admitted: it awaits its response.created. The
        event gets an event_id when it had none, so a server error about it names it."""
        assert verdict.step is not None
        event_id = verdict.data.get("event_id")
        if not isinstance(event_id, str) or not event_id:
            event_id = verdict.data["event_id"] = f"event_governor_{next(self._ids)}"
        response = Response(verdict.step, event_id=event_id[:MAX_EVENT_ID], ticket=ticket)
        self.pending.append(response)
        return response

    def server_started(self, response_id: str | None) -> ModelCall:
        """A response the server started without a response.create (server VAD): its step."""
        return ModelCall(model=self.model, expected_input_tokens=self.expected_input(),
                         expected_output_tokens=self.session_limit or self.config.default_output_tokens,
                         persona=self.persona, provider="openai")

    def track(self, response_id: str | None, step: ModelCall, ticket: Any) -> Response:
        response = Response(step, id=response_id, ticket=ticket)
        if response_id is not None:
            self.responses[response_id] = response
        return response

    # --- server events ---------------------------------------------------------------

    def server(self, content: bytes, is_text: bool) -> ServerVerdict:
        data = _event(content, is_text, "server")
        kind = data["type"]
        if kind in _OUTPUT_DELTAS:
            return self._delta(kind, data)
        if kind == "response.created":
            return self._created(data)
        if kind == "response.function_call_arguments.done":
            verdict = ServerVerdict(kind, _text(data.get("response_id")))
            self._call(data.get("call_id"), data.get("name"), data.get("arguments"), verdict.tool_calls)
            return verdict
        if kind == "response.output_item.done":
            verdict = ServerVerdict(kind, _text(data.get("response_id")))
            self._item(data.get("item"), verdict.tool_calls)
            return verdict
        if kind == "response.done":
            return self._done(data)
        if kind == "error":
            return self._error(data)
        if kind == "conversation.item.input_audio_transcription.completed":
            return self._transcribed(data)
        if kind in ("session.created", "session.updated", "transcription_session.updated"):
            session = as_dict(data.get("session"))
            limit = _limit(session, None)
            if limit is not None and not self.session_limit:
                self.session_limit = limit
            self._transcription(session)
        return ServerVerdict(kind)

    def _transcription(self, session: dict[str, Any]) -> None:
        """The input transcription model a session names (GA audio.input.transcription, beta
        input_audio_transcription)."""
        holder = as_dict(as_dict(as_dict(session.get("audio")).get("input")).get("transcription")) \
            or as_dict(session.get("input_audio_transcription"))
        model = holder.get("model")
        if isinstance(model, str) and model:
            self.transcription_model = model[:256]

    def _transcribed(self, data: dict[str, Any]) -> ServerVerdict:
        """The user's audio transcribed by the session's ASR model: a model call of its own,
        billed at that model's prices, admitted (counted, refused when the session may not
        act) and settled at once from its usage ("tokens"), at least the transcript's own
        count; usage by "duration" (whisper-1) or none: the transcript's count."""
        verdict = ServerVerdict("conversation.item.input_audio_transcription.completed")
        model = self.transcription_model
        verdict.admit = ModelCall(model=model, expected_input_tokens=0, expected_output_tokens=0,
                                  persona=self.persona, provider="openai")
        transcript = data.get("transcript")
        counted = count_text(transcript) if isinstance(transcript, str) else 0
        usage = as_dict(data.get("usage"))
        kind = usage.get("type")
        said = positive_int(usage.get("output_tokens")) if kind == "tokens" else None
        # billed by duration: no token figure to hold the count against (nothing recorded either way)
        verdict.usage = UsageReport(model=model, input_tokens=positive_int(usage.get("input_tokens")) if said is not None
                                    else 0, output_tokens=max(said or 0, counted), persona=self.persona, final=True,
                                    reported_output_tokens=said,
                                    counted_output_tokens=None if kind == "duration" else counted)
        return verdict

    def _delta(self, kind: str, data: dict[str, Any]) -> ServerVerdict:
        response_id = _text(data.get("response_id"))
        verdict = ServerVerdict(kind, response_id)
        response = self.responses.get(response_id) if response_id is not None else None
        delta = data.get("delta")
        if response is None or type(delta) is not str:
            return verdict
        response.counter.add(delta)
        # the running figure (the runtime may cut on it): bytes / bytes_per_token of the text relayed
        estimate = estimate_tokens(response.counter.nbytes, self.config.bytes_per_token)
        if estimate > response.step.expected_output_tokens and (
                response.reported is None or estimate > response.reported.output_tokens):
            # past what the call reserved: the running figure goes to the runtime (it may cut)
            response.reported = verdict.usage = UsageReport(
                model=response.step.model, input_tokens=response.step.expected_input_tokens,
                output_tokens=estimate, persona=self.persona, final=False)
        return verdict

    def _created(self, data: dict[str, Any]) -> ServerVerdict:
        response_id = _text(as_dict(data.get("response")).get("id"))
        verdict = ServerVerdict("response.created", response_id)
        if self.pending:
            response = self.pending.pop(0)
            response.id = response_id
            if response_id is not None:
                self.responses[response_id] = response
        else:
            verdict.admit = self.server_started(response_id)
        return verdict

    def _done(self, data: dict[str, Any]) -> ServerVerdict:
        body = as_dict(data.get("response"))
        response_id = _text(body.get("id"))
        verdict = ServerVerdict("response.done", response_id, done=True)
        for item in as_list(body.get("output")):
            self._item(item, verdict.tool_calls)
        response = self.responses.get(response_id) if response_id is not None else None
        if response is None:  # never announced by response.created: admitted now, then settled
            verdict.admit = self.server_started(response_id)
            step = verdict.admit
            counted = 0
        else:
            step = response.step
            counted = response.counter.tokens  # the governor's count of the text relayed (adapters.counting)
        usage = body.get("usage")
        if isinstance(usage, dict):
            details = as_dict(usage.get("input_token_details"))
            inputs, outputs = positive_int(usage.get("input_tokens")), positive_int(usage.get("output_tokens"))
            # the text relayed is a floor: audio is billed in more tokens than its transcript
            report = measured(UsageReport(model=self.model, input_tokens=inputs, output_tokens=outputs,
                                          cached_input_tokens=min(positive_int(details.get("cached_tokens")), inputs)),
                              counted, model=self.model, expected_input=step.expected_input_tokens,
                              persona=self.persona)
        else:  # no usage: what it reserved (or the count of the text relayed, if more), never nothing
            report = UsageReport(model=step.model, input_tokens=step.expected_input_tokens,
                                 output_tokens=max(step.expected_output_tokens, counted), persona=self.persona,
                                 final=True, reported_output_tokens=None, counted_output_tokens=counted)
        verdict.usage = report
        self.context_tokens = report.input_tokens + report.output_tokens
        self.pending_bytes = 0
        return verdict

    def finished(self, response_id: str | None) -> None:
        if response_id is not None:
            self.responses.pop(response_id, None)

    def _error(self, data: dict[str, Any]) -> ServerVerdict:
        verdict = ServerVerdict("error")
        event_id = _text(as_dict(data.get("error")).get("event_id"))
        if event_id is not None:
            for index, response in enumerate(self.pending):
                if response.event_id == event_id:
                    verdict.release = self.pending.pop(index)
                    break
        return verdict

    def _item(self, item: Any, out: list[ToolCall]) -> None:
        if type(item) is dict and item.get("type") == "function_call":
            self._call(item.get("call_id"), item.get("name"), item.get("arguments"), out)

    def _call(self, call_id: Any, name: Any, arguments: Any, out: list[ToolCall]) -> None:
        key = call_id if isinstance(call_id, str) and call_id else f"{name!r}:{arguments!r}"[:512]
        if key in self.calls_seen:
            return
        step = requested_tool_call(name, arguments, self.persona)
        if step is None:
            return
        self.calls_seen.add(key)
        out.append(step)

    def unfinished(self, response: Response) -> UsageReport:
        """The final usage of a response that never reached its response.done (the socket
        closed or was cut): what it reserved, or the text relayed if more, since what it
        consumed cannot be read."""
        step = response.step
        estimate = estimate_tokens(response.counter.nbytes, self.config.bytes_per_token)
        return UsageReport(model=step.model, input_tokens=step.expected_input_tokens,
                           output_tokens=max(step.expected_output_tokens, estimate), persona=self.persona, final=True)

    def outstanding(self) -> list[Response]:
        """Every admission still holding a ticket (the socket ends: released)."""
        held = self.pending + list(self.responses.values())
        self.pending, self.responses = [], {}
        return held


# --- bytes -------------------------------------------------------------------------------


def _event(content: bytes, is_text: bool, side: str) -> dict[str, Any]:
    if not is_text:
        raise Refused(f"a binary {side} message: the Realtime API speaks JSON text events")
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise Refused(f"a {side} event that is not valid JSON: {exc}") from None
    if type(data) is not dict or type(data.get("type")) is not str or not data["type"]:
        raise Refused(f"a {side} event that is not a JSON object with a string 'type'")
    return data


def _text(value: Any) -> str | None:
    return value[:MAX_EVENT_ID] if isinstance(value, str) and value else None


def _tools(holder: dict[str, Any], kind: str) -> tuple[withhold.Names, ...] | None:
    if holder.get("tools") is None:
        return None
    try:
        return withhold.read_tools(holder["tools"], "tools", withhold.openai_names)
    except BadRequest as exc:
        raise Refused(f"{kind}: {exc.message}") from None


def _limit(holder: dict[str, Any], kind: str | None) -> int | None:
    """The output limit an object names (an int, or "inf": the default); None when none.
    A limit of another type from the client is refused (it would be read as none)."""
    for name in _OUTPUT_LIMITS:
        if name in holder:
            value = holder[name]
            if value == "inf" or value is None:
                return 0
            if positive_int(value):
                return value
            if kind is not None:
                raise Refused(f"{kind}: '{name}' must be a positive integer or \"inf\"")
    return None


def error_event(message: str, governor: dict[str, Any], *, error_type: str, event_id: str | None = None) -> bytes:
    """A Realtime server `error` event carrying the governor's reason (what the openai SDK
    parses as RealtimeErrorEvent: event.error.message, event.error.code, ...)."""
    error: dict[str, Any] = {"type": error_type, "code": governor.get("cause"),
                             "message": message, "param": None, "event_id": event_id, "governor": governor}
    return orjson.dumps({"type": "error", "event_id": "event_governor_error", "error": error})


def encode(data: dict[str, Any]) -> bytes:
    return orjson.dumps(data)


__all__ = ["RealtimeConversation", "ClientVerdict", "ServerVerdict", "Response", "Refused", "CLIENT_EVENTS",
           "error_event", "encode"]
