"""JCS (RFC 8785) against the reference test data, and the base64url helpers."""

from __future__ import annotations

import json
import math
import struct

import pytest

from governor.common.canonical import b64url, b64url_decode, canonicalize, digest_of
from tests.conftest import shared_path


def _pairs():
    inp = shared_path("jcs", "input")
    return sorted(p.name for p in inp.iterdir())


def test_jcs_reference_files():
    names = _pairs()
    assert len(names) >= 6
    for name in names:
        src = shared_path("jcs", "input", name).read_bytes()
        want = shared_path("jcs", "output", name).read_bytes()
        assert canonicalize(json.loads(src)) == want, name


def test_jcs_es6_numbers():
    checked = 0
    with shared_path("jcs", "es6-numbers.csv").open() as fh:
        for line in fh:
            hex_bits, want = line.rstrip("\n").split(",", 1)
            value = struct.unpack(">d", bytes.fromhex(hex_bits.zfill(16)))[0]
            if math.isnan(value) or math.isinf(value):
                continue  # not JSON; JCS refuses them
            assert canonicalize(value).decode() == want, hex_bits
            checked += 1
    assert checked > 60_000


@pytest.mark.parametrize("data", [b"", b"\x00", b"\xff\xfe", bytes(range(64))])
def test_b64url_round_trip(data):
    text = b64url(data)
    assert "=" not in text and "+" not in text and "/" not in text
    assert b64url_decode(text) == data


def test_digest_is_order_independent():
    assert digest_of({"a": 1, "b": [1, 2]}) == digest_of({"b": [1, 2], "a": 1})
    assert digest_of({"a": 1}) != digest_of({"a": 2})
