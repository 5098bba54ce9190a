"""The session binding addon: which session a request acts in (its ADL-Session header, a
token of the session book, else the default), and the request as it goes upstream without
the agent's ADL-* headers (plus the control plane's origin marker).

It runs first in the chain (governor.proxy.chain): it puts the flow's `FlowState`
(governor.proxy.flow_state) on the flow, with the request as the agent sent it, for the
addons after it. A request that names no session it may act in is refused here, and so is
one to a host outside the passport's `permissions.network.allowed_hosts`
(governor.proxy.egress), recorded in its session.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Coroutine

from mitmproxy import http

from governor.adapters import IGNORE, AdapterRegistry, Refusal
from governor.adapters.base import Adapter
from governor.adapters.request_view import RawHeaders, RequestView
from governor.proxy import refusals
from governor.proxy.drain import MESSAGE as DRAINING, RETRY_AFTER_SEC
from governor.proxy.egress import EgressHosts
from governor.proxy.fields import GOVERNOR_PREFIX, PASSPORT_FIELD, SESSION_FIELD, SESSION_HEADER, scan_headers
from governor.proxy.identity_headers import identity_of
from governor.proxy.flow_state import STATE_KEY, FlowState
from governor.proxy.policy import ProxyPolicy
from governor.proxy.refusing import Refuser, as_response, generic_error, plain_error
from governor.runtime.api import RuntimeAPI

log = logging.getLogger("governor.proxy")


class SessionBinding:
    """The mitmproxy addon that binds each request to its session (the `request` hook)."""

    def __init__(self, runtime: RuntimeAPI, registry: AdapterRegistry, policy: ProxyPolicy, refuser: Refuser, *,
                 sessions: Any = None, origin: Any = None, metrics: Any = None,
                 egress: EgressHosts | None = None, drain: Any = None) -> None:
        self.runtime = runtime
        self.drain = drain  # governor.proxy.drain.Drain: once it is closed, every new request is refused (503)
        self.egress = egress  # the passport's allowed_hosts; None: it declares none
        self.registry = registry
        self.policy = policy
        self.refuser = refuser
        self.sessions = sessions  # governor.sessions.book.SessionBook: which session a request may act in
        self.origin = origin  # governor.control.origin.ProxyOrigin, optional
        self.metrics = metrics  # governor.runtime.metrics.Metrics, optional
        self.own_session = f"session-{uuid.uuid4().hex[:12]}"

    def session_of(self, headers: Any) -> str:
        """ADL-Session names the session; without it: the configured default, else the
        runtime's default session (one per process), else one of our own. Without a
        session book only (with one, `request` asks the book)."""
        return self._session(headers.get(SESSION_HEADER))

    def _session(self, named: str | None) -> str:
        return (named or self.policy.default_session
                or getattr(self.runtime, "default_session", None) or self.own_session)

    def request(self, flow: http.HTTPFlow) -> Coroutine[Any, Any, None] | None:
        """Synchronous on the usual path (no coroutine per request); a refusal, which records,
        is returned as a coroutine for mitmproxy to await."""
        try:
            return self._bind(flow)
        except Exception:  # fail closed: never forward what could not be governed
            self._failed(flow)
            return None

    def _failed(self, flow: http.HTTPFlow) -> None:
        log.exception("governor: internal error on %s", flow.request.url)
        state: FlowState | None = flow.metadata.pop(STATE_KEY, None)
        session = (state.session if state is not None else None) or self.session_of(flow.request.headers)
        self.refuser.fail_closed(flow, session, "internal error while governing the request")

    async def _refuse(self, flow: http.HTTPFlow, refusal: Any) -> None:
        try:
            await self._refuse_session(flow, refusal)
        except Exception:  # fail closed: never forward what could not be governed
            self._failed(flow)

    def _bind(self, flow: http.HTTPFlow) -> Coroutine[Any, Any, None] | None:
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
                return self._refuse(flow, resolved)
            session = resolved
        else:
            session = self._session(governing.get(SESSION_FIELD))
        state = FlowState(session)
        flow.metadata[STATE_KEY] = state
        if governing or book is not None:  # who it acts as: bound by the principal (governor.proxy.identity_headers)
            state.persona, read, state.identity_refused, state.persona_host = identity_of(
                book, session, governing, fields, self.policy.agent_identity_headers)
        else:
            read = fields
        state.presented = governing.get(PASSPORT_FIELD)
        state.encoded = encoded
        state.agent_fields = fields
        # the adapters see the headers as the agent sent them (A2A reads its delegation depth
        # from one, which identity_of set from the session's lineage): a view over the field
        # tuple as it is now (rewriting headers replaces it)
        state.view = RequestView(
            request.method, request.host, request.path, RawHeaders(read), request.raw_content,
            port=request.port, scheme=request.scheme,
        )
        # upstream: no ADL-* header of the agent's, and ours marking the request as forwarded
        forwarded = tuple([f for f in fields if f[0][:4].lower() != GOVERNOR_PREFIX]) if governing else fields
        if self.origin is not None:
            forwarded += ((self.origin.header.encode(), self.origin.marker.encode()),)
        if forwarded is not fields:
            headers.fields = forwarded
        if self.drain is not None and self.drain.closed:
            return self._refuse_draining(flow, session)
        if self.origin is not None and self.origin.refuses_connect(request.host, request.port):
            flow.response = plain_error(403, "the governor does not forward requests to its own control plane")
        elif self.egress is not None and not self.egress.allows(request.host):
            return self._refuse_host(flow, session)
        return None

    async def _refuse_host(self, flow: http.HTTPFlow, session: str) -> None:
        """A host outside the passport's allowed_hosts: recorded in the session (or, in none,
        counted), answered 403 in the format of the adapter whose endpoint the path is."""
        try:
            request = flow.request
            view = RequestView(request.method, request.host, request.path, RawHeaders(request.headers.fields), b"")
            await self.refuser.refuse_traffic(flow, session, refusals.HOST_NOT_ALLOWED,
                                              self.egress.message(request.host) if self.egress else "",
                                              adapter=self.registry.claimant(view))
        except Exception:  # fail closed: never forward what could not be governed
            self._failed(flow)

    async def _refuse_draining(self, flow: http.HTTPFlow, session: str) -> None:
        """The governor drains (SIGTERM): no new step; 503, recorded in the session."""
        try:
            request = flow.request
            view = RequestView(request.method, request.host, request.path, RawHeaders(request.headers.fields), b"")
            await self.refuser.refuse_draining(flow, session, DRAINING, RETRY_AFTER_SEC,
                                               adapter=self.registry.claimant(view))
        except Exception:  # fail closed: never forward what could not be governed
            self._failed(flow)

    async def _refuse_session(self, flow: http.HTTPFlow, refusal: Any) -> None:
        """A request that names no session it may act in: answered 403 in its protocol's
        error shape, counted and logged. Only under `unknown_traffic: forward` (the opt-out)
        does token-less traffic no adapter governs pass, in no session, as it did before
        sessions; allowed traffic, like every request, needs a session it may act in."""
        request = flow.request
        view = RequestView(request.method, request.host, request.path, RawHeaders(request.headers.fields),
                           request.raw_content, port=request.port, scheme=request.scheme)
        selected = self.registry.select(view)
        if (selected is None or selected == IGNORE) and refusal.code == "session_token_required" \
                and self.policy.unknown_traffic == "forward":
            # token-less traffic no adapter governs (a package download, a web page: no library
            # adds ADL-Session to it) passes ungoverned, as the operator chose; a lock or a bad
            # token still refuses it, and so does the passport's allowed_hosts
            flow.request.headers.fields = tuple(
                f for f in request.headers.fields if f[0][:4].lower() != GOVERNOR_PREFIX)
            flow.metadata[STATE_KEY] = FlowState("", unclaimed=True, allowed=selected == IGNORE)
            if self.egress is not None and not self.egress.allows(request.host):
                await self._refuse_host(flow, "")
            return
        if isinstance(selected, Refusal):  # refused at selection too; it belongs to no session
            await refusals.record(self.runtime, self.metrics, None, refusals.reason_for(selected.status), {})
            log.info("governor: %s %s would also be refused at selection (%s): counted, not recorded (no session)",
                     request.method, request.pretty_url, selected.status)
        if refusal.audit is not None:
            try:
                await self.sessions.record_refusal(refusal)
            except Exception:  # refused all the same: the safe side
                log.exception("governor: the refusal %s could not be recorded in the audit journal", refusal.code)
        gov = refusal.governor_object()
        message = f"governor: {refusal.message}"
        if isinstance(selected, Adapter):
            try:
                reply = selected.error_response(403, message, gov)
            except Exception:
                log.exception("governor: adapter %s could not build a refusal", selected.name)
                reply = generic_error(403, message, gov)
        else:
            reply = generic_error(403, message, gov)
        flow.response = as_response(reply, gov["action"])
        log.info("governor: refused %s %s: %s (%s)", request.method, request.pretty_url, refusal.code,
                 refusal.session or "no session")
