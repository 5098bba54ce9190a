"""`governor run` as a real child process, for tests and the soak that need its own
file-descriptor limit, its own event loop and /proc figures (RSS, open files)."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class GovernorProcess:
    def __init__(self, data_dir: Path, args: list[str], *, nofile: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.args = args
        self.nofile = nofile
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.proxy: tuple[str, int] | None = None
        self.control_url: str | None = None
        self.log = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.output: list[str] = []  # its standard output, the banner and what follows

    @property
    def ca_file(self) -> Path:
        return self.data_dir / "mitmproxy-ca-cert.pem"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, timeout: float = 60.0) -> "GovernorProcess":
        nofile = self.nofile

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "PYTHONPATH": str(REPO),
               **self.env}
        command = [sys.executable, "-m", "governor", "run", "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0",
                   "--data-dir", str(self.data_dir),
                   # tests about other things name their sessions (tests/proxy_harness.AGENT_NAMED)
                   "--sessions", "agent-named", "--agent-sessions-per-day", "1000000", "--lock-on", "none",
                   "--agent-identity", "headers", *self.args]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log,
                                         preexec_fn=limit)
        lines: list[str] = []

        def read_banner() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                lines.append(line)
                self.output.append(line)
                if line.startswith("Set in the agent's environment"):
                    return

        try:
            await asyncio.wait_for(asyncio.to_thread(read_banner), timeout)
        except asyncio.TimeoutError:
            await self.stop()
            raise AssertionError(f"governor did not start in {timeout}s: {lines} {self.log.read_text()[-2000:]}")
        text = "\n".join(lines)
        proxy = re.search(r"proxy:\s+http://([\d.]+):(\d+)", text)
        control = re.search(r"control plane:\s+(http://\S+)", text)
        if proxy is None or control is None:
            await self.stop()
            raise AssertionError(f"unexpected banner: {text}\n{self.log.read_text()[-2000:]}")
        self.proxy = (proxy.group(1), int(proxy.group(2)))
        self.control_url = control.group(1)
        # keep reading stdout so the child never blocks on a full pipe
        asyncio.get_running_loop().run_in_executor(None, self._drain)
        return self

    def _drain(self) -> None:
        try:
            assert self.proc is not None and self.proc.stdout is not None
            for raw in self.proc.stdout:
                self.output.append(raw.decode(errors="replace").rstrip())
        except (OSError, ValueError):
            pass

    async def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout)
            except asyncio.TimeoutError:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        return self.proc.returncode

    # --- /proc figures -------------------------------------------------------------------

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0
