"""Interception the agent cannot bypass (the chart's `interception` option), on this machine:
two network namespaces made by the test (the pod's, the upstream's, joined by a veth pair
with 10.213.0.0/24 addresses that exist only inside them), the governor with a transparent
listener in the pod's namespace, the chart's own rules script (helm/governor/files/intercept.sh)
installed there, and a hostile agent running as another user that ignores every proxy
variable and connects straight to the upstream's address. Its model calls are governed
(one past the passport's max_iterations is refused), charged and recorded; a connection
to a port the rules do not list is refused. Before the
rules, the same agent reaches the upstream directly: what the rules change is shown.

Needs root, `ip`, `iptables` and `setpriv` (`.ci/dev test` installs them); skipped otherwise.
The governor runs as root here (this machine's Python lives under /root), so the rules
exempt uid 0; in the chart they exempt the governor's uid 10001. The namespaces are
deleted in a finally."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.restartable_governor import write_passport

SCRIPT = REPO / "helm" / "governor" / "files" / "intercept.sh"
AGENT = REPO / "tests" / "netns_agent.py"
AGENT_PYTHON = "/usr/bin/python3"  # readable by any user (the agent is not root)
AGENT_UID = 10002
POD_ADDRESS, UPSTREAM_ADDRESS = "10.213.0.1", "10.213.0.2"
RESOLVER_ADDRESS = "10.213.0.3"  # the pod's DNS server (the upstream's namespace holds it too)
OTHER_PORT = 8443  # listened on by the upstream, not in the rules' ports (80, 443)
TRANSPARENT_PORT = 15001
MAX_ITERATIONS = 12  # the bundled passport's max_iterations: the agent makes one call more
CALLS = MAX_ITERATIONS + 1
GUARD_SEC = 60  # not a timing assertion: only stops a hung process from hanging the suite


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, iptables)"
    for tool in ("ip", "iptables", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/dev test installs iproute2 and iptables)"
    if not os.access(AGENT_PYTHON, os.X_OK):
        return f"{AGENT_PYTHON} (the unprivileged agent's interpreter) is missing"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def _run(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=GUARD_SEC, **kwargs)
    if check:
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done


def _readline(process: subprocess.Popen, wanted: str) -> list[str]:
    """Lines of `process` until one containing `wanted` (bounded by GUARD_SEC)."""
    lines: list[str] = []
    for _ in range(GUARD_SEC * 10):
        ready, _, _ = select.select([process.stdout], [], [], 0.1)
        if ready:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if wanted in line:
                return lines
    raise AssertionError(f"never printed {wanted!r}: {''.join(lines)}")


@pytest.fixture
def namespaces():
    suffix = str(os.getpid() % 100000)
    pod, upstream = f"govpod{suffix}", f"govup{suffix}"
    try:
        _run("ip", "netns", "add", pod)
        _run("ip", "netns", "add", upstream)
        _run("ip", "link", "add", f"gvp{suffix}", "netns", pod, "type", "veth", "peer", "name", f"gvu{suffix}",
             "netns", upstream)
        for ns, device, address in ((pod, f"gvp{suffix}", POD_ADDRESS), (upstream, f"gvu{suffix}", UPSTREAM_ADDRESS)):
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", device)
            _run("ip", "-n", ns, "link", "set", device, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", upstream, "addr", "add", f"{RESOLVER_ADDRESS}/24", "dev", f"gvu{suffix}")
        # ping sockets for every group in the pod, as many nodes allow: the ICMP escape is open
        _run("ip", "netns", "exec", pod, "sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647")
        yield pod, upstream
    finally:
        for ns in (pod, upstream):  # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=GUARD_SEC)


def _agent(pod: str) -> dict:
    """The hostile agent, as AGENT_UID in the pod's namespace, every proxy variable set to a dead proxy."""
    dead = "http://127.0.0.1:9"
    env = {"PATH": "/usr/bin:/bin", "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "ALL_PROXY": dead,
           "http_proxy": dead, "https_proxy": dead, "NO_PROXY": ""}
    done = _run("ip", "netns", "exec", pod, "setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}",
                "--clear-groups", AGENT_PYTHON, str(AGENT), UPSTREAM_ADDRESS, str(OTHER_PORT), str(CALLS),
                RESOLVER_ADDRESS, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


CONTROL_TOKEN = "intercept-test-control-token"  # /v1 reads need it (docs/sessions.md)


def _control(pod: str, path: str) -> dict:
    done = _run("ip", "netns", "exec", pod, sys.executable, "-c",
                "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(urllib.request.Request(sys.argv[1],"
                " headers={'Authorization': 'Bearer ' + sys.argv[2]}), timeout=10).read().decode())",
                f"http://127.0.0.1:8081{path}", CONTROL_TOKEN)
    return json.loads(done.stdout)


SERVE_ONCE = ("import socket; s = socket.create_server(('0.0.0.0', 9000)); print('listening', flush=True); "
              "c, _ = s.accept(); c.sendall(b'agent here'); c.close()")
FETCH = ("import socket, sys; c = socket.create_connection((sys.argv[1], 9000), timeout=10); "
         "print(c.recv(64).decode())")


def _inbound_answer(pod: str, upstream_ns: str) -> str:
    """A connection from the upstream's namespace to a port the agent's user serves in the pod."""
    server = subprocess.Popen(["ip", "netns", "exec", pod, "setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}",
                               "--clear-groups", AGENT_PYTHON, "-c", SERVE_ONCE], stdout=subprocess.PIPE, text=True)
    try:
        _readline(server, "listening")
        done = _run("ip", "netns", "exec", upstream_ns, AGENT_PYTHON, "-c", FETCH, POD_ADDRESS, check=False)
        return done.stdout.strip() or done.stderr.strip().splitlines()[-1]
    finally:
        server.kill()
        server.wait(timeout=GUARD_SEC)


def test_the_agent_cannot_bypass_the_governor(namespaces, tmp_path):
    pod, upstream_ns = namespaces
    upstream = subprocess.Popen(["ip", "netns", "exec", upstream_ns, sys.executable, "-m", "tests.netns_upstream",
                                 UPSTREAM_ADDRESS, str(OTHER_PORT), RESOLVER_ADDRESS], cwd=REPO, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    governor = None
    try:
        _readline(upstream, "ready")

        # Without the rules the agent talks to the upstream directly: nothing governs it.
        before = _agent(pod)
        assert [c.get("status") for c in before["calls"]] == [200] * CALLS, before
        assert all(c["governor"] is None for c in before["calls"])
        assert before["other_port"] == "connected: open", before
        escapes = before["escapes"]
        assert escapes["llm_on_53"].get("status") == 200 and escapes["llm_on_53"]["governor"] is None, escapes
        assert escapes["udp_53"] == escapes["resolver"] == "answered: echo exfiltrated", escapes
        assert escapes["icmp"] == "answered: exfiltrated", escapes

        data = tmp_path / "data"
        # the bundled passport, its egress allow-list (permissions.network.allowed_hosts) naming
        # the upstream's address: the governor refuses hosts outside it
        passport = write_passport(tmp_path / "passport.json", mutate=lambda doc: doc["permissions"]["network"][
            "allowed_hosts"].append(UPSTREAM_ADDRESS))
        governor = subprocess.Popen(["ip", "netns", "exec", pod, sys.executable, "-m", "governor", "run",
                                     "--passport", str(passport), "--listen", "127.0.0.1:8080", "--control", "127.0.0.1:8081",
                                     "--transparent", f"127.0.0.1:{TRANSPARENT_PORT}", "--data-dir", str(data),
                                     "--session", "intercepted", "--sessions", "agent-named", "--lock-on", "none"], cwd=REPO, stdout=subprocess.PIPE,
                                    env={**os.environ, "GOVERNOR_CONTROL_TOKEN": CONTROL_TOKEN},
                                    stderr=subprocess.STDOUT, text=True)
        _readline(governor, "governor running")
        installed = _run("ip", "netns", "exec", pod, "sh", str(SCRIPT),
                         env={"PATH": os.environ["PATH"], "GOVERNOR_UID": "0", "TRANSPARENT_PORT": str(TRANSPARENT_PORT),
                              "DNS_SERVERS": RESOLVER_ADDRESS})
        assert "other outbound refused" in installed.stdout and f"DNS to {RESOLVER_ADDRESS}" in installed.stdout

        after = _agent(pod)
        permitted, refused = after["calls"][:MAX_ITERATIONS], after["calls"][MAX_ITERATIONS]
        assert [c.get("status") for c in permitted] == [200] * MAX_ITERATIONS, after
        assert [c["usage"]["total_tokens"] for c in permitted] == [18] * MAX_ITERATIONS
        # the limit held: the governor answered in the model's place (never forwarded: see the upstream's count)
        assert refused.get("governor") == "fallback" and "iteration limit" in refused["body"], refused
        assert after["other_port"].startswith("ConnectionRefusedError"), after
        # port 53 leaves only to the pod's resolver; an LLM on port 53 and ICMP with a payload do not
        escapes = after["escapes"]
        assert escapes["llm_on_53"].get("error", "").startswith(("ConnectionRefusedError", "ConnectionResetError")), escapes
        assert escapes["udp_53"].startswith(("ConnectionRefusedError", "PermissionError")), escapes
        assert escapes["resolver"] == "answered: echo exfiltrated", escapes
        assert escapes["icmp"].startswith(("TimeoutError", "PermissionError")), escapes

        # what reaches the pod still gets its answers (a kubelet probe, a port the agent serves)
        assert _inbound_answer(pod, upstream_ns) == "agent here"

        view = _control(pod, "/v1/sessions/intercepted")
        charged = {(b["dimension"], b["scope"]): b["used"] for b in view["budgets"] if b["persona"] is None}
        assert charged[("tokens", "per_session")] == 18 * MAX_ITERATIONS, view
        assert view["iterations"] == MAX_ITERATIONS, view

        governor.send_signal(signal.SIGTERM)
        assert governor.wait(timeout=GUARD_SEC) == 0
    finally:
        if governor is not None and governor.poll() is None:
            governor.kill()
            governor.wait(timeout=GUARD_SEC)
        upstream.stdin.close()
        served = upstream.stdout.read()
        upstream.wait(timeout=GUARD_SEC)

    paths = json.loads(served.strip().splitlines()[-1])
    # CALLS direct before the rules, then the MAX_ITERATIONS the governor let through; the one
    # call to port 53 before the rules (none after)
    assert paths == ["/v1/chat/completions"] * (CALLS + MAX_ITERATIONS + 1)

    record_file = data / "records" / "intercepted.json"
    record = json.loads(record_file.read_text())
    assert record["session"] == "intercepted"
    assert [(e["cause"], e["action"]) for e in record["events"] if e["cause"] != "on_anomaly"] == [
        ("on_iteration_limit", "fallback")], record["events"]
    verified = _run(sys.executable, "-m", "governor", "verify", str(record_file),
                    "--offline", "--key", str(data / "keys" / "governor-pub.pem"), check=False)
    assert verified.returncode == 3 and "\nINCOMPLETE" in verified.stdout and "FAIL " not in verified.stdout, verified.stdout + verified.stderr
