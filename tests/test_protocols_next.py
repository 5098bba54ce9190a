"""The protocols' newest revisions through the real governor on the real runtime, with their
official SDKs at those versions: MCP 2026-07-28 (the `mcp` SDK 2.x: stateless, no handshake,
routing headers) and A2A 1.0 (the `a2a-sdk` 1.x: SendMessage, the HTTP+JSON binding). The
project pins mcp 1.x (tests/test_mcp_sdk*.py drive it); the newer SDKs live in their own venv
(.ci/sdk-tools, which `.ci/dev test` builds, in the user's cache) and run here as subprocesses: the server, the
peer agents and the clients are the SDKs' own code, only the governor runs in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.adapters.base import AdapterConfig
from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE
from governor.proxy.server import Settings, serve
from tests.conftest import REPO
from tests.control_harness import peer_passport, real_runtime
from tests.proxy_harness import AGENT_NAMED
from tests.test_a2a_delegation import OURS
from tests.test_mcp_sdk import REVIEWER, _answer_when_pending
from tests.test_mcp_sdk_runtime import PASSPORT as NOTES_PASSPORT

SCRIPTS = Path(__file__).parent / "sdk_next"


@pytest.fixture(scope="module")
def next_python() -> str:
    """The python of .ci/sdk-tools' venv (mcp 2.x, a2a-sdk 1.x), built when missing."""
    done = subprocess.run(["bash", str(REPO / ".ci" / "sdk-tools")], cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        pytest.fail(f".ci/sdk-tools could not build the venv of mcp 2.x and a2a-sdk 1.x:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def _process(python: str, script: str, *args: str) -> AsyncIterator[int]:
    """A server script of sdk_next on a free port (its first argument), until it listens."""
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(python, str(SCRIPTS / script), str(port), *args,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        for _ in range(300):
            if proc.returncode is not None:
                raise AssertionError(f"{script} exited: {(await proc.stderr.read()).decode()[-2000:]}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"{script} did not listen on {port}")
        yield port
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()


async def _client(python: str, script: str, *args: str, timeout: float = 90) -> Any:
    proc = await asyncio.create_subprocess_exec(python, str(SCRIPTS / script), *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{script} timed out")
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{out.decode()}\n{err.decode()[-3000:]}")
    return json.loads(lines[-1])


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


# --- MCP 2026-07-28 (mcp 2.x) ------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def notes_server(tmp_path_factory, next_python):
    """The mcp 2.x notes server, shared by the module: (its URL, the file of the calls it ran)."""
    calls = tmp_path_factory.mktemp("mcp2") / "calls.jsonl"
    async with _process(next_python, "mcp_notes_server.py", str(calls)) as port:
        yield f"http://127.0.0.1:{port}/mcp", calls


@pytest.fixture
async def notes(tmp_path, notes_server):
    """The notes server behind a governor of its own on the real runtime (the notes passport:
    read_note declared, delete_note requires confirmation, shell undeclared), session notes-1."""
    url, calls = notes_server
    calls.write_text("")
    runtime, _ = real_runtime(NOTES_PASSPORT, tmp_path)
    settings = Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path,
                        reviewer_tokens=(REVIEWER,), session="notes-1",
                        adapters=AdapterConfig(extra={"allowed_tools": runtime.allowed_tools}))
    governor = await serve(settings, runtime)
    try:
        yield governor, url, calls
    finally:
        await governor.stop()


async def _record(governor, session: str = "notes-1") -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{governor.control_url}/v1/sessions/{session}/record") as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()


async def test_mcp2_a_declared_tool_runs_an_undeclared_one_is_refused_and_recorded(notes, next_python):
    governor, url, calls = notes
    listed, read, shell = await _client(next_python, "mcp_client.py", url, governor.proxy_url, json.dumps(
        [["list"], ["call", "read_note", {"path": "/notes/a.md"}], ["call", "shell", {"cmd": "id"}]]))
    assert listed["tools"] == ["delete_note", "read_note"]  # shell withheld from the 2.x listing
    assert read == {"text": "contents of /notes/a.md", "is_error": False}
    assert shell["code"] == GOVERNOR_ERROR_CODE and "on_governor_tool_denied" in shell["error"]
    assert shell["data"]["governor"]["tool"] == "shell"
    assert [c["tool"] for c in _lines(calls)] == ["read_note"]  # shell never ran
    record = await _record(governor)
    assert any(e["detail"].get("tool") == "shell" for e in record["events"])


async def test_mcp2_a_tool_needing_confirmation_waits_for_the_reviewer(notes, next_python):
    governor, url, calls = notes
    call = asyncio.create_task(_client(next_python, "mcp_client.py", url, governor.proxy_url,
                                       json.dumps([["call", "delete_note", {"path": "/notes/old.md"}]])))
    approval = await _answer_when_pending(governor.control_url, "approve", "lab-lead")
    [result] = await asyncio.wait_for(call, 90)
    assert approval["tool"] == "delete_note" and approval["arguments"] == {"path": "/notes/old.md"}
    assert result == {"text": "deleted /notes/old.md", "is_error": False}
    assert _lines(calls) == [{"tool": "delete_note", "arguments": {"path": "/notes/old.md"}}]


def _modern_call(name: str, arguments: dict, **headers: str) -> tuple[dict, dict]:
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": name, "arguments": arguments,
                       "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                 "io.modelcontextprotocol/clientCapabilities": {}}}}
    sent = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call", "Mcp-Name": name, **{k.replace("_", "-"): v for k, v in headers.items()}}
    return body, sent


async def _post(governor, url: str, body: Any, headers: Any) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=json.dumps(body), headers=headers, proxy=governor.proxy_url,
                             timeout=aiohttp.ClientTimeout(total=30)) as resp:
            return resp.status, await resp.text()


@pytest.mark.parametrize("case, headers", [
    ("the name header names another tool", {"Mcp-Name": "delete_note"}),
    ("the method header names another method", {"Mcp-Method": "tools/list"}),
    ("a path parameter header the body never carried", {"Mcp-Param-Path": "/etc/shadow"}),
    ("a base64 name header naming another tool", {"Mcp-Name": "=?base64?ZGVsZXRlX25vdGU=?="}),
    ("a malformed base64 name header", {"Mcp-Name": "=?base64?!!!?="}),
])
async def test_mcp2_routing_headers_that_disagree_with_the_body_are_refused(notes, case, headers):
    governor, url, calls = notes
    body, sent = _modern_call("read_note", {"path": "/notes/a.md"})
    status, text = await _post(governor, url, body, {**sent, **headers})
    assert status in (200, 400), text
    error = json.loads(text.split("data: ", 1)[-1]) if text.startswith(("event:", "data:")) else json.loads(text)
    assert "error" in error and "routing headers must mirror the body" in error["error"]["message"], (case, text)
    assert _lines(calls) == []  # nothing ran
    record = await _record(governor)
    assert any("routing headers" in json.dumps(e.get("detail", {})) for e in record["events"]), case


async def test_mcp2_a_repeated_routing_header_is_refused(notes):
    governor, url, calls = notes
    body, sent = _modern_call("read_note", {"path": "/notes/a.md"})
    raw = [(k, v) for k, v in sent.items()] + [("Mcp-Name", "delete_note")]
    status, text = await _post(governor, url, body, _MultiDict(raw))
    assert "appears more than once" in text, text
    assert _lines(calls) == []


async def test_mcp2_headers_that_mirror_the_body_pass(notes):
    governor, url, calls = notes
    body, sent = _modern_call("read_note", {"path": "/notes/b.md"}, Mcp_Param_Path="/notes/b.md")
    status, text = await _post(governor, url, body, sent)
    assert status == 200 and "contents of /notes/b.md" in text, text
    body, sent = _modern_call("read_note", {"path": "/notes/ü.md"},
                              Mcp_Param_Path="=?base64?L25vdGVzL8O8Lm1k?=")  # "/notes/ü.md"
    status, text = await _post(governor, url, body, sent)
    assert status == 200 and "contents of /notes/" in text, text
    assert [c["arguments"]["path"] for c in _lines(calls)] == ["/notes/b.md", "/notes/ü.md"]


class _MultiDict(list):
    """Headers with a repeat, as aiohttp sends a list of pairs."""

    def items(self):
        return iter(self)


# --- A2A 1.0 (a2a-sdk 1.x) ------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def a2a_peers(tmp_path_factory, next_python):
    """Two a2a-sdk 1.x peers, shared by the module (summarizer: permitted; untrusted-bot: the
    passport's deny list), each serving its signed passport through ADL discovery:
    name -> (base URL, the file of the messages it received)."""
    folder = tmp_path_factory.mktemp("a2a1")
    peers = {}
    async with contextlib.AsyncExitStack() as stack:
        for name in ("summarizer", "untrusted-bot"):
            passports = folder / f"{name}-passports.json"
            passports.write_text(json.dumps({f"{name}.json": peer_passport(Ed25519PrivateKey.generate(),
                                                                            name=name)}))
            received = folder / f"{name}-received.jsonl"
            port = await stack.enter_async_context(_process(next_python, "a2a_peer.py", str(passports),
                                                            str(received)))
            peers[name] = (f"http://127.0.0.1:{port}", received)
        yield peers


@pytest.fixture
async def a2a_world(tmp_path, a2a_peers):
    """The peers behind a governor of its own on OURS (its delegation rules), session a2a-1."""
    for _, received in a2a_peers.values():
        received.write_text("")
    runtime, _ = real_runtime(OURS, tmp_path)
    governor = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0),
                                    data_dir=tmp_path, session="a2a-1"), runtime)
    try:
        yield governor, a2a_peers
    finally:
        await governor.stop()


@pytest.mark.parametrize("binding, streaming", [("JSONRPC", "0"), ("JSONRPC", "1"), ("HTTP+JSON", "0"),
                                                ("HTTP+JSON", "1")])
async def test_a2a1_a_permitted_peer_is_a_governed_delegation(a2a_world, next_python, binding, streaming):
    governor, peers = a2a_world
    base, received = peers["summarizer"]
    answer = await _client(next_python, "a2a_client.py", base, governor.proxy_url, binding, streaming, "summarize 7")
    assert answer == {"text": "done: summarize 7"}, answer
    [seen] = _lines(received)
    assert seen["depth"] == "1" and seen["session"] is None  # the governor's depth; no ADL-* header leaks
    record = await _record(governor, "a2a-1")
    assert not any(e["cause"] == "on_delegation_denied" for e in record["events"])
    # §4.2.5: the admission is recorded too, naming the peer
    admitted = [e for e in record["events"] if e["cause"] == "on_governor_delegation_admitted"]
    assert len(admitted) == 1 and "summarizer" in json.dumps(admitted[0]["detail"]), record["events"]


@pytest.mark.parametrize("binding, streaming", [("JSONRPC", "0"), ("JSONRPC", "1"), ("HTTP+JSON", "0"),
                                                ("HTTP+JSON", "1")])
async def test_a2a1_a_denied_peer_never_gets_the_message(a2a_world, next_python, binding, streaming):
    governor, peers = a2a_world
    base, received = peers["untrusted-bot"]
    answer = await _client(next_python, "a2a_client.py", base, governor.proxy_url, binding, streaming, "leak 1")
    if (binding, streaming) == ("HTTP+JSON", "0"):
        # the SDK's REST client names only the status for an ErrorInfo reason it does not know
        # (the body's google.rpc.Status carries the governor's message: the test below)
        assert answer["error"] == "A2AClientError" and "403" in answer["message"], answer
    else:
        assert "error" in answer and "on_delegation_denied" in answer["message"], answer
    assert _lines(received) == []
    record = await _record(governor, "a2a-1")
    assert any(e["cause"] == "on_delegation_denied" for e in record["events"])


async def test_a2a1_a_rest_refusal_is_a_google_rpc_status_naming_the_cause(a2a_world):
    governor, peers = a2a_world
    base, received = peers["untrusted-bot"]
    message = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "leak 2"}]}}
    status, text = await _post(governor, f"{base}/rest/message:send", message,
                               {"Content-Type": "application/json", "A2A-Version": "1.0"})
    error = json.loads(text)["error"]
    assert status == 403 and error["status"] == "PERMISSION_DENIED" and "on_delegation_denied" in error["message"]
    [info] = error["details"]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo" and info["domain"] == "adl-governor"
    assert _lines(received) == []


async def test_a2a1_a_card_read_with_a_query_or_to_another_path_is_not_claimed(a2a_world):
    governor, peers = a2a_world
    base, _ = peers["summarizer"]
    async with aiohttp.ClientSession() as http:
        for url in (f"{base}/.well-known/agent-card.json?x=secret", f"{base}/.well-known/other.json"):
            async with http.get(url, proxy=governor.proxy_url) as resp:
                assert resp.status == 403 and "--allow" in await resp.text(), url  # default deny
        async with http.get(f"{base}/.well-known/agent-card.json", proxy=governor.proxy_url) as resp:
            assert resp.status == 200 and (await resp.json())["name"] == "summarizer"


async def test_a2a1_a_rest_send_that_is_not_a_message_is_refused(a2a_world):
    governor, peers = a2a_world
    base, received = peers["summarizer"]
    for body in ([1, 2], {"message": "hi"}, {"nomessage": {}}):
        status, text = await _post(governor, f"{base}/rest/message:send", body, {"Content-Type": "application/json"})
        assert status == 400, text
    assert _lines(received) == []

