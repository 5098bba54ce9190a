"""Server-sent events, incrementally: the framing every governed stream uses.

OpenAI, Anthropic, MCP streamable HTTP and A2A message/stream all stream SSE.
`SSEDecoder` turns arbitrary chunks (boundaries anywhere, even inside a CRLF)
into events; `last_boundary` lets the proxy forward whole events only, so a cut
never leaves a half-sent event before the terminal one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


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


def encode(data: Any, event: str | None = None) -> bytes:
    """One SSE event; data is JSON-serialized unless already bytes."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n"


class SSEDecoder:
    """Incremental SSE parser (WHATWG event-stream rules, minus id/retry which we ignore)."""

    __slots__ = ("_buf", "_event", "_data", "_has_data")

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[str] = []
        self._has_data = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buf = self._buf + chunk if self._buf else bytes(chunk)
        events: list[SSEEvent] = []
        if 13 not in buf:  # no \r (an int test: a memchr, where b"\r" would be a substring search)
            # the common case (\n line ends only): split in C, once per chunk
            lines = buf.split(b"\n")
            self._buf = lines.pop()  # the unterminated tail, b"" when buf ends with \n
            for raw in lines:
                self._line(raw, events)
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
        return events

    @property
    def idle(self) -> bool:
        """Between events: no partial line or event kept from earlier chunks."""
        return not self._buf and not self._has_data and self._event is None

    def close(self) -> list[SSEEvent]:
        """End of stream: an unterminated last event is dispatched (lenient, as browsers are not)."""
        events: list[SSEEvent] = []
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
            self._event, self._has_data = None, False
            return
        if raw[:6] == b"data: ":  # nearly every line of a stream: the general path below, shortened
            self._data.append(raw[6:].decode("utf-8", errors="replace"))
            self._has_data = True
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
        elif field == "event":
            self._event = value
