"""The answers' addon: response headers (a stream the adapter understands is relayed event
by event by a StreamRelay, anything else governed is buffered), a plain answer read (its
usage charged, the tool calls it asks for admitted, a pause holding it for a reviewer), a
stream's events as its relay hands them over (running usage checked, streamed tool calls
admitted in order), and a stream's end; an upstream failure ends the relay.

It runs before the in-flight addon (governor.proxy.in_flight), which ends the exchange once
this one has read its answer; refusals in flight go through the Enforcer
(governor.proxy.enforcing).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from mitmproxy import http

from governor.adapters import sse, withhold
from governor.adapters.base import UNREAD_ANSWER, UnreadableAnswer, observe_stream_whole
from governor.adapters.fitting import FITTED_HEADER, FITTED_STATE
from governor.policy.reasons import governor_object
from governor.policy.steps import Step, ToolCall, ToolError, UsageReport
from governor.proxy import bodies, holds, withheld
from governor.proxy.enforcing import Enforcer
from governor.proxy.exchanges import Exchanges, upstream_error
from governor.proxy.fields import decoded_body, frame_relayed_stream, has_content_encoding
from governor.proxy.flow_state import STATE_KEY, Flight, FlowState, live_flight
from governor.proxy.held_steps import HeldSteps
from governor.proxy.policy import ProxyPolicy
from governor.proxy.refusing import ACTION_HEADER, Refuser, as_response, governor_error, governor_error_object
from governor.proxy.relay import StreamRelay
from governor.proxy.runtime_calls import RuntimeCalls, paused
from governor.runtime.api import Admission

log = logging.getLogger("governor.proxy")


class Answers:
    """The mitmproxy addon that governs answers (`responseheaders`, `response`, `error`)."""

    def __init__(self, policy: ProxyPolicy, calls: RuntimeCalls, held_steps: HeldSteps, holds_: holds.Holds,
                 refuser: Refuser, enforcer: Enforcer, exchanges: Exchanges, *, metrics: Any = None) -> None:
        self.policy = policy
        self.calls = calls
        self.runtime = calls.runtime
        self.held_steps = held_steps
        self.holds = holds_
        self.refuser = refuser
        self.enforcer = enforcer
        self.exchanges = exchanges
        self.metrics = metrics  # governor.runtime.metrics.Metrics, optional
        self.recording = calls.tasks.recording
        # whether a stream's running usage is within what its call reserved (runtimes without
        # it: every chunk is forwarded and checked after, as before)
        self._covers = getattr(calls.runtime, "covers", None)

    # --- mitmproxy hooks ---------------------------------------------------------------

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state: FlowState | None = flow.metadata.get(STATE_KEY)
        flight = state.flight if state is not None else None
        response = flow.response
        assert response is not None
        if flight is None:
            response.stream = True  # ungoverned traffic: relay as it comes, never buffer
            return
        flight.last_activity = time.monotonic()
        if (fitted := flight.exchange.state.get(FITTED_STATE)) is not None:
            response.headers[FITTED_HEADER] = str(fitted)  # the client learns the limit it was served under
        if self.metrics is not None:
            self.metrics.upstream(flight.exchange.adapter.name, time.monotonic() - flight.started, response.status_code)
        exchange = flight.exchange
        if exchange.state.get("withheld"):  # the client learns which offered tools the model never saw
            response.headers[withhold.HEADER] = withhold.rendered(exchange.state["withheld"])
        try:
            watcher = exchange.adapter.stream_watcher(exchange, response.status_code, response.headers)
        except Exception:
            log.exception("governor: adapter %s failed on response headers", exchange.adapter.name)
            watcher = None
        if watcher is not None and has_content_encoding(response.headers.fields):
            watcher = None  # compressed although we asked for identity: buffered, read whole once decoded
        if watcher is None and UNREAD_ANSWER in exchange.state:
            response.stream = True  # nothing in it the governor reads (a file's content): relayed as it comes
        elif watcher is not None:
            flight.relay = StreamRelay(flow, flight, watcher, self.stream_events, self.enforcer,
                                       self.policy.max_held_stream_bytes)
            response.stream = flight.relay
            frame_relayed_stream(flow.request, response)  # a cut body is shorter than the upstream's
            if flight.refusal is not None:  # decided while we waited for the headers
                self.enforcer.cut(flow, flight, *flight.refusal)

    async def response(self, flow: http.HTTPFlow) -> None:
        flight = live_flight(flow)
        if flight is None:
            return
        try:
            if flight.relay is not None:
                await self._stream_finished(flow, flight)
            else:
                await self._plain_response(flow, flight)
        except Exception:
            log.exception("governor: internal error on the response of %s", flow.request.url)
            if flight.relay is None:
                session = flight.exchange.session
                try:
                    self.refuser.replace(flow, flight, flight.exchange.adapter, governor_error(), session,
                                         governor_error_object(session), flight.exchange)
                except Exception:  # never out of the hook: the in-flight addon after this one ends the exchange
                    log.exception("governor: the refusal of the response of %s could not be built", flow.request.url)
        except asyncio.CancelledError:  # mitmproxy calls no addon after a cancelled one: the exchange ends here
            await self.exchanges.end(flow, flight, upstream_error(flow, flight), stream_over=True)
            raise
        # the exchange ends in the in-flight addon's response hook (governor.proxy.in_flight)

    async def error(self, flow: http.HTTPFlow) -> None:
        flight = live_flight(flow)
        if flight is None:
            return
        try:
            if flight.relay is not None and flight.usage_ticket is not None:
                relay = flight.relay
                if not relay.ended:
                    relay.end()
                await self._stream_finished(flow, flight)
        except Exception:
            log.exception("governor: internal error while closing %s", flow.request.url)
        except asyncio.CancelledError:  # mitmproxy calls no addon after a cancelled one: the exchange ends here
            await self.exchanges.end(flow, flight, flow.error.msg if flow.error else "exchange failed",
                                     stream_over=False)
            raise
        # the exchange ends in the in-flight addon's error hook (governor.proxy.in_flight)

    # --- plain answers -----------------------------------------------------------------

    async def _plain_response(self, flow: http.HTTPFlow, flight: Flight) -> None:
        response = flow.response
        assert response is not None
        exchange = flight.exchange
        adapter = exchange.adapter
        session = exchange.session
        if flight.refusal is not None:
            if ACTION_HEADER not in response.headers:  # the upstream answered before our refusal landed
                decision, gov = flight.refusal
                self.refuser.replace(flow, flight, adapter, decision, session, gov, exchange)
            return
        if response.stream is True:  # relayed unread (UNREAD_ANSWER): nothing to observe
            return
        try:
            body = decoded_body(response, bodies.Bounds(self.policy.max_response_bytes, self.policy.max_decoded_ratio))
            observation = None
            if body is not (response.raw_content or b""):  # decoded: a stream that came so is read whole
                observation = observe_stream_whole(adapter, exchange, response.status_code, response.headers, body)
            if observation is None:
                observation = adapter.observe_response(exchange, response.status_code, response.headers, body)
        except (bodies.BodyError, sse.EventTooLarge, UnreadableAnswer) as exc:
            await self._unreadable_response(flow, flight, getattr(exc, "message", str(exc)))
            return
        if observation.usage is not None and flight.usage_ticket is not None:
            decision = await self.runtime.usage(session, flight.usage_ticket, observation.usage)
            if decision.blocks:
                self.refuser.replace(flow, flight, adapter, decision, session, exchange=exchange)
                return
        await self._admit_observed(flow, flight, observation)

    async def _admit_observed(self, flow: http.HTTPFlow, flight: Flight, observation: Any, start: int = 0,
                              detach: bool = True) -> None:
        """The tool calls a plain answer asks for, admitted in order from `start`; a refusal
        replaces the answer. The first that pauses holds the answer for its reviewer
        (`_hold_answer`); the rest are then admitted by that review, on the hold's shadow
        flow (`detach` False)."""
        exchange = flight.exchange
        session = exchange.session
        steps = observation.steps
        for index in range(start, len(steps)):
            step = steps[index]
            admission = await self.runtime.admit(session, step)
            if paused(admission):
                if detach:
                    await self._hold_answer(flow, flight, observation, index, admission)
                    return
                admission = await self.calls.reviewed(session, step, admission)
            await self.calls.release(session, admission.ticket)
            if admission.decision.blocks:
                # on a shadow flow (not detach) the exchange's own answer is not the one replaced
                self.refuser.replace_blocked(flow, flight if detach else None, exchange, admission)
                return
        if observation.replace_body is not None and flow.response is not None:
            flow.response.content = observation.replace_body
            if exchange.state.get("withheld"):  # an MCP tools/list answer, filtered
                flow.response.headers[withhold.HEADER] = withhold.rendered(exchange.state["withheld"])
                await withheld.record(self.runtime, flow, exchange, "answer")

    async def _hold_answer(self, flow: http.HTTPFlow, flight: Flight, observation: Any, index: int,
                           admission: Admission) -> None:
        """The answer waits for a reviewer in a Hold (governor.proxy.holds): the identical
        request meanwhile attaches to it, and this connection is answered when the review
        is (or 429 review_pending when it outlasts the client's patience)."""
        exchange = flight.exchange
        session = exchange.session
        request = flow.request
        shadow = holds.shadow_of(flow)

        async def review() -> http.Response:
            step = observation.steps[index]
            answered = await self.calls.reviewed(session, step, admission)
            await self.calls.release(session, answered.ticket)
            if answered.decision.blocks:
                self.refuser.replace_blocked(shadow, None, exchange, answered)
            else:
                await self._admit_observed(shadow, flight, observation, index + 1, detach=False)
            assert shadow.response is not None
            return shadow.response

        approval = admission.decision.approval
        assert approval is not None
        key = holds.request_key(session, exchange.persona, request.method, request.host, request.port,
                                request.path, flight.body)
        held = self.holds.start(key, session, approval.id, admission.governor_object.get("expires_at"), review())
        await self.held_steps.serve(flow, held, exchange.adapter, exchange)

    async def _held_stream(self, flow: http.HTTPFlow, flight: Flight, relay: StreamRelay, step: Step,
                           admission: Admission) -> Admission:
        """A streamed answer held for a reviewer stays on its connection (kept alive); the
        identical request meanwhile is answered 429 review_pending, not sent to the model
        (a stream cannot be replayed to it: once the review is over it is a new step)."""
        exchange = flight.exchange
        request = flow.request
        approval = admission.decision.approval
        assert approval is not None
        key = holds.request_key(exchange.session, exchange.persona, request.method, request.host, request.port,
                                request.path, flight.body)
        held = self.holds.start(key, exchange.session, approval.id, admission.governor_object.get("expires_at"),
                                self.calls.reviewed(exchange.session, step, admission, relay))
        return await asyncio.shield(held.task)

    async def _unreadable_response(self, flow: http.HTTPFlow, flight: Flight, why: str) -> None:
        """An answer the governor cannot read within its bounds (a decompression bomb, an
        encoding it does not know, corrupt bytes): fail closed. The agent gets a 502, and a
        model call is charged what it reserved, since what it consumed cannot be read."""
        exchange = flight.exchange
        state = exchange.state
        if flight.usage_ticket is not None and "expected_input" in state:
            report = UsageReport(model=exchange.model, input_tokens=state["expected_input"],
                                 output_tokens=state["expected_output"], persona=exchange.persona, final=True)
            await self.runtime.usage(exchange.session, flight.usage_ticket, report)
        reason = f"the upstream's answer was refused: {why}"
        gov = {"cause": None, "action": "deny", "reason": reason, "session": exchange.session}
        flow.response = as_response(exchange.adapter.error_response(502, f"governor: {reason}", gov, exchange), "deny")
        log.warning("governor: %s (%s)", reason, flow.request.pretty_url)

    async def _stream_finished(self, flow: http.HTTPFlow, flight: Flight) -> None:
        relay = flight.relay
        assert relay is not None
        final: UsageReport | None = None
        for event in relay.final_events:
            if isinstance(event, UsageReport):
                final = event
            else:
                relay.pending_steps.append(event)
        relay.final_events = []
        self._admit_stream_steps_soon(flow, flight, relay)
        if final is not None and flight.usage_ticket is not None:
            await self.runtime.usage(flight.exchange.session, flight.usage_ticket, final)

    # --- streams -----------------------------------------------------------------------

    def stream_events(self, relay: StreamRelay, events: list[Any]) -> None:
        """The relay's `on_events`: called synchronously with what its watcher saw in a chunk."""
        flight = relay.flight
        for event in events:
            if isinstance(event, UsageReport):  # past the admission (watchers report only those)
                relay.latest_usage = event
                if not relay.over and self._covers is not None and flight.usage_ticket is not None \
                        and not self._covers(flight.usage_ticket, event):
                    relay.over = True  # past what the call holds: kept back until the reservation grew
                    relay.hold()
            elif isinstance(event, (ToolCall, ToolError)):
                relay.pending_steps.append(event)
                if isinstance(event, ToolCall) and not relay.ended:
                    relay.held_steps.add(id(event))
                    relay.hold()
        if (relay.latest_usage is not relay.checked_usage and not relay.checking
                and flight.usage_ticket is not None):
            relay.checking = True
            self.calls.tasks.spawn(self._check_usage(relay.flow, flight, relay))
        self._admit_stream_steps_soon(relay.flow, flight, relay)

    async def _check_usage(self, flow: http.HTTPFlow, flight: Flight, relay: StreamRelay) -> None:
        session = flight.exchange.session
        try:
            while (relay.latest_usage is not relay.checked_usage and not relay.ended
                   and relay.terminal is None):
                report = relay.checked_usage = relay.latest_usage
                assert report is not None
                with self.recording:
                    decision = await self.runtime.usage(session, flight.usage_ticket, report)
                if decision.blocks:
                    self.enforcer.enforce(flow, flight, decision, governor_object(decision, session))
                    return
        except Exception:
            log.exception("governor: usage check failed in session %s; cutting the stream", session)
            self.enforcer.enforce(flow, flight, governor_error(), governor_error_object(session))
        finally:
            relay.checking = False
            if relay.over and relay.terminal is None and relay.latest_usage is relay.checked_usage:
                relay.over = False  # every report so far permitted (its reservation grown): release
                relay.unhold()

    def _admit_stream_steps_soon(self, flow: http.HTTPFlow, flight: Flight, relay: StreamRelay) -> None:
        if relay.pending_steps and not relay.admitting:
            relay.admitting = True
            self.calls.tasks.spawn(self._admit_stream_steps(flow, flight, relay))

    async def _admit_stream_steps(self, flow: http.HTTPFlow, flight: Flight, relay: StreamRelay) -> None:
        """Tool calls the model asks for in a stream, admitted in order. From the chunk that
        completes a tool call, output (and the upstream's end) is kept back until the call
        is admitted (a pause holds it for the reviewer); a refusal cuts the stream."""
        session = flight.exchange.session
        try:
            while relay.pending_steps:
                step = relay.pending_steps.pop(0)
                with self.recording:
                    admission = await self.runtime.admit(session, step)
                if paused(admission):
                    admission = await self._held_stream(flow, flight, relay, step, admission)
                await self.calls.release(session, admission.ticket)
                held = id(step) in relay.held_steps
                relay.held_steps.discard(id(step))
                if admission.decision.blocks:
                    decision = admission.decision
                    gov = admission.governor_object or governor_object(decision, session)
                    self.enforcer.enforce(flow, flight, decision, gov)
                elif held:
                    relay.unhold()
        except Exception:
            log.exception("governor: admitting a streamed tool call failed in session %s", session)
            self.enforcer.enforce(flow, flight, governor_error(), governor_error_object(session))
        finally:
            relay.admitting = False
