"""An agent that ignores the proxy variables is governed with `governor exec` (#29 item 6).

The npm `openai` client on Node 20 (from `.ci/node-tools`) ignores HTTPS_PROXY: shown first,
its calls reach the mock provider directly, ungoverned, carrying the agent's ADL-Session token.
Then the same script under `governor exec` (its own user and network namespace, every
connection relayed to the real governor's proxy): each call is governed and charged, the cap
refuses with an error the client raises readably, a stream is governed too, no ADL-* header
reaches the provider, and a connection to a port not relayed reaches nothing.

Needs Linux user namespaces (root here), `ip`, node and npm; skipped, saying why, otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from governor.proxy import netns
from tests.conftest import REPO
from tests.proxy_harness import real_governor
from tests.upstreams import Behaviour

GUARD_SEC = 120  # not a timing assertion: only stops a hung process from hanging the suite

NODE_AGENT = r"""
const OpenAI = require(process.env.OPENAI_MODULE);
const net = require("net");
(async () => {
  const client = new OpenAI({apiKey: "sk-test", baseURL: process.env.BASE_URL, maxRetries: 0,
                             defaultHeaders: {"ADL-Session": process.env.SESSION}});
  const calls = [];
  for (let i = 0; i < Number(process.env.CALLS); i++) {
    try {
      const r = await client.chat.completions.create({model: "gpt-4o-mini", max_tokens: 64,
                                                     messages: [{role: "user", content: "call " + i}]});
      calls.push({status: 200, usage: r.usage});
    } catch (e) {
      calls.push({status: e.status ?? null, message: String(e.message), error: e.error ?? null});
    }
  }
  let streamed = null;
  if (process.env.STREAM === "1") {
    try {
      const stream = await client.chat.completions.create({model: "gpt-4o-mini", max_tokens: 64, stream: true,
                                                           messages: [{role: "user", content: "stream"}]});
      let text = "";
      for await (const chunk of stream) text += chunk.choices?.[0]?.delta?.content ?? "";
      streamed = {text};
    } catch (e) {
      streamed = {status: e.status ?? null, message: String(e.message)};
    }
  }
  const other = await new Promise((resolve) => {
    const socket = net.connect({host: "127.0.0.1", port: Number(process.env.OTHER_PORT)});
    socket.setTimeout(5000, () => { socket.destroy(); resolve("timeout"); });
    socket.on("connect", () => { socket.destroy(); resolve("connected"); });
    socket.on("error", (e) => resolve(e.code));
  });
  console.log(JSON.stringify({calls, streamed, other}));
})();
"""


def _missing() -> str | None:
    if not sys.platform.startswith("linux"):
        return "governor exec needs Linux namespaces"
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node and npm are not installed (.ci/dev test installs them)"
    try:
        netns.ip_command()
    except netns.ExecError as exc:
        return str(exc)
    probe = subprocess.run(["unshare", "--user", "--net", "--map-root-user", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return f"user namespaces are not available here: {probe.stderr.decode().strip()}"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


@pytest.fixture(scope="module")
def openai_module() -> str:
    done = subprocess.run([str(REPO / ".ci" / "node-tools")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return str(Path(done.stdout.strip()) / "node_modules" / "openai")


async def _node(command_prefix: list[str], env: dict[str, str], tmp_path: Path) -> dict:
    script = tmp_path / "agent.js"
    script.write_text(NODE_AGENT)
    proc = await asyncio.create_subprocess_exec(
        *command_prefix, "node", str(script), env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), GUARD_SEC)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError("the node agent timed out")
    lines = out.decode().strip().splitlines()
    assert proc.returncode == 0 and lines, f"node agent failed ({proc.returncode}):\n{out.decode()}\n{err.decode()}"
    return json.loads(lines[-1])


async def test_a_node_agent_that_ignores_the_proxy_variables_is_governed_with_governor_exec(tmp_path, openai_module):
    async with real_governor(tmp_path) as (running, mock):
        other = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        other_port = other.sockets[0].getsockname()[1]
        port = int(mock.base_url.rsplit(":", 1)[1])
        base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "OPENAI_MODULE": openai_module,
                "BASE_URL": f"{mock.base_url}/v1", "SESSION": "node-agent", "OTHER_PORT": str(other_port)}

        # As the README's exports configure it: Node ignores HTTPS_PROXY and goes straight to the
        # provider, ungoverned, carrying its session token there (it trusts the mock's CA here
        # only so that the direct call can succeed and show the hole).
        direct = await _node([], {**base, "CALLS": "1", "HTTPS_PROXY": running.proxy_url,
                                  "NODE_EXTRA_CA_CERTS": str(tmp_path / "tls" / "upstream-ca.pem")}, tmp_path)
        assert direct["calls"][0]["status"] == 200, direct
        assert mock.requests[-1].headers.get("ADL-Session") == "node-agent"
        assert direct["other"] == "connected"
        mock.requests.clear()

        # Under governor exec: every call through the governor, the cap enforced.
        mock.default = Behaviour(input_tokens=9000, output_tokens=50)
        prefix = [sys.executable, "-m", "governor", "exec", "--proxy", running.proxy_url,
                  "--ca", str(running.ca_file), "--port", str(port), "--"]
        env = {**base, "CALLS": "4", "STREAM": "1", "PYTHONPATH": str(REPO)}
        governed = await _node(prefix, env, tmp_path)
        other.close()
        view = await running.runtime.session_view("node-agent")

    calls = governed["calls"]
    # the example passport's 20,000 tokens per session: two calls of 9,050 fit; the third's small
    # reservation fits, but what it used crosses the cap, so the governor answers it with the
    # refusal and halts the session; the fourth and the stream never leave
    assert [c["status"] for c in calls] == [200, 200, 429, 429], calls
    assert calls[0]["usage"]["total_tokens"] == 9050
    refused = calls[2]
    assert "governor" in refused["message"] and refused["error"]["governor"]["cause"] == "on_budget_exhausted", refused
    assert calls[3]["error"]["governor"]["cause"] == "on_budget_exhausted", calls[3]
    assert governed["streamed"]["status"] == 429, governed  # the stream is governed too: refused at the cap
    assert governed["other"] in ("ECONNREFUSED", "ECONNRESET"), governed  # a port not relayed reaches nothing
    assert len(mock.requests) == 3, [r.path for r in mock.requests]  # only the admitted calls reached it
    for request in mock.requests:
        assert not [h for h in request.headers if h.lower().startswith("adl-")], request.headers

    charged = {(b["dimension"], b["scope"]): b["used"] for b in view["budgets"] if b["persona"] is None}
    assert charged[("tokens", "per_session")] == 3 * 9050, view["budgets"]


def test_dns_answers_give_each_name_its_own_address_and_refuse_malformed_queries():
    names = netns.FakeNames()

    def query(name: str, qtype: int = 1, ident: int = 0x1234) -> bytes:
        labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
        return ident.to_bytes(2, "big") + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + labels + b"\x00" + \
            qtype.to_bytes(2, "big") + b"\x00\x01"

    first = netns.dns_answer(query("api.openai.com"), names)
    again = netns.dns_answer(query("API.openai.com.".rstrip(".")), names)
    other = netns.dns_answer(query("api.anthropic.com"), names)
    assert first[:2] == b"\x12\x34" and first[7] == 1  # one answer, the query's id
    assert first[-4:] == again[-4:] and first[-4:] != other[-4:]
    assert names.name(".".join(str(b) for b in first[-4:])) == "api.openai.com"
    aaaa = netns.dns_answer(query("api.openai.com", qtype=28), names)
    assert aaaa[7] == 0 and aaaa[3] & 0x0F == 0  # no IPv6 answer: the agent uses the IPv4 one
    # hostile datagrams: short, answers, compression in a question, truncated, two questions
    for bad in (b"", b"\x00" * 11, b"\x12\x34\x81\x00" + b"\x00" * 8, query("a.b")[:-3],
                b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xc0\x0c\x00\x01\x00\x01",
                b"\x12\x34\x01\x00\x00\x02" + b"\x00" * 6 + b"\x01a\x00\x00\x01\x00\x01"):
        assert netns.dns_answer(bad, names) is None, bad


def test_exec_says_what_is_missing_rather_than_running_ungoverned(tmp_path):
    run = [sys.executable, "-m", "governor", "exec"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    no_command = subprocess.run(run + ["--ca", __file__], capture_output=True, text=True, timeout=60, env=env)
    assert no_command.returncode == 2 and "name the agent command" in no_command.stderr
    no_ca = subprocess.run(run + ["--data-dir", str(tmp_path), "--", "true"], capture_output=True, text=True,
                           timeout=60, env=env)
    assert no_ca.returncode == 2 and "CA" in no_ca.stderr and "governor run" in no_ca.stderr
    bad_proxy = subprocess.run(run + ["--ca", __file__, "--proxy", "socks5://x:1", "--", "true"], capture_output=True,
                               text=True, timeout=60, env=env)
    assert bad_proxy.returncode == 2 and "--proxy" in bad_proxy.stderr
    port_53 = subprocess.run(run + ["--ca", __file__, "--port", "53", "--", "true"], capture_output=True, text=True,
                             timeout=60, env=env)
    assert port_53.returncode == 2 and "--port" in port_53.stderr
