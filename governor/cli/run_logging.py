"""`governor run`'s logging: --log-level and --log-format, read before the other settings
(so that resolving them can already log), and the handlers they configure."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Mapping

from governor.cli import UsageError
from governor.cli.option_values import load_config

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
LEVEL_ENV, FORMAT_ENV, CONFIG_ENV = "GOVERNOR_LOG_LEVEL", "GOVERNOR_LOG_FORMAT", "GOVERNOR_CONFIG"


def _setting(args: argparse.Namespace, name: str, env: str, environ: Mapping[str, str]) -> tuple[Any, str]:
    """The option's value and how the user named it (flag, variable or config key)."""
    if (value := getattr(args, name, None)) is not None:
        return value, "--" + name.replace("_", "-")
    if value := environ.get(env):
        return value, "$" + env
    config_path = getattr(args, "config", None) or environ.get(CONFIG_ENV) or None
    if config_path and (value := load_config(Path(config_path)).get(name)) is not None:
        return value, f"config {config_path}: {name}"
    return None, ""


def log_level(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> str | None:
    """The --log-level setting (command line, environment, config file), or None when not set."""
    value, where = _setting(args, "log_level", LEVEL_ENV, environ)
    if value is None:
        return None
    level = str(value).upper()
    if level not in LOG_LEVELS:
        raise UsageError(f"{where}: expected one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return level


def log_format(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> str:
    """The --log-format setting (command line, environment, config file): text or json."""
    value, where = _setting(args, "log_format", FORMAT_ENV, environ)
    if value is None:
        return "text"
    if str(value).lower() not in LOG_FORMATS:
        raise UsageError(f"{where}: expected text or json, got {value!r}")
    return str(value).lower()


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
