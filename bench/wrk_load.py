"""wrk as a load generator (bench/scaling.py --load wrk): the same closed-loop load as
common.py's Python one (C kept-alive connections, requests back to back) at a fraction of
its CPU, so that more of a small host is left to the processes measured.

wrk has no proxy option: through a proxy its Lua script sends absolute-form requests
(`POST http://HOST:PORT/v1/chat/completions HTTP/1.1`, Host the origin's) on connections
to the proxy, as an HTTP client configured with HTTP_PROXY does. The script counts every
response by status (wrk's own summary only counts "non-2xx or 3xx") and prints one line,
`WRK-RESULT {json}`, from its `done` hook; `parse` reads it. wrk's CPU is read from the
kernel's accounting of the exited process (wait4), never estimated.

wrk takes whole seconds (-d): a duration or warm-up is rounded up to one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

RESULT_PREFIX = "WRK-RESULT "

# %(...)s are filled in by script(); every value is a Lua string literal made by lua_string()
SCRIPT = """-- written by bench/wrk_load.py
wrk.method = "POST"
wrk.path = %(path)s
wrk.body = %(body)s
wrk.headers["Host"] = %(host)s
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
%(extra)s
local threads = {}
function setup(thread)
  table.insert(threads, thread)
end

statuses = {}
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local counts = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      counts[status] = (counts[status] or 0) + n
    end
  end
  local parts = {}
  for status, n in pairs(counts) do
    parts[#parts + 1] = string.format('"%%d": %%d', status, n)
  end
  local e = summary.errors
  io.write(string.format(
    '%(prefix)s{"requests": %%d, "duration_us": %%d, "bytes": %%d, "statuses": {%%s}, ' ..
    '"errors": {"connect": %%d, "read": %%d, "write": %%d, "status": %%d, "timeout": %%d}, ' ..
    '"latency_us": {"p50": %%d, "p99": %%d, "max": %%d}}\\n',
    summary.requests, summary.duration, summary.bytes, table.concat(parts, ", "),
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def lua_string(text: str) -> str:
    """A Lua string literal holding `text` exactly (decimal escapes for anything but
    printable ASCII other than the quote and backslash)."""
    out = []
    for byte in text.encode():
        ch = chr(byte)
        out.append(ch if 32 <= byte < 127 and ch not in '"\\' else f"\\{byte:03d}")
    return '"' + "".join(out) + '"'


def script(url: str, body: str, *, via_proxy: bool, headers: dict[str, str] | None = None) -> str:
    """The Lua script for POSTs of `body` to `url`: absolute-form through a proxy, origin-form direct."""
    parts = urlsplit(url)
    extra = "".join(f"wrk.headers[{lua_string(k)}] = {lua_string(v)}\n" for k, v in (headers or {}).items())
    return SCRIPT % {"path": lua_string(url if via_proxy else (parts.path or "/")), "body": lua_string(body),
                     "host": lua_string(parts.netloc), "extra": extra, "prefix": RESULT_PREFIX}


def parse(stdout: str) -> dict[str, Any]:
    """The script's result line out of wrk's output. A run without one (wrk failed, or its
    output was cut) is an error, never zero requests."""
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
            break
    else:
        raise ValueError(f"no {RESULT_PREFIX.strip()} line in wrk's output: {stdout[-300:]!r}")
    counted = sum(result["statuses"].values())
    if counted != result["requests"]:  # the hook saw every response wrk counted, or the count is not whole
        raise ValueError(f"wrk counted {result['requests']} responses, its script {counted}")
    return result


def statuses(result: dict[str, Any]) -> dict[str, int]:
    """Responses by status, and socket errors (connect, read, write; wrk reconnects after
    each) as "error", the way common.py's load generator counts them."""
    out = {str(k): v for k, v in result["statuses"].items()}
    errors = sum(result["errors"][k] for k in ("connect", "read", "write"))
    if errors:
        out["error"] = errors
    return out


class WrkLoad:
    """One wrk run per segment, in place of a load generator process (the same `ask`)."""

    def __init__(self, threads: int = 1, timeout_s: int = 10) -> None:
        executable = shutil.which("wrk")
        if executable is None:
            raise RuntimeError("--load wrk needs wrk (apt-get install wrk)")
        self.executable, self.threads, self.timeout_s = executable, threads, timeout_s

    def run(self, target: str, lua: str, connections: int, seconds: int) -> tuple[dict[str, Any], float]:
        """wrk for `seconds` against `target` ("http://HOST:PORT/"): its result and its CPU seconds."""
        with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="bench-wrk-") as f:
            f.write(lua)
            f.flush()
            proc = subprocess.Popen(
                [self.executable, "-c", str(connections), "-t", str(min(self.threads, connections)),
                 "-d", f"{seconds}s", "--timeout", f"{self.timeout_s}s", "-s", f.name, target],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            # wrk stops by itself after -d; this is for a wrk that does not
            watchdog = threading.Timer(seconds + self.timeout_s + 30, proc.kill)
            watchdog.start()
            try:
                # its output is a few lines (the pipe cannot fill); wait4 gives the CPU it used
                _, status, usage = os.wait4(proc.pid, 0)
            finally:
                watchdog.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            assert proc.stdout is not None
            output = proc.stdout.read()
            proc.stdout.close()
        if proc.returncode != 0:
            raise RuntimeError(f"wrk exited with {proc.returncode}: {output[-300:]!r}")
        return parse(output), usage.ru_utime + usage.ru_stime

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """A segment as common.py's `load` role answers one: a warm-up run (its count kept),
        then the measured run. Adds `load_cpu_seconds`: wrk's own, both runs."""
        proxy = cmd.get("proxy")
        origin = urlsplit(cmd["url"])
        if origin.scheme != "http":
            raise ValueError("--load wrk sends plain HTTP (absolute-form through the proxy)")
        target = f"http://{proxy}/" if proxy else f"http://{origin.netloc}/"
        lua = script(cmd["url"], cmd["body"], via_proxy=bool(proxy), headers=cmd.get("headers"))
        connections = int(cmd["concurrency"])
        cpu = 0.0
        warmup_count = 0
        if float(cmd.get("warmup", 0)) > 0:
            warm, used = self.run(target, lua, connections, max(1, math.ceil(float(cmd["warmup"]))))
            warmup_count, cpu = warm["requests"], cpu + used
        measured, used = self.run(target, lua, connections, max(1, math.ceil(float(cmd["duration"]))))
        return {"statuses": statuses(measured), "elapsed": measured["duration_us"] / 1e6,
                "warmup_count": warmup_count, "load_cpu_seconds": cpu + used,
                # a response later than --timeout is counted by its status, and also here
                "errors": [f"wrk: {measured['errors']['timeout']} responses after {self.timeout_s} s"]
                if measured["errors"]["timeout"] else [],
                "latency_us": measured["latency_us"], "wrk": measured}

    def stop(self) -> None:  # nothing keeps running between segments
        pass

