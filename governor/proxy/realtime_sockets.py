"""The WebSocket addon: a Realtime socket governed event by event (docs/realtime.md).

The upgrade itself is an exchange like any other (the admission addon admitted its step);
when the upstream answers 101 this addon takes the socket over, in the `response` hook
(before the in-flight addon ends the upgrade's exchange and takes the FlowState off the
flow): a `Socket` in `flow.metadata[SOCKET_KEY]` holds the session, and the adapter's
`RealtimeConversation` reads each message. mitmproxy calls `websocket_message` for every
message before forwarding it and waits for the hook, so what the hook admits is admitted
before the upstream (or the client) sees it:

  client  response.create   a ModelCall admitted first (its tools withheld), else refused
          session.update    the tools it offers that the session may not use, withheld
          a halted session  any client message: the socket is cut
          unreadable        not forwarded: an `error` event tells the client, recorded
  server  response.created  a response the server started itself is admitted here
          deltas past the reservation: a running usage report (a refusal cuts)
          tool calls        ToolCall steps, held until admitted; a refusal cuts
          response.done     the final usage charged, the call's ticket released
          unreadable        the socket is cut

While the socket is open it is ticked (wall-clock charged, limits checked) every
tick_interval; a refusal cuts it.

A cut (governor.proxy.ws_transit): the client gets an `error` event carrying the governor's
reason, then a close frame (1008 for a refusal, 1011 when the governor failed, 1003 for a
message it does not read, 1009 for one too large); the upstream gets a close frame and its
connection is closed, so it stops generating. Whatever the socket still holds is released
at websocket_end.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Coroutine

from mitmproxy import http

from governor.adapters import withhold
from governor.adapters.realtime import MINT, RealtimeAdapter
from governor.adapters.refusals import describe
from governor.adapters.realtime_events import (ClientVerdict, RealtimeConversation, Refused, Response, ServerVerdict,
                                               encode, error_event)
from governor.policy.reasons import governor_object
from governor.policy.steps import Decision, Step, Tick
from governor.proxy import refusals, withheld, ws_transit
from governor.proxy.flow_state import STATE_KEY, FlowState
from governor.proxy.policy import ProxyPolicy
from governor.proxy.refusing import ACTION_HEADER, Refuser, governor_error_object
from governor.proxy.runtime_calls import RuntimeCalls
from governor.runtime.api import Admission
from governor.sessions.entries import halted_reason

log = logging.getLogger("governor.proxy")

SOCKET_KEY = "governor.socket"  # flow.metadata: the Socket of a governed Realtime WebSocket
POLICY_CLOSE = 1008  # RFC 6455: policy violation (a refusal)
UNSUPPORTED_CLOSE = 1003  # data the endpoint cannot accept (a message the governor does not read)
ERROR_CLOSE = 1011  # the governor failed (fail closed)


@dataclass(eq=False)
class Socket:
    """One governed Realtime socket."""

    session: str
    persona: str | None
    conversation: RealtimeConversation
    adapter: RealtimeAdapter
    cut: bool = False  # the governor ended it: nothing more is forwarded
    ticker: asyncio.Task | None = None  # its wall-clock ticks, while it is open


class RealtimeSockets:
    """The mitmproxy addon for governed Realtime WebSockets (`response`, `websocket_message`,
    `websocket_end`)."""

    def __init__(self, policy: ProxyPolicy, calls: RuntimeCalls, refuser: Refuser, *, proxyserver: Any = None,
                 metrics: Any = None, max_message_bytes: int = ws_transit.MAX_MESSAGE_BYTES) -> None:
        self.policy = policy  # tick_interval: an open socket's wall-clock ticks
        self.calls = calls
        self.runtime = calls.runtime
        self.refuser = refuser
        self.proxyserver = proxyserver  # mitmproxy's Proxyserver addon: cuts go through it
        self.metrics = metrics
        ws_transit.install(max_message_bytes)

    # --- mitmproxy hooks ---------------------------------------------------------------

    def response(self, flow: http.HTTPFlow) -> Coroutine[Any, Any, None] | None:
        """A governed Realtime upgrade answered 101: the socket is taken over. A minted key
        (allowed by the operator): recorded before the client gets it (a coroutine for
        mitmproxy to await; any other answer costs a dictionary lookup)."""
        state: FlowState | None = flow.metadata.get(STATE_KEY)
        flight = state.flight if state is not None else None
        if flight is None or type(flight.exchange.adapter) is not RealtimeAdapter:
            return None
        exchange = flight.exchange
        response = flow.response
        if flow.websocket is not None and response is not None and response.status_code == 101 \
                and ACTION_HEADER not in response.headers:  # (not a refusal put in place of the 101)
            self._take_over(flow, exchange)
        elif exchange.state.get("kind") == MINT and response is not None and response.status_code == 200 \
                and ACTION_HEADER not in response.headers:
            return self._minted(flow, exchange)
        return None

    def _take_over(self, flow: http.HTTPFlow, exchange: Any) -> None:
        adapter = exchange.adapter
        try:
            conversation = adapter.conversation(exchange)
        except Exception:  # fail closed: a socket the governor cannot follow is not opened
            log.exception("governor: internal error on the upgrade of %s", flow.request.url)
            flow.websocket = None
            self.refuser.fail_closed(flow, exchange.session, "internal error while governing the WebSocket")
            return
        socket = Socket(exchange.session, exchange.persona, conversation, adapter)
        flow.metadata[SOCKET_KEY] = socket
        if self.policy.tick_interval > 0:
            socket.ticker = self.calls.tasks.spawn(self._tick(flow, socket))

    async def _tick(self, flow: http.HTTPFlow, socket: Socket) -> None:
        """While the socket is open (the provider may answer at any moment: server VAD), a Tick
        every tick_interval: the runtime charges wall-clock and checks its limits; a refusal
        cuts the socket. Ticks of an HTTP exchange of the same session meanwhile charge
        nothing twice (each charges the time since the session's last)."""
        try:
            while not socket.cut:
                await asyncio.sleep(self.policy.tick_interval)
                if socket.cut:
                    return
                try:
                    with self.calls.tasks.recording:
                        admission = await self.runtime.admit(socket.session, Tick())
                    await self.calls.release(socket.session, admission.ticket)
                except Exception:
                    log.exception("governor: wall-clock check failed on a WebSocket of session %s", socket.session)
                    self._cut(flow, socket, governor_error_object(socket.session), ERROR_CLOSE,
                              error_type="governor_unavailable")
                    return
                if admission.decision.blocks:
                    self._refused(flow, socket, admission)
                    return
        except asyncio.CancelledError:
            pass

    async def _minted(self, flow: http.HTTPFlow, exchange: Any) -> None:
        """A key minted through the governor, recorded in its session before the client gets
        it; one that cannot be recorded is not delivered (the answer replaced: 503)."""
        recorder = getattr(self.runtime, "record_minted", None)
        detail = {"decision": "permit", "route": flow.request.path.split("?", 1)[0][:300],
                  "model": exchange.model[:128], "note": "what the minted key spends is not governed"}
        try:
            recorded = recorder is None or await recorder(exchange.session, detail)
        except Exception:
            log.exception("governor: the minting of a Realtime key could not be recorded in session %s",
                          exchange.session)
            recorded = False
        if not recorded:
            self.refuser.fail_closed(flow, exchange.session, "the minting of a Realtime key could not be recorded; "
                                                             "the key is not delivered")
            return
        log.info("governor: a Realtime ephemeral key was minted in session %s (%s): what it spends is not governed",
                 exchange.session, flow.request.pretty_url)

    async def websocket_message(self, flow: http.HTTPFlow) -> None:
        socket: Socket | None = flow.metadata.get(SOCKET_KEY)
        if socket is None or flow.websocket is None:
            return
        messages = flow.websocket.messages
        message = messages[-1]
        if message.injected:
            return
        try:
            if socket.cut:
                message.drop()
            elif ws_transit.oversize(flow, message.from_client, len(message.content)):
                message.drop()
                gov = {"cause": None, "action": "deny", "session": socket.session,
                       "reason": f"a WebSocket message of {len(message.content)} bytes is past the governor's limit"}
                self._cut(flow, socket, gov, 1009, error_type="invalid_request_error")
            elif message.from_client:
                await self._client(flow, socket, message)
            else:
                await self._server(flow, socket, message)
        except Exception:
            log.exception("governor: internal error on a WebSocket message of %s", flow.request.url)
            message.drop()
            gov = {"cause": "on_governor_error", "action": "deny", "fail_closed": True, "session": socket.session,
                   "reason": "internal error while governing the WebSocket"}
            self._cut(flow, socket, gov, ERROR_CLOSE, error_type="governor_unavailable")
        finally:
            # mitmproxy keeps every message of a socket; a Realtime one lives long and carries audio
            if len(messages) > 1:
                del messages[:-1]

    async def websocket_end(self, flow: http.HTTPFlow) -> None:
        socket: Socket | None = flow.metadata.pop(SOCKET_KEY, None)
        if socket is None:
            return
        socket.cut = True
        if socket.ticker is not None:
            socket.ticker.cancel()
        oversize = flow.metadata.pop(ws_transit.OVERSIZE_KEY, None)
        if oversize is not None:
            from_client, held = oversize
            side = "client" if from_client else "upstream"
            await self._record(flow, socket, refusals.EVENT_TOO_LARGE, 1009,
                               f"a {side} WebSocket message passed {held} bytes; the socket was closed")
        code = flow.websocket.close_code if flow.websocket is not None else None
        for response in socket.conversation.outstanding():
            # forwarded, never settled by a response.done: charged what it reserved (its usage never came)
            if response.ticket is None:
                continue
            try:
                await self.runtime.usage(socket.session, response.ticket, socket.conversation.unfinished(response))
            except Exception:
                log.exception("governor: the usage of an unfinished response could not be charged in session %s",
                              socket.session)
            await self.calls.release(socket.session, response.ticket, error=f"socket closed ({code})")

    # --- client events -----------------------------------------------------------------

    async def _client(self, flow: http.HTTPFlow, socket: Socket, message: Any) -> None:
        cause = self._halted(socket.session)
        if cause is not None:
            message.drop()
            gov = {"cause": cause, "action": "halt", "reason": halted_reason(cause), "session": socket.session}
            self._cut(flow, socket, gov, POLICY_CLOSE, error_type="governor_limit_reached")
            return
        try:
            verdict = socket.conversation.client(message.content, message.is_text)
        except Refused as exc:
            message.drop()
            await self._refuse_event(flow, socket, str(exc), close=None if message.is_text else UNSUPPORTED_CLOSE)
            return
        changed = False
        if verdict.step is not None:
            admission = await self.calls.admit(socket.session, verdict.step)
            if admission.decision.blocks:
                message.drop()
                await self.calls.release(socket.session, admission.ticket)
                self._refused(flow, socket, admission)
                return
            named = isinstance(verdict.data.get("event_id"), str) and bool(verdict.data["event_id"])
            socket.conversation.admitted(verdict, admission.ticket)
            changed = not named  # it was given an event_id, so a server error about it names it
            changed |= await self._withhold(flow, socket, verdict, admission.decision.allowed_tools, "response")
        elif verdict.tools:
            allowed = self.runtime.allowed_tools(socket.session, socket.persona)
            changed = await self._withhold(flow, socket, verdict, allowed, "session")
        if changed:
            message.content = encode(verdict.data)

    async def _withhold(self, flow: http.HTTPFlow, socket: Socket, verdict: ClientVerdict,
                        allowed: frozenset[str] | None, holder: str) -> bool:
        if allowed is None or not verdict.tools:
            return False
        target = verdict.data.get(holder) if holder == "response" else verdict.data.get("session")
        if not isinstance(target, dict):
            return False
        names = withhold.withhold_openai(target, allowed, verdict.tools, None)
        if names is None:
            return False
        if names:
            record = _Withheld(socket, names)
            await withheld.record(self.runtime, flow, record, "request")
        return True

    # --- server events -----------------------------------------------------------------

    async def _server(self, flow: http.HTTPFlow, socket: Socket, message: Any) -> None:
        try:
            verdict = socket.conversation.server(message.content, message.is_text)
        except Refused as exc:
            message.drop()
            reason = f"the upstream sent {exc}; the socket is closed (the governor does not deliver what it cannot read)"
            await self._record(flow, socket, refusals.UPSTREAM_EVENT_UNREADABLE, 502, reason)
            gov = {"cause": None, "action": "deny", "reason": reason, "session": socket.session}
            self._cut(flow, socket, gov, UNSUPPORTED_CLOSE, error_type="upstream_error")
            return
        if verdict.kind == "response.created" and verdict.admit is None:
            cause = self._halted(socket.session)
            if cause is not None:  # halted meanwhile: the response must not run
                message.drop()
                gov = {"cause": cause, "action": "halt", "reason": halted_reason(cause), "session": socket.session}
                self._cut(flow, socket, gov, POLICY_CLOSE, error_type="governor_limit_reached")
                return
        response = await self._admit_started(flow, socket, verdict, message)
        if response is False:
            return
        if verdict.release is not None:  # the server refused a response.create: its reservation goes
            await self.calls.release(socket.session, verdict.release.ticket, error="refused by the upstream")
        for step in verdict.tool_calls:
            if not await self._admit_step(flow, socket, step, message):
                return
        if verdict.usage is not None:
            target = response or socket.conversation.responses.get(verdict.response or "")
            if target is not None:
                if not await self._usage(flow, socket, target, verdict, message):
                    return
        if verdict.done and verdict.response is not None:
            socket.conversation.finished(verdict.response)

    async def _admit_started(self, flow: http.HTTPFlow, socket: Socket, verdict: ServerVerdict,
                             message: Any) -> Response | None | bool:
        """A response the server started on its own (server VAD; or one announced only by
        its response.done): admitted before its events are delivered. False: refused (cut)."""
        if verdict.admit is None:
            return None
        admission = await self.calls.admit(socket.session, verdict.admit)
        if admission.decision.blocks:
            message.drop()
            await self.calls.release(socket.session, admission.ticket)
            self._refused(flow, socket, admission)
            return False
        return socket.conversation.track(verdict.response, verdict.admit, admission.ticket)

    async def _admit_step(self, flow: http.HTTPFlow, socket: Socket, step: Step, message: Any) -> bool:
        admission = await self.calls.admit(socket.session, step)
        await self.calls.release(socket.session, admission.ticket)
        if admission.decision.blocks:
            message.drop()  # the call is not delivered: the socket ends here
            self._refused(flow, socket, admission)
            return False
        return True

    async def _usage(self, flow: http.HTTPFlow, socket: Socket, response: Response, verdict: ServerVerdict,
                     message: Any) -> bool:
        assert verdict.usage is not None
        decision = await self.runtime.usage(socket.session, response.ticket, verdict.usage)
        if verdict.usage.final:
            ticket, response.ticket = response.ticket, None
            await self.calls.release(socket.session, ticket)
        if decision.blocks:
            message.drop()
            self._cut(flow, socket, governor_object(decision, socket.session), POLICY_CLOSE,
                      error_type="governor_limit_reached")
            return False
        return True

    # --- refusals ----------------------------------------------------------------------

    def _halted(self, session: str) -> str | None:
        halted = getattr(self.runtime, "halted", None)
        return halted(session) if halted is not None else None

    def _refused(self, flow: http.HTTPFlow, socket: Socket, admission: Admission) -> None:
        decision: Decision = admission.decision
        gov = admission.governor_object or governor_object(decision, socket.session)
        error_type = "governor_limit_reached" if decision.cause in ("on_budget_exhausted", "on_iteration_limit") \
            else "governor_denied"
        self._cut(flow, socket, gov, POLICY_CLOSE, error_type=error_type)

    async def _refuse_event(self, flow: http.HTTPFlow, socket: Socket, reason: str, close: int | None) -> None:
        """A client message the governor does not forward: recorded, and the client told with
        an error event (the socket goes on, as the provider answers a bad event) or, for a
        message that is not text, cut."""
        await self._record(flow, socket, refusals.BAD_REQUEST, 400, reason)
        gov = {"cause": None, "action": "deny", "reason": reason, "session": socket.session}
        if close is not None:
            self._cut(flow, socket, gov, close, error_type="invalid_request_error")
            return
        ws_transit.send(self.proxyserver, flow, error_event(f"governor: {reason}", gov,
                                                            error_type="invalid_request_error"))

    async def _record(self, flow: http.HTTPFlow, socket: Socket, reason: str, status: int, message: str) -> None:
        await refusals.record(self.runtime, self.metrics, socket.session, reason,
                              refusals.detail(reason, status, flow.request, message))
        log.info("governor: refused on the WebSocket %s in session %s: %s", flow.request.pretty_url,
                 socket.session, message)

    def _cut(self, flow: http.HTTPFlow, socket: Socket, gov: dict[str, Any], code: int, *, error_type: str) -> None:
        """The socket ends: the client gets the error event, then both sides a close frame."""
        if socket.cut:
            return
        socket.cut = True
        text = describe(gov) if gov.get("cause") or "dimension" in gov else f"governor: {gov.get('reason')}"
        log.info("governor: cutting the WebSocket %s in session %s (%s)", flow.request.pretty_url, socket.session,
                 gov.get("cause") or gov.get("reason"))
        if self.metrics is not None:
            self.metrics.stream_cut(gov.get("cause"), socket.adapter.name)
        if not ws_transit.send(self.proxyserver, flow, error_event(text, dict(gov), error_type=error_type),
                               (code, text)):
            log.warning("governor: the WebSocket %s could not be cut through mitmproxy; killing it",
                        flow.request.pretty_url)
            if flow.killable:
                flow.kill()


@dataclass
class _Withheld:
    """What governor.proxy.withheld.record reads of an exchange, for a socket's event."""

    socket: Socket
    names: list[str]

    @property
    def state(self) -> dict[str, Any]:
        return {"withheld": self.names}

    @property
    def adapter(self) -> RealtimeAdapter:
        return self.socket.adapter

    @property
    def session(self) -> str:
        return self.socket.session

    @property
    def persona(self) -> str | None:
        return self.socket.persona


__all__ = ["RealtimeSockets", "Socket", "SOCKET_KEY"]
