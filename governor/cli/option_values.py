"""Where `governor run`'s settings come from, and the checks their values share.

An option's value comes from its flag, its environment variable or its key in the --config
file (in that order of precedence). `Origins` remembers which, so that an error raised as
"--tier: ..." is reported as the user wrote it: "$GOVERNOR_TIER: ..." or
"config gov.yaml: tier: ..." (#33 item 8). The option modules (run.py, log_options.py, ...)
keep raising "--flag: ..." and need not know.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping

from governor.cli import UsageError

# options whose config-file value may be a list (the others take one value)
LIST_OPTIONS = frozenset({"webhook", "allow", "witness", "control_host", "lock_on"})

_FLAG = re.compile(r"^--([a-z0-9][a-z0-9-]*)")


class Origins:
    """Which source gave each option its value: 'flag', 'env' or 'file'."""

    def __init__(self, options: Mapping[str, tuple[str, str]], config_path: Any = None) -> None:
        self.options = options
        self.config_path = config_path
        self.given: dict[str, str] = {}

    def note(self, name: str, source: str) -> None:
        self.given[name] = source

    def label(self, name: str) -> str:
        """How the user named option `name` where its value came from."""
        source = self.given.get(name, "flag")
        if source == "env" and name in self.options:
            return "$" + self.options[name][0]
        if source == "file":
            return f"config {self.config_path}: {name}"
        return "--" + name.replace("_", "-")

    def relabel(self, message: str) -> str:
        """An error message that begins "--flag-name" begins with where the value came from instead."""
        match = _FLAG.match(message)
        if not match:
            return message
        name = match.group(1).replace("-", "_")
        if name not in self.options or self.given.get(name, "flag") == "flag":
            return message
        return self.label(name) + message[match.end():]


def scalar(name: str, value: Any, origin: str, lists: frozenset[str] | set[str] = frozenset()) -> Any:
    """A config-file value for a one-value option: a list or a mapping there is refused, naming it
    (`lists`: more options that take a list, e.g. the repeatable ones)."""
    if origin == "file" and name not in LIST_OPTIONS and name not in lists and isinstance(value, (list, dict)):
        kind = "a list" if isinstance(value, list) else "a mapping"
        raise UsageError(f"--{name.replace('_', '-')}: expected a single value, got {kind}")
    return value


def address(value: Any, what: str) -> tuple[str, int]:
    host, sep, port = str(value).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"{what}: expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def seconds(value: Any, what: str) -> float:
    """A positive, finite number of seconds (nan and inf are no durations)."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        raise UsageError(f"{what}: expected a number of seconds, got {value!r}") from None
    if math.isnan(number) or math.isinf(number):
        raise UsageError(f"{what}: expected a number of seconds, got {value!r}")
    if number <= 0:
        raise UsageError(f"{what}: must be positive")
    return number


def whole_number(value: Any, what: str, least: int = 0, unit: str = "") -> int:
    """A whole number >= least, from a flag's text or a config file's integer."""
    text = str(value).strip() if not isinstance(value, bool) else ""
    if not (text.isascii() and text.isdigit()) or int(text) < least:
        raise UsageError(f"{what}: expected a whole number{' of ' + unit if unit else ''} >= {least}, got {value!r}")
    return int(text)


def load_config(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"config {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config {path}: expected a mapping of settings, got {type(data).__name__}")
    if not all(isinstance(key, str) for key in data):
        bad = next(key for key in data if not isinstance(key, str))
        raise UsageError(f"config {path}: setting names are words, got {bad!r}")
    return data
