"""Shared machinery of the benchmark suite: the processes it runs and the numbers it keeps.

Every moving part runs in its own process, started by the suite and stopped by it:

    python bench/common.py upstream    mock OpenAI chat completions upstream (aiohttp)
    python bench/common.py bare        mitmproxy embedded as the governor embeds it, no-op addon
    python bench/common.py load        load generator: JSON commands on stdin, results on stdout
    governor run --passport P ...      the governor itself, as users run it (`Governor` below)

A bench role prints one JSON line when it listens ({"pid", "port", ...}) and stops
cleanly on SIGTERM. The load generator speaks raw HTTP/1.1 over asyncio streams (one
kept-alive connection per worker, absolute-form requests through a proxy), so the
client's own cost is small and the same for every path. Only loopback is used.

Helpers for the orchestrating scripts: percentiles, per-process CPU time and peak
memory from /proc, the bench passports (signed with a key generated per run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import queue
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
PYTHON = sys.executable
HOST = "127.0.0.1"
CA_FILE = "mitmproxy-ca-cert.pem"  # in a proxy's data directory (its mitmproxy confdir)
CHAT_PATH = "/v1/chat/completions"

# --- numbers ----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """n, p50, p90, p99, mean and max of a sample (None for an empty one)."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "mean": None, "max": None}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), digits),
        "p90": round(percentile(values, 90), digits),
        "p99": round(percentile(values, 99), digits),
        "mean": round(sum(values) / len(values), digits),
        "max": round(max(values), digits),
    }


def ratio(numerator: float | None, denominator: float | None, digits: int = 3) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, digits)


# --- per-process accounting (/proc, no dependency) --------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_cpu(path: str) -> float:
    """utime + stime from a /proc stat file (a process's or a thread's), in seconds."""
    with open(path, "rb") as f:
        raw = f.read()
    fields = raw[raw.rindex(b")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # fields 14 and 15 of stat(5)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds, from /proc/<pid>/stat."""
    return _stat_cpu(f"/proc/{pid}/stat")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of `pid`, from /proc."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = _stat_cpu(f"/proc/{pid}/task/{tid}/stat")
        except OSError:  # the thread ended meanwhile
            continue
    return out


def memory_mb(pid: int) -> dict[str, float]:
    """Resident memory now (VmRSS) and at its peak (VmHWM), in MiB."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, value = line.split(":", 1)
                out["rss_mb" if name == "VmRSS" else "peak_rss_mb"] = round(int(value.split()[0]) / 1024, 1)
    return out


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    model = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    load = None
    with contextlib.suppress(OSError):
        load = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": load,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


@contextlib.contextmanager
def scratch(name: str) -> Iterator[Path]:
    """A temporary directory for one benchmark's passport and data directories, removed after."""
    with tempfile.TemporaryDirectory(prefix=f"governor-bench-{name}-") as tmp:
        yield Path(tmp)


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


# --- the bench passports ----------------------------------------------------------------

BIG = 10**12  # a cap that never fires in a benchmark run


def bench_passport(caps: dict[str, Any] | None = None) -> dict[str, Any]:
    """The example passport with every governed member kept and its limits raised so that
    none fires during a run; `caps` overrides the per-session budget (budget accuracy).

    Unsigned, with the example's key and DID removed; `write_passport` signs it."""
    from governor.passport import example_passport_path, load_passport

    doc = load_passport(example_passport_path())
    doc = json.loads(json.dumps(doc))  # a plain, mutable copy
    identity = doc.get("cryptographic_identity", {})
    identity.pop("public_key", None)
    identity.pop("did", None)
    doc["security"]["attestation"].pop("signature", None)
    limits = doc["permissions"]["resource_limits"]
    limits["max_concurrent"] = 1024
    limits["max_duration_sec"] = 7 * 86400
    limits["budget"] = {
        "tokens": {"per_session": BIG, "per_day": BIG},
        "cost_usd": {"per_session": 10**6, "per_day": 10**6},
        "wall_clock_sec": {"per_session": 7 * 86400, "per_day": 7 * 86400},
    }
    for persona in doc["permissions"].get("sub_agents", []):
        persona["max_parallel"] = 1024
        if "budget_share" in persona:
            persona["budget_share"] = {"tokens": {"per_session": BIG // 2, "per_day": BIG // 2},
                                       "cost_usd": {"per_session": 10**5, "per_day": 10**5}}
    invocation = doc["runtime"]["tool_invocation"]
    invocation["max_concurrent"] = 1024
    invocation["max_iterations"] = 10**9
    invocation["max_tool_calls_per_session"] = 10**9
    doc["anomaly_baseline"]["cost_per_session_usd"] = {"min": 0, "max": 10**6}
    for trigger in doc.get("human_oversight", {}).get("triggers", []):
        if isinstance(trigger, dict) and "cost_usd_over" in trigger.get("when", {}):
            trigger["when"]["cost_usd_over"] = 10**5
    if caps:
        for dimension, per_session in caps.items():
            limits["budget"][dimension]["per_session"] = per_session
    doc["name"] = "Governor Bench Agent"
    doc["id"] = "https://example.com/agents/governor-bench"
    return doc


def write_passport(path: Path, caps: dict[str, Any] | None = None) -> Path:
    """Sign the bench passport with a freshly generated Ed25519 key and write it as JSON."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from governor.passport import sign_passport

    signed = sign_passport(bench_passport(caps), Ed25519PrivateKey.generate())
    path.write_text(json.dumps(signed, indent=2))
    return path


# --- running the roles ------------------------------------------------------------------


class Role:
    """A process started by the suite: waits for it to say it listens, stops it on exit.

    `Role("upstream")` runs a role of this file; subclasses run other commands."""

    def __init__(self, role: str, *args: str, ready_timeout: float = 60.0,
                 env: Mapping[str, str] | None = None) -> None:
        """env: variables to set for the process, over this one's environment."""
        self.role = role
        self.proc = subprocess.Popen(
            self.command(role, args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
            text=True, bufsize=1, cwd=str(REPO), env={**os.environ, **env} if env else None,
        )
        self.pid: int = self.proc.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True, name=f"bench-{role}-stdout").start()
        try:
            self.info = self.ready(ready_timeout)
        except BaseException:
            self.stop()
            raise

    def command(self, role: str, args: Sequence[str]) -> list[str]:
        return [PYTHON, str(BENCH / "common.py"), role, *args]

    def ready(self, timeout: float) -> dict[str, Any]:
        return self._read_json(timeout)

    def _read_line(self, deadline: float) -> str:
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"bench {self.role}: no answer in time") from None
        if line is None:
            raise RuntimeError(f"bench {self.role} exited with {self.proc.wait()} (see its stderr above)")
        return line.strip()

    def _pump(self) -> None:
        """Its stdout, line by line, into a queue (a reader thread: select() on a buffered
        pipe would miss lines already read ahead)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _read_json(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            line = self._read_line(deadline)
            if line.startswith("{"):
                return json.loads(line)

    def ask(self, command: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
        """Send one JSON command (load generator) and read its JSON answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        answer = self._read_json(timeout)
        if "error" in answer:
            raise RuntimeError(f"bench {self.role}: {answer['error']}")
        return answer

    @property
    def port(self) -> int:
        return int(self.info["port"])

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            print(f"bench {self.role}: still running 20 s after SIGTERM; killed", file=sys.stderr)
            self.proc.kill()
            self.proc.wait()
        if time.monotonic() - began > 2:
            print(f"bench {self.role}: took {time.monotonic() - began:.1f} s to stop", file=sys.stderr)

    def __enter__(self) -> "Role":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class Governor(Role):
    """`governor run` on a passport, with free loopback ports: how users run it."""

    def __init__(self, passport: Path, data_dir: Path, *, tier: str = "R3", session: str = "bench",
                 extra: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 executable: Path | None = None) -> None:
        """executable: another tree's `governor` (its venv's), to compare revisions in one run."""
        args = ["--passport", str(passport), "--data-dir", str(data_dir), "--tier", tier, "--session", session,
                "--listen", f"{HOST}:0", "--control", f"{HOST}:0", *extra]
        self.data_dir = Path(data_dir)
        self.executable = executable or Path(PYTHON).with_name("governor")
        super().__init__("governor", *args, env=env)

    def command(self, role: str, args: Sequence[str]) -> list[str]:
        return [str(self.executable), "run", *args]

    def ready(self, timeout: float) -> dict[str, Any]:
        """Reads `governor run`'s start-up instructions (proxy and control plane URLs)."""
        from urllib.parse import urlsplit

        deadline = time.monotonic() + timeout
        info: dict[str, Any] = {"pid": self.pid}
        while True:
            line = self._read_line(deadline)
            if line.startswith("proxy:"):
                info["port"] = urlsplit(line.split()[1]).port
            elif line.startswith("control plane:"):
                info["control"] = urlsplit(line.split()[2]).port
            elif line.startswith("Set in the agent") and "port" in info:
                return info

    @property
    def control_url(self) -> str:
        return f"http://{HOST}:{self.info['control']}"

    @property
    def control_token(self) -> str | None:
        """The control token `governor run` wrote to its data directory (None: an older tree's governor)."""
        try:
            return (self.data_dir / "control-token").read_text().strip() or None
        except OSError:
            return None


def upstream_url(port: int, *, tls: bool = False) -> str:
    return f"{'https' if tls else 'http'}://{HOST}:{port}{CHAT_PATH}"


# --- the request the load generator sends -----------------------------------------------


def chat_body(*, model: str = "gpt-4o-mini", stream: bool = False, max_tokens: int = 64,
              chunks: int | None = None, gap_ms: float | None = None) -> str:
    """A small chat completion request (about 400 bytes). The mock reads its stream shape
    from the `mock` member (ignored by the governor; a real API would reject it)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a research assistant. Answer briefly and cite your sources."},
            {"role": "user", "content": "Summarize the main finding of the paper on governed agents in two "
                                        "sentences, then list three open questions it raises."},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
        body["mock"] = {"chunks": chunks if chunks is not None else 20, "gap_ms": gap_ms if gap_ms is not None else 0}
    return json.dumps(body)


# === roles ==============================================================================

# --- mock upstream ----------------------------------------------------------------------

COMPLETION_TEXT = ("Governed agents keep to the limits they declare: the paper shows a proxy that "
                   "reserves budget before each model call and settles it with the provider's usage. "
                   "Open questions: cost of the check, behaviour under concurrency, and tool misuse. ") * 3


def honest_text(completion_tokens: int) -> str:
    """COMPLETION_TEXT cut to what `completion_tokens` can honestly carry: 3 words for every 4
    tokens (English runs at about 1.3 tokens a word). The governor counts the output it relays
    and flags a usage below its count (docs/reference/measured-usage.md): the mock must not lie."""
    words = COMPLETION_TEXT.split(" ")
    return " ".join(words[:max(1, completion_tokens * 3 // 4)])


def plain_answer(model: str, usage: dict[str, int]) -> bytes:
    """The mock upstream's chat completion (non-streamed) for `model` with `usage`, its text
    no more than the usage honestly covers."""
    import orjson

    return orjson.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1_790_000_000, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant",
                                             "content": honest_text(usage["completion_tokens"])},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": usage, "system_fingerprint": "fp_bench",
    })


def stream_writes(model: str, usage: dict[str, int], chunks: int, include_usage: bool) -> Iterator[bytes]:
    """What the mock upstream writes for a streamed chat completion, each write made when
    asked for: one `data:` event per chunk (a word of the answer each), then one write with
    the finish chunk, the usage chunk when the request asked for it
    (stream_options.include_usage) and [DONE]."""
    import orjson

    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1_790_000_000, "model": model}
    words = COMPLETION_TEXT.split(" ")
    for i in range(chunks):
        delta = {"content": words[i % len(words)] + " "}
        if i == 0:
            delta["role"] = "assistant"
        yield b"data: " + orjson.dumps(
            {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}) + b"\n\n"
    tail = b"data: " + orjson.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) + b"\n\n"
    if include_usage:
        tail += b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
    yield tail + b"data: [DONE]\n\n"


def mock_usage(request: dict[str, Any], default_completion: int = 64) -> dict[str, int]:
    """The mock upstream's usage for a request: prompt_tokens = ceil(bytes of the messages / 4),
    completion_tokens = max_tokens (the most the request allows)."""
    import orjson

    prompt = -(-len(orjson.dumps(request.get("messages"))) // 4)
    completion = request.get("max_tokens") or request.get("max_completion_tokens") or default_completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def run_upstream(args: argparse.Namespace) -> None:
    """An OpenAI chat completions endpoint with a fixed answer and the most usage the
    request allows: prompt_tokens = ceil(bytes of the messages / 4), completion_tokens =
    max_tokens. `GET /stats` tells how many requests it answered (what was forwarded)."""
    import orjson
    from aiohttp import web

    plain_cache: dict[tuple, bytes] = {}
    answered = {"requests": 0}

    async def chat(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return web.json_response({"error": {"message": "bad json"}}, status=400)
        answered["requests"] += 1
        model = body.get("model", "gpt-4o-mini")
        use = mock_usage(body, args.completion_tokens)
        if not body.get("stream"):
            key = (model, use["prompt_tokens"], use["completion_tokens"])
            payload = plain_cache.get(key)
            if payload is None:
                payload = plain_cache[key] = plain_answer(model, use)
            return web.Response(body=payload, content_type="application/json")
        shape = body.get("mock") or {}
        chunks = int(shape.get("chunks", 20))
        gap = float(shape.get("gap_ms", 0)) / 1000.0
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        options = body.get("stream_options") or {}
        writes = stream_writes(model, use, chunks, bool(options.get("include_usage")))
        started = time.monotonic()
        for i, data in enumerate(writes):
            if gap and 0 < i < chunks:
                # an absolute schedule: the upstream's gaps do not drift with the loop's jitter
                delay = started + i * gap - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await response.write(data)
        await response.write_eof()
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_post(CHAT_PATH, chat)
        app.router.add_get("/stats", lambda _: web.json_response(answered))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        info: dict[str, Any] = {"pid": os.getpid()}
        context = None
        if args.tls_dir:  # HTTPS, with a CA of its own that the proxies are told to trust
            from tests.upstreams import make_tls

            material = make_tls(Path(args.tls_dir))
            context, info["ca_file"] = material.server_context(), str(material.ca_file)
        site = web.TCPSite(runner, HOST, args.port, ssl_context=context)
        await site.start()
        info["port"] = runner.addresses[0][1]
        await _ready_and_wait(info)
        await runner.cleanup()

    asyncio.run(main())


async def _ready_and_wait(info: dict[str, Any]) -> None:
    """Print the ready line, then wait for SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps(info), flush=True)
    await stop.wait()


# --- bare mitmproxy ---------------------------------------------------------------------


class RelayStreams:
    """The bare proxy's one addon: it relays event streams as they come (what any proxy in
    front of an LLM must do; mitmproxy would otherwise buffer them whole) and does nothing
    else. Plain responses are buffered, as the governor buffers those it governs."""

    def responseheaders(self, flow: Any) -> None:
        if "text/event-stream" in flow.response.headers.get("content-type", ""):
            flow.response.stream = True


class _Started:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    def running(self) -> None:
        self.event.set()


def run_bare(args: argparse.Namespace) -> None:
    """mitmproxy embedded exactly as governor.proxy.server embeds it (same addons, same
    options), with RelayStreams in place of the governor."""
    from mitmproxy import options
    from mitmproxy.addons import core, errorcheck, next_layer, proxyserver, tlsconfig
    from mitmproxy.master import Master

    from governor.proxy.mitm_master import master_options
    from governor.proxy.server import Settings

    async def main() -> None:
        settings = Settings(listen=(HOST, args.port), control=None, data_dir=Path(args.data_dir),
                            upstream_ca=Path(args.upstream_ca) if args.upstream_ca else None)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        started = _Started()
        master = Master(options.Options())
        master.addons.add(core.Core(), proxyserver.Proxyserver(), next_layer.NextLayer(), tlsconfig.TlsConfig(),
                          errorcheck.ErrorCheck(), RelayStreams(), started)
        master.options.update(**master_options(settings))
        task = asyncio.get_running_loop().create_task(master.run())
        await started.event.wait()
        port = master.addons.get("proxyserver").listen_addrs()[0][1]
        await _ready_and_wait({"pid": os.getpid(), "port": port})
        master.shutdown()
        await task

    asyncio.run(main())


# --- load generator ---------------------------------------------------------------------


class HttpConnection:
    """One kept-alive HTTP/1.1 connection; reads Content-Length and chunked bodies, and
    timestamps each server-sent event as it arrives.

    With `tls` (a client context) the connection is HTTPS: to host:port itself, or, with
    `tunnel` ("host:port" of the origin), through a CONNECT tunnel the proxy at host:port
    intercepts, as an agent with HTTPS_PROXY and the proxy's CA does."""

    def __init__(self, host: str, port: int, *, tls: ssl.SSLContext | None = None,
                 tunnel: str | None = None) -> None:
        self.host, self.port = host, port
        self.tls, self.tunnel = tls, tunnel
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        direct_tls = self.tls if self.tunnel is None else None
        self.reader, self.writer = await asyncio.open_connection(
            self.host, self.port, limit=1 << 20, ssl=direct_tls, server_hostname=HOST if direct_tls else None)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tunnel is not None:
            self.writer.write(f"CONNECT {self.tunnel} HTTP/1.1\r\nHost: {self.tunnel}\r\n\r\n".encode())
            head = await self.reader.readuntil(b"\r\n\r\n")
            if head.split(b" ", 2)[1] != b"200":
                raise OSError(f"CONNECT {self.tunnel} refused: {head.splitlines()[0]!r}")
            if self.tls is not None:
                await self.writer.start_tls(self.tls, server_hostname=self.tunnel.rsplit(":", 1)[0])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = self.reader = None

    async def exchange(self, request: bytes, events: list[float] | None = None) -> tuple[int, dict[str, str], bytes]:
        """Send one request, read its response. `events` gets perf_counter() of each SSE
        event's arrival (its blank-line terminator) when given."""
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        body = bytearray()
        if "content-length" in headers:
            body += await self.reader.readexactly(int(headers["content-length"]))
            if events is not None:
                events.extend([time.perf_counter()] * body.count(b"\n\n"))
        elif "chunked" in headers.get("transfer-encoding", ""):
            while True:
                size_line = await self.reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0], 16)
                if size == 0:
                    while await self.reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                    break
                chunk = (await self.reader.readexactly(size + 2))[:-2]
                if events is not None:
                    found = (bytes(body[-1:]) + chunk).count(b"\n\n")
                    if found:
                        events.extend([time.perf_counter()] * found)
                body += chunk
        else:
            body += await self.reader.read()
            self.close()
            return status, headers, bytes(body)
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, bytes(body)


def request_bytes(url: str, body: str, *, via_proxy: bool, headers: dict[str, str] | None = None) -> bytes:
    """An HTTP/1.1 POST: absolute-form through a proxy, origin-form direct."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    target = url if via_proxy else (parts.path or "/")
    payload = body.encode()
    lines = [f"POST {target} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
             "Accept: application/json, text/event-stream", f"Content-Length: {len(payload)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


@dataclass
class Segment:
    """What one measured segment produced."""

    latencies_ms: list[float]
    ttft_ms: list[float]
    gaps_ms: list[float]
    statuses: dict[str, int]
    elapsed: float
    cpu_seconds: float | None
    errors: list[str]
    warmup_count: int = 0  # requests answered before the measured part (any status)
    short_streams: int = 0  # measured 200 streams with fewer events than `stream_chunks`

    def to_dict(self) -> dict[str, Any]:
        return {"latencies_ms": self.latencies_ms, "ttft_ms": self.ttft_ms, "gaps_ms": self.gaps_ms,
                "statuses": self.statuses, "elapsed": self.elapsed, "cpu_seconds": self.cpu_seconds,
                "errors": self.errors[:5], "count": len(self.latencies_ms), "warmup_count": self.warmup_count,
                "short_streams": self.short_streams}


async def load_segment(cmd: dict[str, Any]) -> Segment:
    """Closed-loop load: `concurrency` workers, each on its own kept-alive connection,
    send the request back to back, first for `warmup` seconds (not measured; or once
    `warmup_body` per connection), then for `duration` seconds or until `requests` are done. CPU time of `watch_pid` is read
    around the measured part only (all workers idle at both ends)."""
    from urllib.parse import urlsplit

    url = cmd["url"]
    proxy = cmd.get("proxy")
    origin = urlsplit(url)
    if proxy:
        host, port = proxy.rsplit(":", 1)
    else:
        host, port = origin.hostname, origin.port
    # https: TLS to the origin (direct), or through a CONNECT tunnel with the proxy's CA
    tls = ssl.create_default_context(cafile=cmd["ca_file"]) if origin.scheme == "https" else None
    tunnel = origin.netloc if tls is not None and proxy else None
    absolute = bool(proxy) and tls is None  # plain HTTP through a proxy: absolute-form
    request = request_bytes(url, cmd["body"], via_proxy=absolute, headers=cmd.get("headers"))
    warmup_request = (request_bytes(url, cmd["warmup_body"], via_proxy=absolute, headers=cmd.get("headers"))
                      if cmd.get("warmup_body") else None)
    concurrency = int(cmd.get("concurrency", 1))
    stream_chunks = cmd.get("stream_chunks")  # content events per stream: TTFT and gaps are taken over these
    watch = cmd.get("watch_pid")
    connections = [HttpConnection(host, int(port), tls=tls, tunnel=tunnel) for _ in range(concurrency)]

    async def phase(deadline: float | None, budget: list[int] | None, out: Segment,
                    request: bytes = request) -> None:
        async def worker(conn: HttpConnection) -> None:
            while True:
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                if budget is not None:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                events: list[float] | None = [] if stream_chunks else None
                began = time.perf_counter()
                try:
                    status, _, _ = await conn.exchange(request, events)
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
                    conn.close()
                    out.errors.append(f"{type(exc).__name__}: {exc}")
                    out.statuses["error"] = out.statuses.get("error", 0) + 1
                    await asyncio.sleep(0.01)
                    continue
                ended = time.perf_counter()
                out.latencies_ms.append(round((ended - began) * 1000, 4))
                out.statuses[str(status)] = out.statuses.get(str(status), 0) + 1
                if stream_chunks and status == 200 and len(events or ()) < stream_chunks:
                    out.short_streams += 1
                if events:
                    out.ttft_ms.append(round((events[0] - began) * 1000, 4))
                    content = events[:stream_chunks]
                    out.gaps_ms.extend(round((b - a) * 1000, 4) for a, b in zip(content, content[1:]))

        await asyncio.gather(*(worker(c) for c in connections))

    warm = Segment([], [], [], {}, 0.0, None, [])  # what the warm-up did: only its count is kept
    if warmup_request is not None:  # one short request per connection: connected, nothing else
        await phase(None, [concurrency], warm, warmup_request)
    warmup = float(cmd.get("warmup", 0.3))
    if warmup > 0:
        await phase(time.perf_counter() + warmup, None, warm)
    segment = Segment([], [], [], {}, 0.0, None, [], warmup_count=len(warm.latencies_ms))
    cpu_before = cpu_seconds(watch) if watch else None
    began = time.perf_counter()
    requests = cmd.get("requests")
    await phase(time.perf_counter() + float(cmd["duration"]) if cmd.get("duration") else None,
                [int(requests)] if requests else None, segment)
    segment.elapsed = round(time.perf_counter() - began, 4)
    if watch:
        segment.cpu_seconds = round(cpu_seconds(watch) - cpu_before, 4)
    for conn in connections:
        conn.close()
    return segment


async def burst(cmd: dict[str, Any]) -> dict[str, Any]:
    """`count` requests sent at once: all connections opened first, then every request
    written in the same loop iteration. Returns each response's status and body."""
    proxy_host, proxy_port = cmd["proxy"].rsplit(":", 1)
    count = int(cmd["count"])
    request = request_bytes(cmd["url"], cmd["body"], via_proxy=True, headers=cmd.get("headers"))
    connections = [HttpConnection(proxy_host, int(proxy_port)) for _ in range(count)]
    await asyncio.gather(*(c.open() for c in connections))
    gate = asyncio.Event()

    async def one(conn: HttpConnection) -> dict[str, Any]:
        await gate.wait()
        try:
            status, headers, body = await conn.exchange(request)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            return {"status": None, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            conn.close()
        return {"status": status, "action": headers.get("adl-governor-action"), "body": body.decode("utf-8", "replace")}

    tasks = [asyncio.ensure_future(one(c)) for c in connections]
    await asyncio.sleep(0)
    gate.set()
    return {"responses": await asyncio.gather(*tasks)}


def run_load(args: argparse.Namespace) -> None:
    """Serve JSON commands from stdin: {"op": "segment"|"burst", ...}; one JSON answer each."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        print(json.dumps({"pid": os.getpid(), "port": 0}), flush=True)
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            cmd = json.loads(line)
            try:
                if cmd.get("op") == "burst":
                    answer = await burst(cmd)
                else:
                    answer = (await load_segment(cmd)).to_dict()
            except Exception as exc:  # report to the orchestrator rather than die silently
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(answer), flush=True)

    # nothing to flush; sys.exit would wait for the executor thread blocked on stdin
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    asyncio.run(main())


# --- control plane ----------------------------------------------------------------------


def http_get_json(url: str, timeout: float = 10.0, token: str | None = None) -> Any:
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # loopback control plane
        return json.loads(response.read())


def open_session(control_url: str, token: str | None, label: str = "bench") -> str:
    """Open a session the principal's way (POST /v1/sessions); returns the token the agent sends."""
    import urllib.request

    request = urllib.request.Request(f"{control_url}/v1/sessions", data=json.dumps({"label": label}).encode(),
                                     method="POST", headers={"Content-Type": "application/json",
                                                             **({"Authorization": f"Bearer {token}"} if token else {})})
    with urllib.request.urlopen(request, timeout=10) as response:  # loopback control plane
        return json.loads(response.read())["token"]


def table(rows: Iterable[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain-text table (also valid Markdown)."""
    rows = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h)) for i, h in enumerate(header)]
    out = ["| " + " | ".join(str(h).ljust(w) for h, w in zip(header, widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |" for row in rows]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role", required=True)
    up = sub.add_parser("upstream")
    up.add_argument("--port", type=int, default=0)
    up.add_argument("--completion-tokens", type=int, default=64)
    up.add_argument("--tls-dir", help="serve HTTPS with a CA and certificate written here")
    bare = sub.add_parser("bare")
    bare.add_argument("--port", type=int, default=0)
    bare.add_argument("--data-dir", required=True)
    bare.add_argument("--upstream-ca", help="an extra CA to trust for upstream TLS (the HTTPS upstream's)")
    sub.add_parser("load")
    args = parser.parse_args()
    {"upstream": run_upstream, "bare": run_bare, "load": run_load}[args.role](args)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
