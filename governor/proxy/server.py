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
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mitmproxy import options
from mitmproxy.addons import core, errorcheck, next_layer, proxyserver, tlsconfig
from mitmproxy.master import Master

from governor.adapters import AdapterRegistry, Route
from governor.adapters.allow import AllowEntry
from governor.adapters.base import AdapterConfig
from governor.policy.steps import Tier
from governor.proxy import heads, tracing
from governor.proxy.chain import Chain, assemble
from governor.proxy.connections import (
    DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, ConnectionGuard, ConnectionLimits,
)
from governor.proxy.drain import DEFAULT_GRACE_SEC
from governor.proxy.egress import EgressHosts
from governor.proxy.policy import ProxyPolicy
from governor.runtime.api import RuntimeAPI

log = logging.getLogger("governor.proxy")

CA_FILE = "mitmproxy-ca-cert.pem"


class StartupError(Exception):
    """The governor cannot start (a passport refused at admission, a port in use, ...)."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class _ListenAdvice(logging.Filter):
    """While the proxy starts: mitmproxy's "could not listen" error advises `--mode MODE@PORT`,
    a mitmproxy option the governor does not have; the advice is rewritten to name `--listen`,
    and the listen errors are kept for the StartupError (other errors are left as they are)."""

    MITMPROXY_ADVICE = re.compile(r"\s*Try specifying a different port by using `--mode [^`]*`\.?")
    ADVICE = "choose another address with --listen HOST:PORT"

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "failed to listen" in (text := record.getMessage()):
            message = self.MITMPROXY_ADVICE.sub("", text)
            self.errors.append(message)
            record.msg, record.args = f"{message}; {self.ADVICE}", None
        return True


class _ProxyStartFailed(Exception):
    """mitmproxy logged errors while starting (a port in use, a bad certificate)."""


class _StartupErrorCheck(errorcheck.ErrorCheck):
    """mitmproxy's start-up check, ending the proxy's task instead of the process
    (mitmproxy's calls sys.exit): `serve` then raises a StartupError that says why."""

    name = "errorcheck"  # the name mitmproxy's Master looks it up by

    async def shutdown_if_errored(self) -> None:
        await asyncio.sleep(0)  # as mitmproxy's: let the logging tasks finish first
        if self.logger.has_errored:
            raise _ProxyStartFailed("; ".join(r.getMessage() for r in self.logger.has_errored))


@dataclass
class Settings:
    """Everything `governor run` can be told (CLI flags, GOVERNOR_* variables, --config file)."""

    passport: Path | None = None  # None: the bundled example passport
    allow_unsigned_passport: bool = False  # admit an unsigned passport; every record says so (docs/passports.md)
    config: Path | None = None
    listen: tuple[str, int] = ("127.0.0.1", 8080)
    control: tuple[str, int] | None = ("127.0.0.1", 8081)  # None: no control plane
    mode: str = "regular"  # "regular" or "reverse:URL"
    transparent: tuple[str, int] | None = None  # a second listener in transparent mode (iptables REDIRECT)
    data_dir: Path = Path(".governor")
    tier: Tier = Tier.R2
    session_idle: float = 900.0
    session: str | None = None  # the default session's name (no ADL-Session header); None: generated
    sessions: str = "principal"  # who opens sessions: "principal" (tokens) or "agent-named" (trusts the agent)
    default_session: str = "auto"  # token-less traffic: "auto" (until a principal opens one), "on", "off"
    agent_sessions_per_day: int = 100  # agent-named mode: new names per rolling day
    lock_on: tuple[str, ...] = ("on_governor_session_integrity",)  # halt causes that lock every session
    unknown_traffic: str = "deny"  # "deny" (unless the allow-list names it) | "forward" (ungoverned, logged)
    allow: tuple[AllowEntry, ...] = ()  # the operator's allow-list: destinations that spend nothing
    upstream_ca: Path | None = None  # extra CA bundle trusted for upstream TLS
    upstream_insecure: bool = False  # do not verify upstream certificates (tests only)
    upstream_timeout: float = 300.0
    client_header_timeout: float = DEFAULT_HEADER_TIMEOUT  # a new connection's first request headers, due within
    client_body_timeout: float = DEFAULT_BODY_TIMEOUT  # a request body, complete within this after its headers
    client_idle_timeout: float = DEFAULT_IDLE_TIMEOUT  # a keep-alive connection with nothing in flight, closed after
    max_client_connections: int = 0  # 0: derived from the file-descriptor limit
    metrics_per_session: int = 0  # budget series labelled by session, for at most this many live sessions
    tick_interval: float = 1.0
    persona_idle: float = 60.0  # a persona instance with no request for this long ends (docs/personas.md)
    review_hold: float = 300.0  # a connection held for a reviewer, at most (docs/oversight.md)
    review_retry_after: float = 10.0  # the Retry-After of the 429 review_pending after it
    drain_timeout: float = DEFAULT_GRACE_SEC  # SIGTERM: calls in flight may finish this long (governor.proxy.drain)
    max_body_bytes: int = 64 * 1024 * 1024
    max_response_bytes: int = 256 * 1024 * 1024  # compressed answers the governor reads, once decoded
    max_decoded_ratio: float = 200.0  # decoded / compressed size of a body, past 1 MiB decoded
    max_held_stream_bytes: int = 1024 * 1024  # a stream's output kept back while a step awaits admission
    routes: tuple[Route, ...] = ()
    adapters: AdapterConfig = field(default_factory=AdapterConfig)
    pricing: Path | None = None  # the operator's price overrides (governor.runtime.prices); None: none
    store: str | None = None  # state store URL/path; None: SQLite in the data directory
    governor_id: str | None = None  # the record's governor identifier; None: the key's did.json, else did:web:localhost:governor
    # the transparency log (docs/transparency-log.md): every final record's entry, before the record
    log: bool = True
    log_origin: str | None = None  # None: derived from the governor's id
    log_checkpoint_entries: int = 256
    log_checkpoint_seconds: float = 10.0
    log_require_token: bool = False  # /log/ readable without the control token unless set
    witnesses: tuple[tuple[str, str], ...] = ()  # (URL, vkey): the log's witnesses (c2sp.org/tlog-witness)
    witness_quorum: int | None = None  # cosignatures a proof's checkpoint needs; None: all the witnesses
    witness_wait: float = 10.0  # a proof asked for waits this long for the quorum, then 503
    agent_identity: str = "principal"  # "headers": read ADL-Persona / ADL-Delegation-Depth (cli/identity_options.py)
    rate_limits: tuple = ()  # governor.policy.rates.RateLimit, from --rate-limit (cli/identity_options.py)
    peers: dict[str, str] = field(default_factory=dict)  # A2A: peer URL prefix -> passport file (offline/pinned peers)
    delegation_depth: int = 0  # A2A: the least depth this agent is known to run at (the header cannot lower it)
    reviewer_tokens: tuple[str, ...] = ()
    control_token: str | None = None
    lock_lifter_tokens: tuple[str, ...] = ()  # may lift locks besides the control token (cli/barrier_options.py)
    envelope: Any = None  # the R3 envelope's EnvelopeConfig (cli/envelope_options.py); None: its defaults
    control_hosts: tuple[str, ...] = ()  # Host names the control plane answers to besides localhost ("*": any)
    webhooks: Any = None  # governor.notify.webhooks.WebhookConfig: signed notifications; None: none
    extra: dict[str, Any] = field(default_factory=dict)  # config-file keys for the runtime

    @property
    def ca_file(self) -> Path:
        return self.data_dir / CA_FILE


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


class _Started:
    """Tells serve() when mitmproxy's servers are up (or failed to come up)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def running(self) -> None:
        self.event.set()


def master_options(settings: Settings) -> dict[str, Any]:
    """mitmproxy options for these settings (set once the addons that define them are added)."""
    opts: dict[str, Any] = dict(
        listen_host=settings.listen[0],
        listen_port=settings.listen[1],
        mode=[settings.mode] + ([f"transparent@{settings.transparent[0]}:{settings.transparent[1]}"]
                                if settings.transparent is not None else []),
        confdir=str(settings.data_dir),
        connection_strategy="lazy",
        ssl_insecure=settings.upstream_insecure,
        # mitmproxy's own inactivity bound, for what the connection guard does not time
        # (tunnels, a stream in flight): never shorter than the upstream's allowed silence
        tcp_timeout=int(max(600, settings.upstream_timeout + 60)),
        # what mitmproxy buffers of one body (every request; answers the governor reads whole):
        # without it a hostile agent or upstream had the governor hold any size in memory.
        # Nothing the governor reads is larger; streamed answers are not buffered, so not bound.
        body_size_limit=str(max(settings.max_body_bytes, settings.max_response_bytes)),
    )
    if settings.upstream_ca is not None:
        opts["ssl_verify_upstream_trusted_ca"] = str(settings.upstream_ca)
    return opts


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

    started = _Started()
    heads.install()  # mitmproxy reads HTTP/1 heads without a bound (governor/proxy/heads.py)
    master = Master(options.Options())
    # the connection guard's hooks are called by the chain, first (governor/proxy/dispatch.py)
    master.addons.add(core.Core(), mitm_proxyserver, next_layer.NextLayer(), tlsconfig.TlsConfig(),
                      _StartupErrorCheck(), chain, started)
    try:
        master.options.update(**master_options(settings))
    except Exception as exc:  # mitmproxy's OptionsError, a bad mode spec, an unreadable CA file
        raise StartupError(f"invalid proxy settings: {exc}") from None
    advice = _ListenAdvice()
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
            if not isinstance(failure, _ProxyStartFailed):
                log.error("the proxy stopped while starting", exc_info=failure)
            raise StartupError(f"the proxy could not start (mode {settings.mode}): {failure}")
        why = f": {advice.errors[0]}" if advice.errors else "; see the log above"
        raise StartupError(f"the proxy could not listen on {settings.listen[0]}:{settings.listen[1]} "
                           f"(mode {settings.mode}){why}; {_ListenAdvice.ADVICE}")
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


def witness_alarm(runtime: Any) -> Any:
    """What a witness's rollback or fork refusal does besides its ERROR line: the metric, and
    an event in the audit journal (from the witnessing thread, on the runtime's loop)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None

    def alarm(message: str) -> None:
        runtime.metrics.witness_refusals.inc()
        if loop is not None and not loop.is_closed():
            detail = {"refused_by_witness": message,
                      "effect": "no transparency-log proof is served until the log is restored"}
            asyncio.run_coroutine_threadsafe(runtime.audit.record_audit("on_governor_log_refused", "halt", detail), loop)

    return alarm


def build_runtime(settings: Settings, metrics: Any = None) -> RuntimeAPI:
    """The real runtime: the passport admitted and pinned, the policy compiled, SQLite state
    (or settings.store), the governor's key in the data directory (created on first run).
    Refuses (StartupError, with the admission report) a passport that fails admission."""
    from datetime import datetime, timezone

    from governor.evidence import EvidenceError, ensure_governor_key
    from governor.passport import (
        UNSIGNED_PASSPORT,
        UNSIGNED_PASSPORT_MEMBER,
        AdmissionConfig,
        PassportError,
        admit,
        example_passport_path,
        load_passport,
    )
    from governor.policy import compile_limits
    from governor.policy.causes import canonical_cause
    from governor.runtime.prices import price_book
    from governor.runtime.core import Runtime
    from governor.runtime.duplicates import watch_duplicates
    from governor.store import open_store

    path = settings.passport or example_passport_path()
    try:
        document = load_passport(path)
    except PassportError as exc:
        raise StartupError(f"passport {path}: {exc}") from None
    report = admit(document, AdmissionConfig(now=datetime.now(timezone.utc),
                                             require_signature=not settings.allow_unsigned_passport))
    if not report.verified or report.pinned is None:
        unsigned = report.blocked_at_section == "1.1.5" and "no security.attestation.signature" in \
            (report.step("1.1.5").message if report.step("1.1.5") else "")
        hint = " (unsigned: sign it with `governor passport sign`, or admit it with --allow-unsigned-passport)" \
            if unsigned else ""
        raise StartupError(f"passport {path} refused at admission{hint}", report)
    pricing = settings.pricing or "genai-prices and the bundled overrides"
    try:  # genai-prices, under the bundled overrides, under the operator's (governor.runtime.prices)
        limits = compile_limits(report.pinned.document, tier=settings.tier, pricing=price_book(settings.pricing),
                                passport_digest=report.digest)
    except Exception as exc:  # LimitsError, PricingError: say which file and why
        raise StartupError(f"cannot compile the limits of {path} (pricing {pricing}): {exc}") from None
    from governor.policy.degradation import legacy_degradation_names

    for old in legacy_degradation_names(report.pinned.document.get("runtime")):
        log.warning("passport %s: runtime.degradation.%s is a deprecated cause name: it is read as %s "
                    "(docs/reference/deciding.md)", path, old, canonical_cause(old))
    if report.unsigned:  # only with allow_unsigned_passport: the fail-open override is in every record's header
        log.warning("passport %s is UNSIGNED, admitted by --allow-unsigned-passport: every record names it "
                    "(limits.%s)", path, UNSIGNED_PASSPORT_MEMBER)
        limits = dataclasses.replace(limits, summary={**limits.summary, UNSIGNED_PASSPORT_MEMBER: UNSIGNED_PASSPORT})
    from governor.runtime.resume import archive_passport

    try:  # a session admitted with this passport keeps its limits across a restart with another
        archive_passport(settings.data_dir, report.digest, report.pinned.canonical_bytes)
    except OSError as exc:
        raise StartupError(f"cannot archive the admitted passport in {settings.data_dir}: {exc}") from None
    try:  # <data-dir>/keys: private key (0600), public key, did.json for auditors (§8.2)
        key, governor_id = ensure_governor_key(settings.data_dir, settings.governor_id)
    except (EvidenceError, OSError, ValueError) as exc:
        raise StartupError(f"governor key in {settings.data_dir / 'keys'}: {exc}") from None
    location = settings.store or settings.data_dir / "state.db"
    try:
        store = open_store(location)
    except Exception as exc:  # StoreError, a bad URL: nothing can be decided without state
        raise StartupError(f"state store {location}: {exc}") from None
    transparency_log = None
    if settings.log:
        from governor.evidence.translog import LogError, TransparencyLog, default_origin

        try:  # before the runtime finalizes what a stop left: a record logged but not in place is put there
            transparency_log = TransparencyLog(
                settings.data_dir, key, settings.log_origin or default_origin(governor_id),
                checkpoint_entries=settings.log_checkpoint_entries,
                checkpoint_seconds=settings.log_checkpoint_seconds)
        except (LogError, EvidenceError, OSError, ValueError) as exc:
            raise StartupError(f"transparency log in {settings.data_dir / 'log'}: {exc}") from None
    witnessing = None
    if settings.witnesses:
        from governor.evidence.tlog.note import NoteError, parse_vkey
        from governor.evidence.witnessing import WitnessEndpoint, Witnessing

        if transparency_log is None:
            raise StartupError("--witness needs the transparency log (--log on)")
        try:
            witnessing = Witnessing(transparency_log, [WitnessEndpoint(url, parse_vkey(vkey))
                                                       for url, vkey in settings.witnesses],
                                    quorum=settings.witness_quorum, wait_seconds=settings.witness_wait)
        except (NoteError, ValueError) as exc:
            raise StartupError(f"--witness: {exc}") from None
    runtime = Runtime(limits=limits, store=store, data_dir=settings.data_dir, key=key,
                      governor_id=governor_id, agent_id=report.pinned.id or report.pinned.name, metrics=metrics,
                      session_idle_sec=settings.session_idle, pinned=report.pinned, owns_store=True,
                      persona_idle_sec=settings.persona_idle, transparency_log=transparency_log,
                      witnessing=witnessing)
    runtime.admission = report  # shown at startup: warnings such as trust on first use
    runtime.limit_rates(settings.rate_limits)
    runtime.settings.duplicates = watch_duplicates(store, governor_id=governor_id, public_key=key.public_key(),
                                                   log_origin=settings.log_origin, metrics=metrics)
    if settings.envelope is not None:
        runtime.envelope.config = settings.envelope
    runtime.start()
    if witnessing is not None:
        witnessing.on_alarm = witness_alarm(runtime)
        witnessing.start()
    return runtime
