"""One socket write per read: a client connection's writes within one turn of the event loop
are sent together.

mitmproxy writes each command of a layer separately: an upstream read that carries twenty SSE
events (each an HTTP chunk) becomes twenty `writer.write` calls, twenty `send` syscalls to
the agent, each waking it (bench/FINDINGS.md: a streamed request read its upstream in about
2 reads and wrote its client about 28 times, bare or governed). `coalesce_writes` makes the
client writer keep what it is given during one turn and send it as one write at the end of
the turn (`loop.call_soon`): the same bytes in the same order, no later than the next turn
of the loop. Closing, half-closing and draining send what is kept first.
"""

from __future__ import annotations

import asyncio
from typing import Any

_COALESCING = "_governor_coalescing"


def coalesce_writes(writer: Any) -> bool:
    """Make `writer` (an asyncio StreamWriter) send the writes of one loop turn together.
    False when it cannot (already done, or not a writer of this shape)."""
    if writer is None or getattr(writer, _COALESCING, False):
        return False
    try:
        loop = asyncio.get_running_loop()
        write, close, write_eof, drain = writer.write, writer.close, writer.write_eof, writer.drain
    except (RuntimeError, AttributeError):
        return False
    kept: list[bytes] = []

    def flush() -> None:
        if not kept:
            return
        data = kept[0] if len(kept) == 1 else b"".join(kept)
        kept.clear()
        if not writer.is_closing():
            write(data)

    def coalesced_write(data: bytes) -> None:
        if not data:
            return
        if not kept:
            loop.call_soon(flush)
        kept.append(bytes(data))

    def coalesced_close() -> None:
        flush()
        close()

    def coalesced_write_eof() -> None:
        flush()
        write_eof()

    async def coalesced_drain() -> None:
        flush()
        await drain()

    writer.write = coalesced_write
    writer.close = coalesced_close
    writer.write_eof = coalesced_write_eof
    writer.drain = coalesced_drain
    setattr(writer, _COALESCING, True)
    return True
