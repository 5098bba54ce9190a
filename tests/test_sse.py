"""The incremental SSE decoder: whatever the chunking and line endings, the events of a
reference parser written straight from the WHATWG rules (the fields the governor reads)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

import time

import pytest

from governor.adapters.sse import EventFramer, EventTooLarge, SSEDecoder, SSEEvent, last_boundary


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


@settings(max_examples=300)
@given(streams, st.lists(st.integers(0, 10_000), max_size=12))
def test_the_framer_passes_what_last_boundary_over_everything_so_far_would(stream: bytes, cuts: list[int]):
    """The relay's EventFramer keeps only the tail and searches only the new bytes; what it
    lets through, chunk by chunk, is what last_boundary over the whole buffer would."""
    framer, held, start = EventFramer(), b"", 0
    for cut in sorted({c % (len(stream) + 1) for c in cuts}) + [len(stream)]:
        chunk = stream[start:cut]
        start = cut
        buf = held + chunk
        boundary = last_boundary(buf)
        held = buf[boundary:]
        assert framer.feed(chunk) == buf[:boundary]
        assert framer.pending == len(held)
    assert framer.take() == held and framer.pending == 0


# --- a hostile upstream dribbling one endless event ---------------------------------------
# Before, each chunk copied and scanned everything held so far: 16 MiB dribbled in 1 KiB
# chunks took the decoder minutes of CPU on the proxy's event loop (4 MiB: 47 s measured
# here). Linear now: well under a second. The bound below only says "no hang".
HANG = 20.0  # seconds
DRIBBLE = b"x" * 1024


@pytest.mark.parametrize("start", [b"data: {", b": comment ", b"event: "])
def test_an_endless_line_dribbled_in_small_chunks_is_refused_at_the_limit_without_a_hang(start: bytes):
    decoder = SSEDecoder()
    decoder.feed(start)
    began = time.monotonic()
    chunks = 0
    with pytest.raises(EventTooLarge):
        while True:
            decoder.feed(DRIBBLE)
            chunks += 1
            assert time.monotonic() - began < HANG, f"{chunks} chunks fed in {HANG} s: quadratic"
    assert chunks == decoder.limit // len(DRIBBLE) - 1 or chunks == decoder.limit // len(DRIBBLE)
    assert decoder.idle  # nothing held after the refusal


def test_an_endless_event_dribbled_to_the_framer_is_held_linearly():
    framer = EventFramer()
    began = time.monotonic()
    for chunk in range(16 * 1024):  # 16 MiB, the relay's limit, in 1 KiB chunks without a boundary
        assert framer.feed(b"data: x\n" if chunk % 2 else DRIBBLE) == b""
        assert time.monotonic() - began < HANG, f"{chunk} chunks framed in {HANG} s: quadratic"
    assert framer.feed(b"\n") != b"" and framer.pending == 0  # the boundary lets it all through
