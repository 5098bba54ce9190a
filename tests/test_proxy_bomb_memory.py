"""A decompression bomb does not reach the governor's memory (issue 20, finding 4).

The issue measured `governor run` at 557 MiB before a 509 KiB gzip body and 1,382 MiB after:
mitmproxy inflated the body whole before the size check. Here a real `governor run` (a
subprocess, reverse mode in front of the loopback mock) gets bombs in every coding it reads;
its peak resident memory (VmHWM in /proc/PID/status, reset with clear_refs before the bombs)
may grow by a few tens of MiB at most, and each bomb is answered with a 413 within seconds.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

import brotli
import orjson
import pytest

from tests.proxy_harness import REPO, RawClient
from tests.test_proxy_shapes import gzip_bomb
from tests.upstreams import MockLLM, make_tls

pytestmark = [pytest.mark.asyncio, pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                                                     reason="needs Linux /proc")]

CHAT = orjson.dumps({"model": "gpt-4o-mini", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _brotli_bomb(gib: int) -> bytes:
    compressor = brotli.Compressor(quality=1)
    zeros = bytes(8 << 20)
    return b"".join([compressor.process(zeros) for _ in range(gib * 128)] + [compressor.finish()])


def _zstd_bomb(gib: int) -> bytes:
    from backports import zstd

    compressor = zstd.ZstdCompressor(level=1)
    zeros = bytes(8 << 20)
    return b"".join([compressor.compress(zeros) for _ in range(gib * 128)] + [compressor.flush()])


async def _request(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, float]:
    def go() -> tuple[int, bytes, float]:
        began = time.monotonic()
        client = RawClient(("127.0.0.1", port), Path("/nonexistent"), None)
        try:
            client.send("POST", "/v1/chat/completions", body, headers)
            status, _, answer = client.read_response()
            return status, answer, time.monotonic() - began
        finally:
            client.close()
    return await asyncio.to_thread(go)


async def test_bombs_are_refused_without_growing_the_governors_memory(tmp_path):
    bombs = {"gzip": gzip_bomb(500), "br": _brotli_bomb(2), "zstd": _zstd_bomb(2)}
    assert len(bombs["gzip"]) < 520 * 1024  # the 509 KiB, decoding to 500 MiB
    tls = make_tls(tmp_path / "tls")
    mock = MockLLM(tls)
    await mock.start()
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "governor", "run", "--listen", f"127.0.0.1:{port}", "--control", "off",
        "--mode", f"reverse:{mock.base_url}", "--upstream-ca", str(tls.ca_file),
        "--data-dir", str(tmp_path / "data"), "--session", "bombs",
        cwd=str(REPO), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.startswith(b"governor running"), line
        # warm up: one ordinary call, so what serving needs is already resident
        status, _, _ = await _request(port, CHAT, {})
        assert status in (200, 403, 429), status
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = _status_kib(proc.pid, "VmHWM")
        for coding, bomb in bombs.items():
            status, answer, took = await _request(port, bomb, {"Content-Encoding": coding})
            assert status == 413, (coding, answer)
            assert "times its compressed size" in orjson.loads(answer)["error"]["message"]
            assert took < 10, f"{coding} bomb answered after {took:.1f}s"
        grew = (_status_kib(proc.pid, "VmHWM") - before) / 1024
        print(f"peak RSS before the bombs {before / 1024:.0f} MiB, grew by {grew:.1f} MiB")
        assert grew < 48, f"peak RSS grew by {grew:.0f} MiB"
        assert [r for r in mock.requests if r.method == "POST"][1:] == []  # no bomb went upstream
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        await mock.stop()
