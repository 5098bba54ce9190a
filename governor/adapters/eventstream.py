"""The AWS event-stream framing (`application/vnd.amazon.eventstream`), incrementally.

Bedrock's streamed answers (ConverseStream, InvokeModelWithResponseStream) are binary
frames, not SSE. Each frame ("message") is:

    prelude   total_length u32 | headers_length u32 | prelude_crc u32 (CRC32 of the 8 bytes)
    headers   repeated: name_len u8, name, type u8, value (by type)
    payload   total_length - headers_length - 16 bytes
    crc       u32: CRC32 of everything before it

all big-endian. `FrameDecoder` turns chunks split anywhere into `Frame`s and fails closed:
a bad CRC, a length out of bounds or a header it cannot read raises `MalformedStream`, which
the relay treats as it treats an SSE event too large (the stream is cut with the adapter's
terminal frame and the cut recorded). `FrameFramer` gives the relay whole frames only, so a
cut never follows half a frame. `encode` writes one frame (the governor's own: fallbacks and
the terminal exception frame).

The governor parses this itself rather than depend on botocore at run time (botocore is a
large client library; this is the small part of it the proxy needs). The tests check both
against botocore's own parser (tests/test_adapter_bedrock.py).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Mapping

from governor.adapters.sse import MAX_EVENT_BYTES, EventTooLarge

CONTENT_TYPE = "application/vnd.amazon.eventstream"
PRELUDE = 12  # total_length, headers_length, prelude_crc
OVERHEAD = PRELUDE + 4  # and the message crc
# botocore's header bound (botocore.eventstream); a frame is held whole before it is forwarded,
# so it is bounded as an SSE event is (sse.MAX_EVENT_BYTES, below botocore's 24 MiB payloads)
MAX_HEADERS = 128 * 1024
MAX_FRAME = MAX_EVENT_BYTES

_U32 = struct.Struct(">I")
_PRELUDE = struct.Struct(">III")
# value sizes of the fixed-width header types (0/1: booleans, no value)
_FIXED = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}
_STRING, _BYTES = 7, 6


class MalformedStream(EventTooLarge):
    """The upstream's event stream is not valid framing (bad CRC, lengths out of bounds,
    unreadable headers). A subclass of sse.EventTooLarge so every place that fails closed
    on an oversize SSE event (the relay's cut, a stream read whole) fails closed on it."""


@dataclass(frozen=True, slots=True)
class Frame:
    headers: Mapping[str, object]
    payload: bytes

    @property
    def message_type(self) -> str:
        value = self.headers.get(":message-type")
        return value if isinstance(value, str) else ""

    @property
    def event_type(self) -> str:
        value = self.headers.get(":event-type") or self.headers.get(":exception-type")
        return value if isinstance(value, str) else ""


def _headers(raw: bytes) -> dict[str, object]:
    """The frame's headers; strings and bytes kept, other values decoded as integers."""
    out: dict[str, object] = {}
    i, n = 0, len(raw)
    while i < n:
        size = raw[i]
        i += 1
        if size == 0 or i + size + 1 > n:
            raise MalformedStream("event-stream header name out of bounds")
        try:
            name = raw[i:i + size].decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedStream("event-stream header name is not UTF-8") from None
        i += size
        kind = raw[i]
        i += 1
        value: object
        if kind in (_STRING, _BYTES):
            if i + 2 > n:
                raise MalformedStream("event-stream header value out of bounds")
            length = int.from_bytes(raw[i:i + 2], "big")
            i += 2
            if i + length > n:
                raise MalformedStream("event-stream header value out of bounds")
            chunk = raw[i:i + length]
            i += length
            if kind == _STRING:
                try:
                    value = chunk.decode("utf-8")
                except UnicodeDecodeError:
                    raise MalformedStream("event-stream header value is not UTF-8") from None
            else:
                value = chunk
        elif kind in _FIXED:
            width = _FIXED[kind]
            if i + width > n:
                raise MalformedStream("event-stream header value out of bounds")
            value = kind == 0 if width == 0 else int.from_bytes(raw[i:i + width], "big", signed=kind != 9)
            i += width
        else:
            raise MalformedStream(f"event-stream header of unknown type {kind}")
        if name in out:
            raise MalformedStream(f"event-stream header {name!r} repeated")
        out[name] = value
    return out


def _prelude(buffer: bytes | bytearray, start: int) -> tuple[int, int]:
    """(total_length, headers_length) of the frame at `start`, checked."""
    total, headers, crc = _PRELUDE.unpack_from(buffer, start)
    if zlib.crc32(buffer[start:start + 8]) != crc:
        raise MalformedStream("event-stream prelude CRC mismatch: the upstream's stream is corrupt")
    if headers > MAX_HEADERS:
        raise MalformedStream(f"event-stream headers of {headers} bytes (at most {MAX_HEADERS})")
    if total < OVERHEAD + headers:
        raise MalformedStream(f"event-stream frame length {total} is shorter than its headers")
    if total > MAX_FRAME:
        raise MalformedStream(f"event-stream frame of {total} bytes exceeds the governor's limit of {MAX_FRAME} bytes")
    return total, headers


class FrameDecoder:
    """Chunks in (split anywhere), checked frames out. Linear in the bytes fed: the buffer is
    a bytearray consumed from the front, a frame's prelude is checked once it is whole, its
    body only once all of it has arrived."""

    __slots__ = ("_buffer", "_need")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._need = PRELUDE  # bytes the buffer must hold before anything can be parsed

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def feed(self, chunk: bytes) -> list[Frame]:
        buffer = self._buffer
        buffer += chunk
        frames: list[Frame] = []
        while len(buffer) >= self._need:
            total, headers = _prelude(buffer, 0)
            if len(buffer) < total:
                self._need = total
                break
            (crc,) = _U32.unpack_from(buffer, total - 4)
            if zlib.crc32(memoryview(buffer)[:total - 4]) != crc:
                raise MalformedStream("event-stream message CRC mismatch: the upstream's stream is corrupt")
            frames.append(Frame(_headers(bytes(buffer[PRELUDE:PRELUDE + headers])),
                                bytes(buffer[PRELUDE + headers:total - 4])))
            del buffer[:total]
            self._need = PRELUDE
        return frames

    def close(self) -> int:
        """The stream ended: the bytes of an unfinished frame it ended inside (0: it ended
        on a frame boundary)."""
        left = len(self._buffer)
        self._buffer = bytearray()
        return left


class FrameFramer:
    """For the relay: the bytes of whole frames out, the unfinished tail kept (pending), as
    sse.EventFramer does for SSE events. Its input was checked by the watcher's decoder
    first, so only the lengths are read here."""

    __slots__ = ("_pieces", "pending", "_need")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self.pending = 0
        self._need = 0  # bytes the pending tail needs before a frame ends in it (0: unknown)

    def feed(self, data: bytes) -> bytes:
        if self.pending:
            self.pending += len(data)
            self._pieces.append(data)
            if self.pending < self._need:
                return b""
            data = b"".join(self._pieces)
            self._pieces, self.pending = [], 0
        end, n = 0, len(data)
        while n - end >= 4:
            (total,) = _U32.unpack_from(data, end)
            if total < OVERHEAD or n - end < total:
                break
            end += total
        if end < n:
            rest = data[end:]
            self._pieces, self.pending = [rest], len(rest)
            self._need = _U32.unpack_from(rest)[0] if len(rest) >= 4 else 4
        return data if end == n else data[:end]

    def rest(self) -> bytes:
        return b"".join(self._pieces)

    def take(self) -> bytes:
        rest = self.rest()
        self.clear()
        return rest

    def clear(self) -> None:
        self._pieces, self.pending, self._need = [], 0, 0


def _header(name: str, value: str) -> bytes:
    key = name.encode()
    raw = value.encode()
    return bytes([len(key)]) + key + bytes([_STRING]) + len(raw).to_bytes(2, "big") + raw


def encode(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One frame with string headers."""
    head = b"".join(_header(name, value) for name, value in headers.items())
    total = OVERHEAD + len(head) + len(payload)
    prelude = struct.pack(">II", total, len(head))
    prelude += _U32.pack(zlib.crc32(prelude))
    body = prelude + head + payload
    return body + _U32.pack(zlib.crc32(body))


def event(event_type: str, payload: bytes) -> bytes:
    """An event frame as Bedrock sends them (JSON payload)."""
    return encode({":event-type": event_type, ":content-type": "application/json", ":message-type": "event"},
                  payload)


def exception(exception_type: str, payload: bytes) -> bytes:
    """An exception frame: boto3 raises it from the stream's iterator as an EventStreamError
    (a ClientError) with the payload's `message`."""
    return encode({":exception-type": exception_type, ":content-type": "application/json",
                   ":message-type": "exception"}, payload)


__all__ = ["CONTENT_TYPE", "Frame", "FrameDecoder", "FrameFramer", "MalformedStream", "encode", "event",
           "exception", "MAX_FRAME"]
