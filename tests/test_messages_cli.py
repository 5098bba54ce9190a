"""What `governor run` tells its operator, as a real child process: the address it cannot
listen on (with the governor's own option, --listen) and, when it stops, where each
session's final record went."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys

import orjson
import pytest

from tests.governor_process import REPO, GovernorProcess
from tests.proxy_harness import RawClient
from tests.upstreams import MockLLM, make_tls

CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


def test_a_busy_port_names_the_listen_option_not_mitmproxys(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "governor", "run", "--listen", f"127.0.0.1:{port}", "--control", "127.0.0.1:0",
             "--data-dir", str(tmp_path / "data")],
            cwd=REPO, capture_output=True, text=True, timeout=60,
            env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "PYTHONPATH": str(REPO)})
    assert done.returncode == 1, done.stderr
    assert "--mode" not in done.stderr and "regular@" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"governor run: the proxy could not listen on 127.0.0.1:{port}"), done.stderr
    assert "address already in use" in last.lower() and last.endswith("with --listen HOST:PORT"), last
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_stopping_logs_where_each_final_record_went(tmp_path, stop_signal):
    tls = make_tls(tmp_path / "tls")
    mock = MockLLM(tls)
    await mock.start()
    governor = GovernorProcess(tmp_path / "data", ["--upstream-ca", str(tls.ca_file)])
    try:
        await governor.start()

        def call(session: str) -> int:
            client = RawClient(governor.proxy, governor.ca_file, ("127.0.0.1", mock.port))
            try:
                client.send("POST", "/v1/chat/completions", orjson.dumps(CHAT), {"ADL-Session": session})
                return client.read_response()[0]
            finally:
                client.close()

        for session in ("alpha", "beta"):
            assert await asyncio.wait_for(asyncio.to_thread(call, session), 10.0) == 200
        governor.proc.send_signal(stop_signal)
        assert await asyncio.wait_for(asyncio.to_thread(governor.proc.wait), 30.0) == 0
    finally:
        await governor.stop()
        await mock.stop()
    log = governor.log.read_text()
    written = dict(re.findall(r"session (\S+) ended on shutdown \(completed\): final record (\S+)", log))
    assert set(written) == {"alpha", "beta"}, log
    for session, path in written.items():
        assert json.loads(open(path).read())["session"] == session
        assert path.startswith(str(tmp_path / "data"))
