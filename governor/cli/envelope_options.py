"""`governor run`'s options for the R3 statistical envelope (policy/envelope.py,
docs/reference/deciding.md): the window, the spike threshold k, the cold start, the
concentration bound."""

from __future__ import annotations

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


def apply_envelope_settings(settings: Any, value: Any) -> None:
    from governor.policy.envelope import EnvelopeConfig

    given: dict[str, Any] = {}
    for option, field, kind in (("envelope_window", "window_sec", float), ("envelope_k", "k", float),
                                ("envelope_min_windows", "min_windows", int),
                                ("envelope_concentration", "concentration_share", float)):
        raw = value(option)
        if raw is None:
            continue
        try:
            given[field] = kind(raw)
        except (TypeError, ValueError):
            raise UsageError(f"--{option.replace('_', '-')}: expected a number, got {raw!r}") from None
    if not given:
        return
    try:
        settings.envelope = EnvelopeConfig(**given)
    except ValueError:
        raise UsageError("the envelope options: the window and k must be positive, --envelope-min-windows at "
                         "least 2, --envelope-concentration between 0 and 1") from None
