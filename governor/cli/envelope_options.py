"""`governor run`'s options for the R3 statistical envelope (policy/envelope.py,
docs/reference/deciding.md): the window, the spike threshold k, the cold start, the
concentration bound."""

from __future__ import annotations

import math
from typing import Any

from governor.cli import UsageError

ENVELOPE_OPTIONS: dict[str, tuple[str, str]] = {
    "envelope_window": ("GOVERNOR_ENVELOPE_WINDOW", "R3: the statistical envelope's tumbling window in seconds "
                        "(default 300)"),
    "envelope_k": ("GOVERNOR_ENVELOPE_K", "R3: a window's rate beyond mean + k*sd of the agent's past windows is "
                   "a spike (default 4)"),
    "envelope_min_windows": ("GOVERNOR_ENVELOPE_MIN_WINDOWS", "R3: no envelope verdict before this many active "
                             "windows closed (cold start, default 8)"),
    "envelope_concentration": ("GOVERNOR_ENVELOPE_CONCENTRATION", "R3: one tool's share of a window's tool calls "
                               "beyond this bound is a concentration (default 0.9)"),
}


def _number(option: str, raw: Any, *, whole: bool, low: float, high: float | None, what: str) -> float:
    """One envelope option, checked alone so the error names it (and, through run.py, its source)."""
    flag = "--" + option.replace("_", "-")
    if isinstance(raw, bool) or isinstance(raw, (list, dict)):
        raise UsageError(f"{flag}: expected {what}, got {raw!r}")
    text = str(raw).strip()
    try:
        number = int(text) if whole and text.isascii() and text.isdigit() else float(text)
    except ValueError:
        raise UsageError(f"{flag}: expected {what}, got {raw!r}") from None
    if whole and (not isinstance(number, int)):
        raise UsageError(f"{flag}: expected {what}, got {raw!r}")
    if not math.isfinite(number) or number < low or (high is not None and number >= high) or \
            (not whole and number == low):
        raise UsageError(f"{flag}: expected {what}, got {raw!r}")
    return number


def apply_envelope_settings(settings: Any, value: Any) -> None:
    from governor.policy.envelope import EnvelopeConfig

    checks = (("envelope_window", "window_sec", dict(whole=False, low=0.0, high=None, what="a number of seconds > 0")),
              ("envelope_k", "k", dict(whole=False, low=0.0, high=None, what="a number > 0")),
              ("envelope_min_windows", "min_windows", dict(whole=True, low=2, high=None, what="a whole number >= 2")),
              ("envelope_concentration", "concentration_share",
               dict(whole=False, low=0.0, high=1.0, what="a share between 0 and 1, both excluded")))
    given: dict[str, Any] = {}
    for option, field, rule in checks:
        raw = value(option)
        if raw is not None:
            given[field] = _number(option, raw, **rule)
    if not given:
        return
    try:
        settings.envelope = EnvelopeConfig(**given)
    except ValueError as exc:  # a combination the options' own checks let through
        raise UsageError(f"the envelope options: {exc}") from None
