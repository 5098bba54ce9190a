"""The addon's one-pass reading of the request headers agrees with mitmproxy's Headers."""

from __future__ import annotations

from mitmproxy import http

import pytest

from governor.proxy import bodies
from governor.proxy.fields import PASSPORT_HEADER, PERSONA_HEADER, SESSION_HEADER, decoded_body, scan_headers


def test_adl_headers_are_read_as_headers_get_reads_them() -> None:
    headers = http.Headers([
        (b"Host", b"api.example"), (b"adl-session", b"s-1"), (b"ADL-Persona", b"searcher"),
        (b"Adl-Session", b"s-2"), (b"ADL-Delegation-Depth", b"2"), (b"X-Adl-Not", b"x"),
        (b"ADL-Passport", "caf\u00e9".encode()),
    ])
    found, encoded = scan_headers(headers.fields)
    for name in (SESSION_HEADER, PERSONA_HEADER, PASSPORT_HEADER, "ADL-Delegation-Depth"):
        assert found[name.lower()] == headers.get(name), name
    assert found["adl-session"] == "s-1, s-2"  # repeats folded, as Headers.get folds them
    assert set(found) == {"adl-session", "adl-persona", "adl-delegation-depth", "adl-passport"}
    assert encoded is False


def test_a_request_without_adl_headers_has_none() -> None:
    assert scan_headers(http.Headers(host="api.example", content_type="application/json").fields) == ({}, False)


def test_content_encoding_is_found_as_headers_contains_finds_it() -> None:
    for name in (b"Content-Encoding", b"content-encoding", b"CONTENT-ENCODING"):
        headers = http.Headers([(b"Host", b"api.example"), (b"Content-Type", b"application/json"), (name, b"gzip")])
        assert scan_headers(headers.fields)[1] is ("content-encoding" in headers) is True
    headers = http.Headers([(b"Content-Length", b"3"), (b"Content-Type", b"application/json")])
    assert scan_headers(headers.fields)[1] is ("content-encoding" in headers) is False


def test_a_response_body_is_read_decoded_when_it_can_be_and_refused_when_not() -> None:
    """decoded_body, as the usage of a plain answer is read: a Content-Encoding (any case) is
    undone; one that cannot be undone raises BodyError (the addon answers 502 and charges the
    reservation: an unreadable answer is not a free one); none, the raw bytes."""
    answer = b'{"usage": {"prompt_tokens": 3}}'
    bounds = bodies.Bounds(1024 * 1024)
    for name in ("Content-Encoding", "content-encoding"):
        gzipped = http.Response.make(200, b"", {"Content-Type": "application/json", name: "gzip"})
        gzipped.content = answer  # mitmproxy compresses it, as the upstream would have
        assert gzipped.raw_content != answer
        assert decoded_body(gzipped, bounds) == answer
    broken = http.Response.make(200, b"", {"Content-Encoding": "gzip"})
    broken.raw_content = b"not gzip at all"
    with pytest.raises(bodies.BodyError) as error:
        decoded_body(broken, bounds)
    assert error.value.status == 400 and "cannot be decoded (gzip)" in error.value.message
    assert decoded_body(http.Response.make(200, answer, {"Content-Type": "application/json"}), bounds) == answer
    assert decoded_body(http.Response.make(204, b""), bounds) == b""


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from governor.adapters.request_view import RawHeaders  # noqa: E402

names = st.sampled_from([b"Host", b"host", b"ADL-Session", b"adl-session", b"Content-Type", b"X-Thing", b"x-thing"])
values = st.binary(max_size=8).filter(lambda v: b"\r" not in v and b"\n" not in v)


@given(st.lists(st.tuples(names, values), max_size=8), st.sampled_from(["host", "HOST", "adl-session", "ADL-Session",
                                                                          "content-type", "x-thing", "absent"]))
def test_raw_headers_read_as_mitmproxys_headers_read(fields, name):
    raw, headers = RawHeaders(tuple(fields)), http.Headers(fields)
    assert raw.get(name) == headers.get(name)
    assert (name in raw) == (name in headers)
    assert sorted(raw) == sorted({n.decode().lower() for n, _ in fields})
