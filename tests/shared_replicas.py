"""Governor processes on one real Redis that share sessions (issue #30 item 1): each replica a
separate process (`serve()` with a control plane), all with one governor key (a shared gateway's
replicas sign as one governor), and the clients a test drives them with."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from governor.evidence import KeyFiles, ensure_governor_key

CONTROL = "control-token-for-shared-session-tests-0123"
REVIEWER = "reviewer-token-for-shared-session-tests-012"

REPLICA = """
import asyncio, json, sys
from pathlib import Path
from governor.proxy.server import Settings, serve

async def main():
    cfg = json.loads(sys.argv[1])
    settings = Settings(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=Path(cfg["data_dir"]),
                        store=cfg["store"], control_token=cfg["control"], reviewer_tokens=(cfg["reviewer"],),
                        tick_interval=cfg["tick"], session_idle=cfg["idle"], **cfg.get("extra", {}))
    running = await serve(settings)
    print(json.dumps({"proxy": running.proxy_url, "control": running.control_url}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin
    await running.stop()

asyncio.run(main())
"""


def shared_keys(tmp: Path) -> Path:
    """One governor key for every replica (copied into each data directory)."""
    source = tmp / "gateway-keys"
    ensure_governor_key(source, "did:web:gateway.example")
    return source / "keys"


class Replica:
    def __init__(self, name: str, process: asyncio.subprocess.Process, proxy: str, control: str,
                 data_dir: Path) -> None:
        self.name, self.process, self.proxy, self.control_url, self.data_dir = name, process, proxy, control, data_dir
        self.agent = httpx.AsyncClient(proxy=proxy, trust_env=False, timeout=30)
        self.control = httpx.AsyncClient(base_url=control, trust_env=False, timeout=30,
                                         headers={"Authorization": f"Bearer {CONTROL}"})
        self.reviewer = httpx.AsyncClient(base_url=control, trust_env=False, timeout=30,
                                          headers={"Authorization": f"Bearer {REVIEWER}"})

    @classmethod
    async def start(cls, name: str, tmp: Path, keys: Path, store: str, *, tick: float = 0.0, idle: float = 900.0,
                    extra: dict[str, Any] | None = None) -> Replica:
        data_dir = tmp / name
        if not (data_dir / "keys").exists():
            shutil.copytree(keys, data_dir / "keys")
        config = {"data_dir": str(data_dir), "store": store, "control": CONTROL, "reviewer": REVIEWER,
                  "tick": tick, "idle": idle, "extra": extra or {}}
        log = open(tmp / f"{name}.log", "ab")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", REPLICA, json.dumps(config), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = await asyncio.wait_for(process.stdout.readline(), 60)
            if not line:
                raise RuntimeError(f"replica {name} exited with {await process.wait()}: see {tmp / f'{name}.log'}")
            if line.startswith(b"{"):
                started = json.loads(line)
                return cls(name, process, started["proxy"], started["control"], data_dir)
        raise RuntimeError(f"replica {name} did not start in time")

    async def chat(self, llm_url: str, token: str, max_tokens: int = 100, answers: int = 1) -> httpx.Response:
        body = {"model": "gpt-4o-mini", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
        if answers > 1:
            body["n"] = answers
        return await self.agent.post(f"{llm_url}/chat/completions", headers={"ADL-Session": token}, json=body)

    async def close_clients(self) -> None:
        for client in (self.agent, self.control, self.reviewer):
            await client.aclose()

    async def stop(self) -> None:
        await self.close_clients()
        if self.process.returncode is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()

    async def kill(self) -> None:
        """kill -9: nothing of this process's memory survives."""
        await self.close_clients()
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()


def public_key(keys: Path) -> Path:
    return KeyFiles(keys).public_key
