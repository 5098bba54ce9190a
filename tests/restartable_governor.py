"""`governor run` as a real subprocess, for tests that kill it, restart it or limit it.

    passport = write_passport(tmp_path / "p.json", tokens_per_session=20_000)
    gov = GovernorProcess(tmp_path / "data", passport).start()     # waits for the banner
    ... gov.proxy_url, gov.control_url ...
    gov.kill()        # SIGKILL, no clean-up at all
    gov.stop()        # SIGTERM, waits

The proxy and the control plane listen on free loopback ports (port 0); their addresses
are read from the start-up banner. The governor's log goes to `<data>/../governor-N.log`.
"""

from __future__ import annotations

import copy
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from governor.passport import example_passport_path, load_passport, sign_passport

_URL = re.compile(r"^\s*(proxy|control plane):\s+(http://\S+)")


EXAMPLE_PASSPORT_KEY = Path(__file__).resolve().parents[1] / "policies" / "example-passport.key.pem"


def example_passport() -> dict[str, Any]:
    return copy.deepcopy(load_passport(example_passport_path()))


def write_passport(path: Path, *, scale: float = 1.0, mutate: Callable[[dict], None] | None = None,
                   signed: bool = True) -> Path:
    """The bundled example passport with every token cap multiplied by `scale`, then `mutate`
    applied; written as JSON. A changed passport is re-signed with the example's key (its
    author's), or written unsigned with signed=False (refused unless allow_unsigned_passport)."""
    document = example_passport()
    budget = document["permissions"]["resource_limits"]["budget"]
    for scope in budget["tokens"]:
        budget["tokens"][scope] = int(budget["tokens"][scope] * scale)
    if mutate is not None:
        mutate(document)
    if scale != 1 or mutate is not None or not signed:  # changed: its old signature no longer holds
        document.get("security", {}).get("attestation", {}).pop("signature", None)
        if signed:
            document = sign_passport(document, EXAMPLE_PASSPORT_KEY.read_bytes())
    path.write_text(json.dumps(document), encoding="utf-8")
    return path



CONTROL_TOKEN = "restartable-governor-control-token"  # /v1 needs it (docs/sessions.md)
CONTROL_HEADERS = {"Authorization": f"Bearer {CONTROL_TOKEN}"}

class GovernorProcess:
    _count = 0

    def __init__(self, data_dir: Path, passport: Path, *, nofile: int | None = None, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.passport = Path(passport)
        self.nofile = nofile
        self.extra = extra
        self.env = env or {}
        self.process: subprocess.Popen | None = None
        self.proxy_url = ""
        self.control_url = ""
        self.banner: list[str] = []
        GovernorProcess._count += 1
        self.log_path = self.data_dir.parent / f"governor-{GovernorProcess._count}.log"

    def _limit(self) -> None:  # runs in the child, before exec
        if self.nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def start(self, timeout: float = 60.0) -> GovernorProcess:
        command = [sys.executable, "-m", "governor", "run", "--passport", str(self.passport),
                   "--data-dir", str(self.data_dir), "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0",
                   # these tests name their sessions (tests/proxy_harness.AGENT_NAMED)
                   "--sessions", "agent-named", "--agent-sessions-per-day", "1000000", "--lock-on", "none", "--agent-identity", "headers",
                   *self.extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "GOVERNOR_CONTROL_TOKEN": CONTROL_TOKEN, **self.env}
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
            env.pop(name, None)
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=env,
                                            preexec_fn=self._limit if self.nofile else None)
        finally:
            log.close()
        lines: list[str] = []
        done = threading.Event()

        def read() -> None:
            assert self.process is not None and self.process.stdout is not None
            for raw in self.process.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                lines.append(line)
                if "Ctrl-C stops" in line:
                    break
            done.set()

        threading.Thread(target=read, daemon=True).start()
        if not done.wait(timeout) or self.process.poll() is not None and not any("Ctrl-C" in x for x in lines):
            self.kill()
            raise RuntimeError(f"governor did not start within {timeout}s; log:\n{self.log()[-3000:]}")
        self.banner = lines
        for line in lines:
            if match := _URL.match(line):
                if match.group(1) == "proxy":
                    self.proxy_url = match.group(2)
                else:
                    self.control_url = match.group(2)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the governor gets no chance to end a session or flush anything."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)
            if self.process.stdout is not None:
                self.process.stdout.close()

    def stop(self, timeout: float = 30.0) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode

    def open_files(self) -> int:
        assert self.process is not None
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
