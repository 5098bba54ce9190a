"""The evidence room's fast canonical form is byte-identical to the `jcs` reference."""

from __future__ import annotations

import json
import math
import struct

import jcs
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.evidence._jcs import _dumps, _dumps_safe, _NeedsReference, canonical, canonical_with_events
from tests.conftest import shared_path


def test_every_ecmascript_number_vector():
    """Each float the fast path accepts serializes exactly as ECMAScript does; the rest fall back."""
    fast = 0
    with shared_path("jcs", "es6-numbers.csv").open() as fh:
        for line in fh:
            hex_bits, want = line.rstrip("\n").split(",", 1)
            value = struct.unpack(">d", bytes.fromhex(hex_bits.zfill(16)))[0]
            if not math.isfinite(value):
                continue
            try:
                got = _dumps(_dumps_safe(value))
                fast += 1
            except _NeedsReference:
                got = canonical(value).decode()
            assert got == want, (hex_bits, got, want)
    assert fast > 1_000  # the fast path is really exercised


def test_money_and_ratio_shaped_floats():
    """The floats details carry (costs, shares, seconds) take the fast path and match."""
    for value in [i / 1000 for i in range(1, 20_000)] + [i / 7 for i in range(1, 5_000)] + [1e-4 * i for i in range(1, 500)]:
        assert _dumps(_dumps_safe(value)).encode() == jcs.canonicalize(value), value


def test_reference_files():
    inp = shared_path("jcs", "input")
    for path in sorted(inp.iterdir()):
        want = shared_path("jcs", "output", path.name).read_bytes()
        assert canonical(json.loads(path.read_bytes())) == want, path.name


def test_edge_values():
    for value in [0.0, -0.0, 5.0, -5.0, 2.0**53, 2.0**53 - 1, 1e16, 1e-4, 9.999e-5, 1e21, 1e-7, 0.1, 1 / 3,
                  {"\U0001f600": 1, "\ue000": 2, "a": 3}, {"k": "\u2028\x7f\x00\x1f\"\\"}, [True, False, None],
                  2**64, -(2**63)]:
        assert canonical(value) == jcs.canonicalize(value), value


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_random_values(value):
    try:
        want = jcs.canonicalize(value)
    except UnicodeEncodeError:  # lone surrogates: neither can encode them
        return
    assert canonical(value) == want


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "events", "z", "iat", "ß"]), json_values, max_size=5),
       st.lists(json_values, max_size=5))
def test_record_bytes_assembled_from_event_bytes(members, events):
    record = {**members, "events": events}
    try:
        want = jcs.canonicalize(record)
    except UnicodeEncodeError:
        return
    assert canonical_with_events(record, [canonical(e) for e in events]) == want
