"""`governor run --workers N`: N proxy processes on one listening port, sharing budgets
through the store (docs/deployment.md, "Several workers on one host").

The process started as `governor run --workers N` is a supervisor: it serves nothing itself.
It starts N `governor run` workers with the same options, each listening on the same proxy
address with SO_REUSEPORT (the kernel spreads new connections over them), each in its own
data directory (DATA_DIR/workers/K: journals, records and the transparency log are one
process's; its log's origin the governor's with "/worker-K", so the logs never fork one
origin and the workers are one governor to the duplicate-identity watch) with the CA, the
governor key and the tokens of DATA_DIR copied in, so an agent trusts one CA and every record
is signed by one key. Worker 0 also serves the control
plane (one listener: SO_REUSEPORT would spread the control plane's requests over processes
whose sessions, holds and approvals are their own; budgets are in the store, so any
worker's views of them agree). Signals: SIGTERM and SIGINT are passed to every worker, each
drains as one `governor run` does, and the supervisor exits once all have; SIGHUP is passed
on (each reloads). A worker that dies otherwise (kill -9, a crash) is reported and started
again; one that keeps dying at start stops the whole.

Budgets are shared only through a store every worker opens: `--workers` above 1 needs a
Redis store (the embedded store is one process's: refused).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from governor.cli import UsageError

WORKER_OPTIONS: dict[str, tuple[str, str]] = {
    "workers": ("GOVERNOR_WORKERS", "run N proxy processes on the one --listen port (SO_REUSEPORT), sharing budgets "
                "through a Redis --store; worker 0 serves the control plane (default 1; docs/deployment.md)"),
}
WORKER_ENV = "GOVERNOR_WORKER"  # set in a worker: which one it is (it then shares its listening port)
MAX_WORKERS = 64
SHARED_FILES = ("mitmproxy-ca.pem", "mitmproxy-ca-cert.pem", "mitmproxy-ca-cert.cer", "mitmproxy-ca-cert.p12",
                "mitmproxy-ca.p12", "mitmproxy-dhparam.pem", "control-token", "reviewer-token")
SHARED_DIRS = ("keys",)  # the governor's signing key (governor.evidence.keys)
RESTARTS_AT_START = 5  # a worker that dies this many times within START_WINDOW of its start stops everything
START_WINDOW = 5.0
BANNER_END = "Ctrl-C stops."  # the last line of `governor run`'s start-up instructions


def apply_worker_settings(settings: Any, value: Callable[[str], Any]) -> None:
    """--workers: how many workers `governor run` supervises (settings.workers). In a worker
    it is 1, and the proxy's listening socket is shared with the others (SO_REUSEPORT)."""
    if (index := os.environ.get(WORKER_ENV)) is not None:
        settings.workers = 1
        settings.worker = int(index) if index.isdigit() else None
        share_listening_port()
        return
    given = value("workers")
    if given is None:
        settings.workers = 1
        return
    try:
        workers = int(str(given))
    except ValueError:
        raise UsageError(f"--workers: expected a whole number of processes, got {given!r}") from None
    if not 1 <= workers <= MAX_WORKERS:
        raise UsageError(f"--workers: expected 1 to {MAX_WORKERS}, got {workers}")
    if workers > 1:
        store = str(getattr(settings, "store", "") or "")
        if not store.startswith(("redis://", "rediss://", "redis+", "rediss+")):
            raise UsageError(f"--workers {workers}: the workers share budgets through the store, and the embedded "
                             "store is one process's; use a Redis store (--store redis://HOST:PORT/DB, "
                             "docs/reference/stores.md)")
        if getattr(settings, "transparent", None) is not None:
            raise UsageError(f"--workers {workers}: --transparent is one process's listener; run one worker")
    settings.workers = workers


def share_listening_port() -> None:
    """Make this process's listening sockets SO_REUSEPORT: mitmproxy opens its listener with
    asyncio.start_server and has no option for it. Only in a worker, which serves nothing else."""
    import asyncio

    original = asyncio.start_server
    if getattr(original, "shares_port", False):
        return

    async def start_server(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("reuse_port", True)
        return await original(*args, **kwargs)

    start_server.shares_port = True  # type: ignore[attr-defined]
    asyncio.start_server = start_server  # type: ignore[assignment]


class Worker:
    """One `governor run` worker process and what the supervisor knows of it."""

    def __init__(self, index: int, command: list[str], data_dir: Path) -> None:
        self.index = index
        self.command = command
        self.data_dir = data_dir
        self.banner: list[str] = []  # its start-up instructions (worker 0's are printed once all are up)
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.quick_deaths = 0
        self.restarts = 0
        self.ready = threading.Event()

    def start(self) -> None:
        self.ready.clear()
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, env={**os.environ,
                                                                                   WORKER_ENV: str(self.index)})
        threading.Thread(target=self._pump, args=(self.process,), daemon=True,
                         name=f"governor-worker-{self.index}-stdout").start()

    def _pump(self, process: subprocess.Popen[bytes]) -> None:
        """Its standard output: the banner kept (up to its last line), what follows relayed."""
        assert process.stdout is not None
        banner: list[str] = []
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            if self.ready.is_set():
                sys.stdout.write(line)
                sys.stdout.flush()
                continue
            banner.append(line)
            if line.startswith(BANNER_END):
                self.banner = banner
                self.ready.set()
                if self.restarts:
                    print(f"governor run --workers: worker {self.index} (pid {process.pid}) serves again",
                          file=sys.stderr, flush=True)
        self.ready.set()  # exited: whoever waits sees it

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.send_signal(sig)
            except ProcessLookupError:
                pass


def supervise(settings: Any, argv: list[str] | None = None) -> int:
    """Run settings.workers workers of `governor run` (the same `argv`) until SIGTERM/SIGINT."""
    argv = list(sys.argv[2:] if argv is None else argv)  # after `governor run`
    host, port = settings.listen
    holder = None
    if port == 0:  # one port for all: chosen here, held (SO_REUSEPORT, not listening) while they run
        holder = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((host, 0))
        port = holder.getsockname()[1]
    control = settings.control
    if control is not None and control[1] == 0:
        with socket.socket(socket.AF_INET6 if ":" in control[0] else socket.AF_INET) as s:
            s.bind((control[0], 0))
            control = (control[0], s.getsockname()[1])
    root = Path(settings.data_dir)
    base = [sys.executable, "-m", "governor", "run", *argv, "--listen", f"{_host(host)}:{port}"]
    workers = []
    for k in range(settings.workers):
        directory = root / "workers" / str(k)
        directory.mkdir(parents=True, exist_ok=True)
        _copy_shared(root, directory)
        own = ["--data-dir", str(directory),
               "--control", f"{_host(control[0])}:{control[1]}" if k == 0 and control is not None else "off"]
        workers.append(Worker(k, base + own, directory))
    stopping = threading.Event()
    forwarded: list[int] = []

    def on_signal(sig: int, _frame: Any) -> None:
        if sig == signal.SIGHUP:
            for w in workers:
                w.signal(signal.SIGHUP)
            return
        forwarded.append(sig)
        stopping.set()
        for w in workers:
            w.signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        first = workers[0]
        first.start()
        first.ready.wait(120)
        if first.poll() is not None or not first.ready.is_set():
            print(f"governor run --workers: worker 0 did not start (exit {first.poll()})", file=sys.stderr)
            _stop_all(workers)
            return 1
        for w in workers[1:]:  # the CA, key and tokens worker 0 made: the same for every worker
            _copy_shared(first.data_dir, root)
            _copy_shared(first.data_dir, w.data_dir)
            w.start()
        for w in workers[1:]:
            w.ready.wait(120)
        late = [w.index for w in workers if w.poll() is not None or not w.banner]
        if late:
            print(f"governor run --workers: worker(s) {', '.join(map(str, late))} did not start", file=sys.stderr)
            _stop_all(workers)
            return 1
        # the start-up instructions once every worker listens (worker 0's: the same port, CA and control plane)
        print(f"  workers:        {len(workers)} processes on {_host(host)}:{port} (pids "
              f"{', '.join(str(w.pid) for w in workers)}); worker 0 serves the control plane; data in "
              f"{root / 'workers'}", flush=True)
        sys.stdout.write("".join(first.banner))
        sys.stdout.flush()
        return _watch(workers, stopping)
    finally:
        if holder is not None:
            holder.close()


def _watch(workers: list[Worker], stopping: threading.Event) -> int:
    """Until a stop signal: restart a worker that died. Then wait for every worker's drain."""
    while not stopping.is_set():
        for w in workers:
            code = w.poll()
            if code is None or stopping.is_set():
                continue
            quick = time.monotonic() - w.started_at < START_WINDOW
            w.quick_deaths = w.quick_deaths + 1 if quick else 0
            print(f"governor run --workers: worker {w.index} (pid {w.pid}) exited with {code}"
                  + ("; too many deaths at start, stopping every worker" if w.quick_deaths >= RESTARTS_AT_START
                     else "; starting it again"), file=sys.stderr, flush=True)
            if w.quick_deaths >= RESTARTS_AT_START:
                _stop_all(workers)
                return 1
            w.restarts += 1
            w.start()
        stopping.wait(0.2)
    clean = []
    for w in workers:  # one stopped while it was still starting (no handler yet) had nothing to drain
        code = _wait(w)
        clean.append(code == 0 or (code in (-signal.SIGTERM, -signal.SIGINT) and not w.ready.is_set()))
    return 0 if all(clean) else 1


def _wait(worker: Worker, timeout: float = 120.0) -> int:
    if worker.process is None:
        return 0
    try:
        return worker.process.wait(timeout)
    except subprocess.TimeoutExpired:  # its own drain is bounded: this one is not expected
        worker.process.kill()
        return worker.process.wait()


def _stop_all(workers: list[Worker]) -> None:
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        _wait(w, 60.0)


def _copy_shared(source: Path, target: Path) -> None:
    """Copy what every worker must share (the CA, the governor key, the tokens) where missing."""
    for name in SHARED_FILES:
        src, dst = source / name, target / name
        if src.is_file() and not dst.exists():
            shutil.copy2(src, dst)
    for name in SHARED_DIRS:
        src, dst = source / name, target / name
        if src.is_dir() and not dst.exists():
            shutil.copytree(src, dst)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
