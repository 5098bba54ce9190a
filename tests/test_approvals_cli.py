"""`governor approvals list|show|approve|reject`: the real command as a subprocess, against a
real `governor run` (tests/governor_process.py) holding a real step that an agent sent
through the real proxy to a real MCP tool server (the bundled passport: delete_note
requires confirmation). One governor for the module (its start is the slow part): each test
holds its own step in its own session, on its own note."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys

import httpx
import pytest
import pytest_asyncio

from governor.demo.mock_tools import MockTools
from tests.governor_process import REPO, GovernorProcess

WRONG = "not-the-reviewer-token-0123456789"
HANG_GUARD = 60.0  # not a timing assertion: stops a hung call from hanging the suite

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GOVERNOR_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "governor", "approvals", *args, cwd=REPO, env={**clean, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), HANG_GUARD)
    return proc.returncode, out.decode(), err.decode()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def world(tmp_path_factory):
    tools = MockTools({"/workspace/notes/old.md": "x", "/workspace/notes/keep.md": "y",
                       "/workspace/notes/spare.md": "z"})
    await tools.start()
    governor = GovernorProcess(tmp_path_factory.mktemp("approvals") / "data", [])
    await governor.start()
    agent = httpx.AsyncClient(proxy="http://%s:%d" % governor.proxy, trust_env=False, timeout=HANG_GUARD)
    yield governor, tools, agent
    await agent.aclose()
    await governor.stop()
    await tools.stop()


def ran(tools, arguments: dict) -> list[str]:
    """The tools that ran with these arguments (each test holds a step on its own note)."""
    return [name for name, args in tools.calls if args == arguments]


def held_call(world, session: str, arguments: dict) -> asyncio.Task:
    _, tools, agent = world
    return asyncio.create_task(agent.post(tools.url, headers={"ADL-Session": session}, json={
        "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "delete_note", "arguments": arguments}}))


async def pending(data, session: str) -> dict:
    """The session's held step, polled over HTTP (cheaper than a CLI process a poll)."""
    token = (data / "reviewer-token").read_text().strip()
    url = json.loads((data / "control.json").read_text())["url"]
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=HANG_GUARD) as control:
        for _ in range(300):
            listed = (await control.get("/v1/approvals", headers={"Authorization": f"Bearer {token}"})).json()
            mine = [a for a in listed["approvals"] if a["session"] == session]
            if mine:
                return mine[0]
            await asyncio.sleep(0.05)
    raise AssertionError(f"nothing held in session {session}")


async def test_a_reviewer_lists_shows_and_approves_a_held_step_and_the_agent_continues(world, tmp_path):
    governor, tools, _ = world
    data = governor.data_dir
    token_file = data / "reviewer-token"
    assert token_file.stat().st_mode & 0o777 == 0o600  # written by governor run: none was configured

    call = held_call(world, "review-1", {"path": "/workspace/notes/old.md"})
    held = await pending(data, "review-1")
    assert ran(tools, {"path": "/workspace/notes/old.md"}) == []  # held, not forwarded

    code, out, err = await cli("list", "--data-dir", str(data))
    assert code == 0, err
    assert held["id"] in out and "delete_note" in out and "session review-1" in out and "left" in out

    code, out, err = await cli("show", held["id"], "--data-dir", str(data))
    assert code == 0, err
    shown = dict(line.split(None, 1) if not line.startswith("step digest") else ("step digest", line[12:].strip())
                 for line in out.strip().splitlines())
    assert shown["tool"] == "delete_note" and shown["session"] == "review-1"
    assert shown["arguments"] == '{"path":"/workspace/notes/old.md"}'  # canonical JSON (JCS)
    assert shown["reason"] == held["reason"] and shown["trigger"] == "tools.delete_note.requires_confirmation"
    assert shown["step digest"] == held["step_digest"] and "left)" in shown["expires"]

    code, out, err = await cli("approve", held["id"], "--as", "lab lead", "--reason", "checked the path",
                               "--data-dir", str(data))
    assert code == 0, err
    assert f"approval {held['id']} approved by lab lead" in out
    done = await asyncio.wait_for(call, HANG_GUARD)
    assert done.json()["result"]["content"][0]["text"] == "deleted /workspace/notes/old.md"
    assert ran(tools, {"path": "/workspace/notes/old.md"}) == ["delete_note"]

    # answered once: a second answer is refused and says why
    code, _, err = await cli("approve", held["id"], "--as", "lab lead", "--data-dir", str(data))
    assert code == 1 and "approval_answered" in err and "by lab lead" in err, err
    code, _, err = await cli("show", held["id"], "--data-dir", str(data))
    assert code == 1 and "approval_not_pending" in err

    # the reviewer and the note are in the session's signed record
    control_token = (data / "control-token").read_text().strip()
    async with httpx.AsyncClient(base_url=governor.control_url, trust_env=False, timeout=HANG_GUARD) as control:
        record = (await control.get("/v1/sessions/review-1/record",
                                    headers={"Authorization": f"Bearer {control_token}"})).json()
    released = [e for e in record["events"] if e["action"] == "pause" and e["detail"].get("review") == "approved" and e["cause"] == "on_governor_oversight_trigger"]
    assert released and released[0]["detail"]["reviewer"] == "lab lead"
    assert released[0]["detail"]["reason"] == "checked the path"


async def test_a_rejection_needs_a_reason_and_the_agent_is_refused(world):
    governor, tools, _ = world
    data = governor.data_dir
    call = held_call(world, "review-2", {"path": "/workspace/notes/keep.md"})
    held = await pending(data, "review-2")

    code, _, err = await cli("reject", held["id"], "--as", "lab lead", "--data-dir", str(data))
    assert code == 2 and "--reason" in err  # usage: a rejection says why
    code, out, err = await cli("reject", held["id"], "--as", "lab lead", "--reason", "keep that note",
                               "--data-dir", str(data), "--json")
    assert code == 0, err
    assert json.loads(out)["decision"] == "reject" and json.loads(out)["session"] == "review-2"
    done = (await asyncio.wait_for(call, HANG_GUARD)).json()
    assert done["error"]["data"]["governor"]["cause"] == "on_governor_oversight_trigger"
    assert ran(tools, {"path": "/workspace/notes/keep.md"}) == []  # it never ran


async def test_clear_errors_for_unknown_ids_bad_tokens_and_no_control_plane(world, tmp_path):
    governor, _, _ = world
    data = governor.data_dir
    call = held_call(world, "review-3", {"path": "/workspace/notes/spare.md"})
    held = await pending(data, "review-3")

    code, _, err = await cli("approve", "apr-does-not-exist", "--as", "x", "--data-dir", str(data))
    assert code == 1 and "approval_not_pending" in err and "Traceback" not in err
    code, _, err = await cli("show", "apr-does-not-exist", "--data-dir", str(data))
    assert code == 1 and "approval_not_pending" in err

    (tmp_path / "wrong").write_text(WRONG)
    code, _, err = await cli("approve", held["id"], "--as", "x", "--data-dir", str(data),
                             "--token-file", str(tmp_path / "wrong"))
    assert code == 1 and "token_invalid" in err and "--token-file" in err, err
    code, _, err = await cli("list", "--data-dir", str(data), "--token-file", str(tmp_path / "missing"))
    assert code == 2 and "reviewer token file" in err

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    code, _, err = await cli("list", "--control", f"http://127.0.0.1:{port}", "--data-dir", str(data))
    assert code == 2 and "cannot reach the control plane" in err
    code, _, err = await cli("list", "--data-dir", str(tmp_path / "nowhere"))
    assert code == 2 and "no running governor" in err
    code, _, err = await cli("approve", held["id"], "--as", "x", "--control", governor.control_url,
                             "--data-dir", str(tmp_path / "nowhere"))
    assert code == 2 and "no reviewer token" in err

    # over SSH: the control plane's URL and the token in the environment, no data dir
    token = (data / "reviewer-token").read_text().strip()
    code, out, err = await cli("approve", held["id"], "--as", "remote reviewer", "--control", governor.control_url,
                               "--data-dir", str(tmp_path / "nowhere"), env={"GOVERNOR_REVIEWER_TOKEN": token})
    assert code == 0, err
    assert (await asyncio.wait_for(call, HANG_GUARD)).json()["result"]["content"][0]["text"].startswith("deleted")


async def test_agent_controlled_strings_cannot_drive_the_reviewers_terminal(world):
    governor, _, _ = world
    data = governor.data_dir
    hostile = "/workspace/notes/x\x1b[2J\x1b[32mAPPROVED\x1b]0;pwned\x07\u202egnp.exe\x9b31m"
    call = held_call(world, "review-4", {"path": hostile})
    held = await pending(data, "review-4")
    assert held is not None and held["arguments"]["path"] == hostile  # the JSON carries it exactly
    code, out, err = await cli("show", held["id"], "--data-dir", str(data))
    assert code == 0, err
    assert not any(c in out for c in "\x1b\x07\u202e\x9b"), repr(out)
    assert "\\u001b[2J" in out and "\\u202e" in out and "\\x9b" in out, out  # shown, escaped
    code, out, _ = await cli("list", "--json", "--data-dir", str(data))
    assert "\x1b" not in out and "\u202e" not in out  # JSON output is ASCII-escaped
    code, _, err = await cli("reject", held["id"], "--as", "lab lead", "--reason", "hostile", "--data-dir", str(data))
    assert code == 0, err
    await asyncio.wait_for(call, HANG_GUARD)
