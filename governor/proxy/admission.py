"""The admission addon: a request's body decoded within bounds, the anti-swap check of a
presented passport, its adapter selected, each of its steps admitted (a pause held right
here, or in a hold: governor.proxy.held_steps), and the admitted request rewritten for the
upstream, its `Flight` put on the flow's state (governor.proxy.flow_state).

It runs after the session binding (governor.proxy.binding), which put the request as the
agent sent it on the flow's state; a request no adapter governs is marked unclaimed for the
unknown-traffic addon, and the in-flight addon (governor.proxy.in_flight) tracks what it
forwards.
"""

from __future__ import annotations

import dataclasses

import logging

import orjson
from mitmproxy import http

from governor.adapters import IGNORE, AdapterRegistry, Refusal
from governor.adapters.base import Adapter
from governor.adapters.fitting import fit_request
from governor.adapters.request_view import BadRequest, RequestView
from governor.runtime.personas import PersonaHeaderError, parse_persona
from governor.policy.steps import Decision, ModelCall, PassportPresented
from governor.proxy import bodies, holds, withheld
from governor.proxy.lineage import DELEGATION_HEADER, Lineage
from governor.proxy.fields import rewrite_for_upstream, utf8_charset
from governor.proxy.flow_state import STATE_KEY, Flight, FlowState
from governor.proxy.held_steps import HeldSteps
from governor.proxy.policy import ProxyPolicy
from governor.proxy.presented import PresentedPassportError, PresentedPassports
from governor.proxy.refusing import Refuser
from governor.proxy.runtime_calls import RuntimeCalls
from governor.runtime.api import Admission as StepAdmission

log = logging.getLogger("governor.proxy")


class Admission:
    """The mitmproxy addon that admits each governed request's steps (the `request` hook)."""

    def __init__(self, registry: AdapterRegistry, policy: ProxyPolicy, calls: RuntimeCalls, held_steps: HeldSteps,
                 holds_: holds.Holds, refuser: Refuser, lineage: Lineage | None = None) -> None:
        self.lineage = lineage  # the token a delegated call carries (governor.proxy.lineage)
        self.registry = registry
        self.policy = policy
        self.calls = calls
        self.held_steps = held_steps
        self.holds = holds_  # steps held for a reviewer
        self.refuser = refuser
        self.presented = PresentedPassports()  # ADL-Passport headers, read off the event loop

    async def request(self, flow: http.HTTPFlow) -> None:
        state: FlowState | None = flow.metadata.get(STATE_KEY)
        if state is None or state.unclaimed or flow.response is not None:
            return  # not the governor's to admit, or answered by the session binding
        admitted: list[StepAdmission] = []  # released if governing the request fails half-way
        try:
            await self._admit(flow, state, admitted)
        except Exception:  # fail closed: never forward what could not be governed
            log.exception("governor: internal error on %s", flow.request.url)
            session = state.session
            state.flight = None
            for admission in admitted:
                await self.calls.release(session, admission.ticket, error="governor error")
            self.refuser.fail_closed(flow, session, "internal error while governing the request")

    def done(self) -> None:
        self.presented.close()

    async def _admit(self, flow: http.HTTPFlow, state: FlowState, admitted: list[StepAdmission]) -> None:
        request = flow.request
        session = state.session
        view = state.view
        assert view is not None
        persona = state.persona
        presented = state.presented
        encoded = state.encoded

        # a body that cannot be decoded within the bounds is refused like a shape selection
        # refuses (after the passport check below, which every request gets)
        selected = (encoded and self._decode_request(view, state.agent_fields)) or self.registry.select(view)
        adapter = selected if isinstance(selected, Adapter) else None

        if presented is not None:
            try:
                digest, unreadable = await self.presented.digest(presented), None
            except PresentedPassportError as exc:
                if exc.busy:  # not the agent's fault: nothing presented was judged, the request is not served
                    self.refuser.fail_closed(flow, session, f"ADL-Passport header not read: {exc.reason}")
                    return
                digest, unreadable = exc.digest, exc.reason
            # an unreadable passport is still presented: its bytes' digest is recorded against the pin
            admission = await self.calls.admit(session, PassportPresented(digest))
            await self.calls.release(session, admission.ticket)
            if unreadable is not None:
                self.refuser.refuse_presented(flow, adapter, admission, session, unreadable)
                return
            if admission.decision.blocks:
                self.refuser.refuse(flow, adapter, admission, session)
                return

        if isinstance(selected, Refusal):
            await self.refuser.refuse_unselected(flow, selected, session)
            return
        if adapter is None:
            # the unknown-traffic addon's (governor.proxy.unknown): allowed by the operator, or not
            state.unclaimed = True
            state.allowed = selected == IGNORE
            return
        activity = None
        if state.identity_refused is not None:  # an ADL-Persona header this governor does not read
            await self.refuser.bad_request(flow, adapter, session, state.identity_refused)
            return
        if persona is not None:  # `name` or `name; instance=id` (governor.runtime.personas)
            try:
                activity = parse_persona(persona)
            except PersonaHeaderError as exc:
                await self.refuser.bad_request(flow, adapter, session, str(exc))
                return
            if state.persona_host is not None:  # a child session's persona counts in its parent (max_parallel)
                activity = dataclasses.replace(activity, host=state.persona_host)
            persona = activity.persona
        if len(view.content) > self.policy.max_body_bytes:
            await self.refuser.bad_request(flow, adapter, session,
                                           f"request body of {len(view.content)} bytes exceeds the governor's limit of "
                                           f"{self.policy.max_body_bytes} bytes", status=413)
            return
        try:
            exchange = adapter.open(view, session=session, persona=persona)
        except BadRequest as exc:
            await self.refuser.bad_request(flow, adapter, session, exc.message, status=exc.status)
            return
        held = self.holds.by_key and self.holds.find(session, lambda: holds.request_key(
            session, exchange.persona, request.method, request.host, request.port, request.path,
            holds.identity(exchange, view.content)))
        if held and held.shared and await self.held_steps.serve(flow, held, adapter, exchange):
            return  # a retry of a request whose answer awaits (or awaited) a reviewer: no new step
        admitted_steps = await self.held_steps.admit_request(flow, adapter, exchange, activity, admitted, view.content,
                                                             held if held and not held.shared else None)
        if admitted_steps is None:
            return  # answered: refused, or held for a reviewer past this connection's patience
        steps, taken = admitted_steps
        admissions = taken.admissions
        first = taken.first
        usage_ticket = None
        main: Decision | None = None
        for step, admission in zip(steps, admissions[first:]):
            if admission.edited_arguments is not None and not adapter.edit_request(exchange, admission.edited_arguments):
                for held_admission in admissions:  # never send upstream what the reviewer did not approve
                    await self.calls.release(session, held_admission.ticket, error="refused")
                admitted.clear()
                self.refuser.fail_closed(
                    flow, session, f"the {adapter.name} request cannot carry the reviewer's edited arguments")
                return
            if isinstance(step, ModelCall) and main is None:
                usage_ticket = admission.ticket
                main = admission.decision
        exchange.decision = main if main is not None else (admissions[first].decision if len(admissions) > first else None)

        if self.lineage is not None and "delegation_depth" in exchange.state:  # an admitted A2A delegation
            if (token := self.lineage.token_for(session)) is not None:
                exchange.upstream_headers[DELEGATION_HEADER] = token
        fitted = exchange.decision is not None and fit_request(exchange, exchange.decision)  # output limit
        body = adapter.rewrite_request(exchange, exchange.decision) if exchange.decision is not None else None
        if fitted and body is None:
            body = orjson.dumps(exchange.body)
        if "withheld" in exchange.state:
            await withheld.record(self.calls.runtime, flow, exchange, "request")
        if body is not None and view.encoding is not None:
            # the agent's body was UTF-16/32 or had a BOM (RequestView reads it as Python's json
            # does); the rewritten one is orjson's UTF-8, and a charset must not say otherwise
            content_type = view.headers.get("content-type")
            if content_type and "charset" in content_type.lower():
                exchange.upstream_headers["content-type"] = utf8_charset(content_type)
        if body is not None and encoded:
            request.content = body  # mitmproxy encodes it as the agent had
            body = None
        if body is not None or exchange.stream or exchange.upstream_headers:
            rewrite_for_upstream(request, body, exchange.stream, exchange.upstream_headers)
        flight = Flight(exchange, admissions, usage_ticket, body=view.content)
        state.flight = flight  # tracked by the in-flight addon (governor.proxy.in_flight)

    def _decode_request(self, view: RequestView, fields: tuple[tuple[bytes, bytes], ...]) -> Refusal | None:
        """Undo the body's Content-Encoding (bounded: governor.proxy.bodies) before anything
        reads it, selection included (allowed traffic too: an allow-list entry never lets a
        model call through); a Refusal when it cannot be."""
        policy = self.policy
        try:
            view.content = bodies.decode(view.content, bodies.encodings(fields),
                                         bodies.Bounds(policy.max_body_bytes, policy.max_decoded_ratio))
        except bodies.BodyError as exc:
            return Refusal(exc.status, f"request {exc.message}", self.registry.claimant(view))
        return None
