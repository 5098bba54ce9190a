"""Assembling a running governor: admitted pin -> runtime -> proxy master + control plane, one loop.

    running = await serve(Settings(listen=("127.0.0.1", 0), control=("127.0.0.1", 0)))
    ... running.proxy_url, running.ca_file, running.control_url ...
    await running.stop()

mitmproxy is embedded as a library: a bare `mitmproxy.master.Master` with only the
addons a proxy needs (core, proxyserver, next_layer, tlsconfig, errorcheck) plus
the governor's addon chain (governor.proxy.chain); its confdir is the data directory, where it creates its CA
(`mitmproxy-ca-cert.pem`) on first run. `serve` takes an already-built runtime
(tests, embedding) or builds the real one from the settings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mitmproxy import options
from mitmproxy.addons import core, next_layer, proxyserver, tlsconfig
from mitmproxy.master import Master

from governor.adapters import AdapterRegistry
from governor.proxy import backlog, heads, tracing
from governor.proxy.chain import Chain, assemble
from governor.proxy.connections import ConnectionGuard, ConnectionLimits
from governor.proxy.egress import EgressHosts
from governor.proxy.mitm_master import ListenAdvice, ProxyStartFailed, Started, StartupErrorCheck, master_options
from governor.proxy.policy import ProxyPolicy
from governor.proxy.runtime_setup import build_runtime
from governor.proxy.settings import Settings, StartupError
from governor.runtime.api import RuntimeAPI

log = logging.getLogger("governor.proxy")

# Settings and StartupError (proxy/settings.py) are this room's door as well: most callers
# import them from here, with `serve`.
__all__ = ["Running", "Settings", "StartupError", "attach_notifier", "build_chain", "egress_hosts", "serve",
           "session_book"]


@dataclass
class Running:
    """A started governor. `stop()` shuts everything down and waits for it."""

    settings: Settings
    runtime: RuntimeAPI
    master: Master
    chain: Chain  # the governor's addons, and what they share that tests look at
    proxy_address: tuple[str, int]
    control_address: tuple[str, int] | None
    _master_task: asyncio.Task
    _control_runner: Any = None
    _peers: Any = None  # the A2A PeerResolver serve() built (closed on stop)
    sessions: Any = None  # the SessionBook: who may act in which session, locks
    control_token_file: Any = None  # <data-dir>/control-token when `governor run` made or read it
    connections: ConnectionGuard | None = None  # client connection deadlines and cap
    notifier: Any = None  # the webhook notifier serve() attached to the runtime (closed on stop)
    control_context: Any = None  # the control plane's ControlContext (None: no control plane)
    metrics: Any = None  # the governor's Metrics (a reloaded notifier counts there too)
    tracing: Any = None  # governor.proxy.tracing.Tracing: its spans flushed at the stop (None: no traces)

    @property
    def proxy_url(self) -> str:
        host, port = self.proxy_address
        return f"http://{host}:{port}"

    @property
    def control_url(self) -> str | None:
        if self.control_address is None:
            return None
        host, port = self.control_address
        return f"http://{host}:{port}"

    @property
    def ca_file(self) -> Path:
        return self.settings.ca_file

    def agent_environment(self) -> dict[str, str]:
        """What to set in the agent's environment to send its traffic through the governor."""
        ca = str(self.ca_file.resolve())
        if self.settings.mode.startswith("reverse:"):
            return {"OPENAI_BASE_URL": f"{self.proxy_url}/v1", "ANTHROPIC_BASE_URL": self.proxy_url}
        return {
            "HTTPS_PROXY": self.proxy_url,
            "HTTP_PROXY": self.proxy_url,
            "SSL_CERT_FILE": ca,
            "REQUESTS_CA_BUNDLE": ca,
            "NODE_EXTRA_CA_CERTS": ca,
            # Node honours the proxy variables only when asked (Node 24+, 22.21+); older Node
            # ignores them: `governor exec` (docs/clients.md)
            "NODE_USE_ENV_PROXY": "1",
        }

    async def drain(self, grace: float, hurry: asyncio.Event | None = None) -> int:
        """A graceful stop's first half (governor.proxy.drain): new requests refused (503),
        `/readyz` not ready, calls in flight finished within `grace` seconds (or until
        `hurry` is set), the rest cut and recorded. `stop()` then ends the sessions."""
        if self.chain.drain is None:
            return 0
        return await self.chain.drain.run(grace, hurry)

    async def replace_webhooks(self, config: Any) -> None:
        """New webhook settings (a reload, SIGHUP): a new notifier takes every event from now
        on; the old one is given a moment for what it was delivering, then closed."""
        old = self.notifier
        self.settings.webhooks = config
        self.notifier = attach_notifier(self.settings, self.runtime, self.metrics)
        if self.notifier is None and hasattr(self.runtime, "notifier"):
            from governor.notify.webhooks import NULL_NOTIFIER

            self.runtime.notifier = NULL_NOTIFIER
        if old is not None:
            await old.close()

    async def stop(self) -> None:
        self.master.shutdown()
        try:
            await asyncio.wait_for(self._master_task, timeout=10)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            self._master_task.cancel()
        # events recorded from the proxy's tasks (a stream cut's refusal) before the final
        # records are signed: the done hook awaited them; a cut since (connections outlive
        # the master) or a master that timed out is awaited here (governor/proxy/recording.py)
        await self.chain.recording.settle()
        if self._control_runner is not None:
            await self._control_runner.cleanup()
            self._control_runner = None
        if self._peers is not None:
            await self._peers.close()
            self._peers = None
        close = getattr(self.runtime, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result
        if self.notifier is not None:  # after the runtime: notifications of its last halts still go out
            await self.notifier.close()
            self.notifier = None
        if self.tracing is not None:  # the last spans exported (bounded by OTEL_BSP_EXPORT_TIMEOUT)
            await asyncio.to_thread(self.tracing.shutdown)
            self.tracing = None


async def serve(settings: Settings, runtime: RuntimeAPI | None = None, *, metrics: Any = None) -> Running:
    """Start the proxy (and the control plane when settings.control is set) in this loop."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if metrics is None:
        from governor.runtime.metrics import Metrics

        metrics = Metrics(per_session=settings.metrics_per_session)
    if runtime is None:
        runtime = build_runtime(settings, metrics)
    notifier = attach_notifier(settings, runtime, metrics)
    try:
        book = session_book(settings, runtime, metrics)
    except Exception as exc:  # an unreadable or damaged sessions/book.jsonl, a bad setting
        raise StartupError(f"sessions: {exc}") from None
    recover = getattr(runtime, "recover", None)
    if recover is not None:  # sessions the last run left unfinished: finalized before any traffic
        try:
            await recover()
        except Exception as exc:
            raise StartupError(f"cannot finalize the sessions left unfinished in {settings.data_dir}: {exc}") from None
    origin = None
    control_runner = None
    control_address = None
    control_context = None  # the control plane's ControlContext: its token sets change on a reload
    guard = ConnectionGuard(ConnectionLimits(
        header_timeout=settings.client_header_timeout, body_timeout=settings.client_body_timeout,
        idle_timeout=settings.client_idle_timeout, max_connections=settings.max_client_connections))
    if settings.control is not None:
        from governor.control.origin import ProxyOrigin

        origin = ProxyOrigin()
    mitm_proxyserver = proxyserver.Proxyserver()
    try:
        traces = tracing.start(None, metrics)  # the OTEL_* variables (docs/tracing.md)
    except tracing.TracingError as exc:
        raise StartupError(str(exc)) from None
    chain, peers = build_chain(settings, runtime, metrics=metrics, origin=origin, sessions=book,
                               proxyserver=mitm_proxyserver, guard=guard, tracing=traces)
    if settings.control is not None:
        from governor.control.app import create_app, start_control
        from governor.control.context import ControlContext

        drain = chain.drain
        control_context = ControlContext.build(
            runtime, reviewer_tokens=settings.reviewer_tokens, control_token=settings.control_token,
            metrics=metrics, origin=origin, control_hosts=settings.control_hosts, sessions=book,
            log_require_token=settings.log_require_token, lock_lifter_tokens=settings.lock_lifter_tokens,
            draining=(lambda: drain.draining) if drain is not None else None)
        app = create_app(control_context)
        try:
            control_runner = await start_control(app, settings.control[0], settings.control[1])
        except OSError as exc:
            if peers is not None:
                await peers.close()
            raise StartupError(f"cannot listen on {settings.control[0]}:{settings.control[1]} "
                               f"for the control plane: {exc}") from None
        control_address = tuple(control_runner.addresses[0][:2])

    started = Started()
    heads.install()  # mitmproxy reads HTTP/1 heads without a bound (governor/proxy/heads.py)
    backlog.install()  # mitmproxy listens with a backlog of 100 (governor/proxy/backlog.py)
    master = Master(options.Options())
    # the connection guard's hooks are called by the chain, first (governor/proxy/dispatch.py)
    master.addons.add(core.Core(), mitm_proxyserver, next_layer.NextLayer(), tlsconfig.TlsConfig(),
                      StartupErrorCheck(), chain, started)
    try:
        master.options.update(**master_options(settings))
    except Exception as exc:  # mitmproxy's OptionsError, a bad mode spec, an unreadable CA file
        raise StartupError(f"invalid proxy settings: {exc}") from None
    advice = ListenAdvice()
    proxy_log = logging.getLogger(proxyserver.__name__)
    proxy_log.addFilter(advice)
    task = asyncio.get_running_loop().create_task(master.run(), name="governor proxy")
    waiter = asyncio.ensure_future(started.event.wait())
    try:
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        proxy_log.removeFilter(advice)
    if task.done() or not master.addons.get("proxyserver").listen_addrs():
        waiter.cancel()
        if not task.done():
            master.shutdown()
            await asyncio.wait([task])
        master.addons.get("errorcheck").finish()  # its log handler, left installed when start-up fails
        failure = None if task.cancelled() else task.exception()  # retrieved: it goes in the message
        if control_runner is not None:
            await control_runner.cleanup()
        if peers is not None:
            await peers.close()
        if failure is not None and not advice.errors:  # something else than listening failed
            if not isinstance(failure, ProxyStartFailed):
                log.error("the proxy stopped while starting", exc_info=failure)
            raise StartupError(f"the proxy could not start (mode {settings.mode}): {failure}")
        why = f": {advice.errors[0]}" if advice.errors else "; see the log above"
        raise StartupError(f"the proxy could not listen on {settings.listen[0]}:{settings.listen[1]} "
                           f"(mode {settings.mode}){why}; {ListenAdvice.ADVICE}")
    host, port = master.addons.get("proxyserver").listen_addrs()[0][:2]
    return Running(settings, runtime, master, chain, (host, port), control_address, task, control_runner, peers,
                   sessions=book, connections=guard, notifier=notifier, control_context=control_context,
                   metrics=metrics, tracing=traces)


def attach_notifier(settings: Settings, runtime: Any, metrics: Any = None) -> Any:
    """The webhook notifier of settings.webhooks, set as the runtime's (None: no webhooks)."""
    if settings.webhooks is None or not hasattr(runtime, "notifier"):
        return None
    from governor.common.version import package_version
    from governor.notify.webhooks import WebhookNotifier

    notifier = WebhookNotifier(settings.webhooks, governor=str(getattr(runtime, "governor_id", "") or ""),
                               metrics=metrics, user_agent=f"adl-governor/{package_version()}")
    runtime.notifier = notifier
    return notifier


def session_book(settings: Settings, runtime: Any, metrics: Any = None) -> Any:
    """The runtime's session book, else a new one for these settings (attached to the
    runtime when it keeps one: it then records locks and learns of ends)."""
    from governor.sessions.book import SessionBook

    book = getattr(runtime, "session_book", None)
    if book is None:
        book = SessionBook(settings.data_dir, mode=settings.sessions, default=settings.default_session,
                           default_name=settings.session, agent_sessions_per_day=settings.agent_sessions_per_day,
                           lock_causes=settings.lock_on, metrics=metrics,
                           shared=getattr(getattr(runtime, "shared", None), "sessions", None))
        attach = getattr(runtime, "attach_sessions", None)
        if attach is not None:
            attach(book)
    return book


def build_chain(settings: Settings, runtime: RuntimeAPI, *, metrics: Any = None, origin: Any = None,
                sessions: Any = None, proxyserver: Any = None, guard: Any = None,
                tracing: Any = None) -> tuple[Chain, Any]:
    """The enforcement point for these settings over `runtime`: its addon chain with its adapters,
    and the A2A peer resolver it made (None when the settings bring their own), which the
    caller closes when done."""
    policy = ProxyPolicy(
        default_session=settings.session,
        unknown_traffic=settings.unknown_traffic,
        upstream_timeout=settings.upstream_timeout,
        tick_interval=settings.tick_interval,
        max_body_bytes=settings.max_body_bytes,
        max_response_bytes=settings.max_response_bytes,
        max_decoded_ratio=settings.max_decoded_ratio,
        max_held_stream_bytes=settings.max_held_stream_bytes,
        review_hold=settings.review_hold,
        review_retry_after=settings.review_retry_after,
        agent_identity_headers=settings.agent_identity == "headers",
    )
    adapter_config = settings.adapters
    if hasattr(runtime, "allowed_tools") and "allowed_tools" not in adapter_config.extra:
        # the MCP adapter filters tools/list answers by what the session (persona) may use
        adapter_config = dataclasses.replace(
            adapter_config, extra={**adapter_config.extra, "allowed_tools": runtime.allowed_tools})
    peers = None
    if "a2a_peers" not in adapter_config.extra:
        # A2A: a peer's passport is verified with the admission code before §4.2 is evaluated
        from governor.adapters.a2a import PeerResolver, admission_verifier

        pinned = getattr(runtime, "pinned", None)
        verifier = admission_verifier(requesting_agent=pinned.document if pinned is not None else None)
        peers = PeerResolver(verifier, static=settings.peers)
        adapter_config = dataclasses.replace(adapter_config, extra={
            **adapter_config.extra, "a2a_peers": peers, "delegation_depth": settings.delegation_depth})
    registry = AdapterRegistry.default(adapter_config, settings.routes, settings.allow)
    if sessions is None:
        sessions = session_book(settings, runtime, metrics)
    chain = assemble(runtime, registry, policy, metrics=metrics, origin=origin, sessions=sessions,
                        proxyserver=proxyserver, egress=egress_hosts(runtime), guard=guard, tracing=tracing)
    if settings.unknown_traffic == "forward":
        log.warning("governor: --unknown-traffic forward: traffic no adapter governs is forwarded ungoverned "
                    "(uncounted, unrecorded); the default refuses it unless the allow-list names it")
    return chain, peers


def egress_hosts(runtime: Any) -> EgressHosts | None:
    """The pinned passport's permissions.network.allowed_hosts (None: it declares none, or
    the runtime pins no passport, as scripted test runtimes do)."""
    pinned = getattr(runtime, "pinned", None)
    if pinned is None:
        return None
    try:
        return EgressHosts.of_passport(pinned.document)
    except ValueError as exc:
        raise StartupError(f"passport: {exc}") from None


