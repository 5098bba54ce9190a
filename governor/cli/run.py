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
from governor.cli.banner import instructions
from governor.cli.barrier_options import BARRIER_OPTIONS, apply_barrier_settings
from governor.cli.identity_options import IDENTITY_OPTIONS, apply_identity_settings
from governor.cli.envelope_options import ENVELOPE_OPTIONS, apply_envelope_settings
from governor.cli.log_options import LOG_OPTIONS, apply_log_settings
from governor.cli.option_values import Origins, address, load_config, scalar, seconds, whole_number
from governor.cli.run_checks import WEBHOOK_SECRET_ENV  # noqa: F401 (re-exported: tests, the chart's checks)
from governor.cli.run_checks import (WEBHOOK_FILE_SETTINGS, allow_list, audio_floor, deployments, file_switch, file_text,
                                     fitting, routes, session_settings, store_location, tokens_estimate, webhooks)
from governor.cli.run_files import ensure_control_token, ensure_reviewer_token, write_control_file
from governor.cli.run_logging import configure_logging, log_format, log_level
from governor.cli.workers import WORKER_OPTIONS, apply_worker_settings, supervise
from governor.cli.passport_options import PASSPORT_OPTIONS, SWITCH_OPTIONS, apply_passport_settings

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
                "comma-separated, or none (default on_governor_session_integrity)"),
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
    "pricing": ("GOVERNOR_PRICING", "price overrides over genai-prices and the bundled ones (docs/reference/pricing.md)"),
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
    **IDENTITY_OPTIONS,  # rate limits, the agent's identity (governor/cli/identity_options.py)
    **WORKER_OPTIONS,  # --workers N (governor/cli/workers.py)
    **PASSPORT_OPTIONS,  # admitting an unsigned passport (governor/cli/passport_options.py)
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

REPEATABLE = {"webhook", "allow", "witness", "rate_limit"}


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run", help="run the governor: the intercepting proxy and its control plane",
        description="Run the governor on an admitted passport: an intercepting proxy that governs the "
        "agent's LLM, MCP and A2A traffic, and the control plane (sessions, approvals, records). "
        "Each option can also be set with its environment variable or in the --config file.",
    )
    for name, (env, text) in OPTIONS.items():
        run.add_argument("--" + name.replace("_", "-"), dest=name, metavar=name.split("_")[-1].upper(),
                         help=f"{text} [${env}]", **({"action": "append"} if name in REPEATABLE else
                                                     {"nargs": "?", "const": "yes"} if name in SWITCH_OPTIONS else {}))
    run.set_defaults(func=run_command)


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Any:
    """Settings from the command line, then the environment, then the config file; a bad value
    is refused naming the flag, the variable or the config key it came from."""
    origins = Origins(OPTIONS)
    try:
        return _settings(args, environ, origins)
    except UsageError as exc:
        raise UsageError(origins.relabel(str(exc))) from None


def _settings(args: argparse.Namespace, environ: Mapping[str, str], origins: Origins) -> Any:
    from governor.adapters import Route
    from governor.adapters.base import AdapterConfig
    from governor.policy.steps import Tier
    from governor.proxy.server import Settings

    def given(name: str) -> Any:
        value = getattr(args, name, None)
        if value is None:
            value = environ.get(OPTIONS[name][0]) or None
            origins.note(name, "env")
        else:
            origins.note(name, "flag")
        return value

    origins.config_path = config_path = given("config")
    file = load_config(Path(config_path)) if config_path else {}
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
        raise UsageError(f"config {config_path}: unknown settings {', '.join(sorted(unknown))} "
                         "(the keys are in docs/reference/configuration.md)")

    def value(name: str) -> Any:
        v = given(name) if name in OPTIONS else None
        if v is None and file.get(name) is not None:
            origins.note(name, "file")
            return scalar(name, file[name], "file", REPEATABLE)
        return v

    settings = Settings()
    if (passport := value("passport")) is not None:
        settings.passport = Path(str(passport))
        if not settings.passport.is_file():
            raise UsageError(f"--passport: no such file {passport}")
    if (listen := value("listen")) is not None:
        settings.listen = address(listen, "--listen")
    if (control := value("control")) is not None:
        settings.control = None if str(control).lower() == "off" else address(control, "--control")
    if (hosts := value("control_host")) is not None:
        names = hosts if isinstance(hosts, list) else str(hosts).split(",")
        settings.control_hosts = tuple(str(h).strip() for h in names if str(h).strip())
    if (mode := value("mode")) is not None:
        if mode != "regular" and not str(mode).startswith("reverse:"):
            raise UsageError(f"--mode: expected regular or reverse:URL, got {mode!r}")
        settings.mode = mode
    if (transparent := value("transparent")) is not None:
        settings.transparent = address(transparent, "--transparent")
    if (data_dir := value("data_dir")) is not None:
        settings.data_dir = Path(str(data_dir))
        if not str(data_dir).strip() or settings.data_dir.exists() and not settings.data_dir.is_dir():
            raise UsageError(f"--data-dir: not a directory: {data_dir!r}")
    if (tier := value("tier")) is not None:
        try:
            settings.tier = Tier(str(tier).upper())
        except ValueError:
            raise UsageError(f"--tier: expected R1, R2 or R3, got {tier!r}") from None
    if (idle := value("session_idle")) is not None:
        settings.session_idle = seconds(idle, "--session-idle")
    if (unknown_traffic := value("unknown_traffic")) is not None:
        if unknown_traffic not in ("forward", "deny"):
            raise UsageError(f"--unknown-traffic: expected forward or deny, got {unknown_traffic!r}")
        settings.unknown_traffic = unknown_traffic
    if (session := value("session")) is not None:
        if not str(session).strip() or any(c.isspace() or ord(c) < 0x20 for c in str(session)):
            raise UsageError(f"--session: a name without spaces or control characters, got {session!r}")
        settings.session = str(session)
    session_settings(settings, value)
    if (ca := value("upstream_ca")) is not None:
        settings.upstream_ca = Path(str(ca))
        if not settings.upstream_ca.is_file():
            raise UsageError(f"--upstream-ca {ca}: no such file")
    if (timeout := value("upstream_timeout")) is not None:
        settings.upstream_timeout = seconds(timeout, "--upstream-timeout")
    for name in ("client_header_timeout", "client_body_timeout", "client_idle_timeout"):
        if (timeout := value(name)) is not None:
            setattr(settings, name, seconds(timeout, "--" + name.replace("_", "-")))
    if (cap := value("max_client_connections")) is not None:
        settings.max_client_connections = whole_number(cap, "--max-client-connections", least=1)
    if (per_session := value("metrics_per_session")) is not None:
        settings.metrics_per_session = whole_number(per_session, "--metrics-per-session")
    if (pricing := value("pricing")) is not None:
        settings.pricing = Path(str(pricing))
        if not settings.pricing.is_file():
            raise UsageError(f"--pricing: no such file {pricing}")
    if (persona_idle := value("persona_idle")) is not None:
        settings.persona_idle = seconds(persona_idle, "--persona-idle")
    if (review_hold := value("review_hold_seconds")) is not None:
        settings.review_hold = seconds(review_hold, "--review-hold-seconds")
    if (retry_after := value("review_retry_after")) is not None:
        settings.review_retry_after = seconds(retry_after, "--review-retry-after")
    if (store := value("store")) is not None:
        settings.store = store_location(store)
    if (drain := value("drain_timeout")) is not None:
        settings.drain_timeout = seconds(drain, "--drain-timeout")
    settings.upstream_insecure = file_switch(file, "upstream_insecure", False, config_path)
    if "tick_interval" in file:
        tick = file["tick_interval"]
        if isinstance(tick, bool) or not isinstance(tick, (int, float)) or not 0 <= tick < float("inf"):
            raise UsageError(f"config {config_path}: tick_interval must be a number of seconds >= 0 (0: no in-flight ticks)")
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
    if (identifier := value("id") or file_text(file, "governor_id", config_path)) is not None:
        settings.governor_id = str(identifier)
    apply_log_settings(settings, value)
    apply_identity_settings(settings, value)
    apply_worker_settings(settings, value)
    apply_passport_settings(settings, value)
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
    settings.allow = allow_list(value, config_path)
    settings.routes = routes(file, Route, config_path)
    try:
        settings.adapters = AdapterConfig(
            **tokens_estimate(file, config_path),
            inject_stream_usage=file_switch(file, "inject_stream_usage", True, config_path),
            **fitting(value),
            extra={"deployments": deployments(file.get("deployments")), **audio_floor(file)},
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"config {config_path}: {exc}") from None
    if (secrets := value("realtime_client_secrets")) is not None:
        if secrets not in ("refuse", "allow"):
            raise UsageError(f"--realtime-client-secrets: expected refuse or allow, got {secrets!r}")
        import dataclasses

        settings.adapters = dataclasses.replace(
            settings.adapters, extra={**settings.adapters.extra, "realtime_client_secrets": secrets})
    settings.webhooks = webhooks(value, file, environ, config_path)
    from governor.control.auth import TokenConfigError, load_control_token, load_reviewer_tokens

    try:
        reviewer_file = value("reviewer_tokens")
        settings.reviewer_tokens = load_reviewer_tokens(None if reviewer_file is None else str(reviewer_file), environ)
    except TokenConfigError as exc:
        where = "--reviewer-tokens: " if str(exc).startswith("reviewer token file") else ""
        raise UsageError(where + str(exc)) from None
    try:
        settings.control_token = load_control_token(file_text(file, "control_token", config_path), environ)
    except TokenConfigError as exc:
        where = f"config {config_path}: control_token" if "control_token" in file else "$GOVERNOR_CONTROL_TOKEN"
        raise UsageError(f"{where}: {exc}") from None
    apply_barrier_settings(settings, value)
    apply_envelope_settings(settings, value)
    return settings


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


def run_command(args: argparse.Namespace) -> int:
    configure_logging(log_level(args), log_format(args))
    settings = resolve(args)
    if settings.workers > 1:  # a supervisor of N workers (governor/cli/workers.py)
        return supervise(settings)
    return asyncio.run(_serve_until_stopped(settings, args))
