"""NDJSON framing (governor/adapters/ndjson.py): whole lines however the chunks fall, the
unfinished line bounded, linear in the bytes however they are dribbled."""

from __future__ import annotations

import time

import pytest

from governor.adapters.ndjson import LineDecoder, LineFramer
from governor.adapters.sse import EventTooLarge

STREAM = b'{"a":1}\n{"b":2}\n\n{"c":"x\\ny"}\n'


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, len(STREAM)])
def test_lines_are_whole_however_the_chunks_fall(size):
    decoder, framer = LineDecoder(), LineFramer()
    lines, forwarded = [], b""
    for i in range(0, len(STREAM), size):
        chunk = STREAM[i:i + size]
        lines += decoder.feed(chunk)
        out = framer.feed(chunk)
        assert not out or out.endswith(b"\n")  # the relay forwards whole lines only
        forwarded += out
    assert lines + decoder.close() == [b'{"a":1}', b'{"b":2}', b'{"c":"x\\ny"}']  # the blank line skipped
    assert forwarded == STREAM and framer.pending == 0


def test_an_unterminated_last_line_is_kept_to_the_end():
    decoder, framer = LineDecoder(), LineFramer()
    assert decoder.feed(b'{"a":1}\n{"done":tr') == [b'{"a":1}']
    assert decoder.close() == [b'{"done":tr']
    assert framer.feed(b'{"a":1}\n{"done":tr') == b'{"a":1}\n' and framer.pending == 10
    assert framer.take() == b'{"done":tr' and framer.pending == 0


def test_a_line_past_the_bound_raises():
    decoder = LineDecoder(limit=1000)
    decoder.feed(b"x" * 600)
    with pytest.raises(EventTooLarge, match="without a newline"):
        decoder.feed(b"x" * 600)
    with pytest.raises(EventTooLarge):
        LineDecoder(limit=1000).feed(b"y" * 1001 + b"\n")


def test_an_endless_line_dribbled_is_linear():
    decoder, framer = LineDecoder(limit=64 * 1024 * 1024), LineFramer()
    chunk = b"z" * 1024
    started = time.process_time()
    for _ in range(16 * 1024):  # 16 MiB, 1 KiB at a time
        decoder.feed(chunk)
        framer.feed(chunk)
    assert time.process_time() - started < 2.0
    assert framer.pending == 16 * 1024 * 1024
    assert decoder.feed(b"\n") == [b"z" * (16 * 1024 * 1024)]
