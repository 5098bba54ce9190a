"""The incremental SSE decoder: whatever the chunking and line endings, the events of a
reference parser written straight from the WHATWG rules (the fields the governor reads)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from governor.adapters.sse import SSEDecoder, SSEEvent, last_boundary


def reference(stream: bytes) -> list[tuple[str | None, str]]:
    """Lines split on CRLF, LF or CR; a blank line dispatches; ':' starts a comment; the
    value loses one leading space; several data lines join with LF; an unterminated last
    event is dispatched at the end (as the decoder's close() does)."""
    events, event, data = [], None, []
    for raw in re.split(rb"\r\n|\n|\r", stream) + [b""]:
        line = raw.decode("utf-8", errors="replace")
        if not line:
            if data:
                events.append((event, "\n".join(data)))
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    return events


text = st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)
lines = st.one_of(
    text.map(lambda t: "data: " + t),
    text.map(lambda t: "data:" + t),
    text.map(lambda t: "event: " + t),
    text.map(lambda t: ": " + t),  # a comment
    text.map(lambda t: "id: " + t),  # a field the governor ignores
    st.just(""),  # dispatch
)
streams = st.tuples(st.lists(lines, max_size=20), st.sampled_from(["\n", "\r\n", "\r"]), st.booleans()).map(
    lambda t: (t[1].join(t[0]) + (t[1] if t[2] else "")).encode())


def decode(stream: bytes, cuts: list[int]) -> list[tuple[str | None, str]]:
    decoder, out, start = SSEDecoder(), [], 0
    for cut in sorted({c % (len(stream) + 1) for c in cuts}) + [len(stream)]:
        out += decoder.feed(stream[start:cut])
        start = cut
    out += decoder.close()
    return [(e.event, e.data) for e in out]


@settings(max_examples=400)
@given(streams, st.lists(st.integers(0, 10_000), max_size=8))
def test_any_chunking_gives_the_reference_events(stream: bytes, cuts: list[int]):
    assert decode(stream, cuts) == reference(stream)


def test_a_chunk_ending_inside_crlf_is_one_line_end():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\r\n") == [SSEEvent(None, "a")]


def test_last_boundary_is_just_past_the_last_whole_event():
    assert last_boundary(b"data: a\n\ndata: b") == len(b"data: a\n\n")
    assert last_boundary(b"data: a\r\n\r\n") == len(b"data: a\r\n\r\n")
    assert last_boundary(b"data: a\n") == 0


@settings(max_examples=300)
@given(streams, st.integers(0, 10_000))
def test_what_last_boundary_lets_through_is_whole_events(stream: bytes, cut: int):
    """The relay forwards buf[:last_boundary(buf)]: whole events, never part of one."""
    buf = stream[:cut % (len(stream) + 1)]
    head = buf[:last_boundary(buf)]
    assert head == b"" or head.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))
    forwarded = reference(head)
    assert forwarded == reference(stream)[:len(forwarded)]
