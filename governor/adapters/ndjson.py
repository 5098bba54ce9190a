"""Newline-delimited JSON streams (Ollama's `application/x-ndjson`), incrementally.

`LineDecoder` turns arbitrary chunks into whole lines for a watcher; `LineFramer` is the
relay's framing for such a stream (whole lines forwarded, the unfinished one kept), as
`sse.EventFramer` is for SSE. What either holds of one line is bounded by
`sse.MAX_EVENT_BYTES`: past it `sse.EventTooLarge` is raised (the relay cuts the stream,
as for an SSE event without a boundary). Both are linear in the bytes fed: a line that
grows over many chunks is kept as pieces and joined once, when it ends.
"""

from __future__ import annotations

from governor.adapters.sse import MAX_EVENT_BYTES, EventTooLarge


class LineDecoder:
    """Whole lines (without their `\\n`, blank ones skipped) from arbitrary chunks."""

    __slots__ = ("_pieces", "_held", "limit")

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self._pieces: list[bytes] = []  # the unfinished line, as it came
        self._held = 0
        self.limit = limit

    def _too_large(self, size: int) -> EventTooLarge:
        self._pieces, self._held = [], 0
        return EventTooLarge(f"the upstream sent {size} bytes of one NDJSON line without a newline "
                             f"(the governor holds at most {self.limit})")

    def feed(self, chunk: bytes) -> list[bytes]:
        if 10 not in chunk:  # no line ends here: kept aside, unjoined
            if chunk:
                self._pieces.append(chunk)
                self._held += len(chunk)
                if self._held > self.limit:
                    raise self._too_large(self._held)
            return []
        lines = chunk.split(b"\n")
        if self._pieces:
            lines[0] = b"".join(self._pieces) + lines[0]
        tail = lines.pop()
        self._pieces, self._held = ([tail], len(tail)) if tail else ([], 0)
        for line in lines:
            if len(line) > self.limit:
                raise self._too_large(len(line))
        if self._held > self.limit:
            raise self._too_large(self._held)
        return [line for line in lines if line.strip()]

    def close(self) -> list[bytes]:
        """End of stream: an unterminated last line is a line (Ollama ends each with `\\n`)."""
        rest = b"".join(self._pieces)
        self._pieces, self._held = [], 0
        return [rest] if rest.strip() else []


class LineFramer:
    """Whole lines out, the unfinished one kept (the relay forwards complete lines only);
    `pending` is its size (the caller bounds it). The interface of `sse.EventFramer`."""

    __slots__ = ("_pieces", "pending")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self.pending = 0

    def feed(self, data: bytes) -> bytes:
        cut = data.rfind(b"\n") + 1  # a pending tail has no newline: only the new bytes are searched
        if not cut:
            if data:
                self._pieces.append(data)
                self.pending += len(data)
            return b""
        out = b"".join(self._pieces) + data[:cut] if self._pieces else data[:cut]
        rest = data[cut:]
        self._pieces, self.pending = ([rest], len(rest)) if rest else ([], 0)
        return out

    def take(self) -> bytes:
        """The pending tail, emptied (what is left at the end of the stream)."""
        rest = b"".join(self._pieces)
        self.clear()
        return rest

    def clear(self) -> None:
        self._pieces, self.pending = [], 0


__all__ = ["LineDecoder", "LineFramer"]
