"""Exact RFC 8785 (JCS) bytes, fast, for the values records are made of.

`governor.common.canonical.canonicalize` (the `jcs` package) is pure Python: about 30 µs
for one small event, so hashing and signing a 10,000-event record would take
most of a second. The C encoder behind `json.dumps(sort_keys=True,
separators=(",", ":"), ensure_ascii=False)` produces the very same bytes as JCS
whenever three conditions hold, which `_dumps_safe` checks (else the reference
implementation is used, so the output is always exactly JCS):

* every number is an int of magnitude <= 2**53 (beyond, JCS rounds it to a
  double), an integral float in that range (JCS writes it as an integer: we pass
  `int(value)`), or a non-integral float with 1e-4 <= |value| < 1e16, where
  Python's shortest round-trip `repr` and ECMAScript's Number-to-String agree
  digit for digit and both use fixed notation;
* no object key contains a character outside the Basic Multilingual Plane (JCS
  sorts keys by UTF-16 code units, Python by code points: they differ only there);
* only plain dict / list / tuple / str / int / bool / None / float values.

String escaping is identical in both (the same `\\uXXXX` lowercase rule for
control characters, nothing else escaped). `tests/test_evidence_jcs.py` proves the
equality against `jcs` on every ECMAScript number test vector and on random values.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from governor.common.canonical import canonicalize

_dumps = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False, check_circular=False
).encode
_EXACT_INT = float(2**53)


class _NeedsReference(Exception):
    """The value has a shape the fast path does not reproduce exactly."""


def _dumps_safe(value: Any) -> Any:
    """`value`, or a copy with integral floats made ints; raise _NeedsReference if unsafe."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -_EXACT_INT <= value <= _EXACT_INT:
            return value
        raise _NeedsReference  # JCS numbers are doubles: the reference rounds it
    if kind is float:
        if value.is_integer():
            if -_EXACT_INT <= value <= _EXACT_INT:
                return int(value)
            raise _NeedsReference
        if 1e-4 <= abs(value) < 1e16:
            return value
        raise _NeedsReference
    if kind is dict:
        copy = None
        for key, item in value.items():
            if type(key) is not str or (not key.isascii() and max(key) > "\uffff"):
                raise _NeedsReference
            safe = _dumps_safe(item)
            if safe is not item:
                if copy is None:
                    copy = dict(value)
                copy[key] = safe
        return value if copy is None else copy
    if kind is list or kind is tuple:
        items = [_dumps_safe(item) for item in value]
        if kind is list and all(a is b for a, b in zip(items, value)):
            return value
        return items
    raise _NeedsReference


def canonical(value: Any) -> bytes:
    """JCS bytes of `value`, identical to governor.common.canonical.canonicalize."""
    try:
        safe = _dumps_safe(value)
    except _NeedsReference:
        return canonicalize(value)
    return _dumps(safe).encode("utf-8")


def canonical_with_events(record: Mapping[str, Any], event_bytes: Sequence[bytes]) -> bytes:
    """JCS bytes of `record`, reusing the already canonical bytes of record["events"].

    JCS of an object is `{` + members sorted by key + `}`, and of an array `[` +
    items + `]`, so the record's bytes can be assembled from its events' bytes
    (which the hash chain needs anyway) instead of canonicalizing them twice.
    """
    if not all(type(key) is str and key.isascii() for key in record):  # never in a schema-valid record
        return canonical(record)
    members = []
    for key in sorted(record):  # ASCII: code-point order is UTF-16 order
        if key == "events":
            value = b"[" + b",".join(event_bytes) + b"]"
        else:
            value = canonical(record[key])
        members.append(canonical(key) + b":" + value)
    return b"{" + b",".join(members) + b"}"
