"""The enforcement point: the mitmproxy addon that governs every request the agent sends.

Thin by design: adapters turn a flow into steps and decisions back into bytes,
the runtime decides; this addon only sequences them over mitmproxy's hooks:

  request          session/persona from ADL-* headers (stripped), anti-swap check,
                   adapter selection, admit each step (a PAUSE holds the request
                   here until a reviewer answers), refuse in the provider's format
                   or rewrite and forward.
  responseheaders  a stream the adapter understands is relayed event by event
                   (StreamRelay), anything else governed is buffered.
  response         plain answers: usage, tool calls the model asks for, finish;
                   streams: final usage and release.
  error            the exchange failed: release what it holds.

While a session has exchanges in flight, one ticker per session admits Tick steps
(wall-clock limits), and one watchdog pass a second enforces the upstream timeout of
every exchange (no headers, or a stream gone silent). Their refusals, and those of
usage checks on a stream, are applied to the flow in flight by `transit`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson
from mitmproxy import ctx, http

from governor.adapters import IGNORE, AdapterRegistry, Refusal
from governor.adapters import sse, withhold
from governor.adapters.fitting import FITTED_HEADER, FITTED_STATE, fit_request
from governor.adapters.base import (
    Adapter,
    BadRequest,
    Exchange,
    RawHeaders,
    Reply,
    RequestView,
    StreamWatcher,
    describe,
    governor_object,
    observe_stream_whole,
    status_for,
)
from governor.policy.steps import (
    Action,
    Decision,
    ModelCall,
    PassportPresented,
    Step,
    Tick,
    ToolCall,
    ToolError,
    UsageReport,
)
from governor.personas import PersonaHeaderError, parse_persona
from governor.proxy import bodies, held_steps, holds, refusals, transit
from governor.proxy.fields import (  # noqa: F401 (the header names, imported from here too)
    GOVERNOR_HEADER_PREFIX, GOVERNOR_PREFIX, PASSPORT_FIELD, PASSPORT_HEADER, PERSONA_FIELD, PERSONA_HEADER,
    SESSION_FIELD, SESSION_HEADER, decoded_body, has_content_encoding, log_withheld, rewrite_for_upstream,
    scan_headers,
)
from governor.proxy.held_steps import paused
from governor.proxy.in_flight import InFlight
from governor.proxy.responding import Responding
from governor.proxy.relay import METADATA_KEY, SESSION_KEY, Flight, StreamRelay
from governor.proxy.refusing import (  # noqa: F401 (ACTION_HEADER, REPLACED_KEY: imported from here too)
    ACTION_HEADER, REPLACED_KEY, Refusing, as_raw, as_response, governor_error, governor_error_object, plain_error,
)
from governor.proxy.presented import PresentedPassportError, PresentedPassports, presented_digest  # noqa: F401
from governor.runtime_api import Admission, RuntimeAPI
from governor.sessions import halted_reason

log = logging.getLogger("governor.proxy")


@dataclass(frozen=True, slots=True)
class ProxyPolicy:
    """How the enforcement point behaves (the `governor run` options)."""

    default_session: str | None = None  # None: the runtime's (one per process), else one generated here
    unknown_traffic: str = "forward"  # "forward" (logged and counted) | "deny"
    upstream_timeout: float = 300.0  # seconds without response headers, or between stream chunks
    tick_interval: float = 1.0  # wall-clock Tick steps while an exchange is in flight (0: never)
    max_body_bytes: int = 64 * 1024 * 1024  # governed request bodies larger than this (decoded): 413
    max_response_bytes: int = 256 * 1024 * 1024  # compressed answers the governor reads, decoded: 502 past it
    max_decoded_ratio: float = bodies.DEFAULT_RATIO  # decoded / compressed size, past 1 MiB decoded
    max_held_stream_bytes: int = 1024 * 1024  # a stream's output kept back during an admission: cut past it
    review_hold: float = holds.DEFAULT_HOLD_SEC  # a connection held for a reviewer, at most (then 429)
    review_retry_after: float = holds.DEFAULT_RETRY_AFTER_SEC  # the Retry-After of that 429


class Governor(Responding, InFlight, Refusing):
    """The mitmproxy addon. One instance per proxy; all per-flow state lives in flow.metadata."""

    def __init__(
        self,
        runtime: RuntimeAPI,
        registry: AdapterRegistry,
        policy: ProxyPolicy,
        *,
        metrics: Any = None,
        origin: Any = None,
        sessions: Any = None,
    ) -> None:
        self.runtime = runtime
        self.sessions = sessions  # governor.sessions.SessionBook: which session a request may act in
        self.registry = registry
        self.policy = policy
        self.metrics = metrics  # governor.metrics.Metrics, optional
        self.origin = origin  # governor.control.origin.ProxyOrigin, optional
        self.unknown_seen: dict[str, int] = {}  # host -> requests forwarded ungoverned
        self.tasks: set[asyncio.Task] = set()
        self.proxyserver: Any = None  # this master's Proxyserver addon (transit needs its connections)
        self._own_session = f"session-{uuid.uuid4().hex[:12]}"
        self.in_flight: dict[str, dict[Flight, http.HTTPFlow]] = {}  # session -> exchanges in flight
        self.tickers: dict[str, asyncio.Task] = {}  # session -> its wall-clock ticker
        self.watchdog: asyncio.Task | None = None  # upstream timeouts, while anything is in flight
        # whether a stream's running usage is within what its call reserved (runtimes without
        # it: every chunk is forwarded and checked after, as before)
        self._covers = getattr(runtime, "covers", None)
        self.presented = PresentedPassports()  # ADL-Passport headers, read off the event loop
        self.holds = holds.Holds(policy.review_hold, policy.review_retry_after,  # steps held for a reviewer
                                 on_count=metrics.review_hold if metrics is not None else None)

    def session_of(self, headers: Any) -> str:
        """ADL-Session names the session; without it: the configured default, else the
        runtime's default session (one per process), else one of our own. Without a
        session book only (with one, `_request` asks the book)."""
        return self._session(headers.get(SESSION_HEADER))

    def _session(self, named: str | None) -> str:
        return (named or self.policy.default_session
                or getattr(self.runtime, "default_session", None) or self._own_session)

    def load(self, loader: Any) -> None:
        # ctx.master is the master adding us right now; remember its proxyserver rather than
        # reading the process-global ctx later.
        self.proxyserver = ctx.master.addons.get("proxyserver")

    # --- mitmproxy hooks ---------------------------------------------------------------

    async def request(self, flow: http.HTTPFlow) -> None:
        admitted: list[Admission] = []  # released if governing the request fails half-way
        try:
            await self._request(flow, admitted)
        except Exception:  # fail closed: never forward what could not be governed
            log.exception("governor: internal error on %s", flow.request.url)
            session = flow.metadata.get(SESSION_KEY) or self.session_of(flow.request.headers)
            flow.metadata.pop(METADATA_KEY, None)
            for admission in admitted:
                await self._release(session, admission.ticket, error="governor error")
            self._fail_closed(flow, session, "internal error while governing the request")

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        flight: Flight | None = flow.metadata.get(METADATA_KEY)
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
        if watcher is not None:
            flight.relay = StreamRelay(self, flow, flight, watcher)
            response.stream = flight.relay
            if flight.refusal is not None:  # decided while we waited for the headers
                self._cut(flow, flight, *flight.refusal)

    async def response(self, flow: http.HTTPFlow) -> None:
        flight: Flight | None = flow.metadata.get(METADATA_KEY)
        if flight is None or flight.finished:
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
                self._replace(flow, flight.exchange.adapter, governor_error(), session,
                              governor_error_object(session), flight.exchange)
        finally:
            await self._finish(flight, self._upstream_error(flow))
            self._forget(flow, flight, stream_over=True)

    async def error(self, flow: http.HTTPFlow) -> None:
        flight: Flight | None = flow.metadata.get(METADATA_KEY)
        if flight is None or flight.finished:
            return
        try:
            if flight.relay is not None and flight.usage_ticket is not None:
                relay = flight.relay
                if not relay.ended:
                    relay.end()
                await self._stream_finished(flow, flight)
        except Exception:
            log.exception("governor: internal error while closing %s", flow.request.url)
        finally:
            message = flow.error.msg if flow.error else "exchange failed"
            if flow.response is None and self.metrics is not None:  # the upstream never answered
                self.metrics.upstream_error(flight.exchange.adapter.name)
            await self._finish(flight, message)
            self._forget(flow, flight, stream_over=False)

    def server_connected(self, data: Any) -> None:
        if self.origin is not None:
            self.origin.connected(data.server.sockname)

    def server_disconnected(self, data: Any) -> None:
        if self.origin is not None:
            self.origin.disconnected(data.server.sockname)

    def server_connect(self, data: Any) -> None:
        address = data.server.address
        if self.origin is not None and address and self.origin.refuses_connect(address[0], address[1]):
            data.server.error = "the governor does not connect to its own control plane"

    def done(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        self.presented.close()

    # --- request -----------------------------------------------------------------------

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
            log_withheld(flow, exchange, "request")
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

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task


# --- helpers ---------------------------------------------------------------------------

