"""The addon's side of the requests: a request's session and persona read from its ADL-*
headers (then stripped), its body decoded within bounds, the anti-swap check of a presented
passport, its adapter selected, each of its steps admitted (a pause held right here, or in
a hold: governor.proxy.held_steps), and the admitted request rewritten for the upstream.

`Requesting` is mixed into `governor.proxy.addon.Governor` (kept apart: addon.py was long
enough); the `request` hook there calls `_request`, the per-request path. `_admit`,
`_reviewed` and `_release` are how every side of the addon asks the runtime.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from mitmproxy import http

from governor.adapters import IGNORE, Refusal
from governor.adapters.base import Adapter, BadRequest, RawHeaders, RequestView
from governor.adapters.fitting import fit_request
from governor.personas import PersonaHeaderError, parse_persona
from governor.policy.steps import Decision, ModelCall, PassportPresented, Step
from governor.proxy import bodies, held_steps, holds, withheld
from governor.proxy.fields import (GOVERNOR_PREFIX, PASSPORT_FIELD, PERSONA_FIELD, SESSION_FIELD,
                                   rewrite_for_upstream, scan_headers)
from governor.proxy.held_steps import paused
from governor.proxy.presented import PresentedPassportError
from governor.proxy.refusing import plain_error
from governor.proxy.relay import METADATA_KEY, SESSION_KEY, Flight
from governor.runtime_api import Admission

log = logging.getLogger("governor.proxy")


class Requesting:
    """A request governed, and the runtime asked, for `governor.proxy.addon.Governor`."""

    async def _request(self, flow: http.HTTPFlow, admitted: list[Admission]) -> None:
        request = flow.request
        headers = request.headers
        fields = headers.fields
        governing, encoded = scan_headers(fields)
        book = self.sessions
        if book is not None:
            # the request acts only in a session its token names (a dict hit): a refusal
            # opens nothing and touches no session
            resolved = book.resolve(governing.get(SESSION_FIELD))
            if type(resolved) is not str:
                await self._refuse_session(flow, resolved)
                return
            session = resolved
        else:
            session = self._session(governing.get(SESSION_FIELD))
        flow.metadata[SESSION_KEY] = session
        persona = governing.get(PERSONA_FIELD) or None
        presented = governing.get(PASSPORT_FIELD)
        # the adapters see the headers as the agent sent them (A2A reads its delegation depth
        # from one): a view over the field tuple as it is now (rewriting headers replaces it)
        view = RequestView(
            request.method, request.host, request.path, RawHeaders(fields), request.raw_content,
            port=request.port, scheme=request.scheme,
        )
        # upstream: no ADL-* header of the agent's, and ours marking the request as forwarded
        forwarded = tuple([f for f in fields if f[0][:4].lower() != GOVERNOR_PREFIX]) if governing else fields
        if self.origin is not None:
            forwarded += ((self.origin.header.encode(), self.origin.marker.encode()),)
        if forwarded is not fields:
            headers.fields = forwarded
        if self.origin is not None and self.origin.refuses_connect(request.host, request.port):
            flow.response = plain_error(403, "the governor does not forward requests to its own control plane")
            return

        # a body that cannot be decoded within the bounds is refused like a shape selection
        # refuses (after the passport check below, which every request gets)
        selected = (encoded and self._decode_request(view, fields)) or self.registry.select(view)
        adapter = selected if isinstance(selected, Adapter) else None

        if presented is not None:
            try:
                digest, unreadable = await self.presented.digest(presented), None
            except PresentedPassportError as exc:
                if exc.busy:  # not the agent's fault: nothing presented was judged, the request is not served
                    self._fail_closed(flow, session, f"ADL-Passport header not read: {exc.reason}")
                    return
                digest, unreadable = exc.digest, exc.reason
            # an unreadable passport is still presented: its bytes' digest is recorded against the pin
            admission = await self._admit(session, PassportPresented(digest))
            await self._release(session, admission.ticket)
            if unreadable is not None:
                self._refuse_presented(flow, adapter, admission, session, unreadable)
                return
            if admission.decision.blocks:
                self._refuse(flow, adapter, admission, session)
                return

        if selected == IGNORE:
            return
        if isinstance(selected, Refusal):
            await self._refuse_unselected(flow, selected, session)
            return
        if adapter is None:
            self._unknown(flow, session)
            return
        activity = None
        if persona is not None:  # `name` or `name; instance=id` (governor.personas)
            try:
                activity = parse_persona(persona)
            except PersonaHeaderError as exc:
                await self._bad_request(flow, adapter, session, str(exc))
                return
            persona = activity.persona
        if len(view.content) > self.policy.max_body_bytes:
            await self._bad_request(flow, adapter, session,
                              f"request body of {len(view.content)} bytes exceeds the governor's limit of "
                              f"{self.policy.max_body_bytes} bytes", status=413)
            return
        try:
            exchange = adapter.open(view, session=session, persona=persona)
        except BadRequest as exc:
            await self._bad_request(flow, adapter, session, exc.message, status=exc.status)
            return
        held = self.holds.by_key and self.holds.find(session, lambda: holds.request_key(
            session, exchange.persona, request.method, request.host, request.port, request.path,
            holds.identity(exchange, view.content)))
        if held and held.shared and await self._serve_held(flow, held, adapter, exchange):
            return  # a retry of a request whose answer awaits (or awaited) a reviewer: no new step
        admitted_steps = await held_steps.admit_request(self, flow, adapter, exchange, activity, admitted, view.content,
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
                    await self._release(session, held_admission.ticket, error="refused")
                admitted.clear()
                self._fail_closed(flow, session, f"the {adapter.name} request cannot carry the reviewer's edited arguments")
                return
            if isinstance(step, ModelCall) and main is None:
                usage_ticket = admission.ticket
                main = admission.decision
        exchange.decision = main if main is not None else (admissions[first].decision if len(admissions) > first else None)

        fitted = exchange.decision is not None and fit_request(exchange, exchange.decision)  # output limit
        body = adapter.rewrite_request(exchange, exchange.decision) if exchange.decision is not None else None
        if fitted and body is None:
            body = orjson.dumps(exchange.body)
        if "withheld" in exchange.state:
            await withheld.record(self.runtime, flow, exchange, "request")
        if body is not None and encoded:
            request.content = body  # mitmproxy encodes it as the agent had
            body = None
        if body is not None or exchange.stream or exchange.upstream_headers:
            rewrite_for_upstream(request, body, exchange.stream, exchange.upstream_headers)
        flight = Flight(exchange, admissions, usage_ticket, body=view.content)
        flow.metadata[METADATA_KEY] = flight
        self._track(flow, flight)

    async def _admit(self, session: str, step: Step) -> Admission:
        """Admit one step; a PAUSE is held right here until the reviewer's answer (or the
        timeout's resolution) comes back."""
        admission = await self.runtime.admit(session, step)
        if paused(admission):
            admission = await self._reviewed(session, step, admission)
        return admission

    async def _reviewed(self, session: str, step: Step, admission: Admission, relay: Any = None) -> Admission:
        """A paused step held until the reviewer's answer (or the timeout's resolution); a
        held stream is kept alive meanwhile."""
        approval = admission.decision.approval
        assert approval is not None
        log.info("governor: holding %s in session %s for approval %s", type(step).__name__, session, approval.id)
        pinger = None
        if relay is not None:
            pinger = self._spawn(holds.keep_alive(relay, holds.keepalive_interval(relay.flow.request.headers)))
        try:
            answered = await self.runtime.await_approval(session, approval.id)
        finally:
            if pinger is not None:
                pinger.cancel()
        if admission.ticket is not None and admission.ticket is not answered.ticket:
            await self._release(session, admission.ticket)
        return answered

    async def _release(self, session: str, ticket: Any, error: str | None = None) -> None:
        if ticket is None:
            return
        try:
            await self.runtime.finish(session, ticket, error=error)
        except Exception:
            log.exception("governor: runtime.finish failed in session %s", session)

    def _decode_request(self, view: RequestView, fields: Any) -> Refusal | None:
        """Undo the body's Content-Encoding (bounded: governor.proxy.bodies) before anything
        reads it, selection included; a Refusal when it cannot be. Traffic a route ignores is
        left as it is."""
        if self.registry.routes and self.registry.routed(view) == IGNORE:
            return None
        policy = self.policy
        try:
            view.content = bodies.decode(view.content, bodies.encodings(fields),
                                         bodies.Bounds(policy.max_body_bytes, policy.max_decoded_ratio))
        except bodies.BodyError as exc:
            return Refusal(exc.status, f"request {exc.message}", self.registry.claimant(view))
        return None
