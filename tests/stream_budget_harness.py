"""Parallel streams against one token cap, through the real proxy and runtime: the test
passport, governors in this process or as separate processes on one Redis, and an agent
that opens N streams at once and counts, at the client, the tokens it was delivered.

The mock upstream's text deltas are "abcd", one token each (4 bytes per token, the
adapters' estimate), so the count at the client is the count of delivered tokens.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.upstreams import Behaviour

CAP = 10_000
PIECE = "abcd"  # one token of text per delta

PASSPORT = {
    "adl_spec": "0.4.0", "name": "stream-agent", "description": "opens many streams at once", "version": "1.0.0",
    "id": "https://example.com/agents/stream-agent", "data_classification": {"sensitivity": "internal"},
    "lifecycle": {"status": "active"},
    "permissions": {"resource_limits": {"budget": {"tokens": {"per_session": CAP}}}},
}


def write_passport(path: Path) -> Path:
    from governor.passport import sign_passport

    path.write_text(json.dumps(sign_passport(PASSPORT, Ed25519PrivateKey.generate())))
    return path


def behaviour(tokens: int, *, per_chunk_usage: bool, honest: bool) -> Behaviour:
    """A stream of `tokens` one-token deltas; usage in every chunk or only at the end; an
    honest upstream stops at the request's max_tokens, a hostile one ignores it."""
    return Behaviour(text=PIECE * tokens, chunks=tokens, input_tokens=11, output_tokens=tokens,
                     progressive_usage=per_chunk_usage, honour_max_tokens=honest)


@dataclass
class Tally:
    """What the agent saw: tokens delivered per stream, statuses, streams cut by the governor."""

    delivered: list[int] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    cut: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.delivered)


async def one_stream(client: httpx.AsyncClient, url: str, session: str, max_tokens: int | None,
                     tally: Tally) -> None:
    anthropic = url.endswith("/v1/messages")
    body: dict[str, Any] = {"model": "claude-haiku-4-5" if anthropic else "gpt-4o-mini", "stream": True,
                            "messages": [{"role": "user", "content": "write on"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    chars = 0
    status = None
    try:
        async with client.stream("POST", url, json=body, headers={"ADL-Session": session}) as response:
            status = response.status_code
            tally.statuses.append(status)
            if response.status_code != 200:
                await response.aread()
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                data = orjson.loads(line[6:])
                if "governor" in data or "error" in data:
                    tally.cut += 1
                    continue
                if data.get("type") == "content_block_delta":  # Anthropic
                    chars += len((data.get("delta") or {}).get("text") or "")
                for choice in data.get("choices") or ():
                    chars += len((choice.get("delta") or {}).get("content") or "")
    except httpx.HTTPError as exc:  # a broken connection still counts what arrived
        # whether it broke before the response or mid-body tells an unaccepted connection from a cut
        tally.errors.append(f"{type(exc).__name__} {'after ' + str(status) if status else 'before a response'}: {exc!r}")
    finally:
        tally.delivered.append(-(-chars // len(PIECE)))


async def parallel_streams(proxies: list[str], upstream: str, streams: int, max_tokens: int | None,
                           session: str, timeout: float = 120.0, api: str = "openai") -> Tally:
    """`streams` streams at once in one session, spread over the governors at `proxies`
    (OpenAI chat completions, or Anthropic messages with api="anthropic")."""
    tally = Tally()
    clients = [httpx.AsyncClient(proxy=p, trust_env=False, timeout=60,
                                 limits=httpx.Limits(max_connections=streams, max_keepalive_connections=0))
               for p in proxies]
    try:
        url = f"{upstream}/v1/messages" if api == "anthropic" else f"{upstream}/v1/chat/completions"
        await asyncio.wait_for(asyncio.gather(*[
            one_stream(clients[i % len(clients)], url, session, max_tokens, tally) for i in range(streams)]),
            timeout)
    finally:
        for client in clients:
            await client.aclose()
    return tally


# --- governors as separate processes ------------------------------------------------------

REPLICA = """
import asyncio, json, logging, os, sys
from pathlib import Path
from governor.adapters.base import AdapterConfig
from governor.policy.steps import Tier
from governor.proxy.server import Settings, serve
from tests.proxy_harness import AGENT_NAMED

async def main():
    cfg = json.loads(sys.argv[1])
    logging.basicConfig(level=os.environ.get("GOVERNOR_TEST_REPLICA_LOG", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    running = await serve(Settings(**AGENT_NAMED, passport=Path(cfg["passport"]), listen=("127.0.0.1", 0), control=None,
                                   data_dir=Path(cfg["data_dir"]), store=cfg["store"], tier=Tier.R2,
                                   governor_id=cfg["governor_id"],
                                   tick_interval=0, adapters=AdapterConfig(default_output_tokens=cfg["guess"], fit_output=False)))
    print(json.dumps({"proxy": running.proxy_url}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin
    await running.stop()

asyncio.run(main())
"""


class Replica:
    """A governor process (`serve()` on the test passport) with its own data directory and its
    own id (two governors on one store with one id are reported as duplicates, unless they are
    the workers of one `governor run --workers`: governor.runtime.duplicates), output fitting
    off: these tests measure a stream growing past its reservation (docs/budgets.md)."""

    def __init__(self, process: asyncio.subprocess.Process, proxy: str, data_dir: Path) -> None:
        self.process = process
        self.proxy = proxy
        self.data_dir = data_dir

    def duplicates_reported(self) -> list[str]:
        """The lines of its log that report another live governor with its id or key."""
        text = (self.data_dir / "governor.log").read_text(errors="replace")
        return [line for line in text.splitlines() if "another live governor on this store" in line]

    @classmethod
    async def start(cls, passport: Path, data_dir: Path, store: str, guess: int = 4096) -> "Replica":
        config = {"passport": str(passport), "data_dir": str(data_dir), "store": store, "guess": guess,
                  "governor_id": f"did:web:localhost:{data_dir.name}"}  # its own, as bench/scaling.py gives each
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        data_dir.mkdir(parents=True, exist_ok=True)
        # the governor's log stays in its data directory: a failed case shows what the governor saw
        with open(data_dir / "governor.log", "ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", REPLICA, json.dumps(config), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=log, env=env)
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = await asyncio.wait_for(process.stdout.readline(), 60)
            if not line:
                raise RuntimeError(f"governor replica exited with {await process.wait()}")
            if line.startswith(b"{"):
                return cls(process, json.loads(line)["proxy"], data_dir)
        raise RuntimeError("governor replica did not start in time")

    async def stop(self) -> None:
        if self.process.returncode is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()
