"""`governor run`: start the proxy (the enforcement point) and the control plane.

Every option has an environment variable (GOVERNOR_<OPTION>, e.g. GOVERNOR_LISTEN)
and a key in the --config YAML file (the option name with underscores); the command
line wins over the environment, which wins over the file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any, Mapping

from governor.cli import UsageError
from governor.cli.barrier_options import BARRIER_OPTIONS, apply_barrier_settings
from governor.cli.envelope_options import ENVELOPE_OPTIONS, apply_envelope_settings
from governor.cli.log_options import LOG_OPTIONS, apply_log_settings

# option name -> (environment variable, help)
OPTIONS: dict[str, tuple[str, str]] = {
    "passport": ("GOVERNOR_PASSPORT", "the ADL passport to enforce (default: the bundled example)"),
    "config": ("GOVERNOR_CONFIG", "a YAML file of settings (keys: these options, plus routes, ...)"),
    "listen": ("GOVERNOR_LISTEN", "proxy address HOST:PORT (default 127.0.0.1:8080)"),
    "control": ("GOVERNOR_CONTROL", "control plane address HOST:PORT, or 'off' (default 127.0.0.1:8081)"),
    "control_host": ("GOVERNOR_CONTROL_HOST", "extra Host names the control plane answers to, comma-separated "
                     "(default: its listen address, localhost, 127.0.0.1, ::1; '*': any)"),
    "mode": ("GOVERNOR_MODE", "regular (explicit HTTPS_PROXY, default) or reverse:URL (agent's base URL = the proxy)"),
    "transparent": ("GOVERNOR_TRANSPARENT", "a second proxy listener HOST:PORT in transparent mode, for the "
                    "connections iptables redirects to it (Linux; the chart's interception option)"),
    "data_dir": ("GOVERNOR_DATA_DIR", "state, journals, records, the governor key and the CA (default ./.governor)"),
    "tier": ("GOVERNOR_TIER", "R1 observe, R2 enforce (default), R3 enforce + anomaly monitoring"),
    "session_idle": ("GOVERNOR_SESSION_IDLE", "end a session idle this many seconds (default 900)"),
    "unknown_traffic": ("GOVERNOR_UNKNOWN_TRAFFIC", "traffic no adapter governs and no --allow entry names: deny "
                        "(default: refused 403, recorded) or forward (ungoverned: uncounted, unrecorded, logged)"),
    "allow": ("GOVERNOR_ALLOW", "a destination that spends nothing, let through although no adapter governs it: "
              "[METHODS ]HOST[/PATH] (globs: * within a label or segment, ** across segments), e.g. pypi.org or "
              "'GET api.internal/status/**'; repeat the option, or comma-separate in the variable; a list in "
              "the config file (allow:)"),
    "session": ("GOVERNOR_SESSION", "the name of the default session (requests without an ADL-Session token; "
                "default: generated, one per process)"),
    "sessions": ("GOVERNOR_SESSIONS", "who opens sessions: principal (default: `governor sessions open` / POST "
                 "/v1/sessions issue tokens) or agent-named (any ADL-Session value opens one: trusts the agent, "
                 "capped by --agent-sessions-per-day)"),
    "default_session": ("GOVERNOR_DEFAULT_SESSION", "requests without a session token: auto (default: a default "
                        "session until a principal opens one here), on, or off (refused)"),
    "agent_sessions_per_day": ("GOVERNOR_AGENT_SESSIONS_PER_DAY", "agent-named mode: sessions the agent may open "
                               "per rolling day (default 100)"),
    "lock_on": ("GOVERNOR_LOCK_ON", "halt causes that also lock every session until a principal lifts the lock, "
                "comma-separated, or none (default on_session_integrity)"),
    "upstream_ca": ("GOVERNOR_UPSTREAM_CA", "an extra CA bundle to trust for upstream TLS"),
    "upstream_timeout": ("GOVERNOR_UPSTREAM_TIMEOUT", "seconds an upstream may stay silent (default 300)"),
    "client_header_timeout": ("GOVERNOR_CLIENT_HEADER_TIMEOUT", "seconds a new client connection has to send its "
                              "first request's headers (default 30)"),
    "client_body_timeout": ("GOVERNOR_CLIENT_BODY_TIMEOUT", "seconds a request body has to arrive after its headers "
                            "(default 120)"),
    "client_idle_timeout": ("GOVERNOR_CLIENT_IDLE_TIMEOUT", "seconds a keep-alive client connection may sit idle "
                            "(default 60)"),
    "max_client_connections": ("GOVERNOR_MAX_CLIENT_CONNECTIONS", "client connections open at once (default: from "
                               "the file-descriptor limit, about 7/16 of it); over it the longest-waiting idle one is "
                               "closed, or the newcomer refused"),
    "pricing": ("GOVERNOR_PRICING", "the cost model (default policies/pricing.yaml)"),
    "fit_output": ("GOVERNOR_FIT_OUTPUT", "on (default) or off: lower a model call's output limit (max_tokens, "
                   "...) to what its budgets leave, and give a call naming none its reservation's (docs/fitting.md)"),
    "fit_floor": ("GOVERNOR_FIT_FLOOR", "the smallest output limit, in tokens per answer, a call is fitted to; "
                  "a call that fits only below it is refused as budget-exhausted (default 256)"),
    "realtime_client_secrets": ("GOVERNOR_REALTIME_CLIENT_SECRETS", "refuse (default) or allow: minting an ephemeral "
                                "OpenAI Realtime key (POST /v1/realtime/client_secrets, /sessions, ...), which lets a "
                                "client talk to the provider directly, ungoverned (docs/realtime.md)"),
    "persona_idle": ("GOVERNOR_PERSONA_IDLE", "end a persona instance idle this many seconds (default 60)"),
    "store": ("GOVERNOR_STORE", "state store: a path or sqlite://PATH (SQLite, counters written behind; ?shared=true: several processes share the file), redis://HOST:PORT/DB, redis+sentinel://HOST:PORT[,...]/SERVICE[/DB], redis+cluster://HOST:PORT[,...] (?timeout=, ?wait=N replicas: docs/reference/stores.md) or memory:"),
    "reviewer_tokens": ("GOVERNOR_REVIEWER_TOKENS_FILE", "file of reviewer tokens (one a line) for approvals"),
    "review_hold_seconds": ("GOVERNOR_REVIEW_HOLD_SECONDS", "hold a connection whose step awaits a reviewer at most "
                            "this long, less when the client's X-Stainless-Read-Timeout is shorter, then answer 429 "
                            "review_pending (default 300; docs/oversight.md)"),
    "review_retry_after": ("GOVERNOR_REVIEW_RETRY_AFTER", "the Retry-After seconds of a 429 review_pending "
                           "(default 10)"),
    **LOG_OPTIONS,  # the transparency log (governor/cli/log_options.py)
    **BARRIER_OPTIONS,  # who may lift a lock (governor/cli/barrier_options.py)
    **ENVELOPE_OPTIONS,  # the R3 statistical envelope (governor/cli/envelope_options.py)
    "id": ("GOVERNOR_ID", "the governor's identifier in its records and did.json (HTTPS URI or did:web; "
           "default: the key's did.json, else did:web:localhost:governor)"),
    "metrics_per_session": ("GOVERNOR_METRICS_PER_SESSION", "export budget series labelled by session (the agent's "
                            "ADL-Session value) for at most this many live sessions (default 0: none; every other "
                            "label is a closed set)"),
    "webhook": ("GOVERNOR_WEBHOOKS", "a URL to POST signed notifications to (a review waiting, a halt, a lock, a "
                "budget warning): repeat the option, or comma-separate in the variable; a list in the config file"),
    "webhook_secret_file": ("GOVERNOR_WEBHOOK_SECRET_FILE", "the file holding the webhooks' HMAC secret (or the "
                            "secret itself in $GOVERNOR_WEBHOOK_SECRET); required with --webhook"),
    "log_level": ("GOVERNOR_LOG_LEVEL", "log level of every logger, mitmproxy's included (default: INFO for the "
                  "governor's own, WARNING for mitmproxy's, which otherwise logs every connection and stream)"),
    "drain_timeout": ("GOVERNOR_DRAIN_TIMEOUT", "on SIGTERM, seconds the calls in flight (streams too) may take to "
                      "finish while new requests are refused 503, before they are cut (default 25: under "
                      "Kubernetes' 30 s grace period); a second SIGTERM or SIGINT stops at once"),
    "log_format": ("GOVERNOR_LOG_FORMAT", "text (default) or json: one JSON object per line (timestamp, level, "
                   "logger, message and the call's extras such as session and cause)"),
}

REPEATABLE = {"webhook", "allow", "witness"}
WEBHOOK_SECRET_ENV = "GOVERNOR_WEBHOOK_SECRET"
WEBHOOK_FILE_SETTINGS = ("webhook_timeout", "webhook_attempts", "webhook_backoff", "webhook_queue")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run", help="run the governor: the intercepting proxy and its control plane",
        description="Run the governor on an admitted passport: an intercepting proxy that governs the "
        "agent's LLM, MCP and A2A traffic, and the control plane (sessions, approvals, records). "
        "Each option can also be set with its environment variable or in the --config file.",
    )
    for name, (env, text) in OPTIONS.items():
        run.add_argument("--" + name.replace("_", "-"), dest=name, metavar=name.split("_")[-1].upper(),
                         help=f"{text} [${env}]", **({"action": "append"} if name in REPEATABLE else {}))
    run.set_defaults(func=run_command)


def _address(value: str, what: str) -> tuple[str, int]:
    host, sep, port = str(value).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"{what}: expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _number(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what}: expected a number of seconds, got {value!r}") from None
    if number <= 0:
        raise UsageError(f"{what}: must be positive")
    return number


def _load_config(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config {path}: expected a mapping of settings")
    return data


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Any:
    """Settings from the command line, then the environment, then the config file."""
    from governor.adapters import Route
    from governor.adapters.base import AdapterConfig
    from governor.policy.steps import Tier
    from governor.proxy.server import Settings

    def given(name: str) -> Any:
        value = getattr(args, name, None)
        if value is None:
            value = environ.get(OPTIONS[name][0]) or None
        return value

    config_path = given("config")
    file = _load_config(Path(config_path)) if config_path else {}
    known = set(OPTIONS) | {"routes", "upstream_insecure", "tick_interval", "max_body_bytes", "default_output_tokens",
                            "bytes_per_token", "inject_stream_usage", "governor_id", "control_token",
                            "peers", "delegation_depth"}
    known |= {"max_response_bytes", "max_decoded_ratio"}  # bounds of compressed bodies (docs/wire-protocols.md)
    known |= {"max_held_stream_bytes"}  # a stream's output kept back during an admission (docs/wire-protocols.md)
    known |= {"audio_bytes_per_second"}  # transcriptions reserved by upload size (docs/reference/pricing.md)
    known |= set(WEBHOOK_FILE_SETTINGS)  # docs/notifications.md
    known |= {"deployments"}  # Azure OpenAI deployment -> model it is priced as (docs/reference/compat.md)
    unknown = set(file) - known
    if unknown:
        raise UsageError(f"config {config_path}: unknown settings {', '.join(sorted(unknown))}")

    def value(name: str) -> Any:
        v = given(name) if name in OPTIONS else None
        return v if v is not None else file.get(name)

    settings = Settings()
    if (passport := value("passport")) is not None:
        settings.passport = Path(passport)
        if not settings.passport.is_file():
            raise UsageError(f"passport {passport}: no such file")
    if (listen := value("listen")) is not None:
        settings.listen = _address(listen, "--listen")
    if (control := value("control")) is not None:
        settings.control = None if str(control).lower() == "off" else _address(control, "--control")
    if (hosts := value("control_host")) is not None:
        names = hosts if isinstance(hosts, list) else str(hosts).split(",")
        settings.control_hosts = tuple(str(h).strip() for h in names if str(h).strip())
    if (mode := value("mode")) is not None:
        if mode != "regular" and not str(mode).startswith("reverse:"):
            raise UsageError(f"--mode: expected regular or reverse:URL, got {mode!r}")
        settings.mode = mode
    if (transparent := value("transparent")) is not None:
        settings.transparent = _address(transparent, "--transparent")
    if (data_dir := value("data_dir")) is not None:
        settings.data_dir = Path(data_dir)
    if (tier := value("tier")) is not None:
        try:
            settings.tier = Tier(str(tier).upper())
        except ValueError:
            raise UsageError(f"--tier: expected R1, R2 or R3, got {tier!r}") from None
    if (idle := value("session_idle")) is not None:
        settings.session_idle = _number(idle, "--session-idle")
    if (unknown_traffic := value("unknown_traffic")) is not None:
        if unknown_traffic not in ("forward", "deny"):
            raise UsageError(f"--unknown-traffic: expected forward or deny, got {unknown_traffic!r}")
        settings.unknown_traffic = unknown_traffic
    if (session := value("session")) is not None:
        settings.session = str(session)
    _session_settings(settings, value)
    if (ca := value("upstream_ca")) is not None:
        settings.upstream_ca = Path(ca)
        if not settings.upstream_ca.is_file():
            raise UsageError(f"--upstream-ca {ca}: no such file")
    if (timeout := value("upstream_timeout")) is not None:
        settings.upstream_timeout = _number(timeout, "--upstream-timeout")
    for name in ("client_header_timeout", "client_body_timeout", "client_idle_timeout"):
        if (seconds := value(name)) is not None:
            setattr(settings, name, _number(seconds, "--" + name.replace("_", "-")))
    if (cap := value("max_client_connections")) is not None:
        if not str(cap).isdigit() or int(cap) < 1:
            raise UsageError(f"--max-client-connections: expected a whole number >= 1, got {cap!r}")
        settings.max_client_connections = int(cap)
    if (per_session := value("metrics_per_session")) is not None:
        if not str(per_session).isdigit():
            raise UsageError(f"--metrics-per-session: expected a whole number >= 0, got {per_session!r}")
        settings.metrics_per_session = int(per_session)
    if (pricing := value("pricing")) is not None:
        settings.pricing = Path(pricing)
    if (persona_idle := value("persona_idle")) is not None:
        settings.persona_idle = _number(persona_idle, "--persona-idle")
    if (review_hold := value("review_hold_seconds")) is not None:
        settings.review_hold = _number(review_hold, "--review-hold-seconds")
    if (retry_after := value("review_retry_after")) is not None:
        settings.review_retry_after = _number(retry_after, "--review-retry-after")
    if (store := value("store")) is not None:
        settings.store = str(store)
    if (drain := value("drain_timeout")) is not None:
        settings.drain_timeout = _number(drain, "--drain-timeout")
    settings.upstream_insecure = bool(file.get("upstream_insecure", False))
    if "tick_interval" in file:
        tick = file["tick_interval"]
        if isinstance(tick, bool) or not isinstance(tick, (int, float)) or not 0 <= tick < float("inf"):
            raise UsageError(f"config {config_path}: tick_interval must be a number of seconds >= 0 (0: no ticks)")
        settings.tick_interval = float(tick)
    for key in ("max_body_bytes", "max_response_bytes"):  # -1 or 0 would refuse (or pass) every body
        if key in file:
            bound = file[key]
            if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
                raise UsageError(f"config {config_path}: {key} must be a whole number of bytes >= 1, got {bound!r}")
            setattr(settings, key, bound)
    if "max_decoded_ratio" in file:
        ratio = file["max_decoded_ratio"]
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio < 1:
            raise UsageError(f"config {config_path}: max_decoded_ratio must be a number >= 1")
        settings.max_decoded_ratio = float(ratio)
    if "max_held_stream_bytes" in file:
        held = file["max_held_stream_bytes"]
        if isinstance(held, bool) or not isinstance(held, int) or held < 1:
            raise UsageError(f"config {config_path}: max_held_stream_bytes must be a whole number of bytes >= 1")
        settings.max_held_stream_bytes = held
    if (identifier := value("id") or file.get("governor_id")) is not None:
        settings.governor_id = str(identifier)
    apply_log_settings(settings, value)
    peers = file.get("peers") or {}
    if not isinstance(peers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in peers.items()):
        raise UsageError(f"config {config_path}: peers must map peer URL prefixes to passport files")
    for prefix, passport_file in peers.items():
        if not Path(passport_file).is_file():
            raise UsageError(f"config {config_path}: peers[{prefix!r}]: no such file {passport_file}")
    settings.peers = dict(peers)
    if "delegation_depth" in file:
        depth = file["delegation_depth"]
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise UsageError(f"config {config_path}: delegation_depth must be a whole number >= 0")
        settings.delegation_depth = depth
    settings.allow = _allow_list(value, config_path)
    try:
        settings.routes = tuple(Route.parse(r) for r in file.get("routes") or ())
        settings.adapters = AdapterConfig(
            bytes_per_token=float(file.get("bytes_per_token", 4.0)),
            default_output_tokens=int(file.get("default_output_tokens", 4096)),
            inject_stream_usage=bool(file.get("inject_stream_usage", True)),
            **_fitting(value),
            extra={"deployments": _deployments(file.get("deployments")), **_audio_floor(file)},
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"config {config_path}: {exc}") from None
    if (secrets := value("realtime_client_secrets")) is not None:
        if secrets not in ("refuse", "allow"):
            raise UsageError(f"--realtime-client-secrets: expected refuse or allow, got {secrets!r}")
        import dataclasses

        settings.adapters = dataclasses.replace(
            settings.adapters, extra={**settings.adapters.extra, "realtime_client_secrets": secrets})
    settings.webhooks = _webhooks(value, file, environ, config_path)
    from governor.control.auth import TokenConfigError, load_control_token, load_reviewer_tokens

    try:
        settings.reviewer_tokens = load_reviewer_tokens(value("reviewer_tokens"), environ)
        settings.control_token = load_control_token(file.get("control_token"), environ)
    except TokenConfigError as exc:
        raise UsageError(str(exc)) from None
    apply_barrier_settings(settings, value)
    apply_envelope_settings(settings, value)
    return settings


def _deployments(value: Any) -> dict[str, str]:
    """The config file's `deployments`: Azure OpenAI deployment names to the models they serve."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and isinstance(v, str) and v
                                              for k, v in value.items()):
        raise ValueError("deployments must map Azure deployment names to model names (non-empty strings)")
    return dict(value)


def _allow_list(value: Any, config_path: Any) -> tuple[Any, ...]:
    """--allow (repeated), $GOVERNOR_ALLOW (comma-separated) or the config file's `allow` list:
    the operator's allow-list (governor.adapters.allow)."""
    from governor.adapters.allow import AllowEntry

    from governor.adapters.allow import HTTP_METHODS

    entries = value("allow")
    if entries is None:
        return ()
    if isinstance(entries, str):  # the variable: comma-separated, "GET,HEAD host/path" kept whole
        entries, pieces = [], [piece.strip() for piece in entries.split(",") if piece.strip()]
        pending = ""
        for piece in pieces:
            if piece.upper() in HTTP_METHODS:  # a method of the next entry's list
                pending += piece + ","
                continue
            entries.append(pending + piece)
            pending = ""
    if not isinstance(entries, list):
        raise UsageError(f"config {config_path}: allow must be a list of entries (HOST[/PATH] or "
                         "{host, path, methods})")
    try:
        return tuple(AllowEntry.parse(entry) for entry in entries)
    except ValueError as exc:
        raise UsageError(f"--allow: {exc}") from None


def _fitting(value: Any) -> dict[str, Any]:
    """--fit-output and --fit-floor as AdapterConfig fields (only those given)."""
    fields: dict[str, Any] = {}
    if (fit := value("fit_output")) is not None:
        fit = {True: "on", False: "off"}.get(fit, str(fit).lower())  # YAML reads on/off as booleans
        if fit not in ("on", "off"):
            raise UsageError(f"--fit-output: expected on or off, got {fit!r}")
        fields["fit_output"] = fit == "on"
    if (floor := value("fit_floor")) is not None:
        if isinstance(floor, bool) or not str(floor).isdigit() or int(floor) < 1:
            raise UsageError(f"--fit-floor: expected a whole number of tokens >= 1, got {floor!r}")
        fields["fit_floor"] = int(floor)
    return fields


def _audio_floor(file: dict) -> dict:
    """`audio_bytes_per_second`: the most bytes a second of uploaded audio is assumed to take
    (docs/reference/pricing.md); the media adapter reserves transcriptions by it."""
    if "audio_bytes_per_second" not in file:
        return {}
    floor = file["audio_bytes_per_second"]
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor < float("inf"):
        raise ValueError("audio_bytes_per_second must be a positive number of bytes")
    return {"audio_bytes_per_second": float(floor)}


def _webhooks(value: Any, file: Mapping[str, Any], environ: Mapping[str, str], config_path: Any) -> Any:
    """The WebhookConfig of --webhook (and its secret, and the config file's webhook_* tuning), or None."""
    from governor.notify.webhooks import WebhookConfig, WebhookConfigError

    urls = value("webhook")
    if urls is None:
        return None
    if isinstance(urls, str):
        urls = urls.replace(",", " ").split()
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise UsageError(f"config {config_path}: webhook must be a URL or a list of URLs")
    urls = [u.strip() for u in urls if u.strip()]
    if not urls:
        return None
    secret_file = value("webhook_secret_file")
    if secret_file is not None:
        try:
            secret = Path(secret_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--webhook-secret-file {secret_file}: {exc}") from None
    else:
        secret = environ.get(WEBHOOK_SECRET_ENV, "").strip()
    if not secret:
        raise UsageError(f"--webhook needs a secret to sign with: --webhook-secret-file FILE or ${WEBHOOK_SECRET_ENV}")
    tuning: dict[str, Any] = {}
    for key in WEBHOOK_FILE_SETTINGS:
        if key in file:
            number = file[key]
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                raise UsageError(f"config {config_path}: {key} must be a number")
            tuning[key.removeprefix("webhook_")] = int(number) if key in ("webhook_attempts", "webhook_queue") else float(number)
    try:
        return WebhookConfig(tuple(dict.fromkeys(urls)), secret, **tuning)
    except WebhookConfigError as exc:
        raise UsageError(str(exc)) from None


def _session_settings(settings: Any, value: Any) -> None:
    from governor.sessions.book import DEFAULT_MODES, MODES, parse_lock_causes

    if (mode := value("sessions")) is not None:
        if mode not in MODES:
            raise UsageError(f"--sessions: expected {' or '.join(MODES)}, got {mode!r}")
        settings.sessions = mode
    if (default := value("default_session")) is not None:
        default = {True: "on", False: "off"}.get(default, str(default).lower())  # YAML reads on/off as booleans
        if default not in DEFAULT_MODES:
            raise UsageError(f"--default-session: expected {', '.join(DEFAULT_MODES)}, got {default!r}")
        settings.default_session = default
    if (cap := value("agent_sessions_per_day")) is not None:
        try:
            settings.agent_sessions_per_day = int(cap)
        except (TypeError, ValueError):
            raise UsageError(f"--agent-sessions-per-day: expected a whole number, got {cap!r}") from None
        if settings.agent_sessions_per_day < 0:
            raise UsageError("--agent-sessions-per-day: must be >= 0")
    if (causes := value("lock_on")) is not None:
        try:
            settings.lock_on = parse_lock_causes(causes)
        except ValueError as exc:
            raise UsageError(f"--lock-on: {exc}") from None


CONTROL_TOKEN_FILE = "control-token"
CONTROL_FILE = "control.json"


def ensure_control_token(settings: Any) -> Path | None:
    """With a control plane and no control token configured: the one in
    <data-dir>/control-token (mode 0600), created on first run. Opening sessions and
    lifting locks always need a token; `governor sessions` finds it there. Returns the
    file when the token came from it."""
    if settings.control is None or settings.control_token:
        return None
    settings.control_token = _token_file(settings.data_dir / CONTROL_TOKEN_FILE, "control token")
    return settings.data_dir / CONTROL_TOKEN_FILE


REVIEWER_TOKEN_FILE = "reviewer-token"


def ensure_reviewer_token(settings: Any) -> Path | None:
    """With a control plane and no reviewer token configured: the one in
    <data-dir>/reviewer-token (mode 0600), created on first run, so a reviewer on this
    machine can answer approvals (`governor approvals` finds it there) instead of every
    held step timing out. Returns the file when the token came from it."""
    if settings.control is None or settings.reviewer_tokens:
        return None
    token = _token_file(settings.data_dir / REVIEWER_TOKEN_FILE, "reviewer token")
    settings.reviewer_tokens = (token,)
    return settings.data_dir / REVIEWER_TOKEN_FILE


def _token_file(path: Path, what: str) -> str:
    """The token in `path` (mode 0600), written with a fresh random one when missing or empty."""
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    except OSError as exc:
        raise UsageError(f"{what} file {path}: {exc.strerror or exc}") from None
    if not token:
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def write_control_file(running: Any) -> None:
    """<data-dir>/control.json: where this governor's control plane listens (for `governor sessions`)
    and its explicit proxy (for `governor exec`)."""
    import json

    if not running.control_url:
        return
    path = running.settings.data_dir / CONTROL_FILE
    tmp = path.with_name(path.name + ".tmp")
    # the explicit proxy too, for `governor exec` (not in reverse mode: no CONNECT there)
    proxy = {"proxy": running.proxy_url} if running.settings.mode == "regular" else {}
    tmp.write_text(json.dumps({"url": running.control_url, "pid": os.getpid(), **proxy}) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def instructions(running: Any) -> str:
    settings, runtime = running.settings, running.runtime
    data = settings.data_dir.resolve()
    lines = ["governor running"]
    report, pinned = getattr(runtime, "admission", None), getattr(runtime, "pinned", None)
    if report is not None and pinned is not None:
        lines.append(f"  passport:       {pinned.name} {pinned.version} ({settings.passport or 'bundled example'})")
        lines.append(f"                  digest {report.digest}")
        lines += [f"                  warning: {step.section} {step.message}" for step in report.warnings]
    limits = getattr(runtime, "limits", None)
    lines.append(f"  tier:           {limits.tier.value if limits is not None else settings.tier.value}")
    lines.append(f"  proxy:          {running.proxy_url} (mode {settings.mode})")
    if settings.transparent is not None:
        lines.append("  transparent:    {}:{} (connections redirected by iptables)".format(*settings.transparent))
    guard = getattr(running, "connections", None)
    if guard is not None:
        lines.append(f"  clients:        at most {guard.cap} connections; headers within {settings.client_header_timeout:g}s, "
                     f"bodies {settings.client_body_timeout:g}s, idle keep-alive closed after {settings.client_idle_timeout:g}s")
    if running.control_url:
        lines.append(f"  control plane:  {running.control_url}")
        token_file = getattr(running, "control_token_file", None)
        lines.append("  control token:  " + (f"{token_file} (mode 0600)" if token_file else "configured"))
        reviewer_file = getattr(running, "reviewer_token_file", None)
        lines.append("  approvals:      " + (f"reviewer token {reviewer_file} (mode 0600): governor approvals list "
                                             f"--data-dir {settings.data_dir}" if reviewer_file else
                                             f"{len(settings.reviewer_tokens)} reviewer token(s) configured"
                     if settings.reviewer_tokens else "no reviewer token configured (GOVERNOR_REVIEWER_TOKEN): "
                     "paused steps can only time out"))
    if settings.webhooks is not None:
        from governor.notify.webhooks import redacted

        lines.append("  webhooks:       " + ", ".join(redacted(u) for u in settings.webhooks.urls)
                     + " (signed; reviews waiting, halts, locks, budget warnings)")
    if settings.unknown_traffic == "forward":
        lines.append("  other traffic:  FORWARDED UNGOVERNED (--unknown-traffic forward): uncounted, unrecorded")
    else:
        allowed = ", ".join(entry.describe() for entry in settings.allow[:4]) + (", ..." if len(settings.allow) > 4 else "")
        lines.append("  other traffic:  refused (default deny), unless allowed: " + (allowed or "no --allow entry"))
    lines.append(f"  data:           {data}")
    if getattr(runtime, "governor_id", None):
        lines.append(f"  governor id:    {runtime.governor_id}")
        from governor.evidence.keys import KeyFiles

        keys = KeyFiles(data / "keys")
        lines.append(f"  records:        {data / 'records'}")
        lines.append(f"  verify with:    governor verify RECORD --key {keys.public_key}  (or --did-document {keys.did_document})")
    lines += session_lines(settings, running)
    lines.append("Set in the agent's environment:")
    lines += [f"  export {key}={value}" for key, value in running.agent_environment().items()]
    if not settings.mode.startswith("reverse:"):
        lines.append(f"An agent that ignores those (Node 20's fetch, the npm openai client): governor exec --data-dir {settings.data_dir} "
                     "-- node agent.js")
    lines.append("Ctrl-C stops.")
    return "\n".join(lines)


def session_lines(settings: Any, running: Any) -> list[str]:
    """How sessions are opened here (the banner): the operator must know how to start afresh."""
    data = settings.data_dir
    default = {"auto": "token-less requests use a default session until a principal opens one here",
               "on": "token-less requests use the default session",
               "off": "token-less requests are refused"}[settings.default_session]
    lines = [f"  sessions:       {settings.sessions}; {default}"]
    if settings.sessions == "agent-named":
        lines.append(f"                  agent-named: any ADL-Session value opens a session (trusts the agent; "
                     f"at most {settings.agent_sessions_per_day} a day)")
    if running.control_url:
        lines.append(f"  open a session: governor sessions open --data-dir {data}   (or POST {running.control_url}"
                     "/v1/sessions with the control token); the agent sends the token it returns as ADL-Session")
        lines.append("                  a halted session stays halted: open a new one; "
                     + (f"a lock ({', '.join(settings.lock_on)}) stops every session until "
                        f"`governor locks lift ID --by NAME --data-dir {data}`" if settings.lock_on else "no cause locks"))
    else:
        lines.append("  open a session: no control plane (--control off): only the default session is available")
    book = getattr(running, "sessions", None)
    if book is not None and book.locked:
        lines.append("  LOCKED:         " + "; ".join(f"{lock['id']} (session {lock['session']}, {lock['cause']})"
                                                     for lock in book.locks_view() if lock["state"] == "locked"))
    lines.append("  personas:       name them with the ADL-Persona request header")
    return lines


async def _serve_until_stopped(settings: Any, args: argparse.Namespace | None = None) -> int:
    from governor.proxy.server import StartupError, serve

    loop = asyncio.get_running_loop()
    # a SIGHUP while starting must not kill the process (its default): it is logged, not applied
    loop.add_signal_handler(signal.SIGHUP, _hup_while_starting)
    token_file = ensure_control_token(settings)
    reviewer_file = ensure_reviewer_token(settings)
    try:
        running = await serve(settings)
    except StartupError as exc:
        print(f"governor run: {exc}", file=sys.stderr)
        if exc.report is not None:
            from governor.passport import format_report

            print(format_report(settings.passport or Path("passport"), exc.report), file=sys.stderr)
        return 1
    running.control_token_file = token_file
    running.reviewer_token_file = reviewer_file
    write_control_file(running)
    print(instructions(running), flush=True)
    _freeze_startup_objects()
    from governor.cli.reload import Reloader, Shutdown

    shutdown = Shutdown(running)
    reloader = Reloader(running, _reader(args) if args is not None else None, shutdown=shutdown,
                        log_level=_level_or_none(args))
    loop.add_signal_handler(signal.SIGHUP, reloader.signalled)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, shutdown.signalled, sig)
    try:
        await shutdown.requested.wait()
        await shutdown.drain()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        # during the final stop a signal still stops at once, with no traceback: ignored
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, shutdown.ignored, sig)
        await reloader.settle()
        await running.stop()
    return 0


def _reader(args: argparse.Namespace) -> Any:
    """What a SIGHUP reads: the settings and log level as at start, the token files too."""
    def read() -> tuple[Any, str | None]:
        settings = resolve(args)
        level = log_level(args)
        ensure_control_token(settings)
        ensure_reviewer_token(settings)
        return settings, level

    return read


def _level_or_none(args: argparse.Namespace | None) -> str | None:
    try:
        return log_level(args) if args is not None else None
    except UsageError:
        return None


def _hup_while_starting() -> None:
    import logging

    logging.getLogger("governor").warning("governor: SIGHUP while starting: ignored (send it again once started)")


def _freeze_startup_objects() -> None:
    """Move everything start-up made (modules, schemas, the pinned passport, mitmproxy's
    addons and certificates) out of the cyclic GC's reach, as long-running servers do.

    They live as long as the process, yet every full collection walked all of them again:
    in `governor run` under load that was ~75 ms per full collection, about twice a bare
    mitmproxy's, and ~50 us per request of GC in all (README, Benchmarks). Frozen
    objects are still freed by reference counting; only cycles among them would stay,
    and start-up garbage is collected first."""
    import gc

    gc.collect()
    gc.freeze()


def log_level(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> str | None:
    """The --log-level setting (command line, environment, config file), or None when not set."""
    value = getattr(args, "log_level", None) or environ.get(OPTIONS["log_level"][0]) or None
    if value is None:
        config_path = getattr(args, "config", None) or environ.get(OPTIONS["config"][0]) or None
        value = _load_config(Path(config_path)).get("log_level") if config_path else None
    if value is None:
        return None
    level = str(value).upper()
    if level not in LOG_LEVELS:
        raise UsageError(f"--log-level: expected one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return level


def log_format(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> str:
    """The --log-format setting (command line, environment, config file): text or json."""
    value = getattr(args, "log_format", None) or environ.get(OPTIONS["log_format"][0]) or None
    if value is None:
        config_path = getattr(args, "config", None) or environ.get(OPTIONS["config"][0]) or None
        value = _load_config(Path(config_path)).get("log_format") if config_path else None
    value = str(value or "text").lower()
    if value not in LOG_FORMATS:
        raise UsageError(f"--log-format: expected text or json, got {value!r}")
    return value


def configure_logging(level: str | None, fmt: str = "text") -> None:
    """INFO for the governor's own loggers; mitmproxy's at WARNING unless a level is set.

    At INFO mitmproxy logs every client connection and every streamed response: a log
    record per request is measurable CPU on the proxy's hot path (bench/overhead.py)."""
    import logging

    if fmt == "json":
        from governor.common.logjson import JSONFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(JSONFormatter())
        logging.basicConfig(level=level or "INFO", handlers=[handler], force=True)
    else:
        logging.basicConfig(level=level or "INFO", format=LOG_FORMAT)
    logging.getLogger("mitmproxy").setLevel(level or "WARNING")


def run_command(args: argparse.Namespace) -> int:
    configure_logging(log_level(args), log_format(args))
    settings = resolve(args)
    return asyncio.run(_serve_until_stopped(settings, args))
