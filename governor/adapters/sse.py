"""Server-sent events, incrementally: the framing every governed stream uses.

OpenAI, Anthropic, MCP streamable HTTP and A2A message/stream all stream SSE.
`SSEDecoder` turns arbitrary chunks (boundaries anywhere, even inside a CRLF)
into events; `last_boundary` lets the proxy forward whole events only, so a cut
never leaves a half-sent event before the terminal one.

What the decoder holds between chunks (the unterminated line, the data lines of an event
not yet dispatched) is bounded: past `MAX_EVENT_BYTES` it raises `EventTooLarge`, and the
proxy cuts the stream. An upstream that never sends an event boundary cannot make the
governor (which forwards whole events only) hold its stream in memory.

Both are linear in the bytes fed, however the upstream slices them: a line or an event
that grows over many chunks is kept as a list of pieces, and only the bytes that can
complete a terminator are searched (an upstream dribbling one endless line in 1 KiB
chunks made each chunk copy and scan everything held so far: minutes of the event loop).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import orjson

from governor.adapters.base import StreamEvent, StreamWatcher

# One event's bytes: the largest real ones are the Responses API's final
# `response.completed` (the whole response again), far below this.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class EventTooLarge(ValueError):
    """An event (or a line) grew past the decoder's limit without a boundary."""


@dataclass(slots=True)
class SSEEvent:
    event: str | None
    data: str

    def json(self) -> Any:
        """The data as JSON, or None when it is not JSON (e.g. "[DONE]", garbage)."""
        try:
            return orjson.loads(self.data)
        except orjson.JSONDecodeError:
            return None


def last_boundary(buf: bytes | bytearray) -> int:
    """Offset just past the last complete event in buf (0 when there is none)."""
    if buf.endswith(b"\n\n"):  # a chunk of whole events: the usual case, decided at once
        return len(buf)
    end = 0
    for boundary in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        found = buf.rfind(boundary)
        if found != -1:
            end = max(end, found + len(boundary))
    return end


class EventFramer:
    """Whole events out, the unfinished tail kept: the relay forwards complete events only.

    `feed` returns the bytes up to the last event boundary seen so far (b"" when none
    completed) and keeps the rest; `pending` is its size (the caller bounds it). Linear:
    a pending tail has no boundary in it, so a boundary the new bytes complete starts at
    most 3 bytes before them; only those and the new bytes are searched, and a tail that
    grows is kept as pieces, joined once when an event completes."""

    __slots__ = ("_pieces", "_edge", "pending")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._edge = b""  # the last 3 bytes pending
        self.pending = 0

    def feed(self, data: bytes) -> bytes:
        if not self.pending:
            cut = last_boundary(data)
            if cut == len(data):
                return data
            rest = data[cut:]
            self._pieces, self._edge, self.pending = [rest], rest[-3:], len(rest)
            return data[:cut]
        edge = self._edge
        joined = edge + data
        cut = last_boundary(joined)
        if not cut:
            self._pieces.append(data)
            self._edge = joined[-3:]
            self.pending += len(data)
            return b""
        cut -= len(edge)  # > 0: the tail itself completed no boundary
        out = b"".join(self._pieces) + data[:cut]
        rest = data[cut:]
        self._pieces, self._edge, self.pending = ([rest] if rest else []), rest[-3:], len(rest)
        return out

    def rest(self) -> bytes:
        """The pending tail (kept)."""
        if len(self._pieces) > 1:
            self._pieces = [b"".join(self._pieces)]
        return self._pieces[0] if self._pieces else b""

    def take(self) -> bytes:
        """The pending tail, emptied (what is left at the end of the stream)."""
        rest = self.rest()
        self.clear()
        return rest

    def clear(self) -> None:
        self._pieces, self._edge, self.pending = [], b"", 0


def encode(data: Any, event: str | None = None) -> bytes:
    """One SSE event; data is JSON-serialized unless already bytes."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n"


class SSEDecoder:
    """Incremental SSE parser (WHATWG event-stream rules, minus id/retry which we ignore)."""

    __slots__ = ("_buf", "_more", "_more_bytes", "_event", "_data", "_has_data", "_held", "limit")

    def __init__(self, limit: int | None = None) -> None:
        self._buf = b""
        self._more: list[bytes] = []  # chunks continuing _buf's unterminated line, not yet joined
        self._more_bytes = 0
        self._event: str | None = None
        self._data: list[str] = []
        self._has_data = False
        self._held = 0  # characters in _data: the event being assembled
        self.limit = MAX_EVENT_BYTES if limit is None else limit

    def _check(self) -> None:
        if len(self._buf) + self._more_bytes + self._held > self.limit:
            held = len(self._buf) + self._more_bytes + self._held
            self._buf, self._data, self._held, self._has_data, self._event = b"", [], 0, False, None
            self._more, self._more_bytes = [], 0
            raise EventTooLarge(f"the upstream sent {held} bytes of one event without an event boundary "
                                f"(the governor holds at most {self.limit})")

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._buf and 10 not in chunk and 13 not in chunk and self._buf[-1] != 13:
            # the unterminated line goes on and this chunk ends no line: keep it aside, unjoined
            self._more.append(chunk)
            self._more_bytes += len(chunk)
            self._check()
            return []
        if self._more:
            self._buf += b"".join(self._more)
            self._more, self._more_bytes = [], 0
        buf = self._buf + chunk if self._buf else bytes(chunk)
        events: list[SSEEvent] = []
        if 13 not in buf:  # no \r (an int test: a memchr, where b"\r" would be a substring search)
            # the common case (\n line ends only): split in C, once per chunk
            lines = buf.split(b"\n")
            self._buf = lines.pop()  # the unterminated tail, b"" when buf ends with \n
            for raw in lines:
                self._line(raw, events)
            if self._buf or self._held:
                self._check()
            return events
        start = 0
        n = len(buf)
        while start < n:
            # find the next line terminator: \r\n, \n or \r
            nl = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, nl if nl != -1 else n)
            if cr != -1:
                if cr == n - 1:  # a lone \r at the end may be the first half of \r\n
                    break
                end, nxt = cr, cr + (2 if buf[cr + 1 : cr + 2] == b"\n" else 1)
            elif nl != -1:
                end, nxt = nl, nl + 1
            else:
                break
            self._line(buf[start:end], events)
            start = nxt
        self._buf = buf[start:]
        self._check()
        return events

    @property
    def idle(self) -> bool:
        """Between events: no partial line or event kept from earlier chunks."""
        return not self._buf and not self._has_data and self._event is None  # _more only follows a _buf

    def close(self) -> list[SSEEvent]:
        """End of stream: an unterminated last event is dispatched (lenient, as browsers are not)."""
        events: list[SSEEvent] = []
        if self._more:
            self._buf += b"".join(self._more)
            self._more, self._more_bytes = [], 0
        if self._buf:
            # what is left is one line: feed() kept a lone \r at the end in case \n followed
            self._line(self._buf.removesuffix(b"\r"), events)
            self._buf = b""
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        if not raw:
            if self._has_data:
                data = self._data
                events.append(SSEEvent(self._event, data[0] if len(data) == 1 else "\n".join(data)))
                self._data = []
                self._held = 0
            self._event, self._has_data = None, False
            return
        if raw[:6] == b"data: ":  # nearly every line of a stream: the general path below, shortened
            self._data.append(raw[6:].decode("utf-8", errors="replace"))
            self._has_data = True
            self._held += len(raw)
            return
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._has_data = True
            self._held += len(raw)
        elif field == "event":
            self._event = value


class SSEStreamWatcher(StreamWatcher):
    """A watcher of an SSE stream (its `decoder`): each whole event
    goes to `_event`; when the upstream ends the stream, `_closed` adds what is left (the
    final usage)."""

    decoder: SSEDecoder

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for event in self.decoder.feed(chunk):
            self._event(event, out)
        return out

    def close(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for event in self.decoder.close():
            self._event(event, out)
        self._closed(out)
        return out

    @abc.abstractmethod
    def _event(self, event: Any, out: list[StreamEvent]) -> None:
        """Read one decoded SSE event, appending what it reports to `out`."""

    @abc.abstractmethod
    def _closed(self, out: list[StreamEvent]) -> None:
        """The stream ended: append what is left, ending with the final usage."""
