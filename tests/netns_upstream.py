"""The upstream for tests/test_intercept.py, run inside its own network namespace:
the mock LLM on HOST:80 and on HOST:53 (an LLM on the DNS port, the escape interception
must close), a plain TCP listener on HOST:OTHER_PORT (a port the interception rules do not
list), and a UDP echo on port 53 of HOST and of each RESOLVER (the pod's DNS servers, which
the agent may reach). Prints "ready", then, when stdin closes, the paths of the requests the
mocks served as one JSON line, and exits.

    python -m tests.netns_upstream HOST OTHER_PORT [RESOLVER ...]
"""

from __future__ import annotations

import asyncio
import json
import sys

from tests.upstreams import MockLLM


class Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        self.transport.sendto(b"echo " + data[2:], addr)


async def main(host: str, other_port: int, resolvers: list[str]) -> None:
    mock, on_53 = MockLLM(), MockLLM()
    await mock.start(host=host, port=80)
    await on_53.start(host=host, port=53)
    loop = asyncio.get_running_loop()
    echoes = [(await loop.create_datagram_endpoint(Echo, local_addr=(address, 53)))[0]
              for address in (host, *resolvers)]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"open\n")
        await writer.drain()
        writer.close()

    other = await asyncio.start_server(answer, host, other_port)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin
    other.close()
    for echo in echoes:
        echo.close()
    await mock.stop()
    await on_53.stop()
    print(json.dumps([r.path for r in mock.requests + on_53.requests]), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
