"""A throwaway redis-server on a free loopback port, for the Redis store's tests and benchmark."""

from __future__ import annotations

import os
import signal
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

import pytest
import redis

REDIS_SERVER = shutil.which("redis-server")
if REDIS_SERVER is None and os.environ.get("CI"):
    # CI's `.ci/dev test` installs it: a missing server there is a broken set-up, not a skip
    raise RuntimeError("redis-server is not installed on CI; `.ci/dev test` should have installed it")
NOT_INSTALLED = "redis-server is not installed (apt-get install redis-server; `.ci/dev test` installs it)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ExitedAtStart(RuntimeError):
    """redis-server ended before it answered (most likely its port was taken)."""


class RedisServer:
    """One redis-server process without persistence, in its own temporary directory."""

    def __init__(self) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError(NOT_INSTALLED)
        self._dir = tempfile.TemporaryDirectory(prefix="governor-redis-")
        # a free port can be taken between our probe and redis-server's bind (the suite's other
        # workers start servers too): a server that exits at once is started again on another
        for attempt in range(3):
            self.port = _free_port()
            self.url = f"redis://127.0.0.1:{self.port}/0"
            self.process = subprocess.Popen(
                [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", self._dir.name],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                self._wait_ready()
                return
            except ExitedAtStart:
                if attempt == 2:
                    self._dir.cleanup()
                    raise

    def _wait_ready(self, timeout: float = 10.0) -> None:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.process.poll() is not None:
                    raise ExitedAtStart(f"redis-server exited with {self.process.returncode} (port {self.port} taken?)")
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server on port {self.port} did not answer PING within {timeout}s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # a test may have SIGSTOPped it: SIGTERM would wait
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._dir.cleanup()


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis server for the whole test session (skipped, with the reason, without redis-server)."""
    if REDIS_SERVER is None:
        pytest.skip(NOT_INSTALLED)
    with redis_server() as server:
        yield server.url
