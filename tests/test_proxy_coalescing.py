"""proxy/coalescing: the agent's connection sends what one turn of the event loop wrote as one
write, in order, and nothing is lost at a close, a half-close or a drain (real sockets, loopback)."""

from __future__ import annotations

import asyncio

import pytest

from governor.proxy.coalescing import coalesce_writes

pytestmark = pytest.mark.asyncio


async def pair():
    accepted: asyncio.Queue = asyncio.Queue()

    async def on_client(reader, writer):
        await accepted.put((reader, writer))

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    _, served = await asyncio.wait_for(accepted.get(), 5)
    return server, reader, writer, served


def counting(writer) -> list[bytes]:
    sent: list[bytes] = []
    original = writer.transport.write

    def write(data):
        sent.append(bytes(data))
        original(data)

    writer.transport.write = write
    return sent


async def test_the_writes_of_one_turn_go_out_as_one_in_order():
    server, reader, writer, served = await pair()
    try:
        sent = counting(served)
        assert coalesce_writes(served) and not coalesce_writes(served)  # once
        for n in range(20):
            served.write(b"data: %d\n\n" % n)
        assert sent == []  # kept until the end of the turn
        await asyncio.sleep(0)
        assert len(sent) == 1
        served.write(b"tail\n\n")
        await served.drain()  # a drain sends what is kept first
        assert len(sent) == 2
        expected = b"".join(b"data: %d\n\n" % n for n in range(20)) + b"tail\n\n"
        assert await asyncio.wait_for(reader.readexactly(len(expected)), 5) == expected
    finally:
        writer.close()
        served.close()
        server.close()


async def test_close_and_half_close_send_what_is_kept():
    server, reader, writer, served = await pair()
    try:
        coalesce_writes(served)
        served.write(b"last words")
        served.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == b"last words"
    finally:
        writer.close()
        server.close()
    server, reader, writer, served = await pair()
    try:
        coalesce_writes(served)
        served.write(b"goodbye")
        served.close()
        assert await asyncio.wait_for(reader.read(), 5) == b"goodbye"
    finally:
        writer.close()
        server.close()


async def test_a_write_to_a_closed_peer_neither_raises_nor_hangs():
    server, reader, writer, served = await pair()
    coalesce_writes(served)
    writer.close()
    served.close()
    served.write(b"too late")  # after close: dropped, as mitmproxy's own is_closing check does
    await asyncio.sleep(0.01)
    server.close()
    assert coalesce_writes(None) is False
