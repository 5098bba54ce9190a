"""Canonical bytes of step arguments, fast where it is provably the same as JCS.

Loop signatures and approval digests hash JCS(arguments) on every tool call. The
`jcs` package takes ~15 us for a small object; orjson with sorted keys produces the
identical bytes whenever the value is made only of dicts with ASCII string keys,
lists, strings, booleans, None and integers within +-2**53 (JCS orders keys by UTF-16
code units, which equals orjson's order for ASCII; JCS writes floats in ECMAScript
form, which orjson does not, so any float takes the JCS path). Everything else goes
through governor.common.canonical unchanged.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from governor.common.canonical import canonicalize, sha256_b64url

_SAFE_INT = 2**53


def _plain(value: Any) -> bool:
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -_SAFE_INT <= value <= _SAFE_INT
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not key.isascii() or not _plain(item):
                return False
        return True
    if kind is list:
        for item in value:
            if not _plain(item):
                return False
        return True
    return False


def canonical_bytes(value: Any) -> bytes:
    """JCS bytes of `value` (a Mapping at the top is read as an object)."""
    if type(value) is not dict and isinstance(value, Mapping):
        value = dict(value)
    if _plain(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # e.g. a lone surrogate: let JCS decide
            pass
    return canonicalize(value)


def digest(value: Any) -> str:
    """base64url(SHA-256(JCS(value))): governor.common.canonical.digest_of, same bytes."""
    return sha256_b64url(canonical_bytes(value))
