"""`governor run`'s passport admission options (docs/passports.md, "Unsigned passports"):
their help, and how their values (flags, environment, config file) become Settings fields."""

from __future__ import annotations

from typing import Any

from governor.cli import UsageError

PASSPORT_OPTIONS: dict[str, tuple[str, str]] = {
    "allow_unsigned_passport": (
        "GOVERNOR_ALLOW_UNSIGNED_PASSPORT",
        "admit a passport without a signature (refused by default); every record then names it in "
        "limits.passport_signature = \"unsigned\". Given alone it means yes; also yes/no"),
}
# options that may be given without a value (then "yes")
SWITCH_OPTIONS = frozenset({"allow_unsigned_passport"})

_YES, _NO = ("yes", "on", "true", "1"), ("no", "off", "false", "0")


def apply_passport_settings(settings: Any, value: Any) -> None:
    given = value("allow_unsigned_passport")
    if given is None:
        return
    if isinstance(given, bool):
        settings.allow_unsigned_passport = given
        return
    word = str(given).strip().lower()
    if word not in _YES + _NO:
        raise UsageError(f"--allow-unsigned-passport: expected yes or no, got {given!r}")
    settings.allow_unsigned_passport = word in _YES
