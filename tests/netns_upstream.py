"""The upstream for tests/test_intercept.py, run inside its own network namespace:
the mock LLM on HOST:80 and a plain TCP listener on HOST:OTHER_PORT (a port the
interception rules do not list). Prints "ready", then, when stdin closes, the paths of
the requests the mock served as one JSON line, and exits.

    python -m tests.netns_upstream HOST OTHER_PORT
"""

from __future__ import annotations

import asyncio
import json
import sys

from tests.upstreams import MockLLM


async def main(host: str, other_port: int) -> None:
    mock = MockLLM()
    await mock.start(host=host, port=80)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"open\n")
        await writer.drain()
        writer.close()

    other = await asyncio.start_server(answer, host, other_port)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin
    other.close()
    await mock.stop()
    print(json.dumps([r.path for r in mock.requests]), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
