"""The checks behind `governor run`'s structured settings: the allow-list, output fitting, Azure
deployments, audio reservations, webhooks and the session options (each value refused with
an error naming its option; governor/cli/option_values.py says where it came from)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from governor.cli import UsageError
from governor.cli.option_values import whole_number

WEBHOOK_SECRET_ENV = "GOVERNOR_WEBHOOK_SECRET"
WEBHOOK_FILE_SETTINGS = ("webhook_timeout", "webhook_attempts", "webhook_backoff", "webhook_queue")


def deployments(value: Any) -> dict[str, str]:
    """The config file's `deployments`: Azure OpenAI deployment names to the models they serve."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and isinstance(v, str) and v
                                              for k, v in value.items()):
        raise ValueError("deployments must map Azure deployment names to model names (non-empty strings)")
    return dict(value)


def allow_list(value: Any, config_path: Any) -> tuple[Any, ...]:
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


def fitting(value: Any) -> dict[str, Any]:
    """--fit-output and --fit-floor as AdapterConfig fields (only those given)."""
    fields: dict[str, Any] = {}
    if (fit := value("fit_output")) is not None:
        fit = {True: "on", False: "off"}.get(fit, str(fit).lower())  # YAML reads on/off as booleans
        if fit not in ("on", "off"):
            raise UsageError(f"--fit-output: expected on or off, got {fit!r}")
        fields["fit_output"] = fit == "on"
    if (floor := value("fit_floor")) is not None:
        fields["fit_floor"] = whole_number(floor, "--fit-floor", least=1, unit="tokens")
    return fields


def audio_floor(file: dict) -> dict:
    """`audio_bytes_per_second`: the most bytes a second of uploaded audio is assumed to take
    (docs/reference/pricing.md); the media adapter reserves transcriptions by it."""
    if "audio_bytes_per_second" not in file:
        return {}
    floor = file["audio_bytes_per_second"]
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor < float("inf"):
        raise ValueError("audio_bytes_per_second must be a positive number of bytes")
    return {"audio_bytes_per_second": float(floor)}


def webhooks(value: Any, file: Mapping[str, Any], environ: Mapping[str, str], config_path: Any) -> Any:
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
        raise UsageError(f"--webhook: {exc}") from None


def session_settings(settings: Any, value: Any) -> None:
    from governor.sessions.book import DEFAULT_MODES, MODES
    from governor.sessions.lock_causes import parse_lock_causes

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
        settings.agent_sessions_per_day = whole_number(cap, "--agent-sessions-per-day")
    if (causes := value("lock_on")) is not None:
        try:
            settings.lock_on = parse_lock_causes(causes)
        except ValueError as exc:
            raise UsageError(f"--lock-on: {exc}") from None


STORE_SCHEMES = ("sqlite://", "redis://", "rediss://", "redis+", "rediss+")


def store_location(value: Any) -> str:
    """--store: memory:, a path, or a URL of a scheme the stores know (opened, and checked
    further, at start-up: governor/store/__init__.py)."""
    location = str(value).strip()
    if not location:
        raise UsageError("--store: expected a path, sqlite://PATH, redis://... or memory:, got ''")
    if "://" in location and not location.startswith(STORE_SCHEMES):
        raise UsageError(f"--store: unknown scheme in {location.split('://')[0] + '://'!r} (expected sqlite://, "
                         "redis://, redis+sentinel://, redis+cluster://, memory: or a path)")
    return location


def file_switch(file: Mapping[str, Any], key: str, default: bool, config_path: Any) -> bool:
    """A config-file switch must be a YAML boolean: bool("false") is True, and
    `upstream_insecure: "no"` must not turn TLS verification off."""
    value = file.get(key, default)
    if not isinstance(value, bool):
        raise UsageError(f"config {config_path}: {key}: expected true or false, got {value!r}")
    return value


def tokens_estimate(file: Mapping[str, Any], config_path: Any) -> dict[str, Any]:
    """bytes_per_token (a positive number) and default_output_tokens (a whole number >= 1)."""
    import math

    per_token = file.get("bytes_per_token", 4.0)
    if isinstance(per_token, bool) or not isinstance(per_token, (int, float)) or not 0 < per_token < math.inf:
        raise UsageError(f"config {config_path}: bytes_per_token: expected a positive number, got {per_token!r}")
    output = file.get("default_output_tokens", 4096)
    if isinstance(output, bool) or not isinstance(output, int) or output < 1:
        raise UsageError(f"config {config_path}: default_output_tokens: expected a whole number >= 1, got {output!r}")
    return {"bytes_per_token": float(per_token), "default_output_tokens": output}


def file_text(file: Mapping[str, Any], key: str, config_path: Any) -> str | None:
    """A config-file value that must be a string (a token, an identifier), or None when absent."""
    value = file.get(key)
    if value is not None and not isinstance(value, str):
        raise UsageError(f"config {config_path}: {key}: expected a string, got {type(value).__name__}")
    return value


def routes(file: Mapping[str, Any], route_type: Any, config_path: Any) -> tuple[Any, ...]:
    """The config file's `routes`: a list of adapter overrides (governor.adapters.Route)."""
    given = file.get("routes") or []
    if not isinstance(given, list):
        raise UsageError(f"config {config_path}: routes: expected a list of routes, got {type(given).__name__}")
    try:
        return tuple(route_type.parse(r) for r in given)
    except (TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"config {config_path}: routes: {exc}") from None
