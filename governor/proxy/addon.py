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

The hooks are here; what they call lives beside this module, one concern each: the
`Requesting` (requesting.py), `Responding` (responding.py), `InFlight` (in_flight.py) and
`Refusing` (refusing.py) mixins of `Governor`, the relay of a stream and the exchange in
flight (relay.py), and the header and body helpers (fields.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from mitmproxy import ctx, http

from governor.adapters import AdapterRegistry, withhold
from governor.adapters.fitting import FITTED_HEADER, FITTED_STATE
from governor.proxy import bodies, holds, recording
from governor.proxy.fields import SESSION_HEADER, has_content_encoding
from governor.proxy.in_flight import InFlight
from governor.proxy.presented import PresentedPassports
from governor.proxy.refusing import Refusing, governor_error, governor_error_object
from governor.proxy.relay import METADATA_KEY, SESSION_KEY, Flight, StreamRelay
from governor.proxy.requesting import Requesting
from governor.proxy.responding import Responding
from governor.runtime.api import Admission, RuntimeAPI

# imported from here by the proxy's users and tests (they lived here before the split)
from governor.proxy.fields import GOVERNOR_HEADER_PREFIX, PASSPORT_HEADER, PERSONA_HEADER  # noqa: F401
from governor.proxy.presented import PresentedPassportError, presented_digest  # noqa: F401
from governor.proxy.refusing import ACTION_HEADER, REPLACED_KEY  # noqa: F401

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


class Governor(Requesting, Responding, InFlight, Refusing):
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
        self.recording = recording.Recording()  # events recorded from tasks: a stop awaits them
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

    async def done(self) -> None:
        for task in list(self.tasks):
            self.recording.cancel(task)  # a task inside a runtime call: once the call has returned
        await self.recording.settle()
        self.presented.close()

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task
