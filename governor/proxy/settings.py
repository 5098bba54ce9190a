"""What a governor is told to do (`Settings`: CLI flags, GOVERNOR_* variables, --config file)
and how it says it cannot start (`StartupError`). `governor.proxy.server.serve` runs them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from governor.adapters import Route
from governor.adapters.allow import AllowEntry
from governor.adapters.base import AdapterConfig
from governor.policy.steps import Tier
from governor.proxy.connections import DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT
from governor.proxy.drain import DEFAULT_GRACE_SEC

CA_FILE = "mitmproxy-ca-cert.pem"


class StartupError(Exception):
    """The governor cannot start (a passport refused at admission, a port in use, ...)."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


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
    tick_interval: float = 1.0  # the proxy's in-flight wall-clock ticks (0: none); not the sweeper's period
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
    # which worker of `governor run --workers N` this process is (None: not one): its log's
    # origin is the governor's with "/worker-K", so N logs under one key never fork one origin
    worker: int | None = None
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
