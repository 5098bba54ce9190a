"""What `governor run` and the CLI tell a user is true (#33 item 5): the banner's commands run as
printed from any directory with `governor` not on PATH; after a principal opens a session the
token-less call's 403 says why and how to go back; `sessions list` shows budgets, and a session
that halted says so after it ended; every list and show command takes --json."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.upstreams import MockLLM

VENV_BIN = Path(sys.executable).parent
BARE_PATH = "/usr/bin:/bin"  # no .venv/bin: `governor` alone is not a command here


async def start_governor(tmp_path: Path, upstream: str) -> tuple[subprocess.Popen, list[str]]:
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [str(VENV_BIN / "governor"), "run", "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0",
         "--data-dir", "data", "--mode", f"reverse:{upstream}"],
        cwd=tmp_path, env={"PATH": BARE_PATH, "HOME": str(tmp_path)}, stdout=subprocess.PIPE,
        stderr=open(tmp_path / "run.log", "wb"))
    lines: list[str] = []

    def banner() -> None:
        for raw in proc.stdout:
            lines.append(raw.decode().rstrip())
            if lines[-1] == "Ctrl-C stops.":
                return

    try:
        await asyncio.wait_for(asyncio.to_thread(banner), 90)
    except asyncio.TimeoutError:
        proc.kill()
        raise AssertionError(f"no banner: {lines} {(tmp_path / 'run.log').read_text()[-2000:]}")
    assert data.is_dir()
    return proc, lines


def printed(lines: list[str], label: str) -> str:
    [line] = [line for line in lines if line.strip().startswith(label)]
    return line.split(":", 1)[1].strip()


def shell(command: str) -> subprocess.CompletedProcess:
    """The command as a user pastes it: in a shell, elsewhere, without the venv on PATH."""
    return subprocess.run(["bash", "-c", command], cwd="/", env={"PATH": BARE_PATH, "HOME": "/tmp"},
                          capture_output=True, text=True, timeout=60)


async def test_the_banner_commands_run_as_printed_and_the_403_says_how_to_go_back(tmp_path: Path) -> None:
    mock = MockLLM()
    await mock.start()
    proc, lines = await start_governor(tmp_path, mock.base_url)
    try:
        text = "\n".join(lines)
        proxy = re.search(r"proxy:\s+(http://[\d.]+:\d+)", text).group(1)
        listed = printed(lines, "list approvals:")
        opened = printed(lines, "open a session:")
        assert not listed.startswith("governor ")  # not on PATH here: the banner names what runs
        assert str(tmp_path / "data") in listed and str(tmp_path / "data") in opened
        done = shell(listed)
        assert done.returncode == 0, (listed, done.stderr)
        assert "no approvals" in done.stdout.lower() or done.stdout.strip() == "", done.stdout
        done = shell(opened + " --label 'first run' --json")
        assert done.returncode == 0, (opened, done.stderr)
        token = json.loads(done.stdout)["token"]
        assert "once one is opened, token-less requests are refused here" in text

        async with httpx.AsyncClient(base_url=proxy, timeout=30) as client:
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
            tokenless = await client.post("/v1/chat/completions", json=body)
            assert tokenless.status_code == 403
            message = tokenless.json()["error"]["message"]
            assert "a principal opened a session on this governor's data directory" in message
            assert "--default-session on" in message and "ADL-Session" in message
            governed = await client.post("/v1/chat/completions", json=body,
                                         headers={"ADL-Session": token, "ADL-Agent-Note": "writer",
                                                  "ADL-Governor-Via": "forged-by-agent"})
            assert governed.status_code == 200, governed.text
        # what docs/reference/wire-protocols.md says an upstream sees: no ADL-* header of the agent's,
        # and the proxy's one marker (a per-process id, not the session token, not the agent's)
        [seen] = mock.requests
        adl = {k.lower(): v for k, v in seen.headers.items() if k.lower().startswith("adl-")}
        assert set(adl) == {"adl-governor-via"}, seen.headers
        assert adl["adl-governor-via"] not in (token, "forged-by-agent") and len(adl["adl-governor-via"]) >= 16

        done = shell(opened.replace(" sessions open ", " sessions list "))
        assert done.returncode == 0, done.stderr
        assert "first run" in done.stdout and "budgets: " in done.stdout, done.stdout
        assert re.search(r"tokens \d+/\d+ per_session", done.stdout), done.stdout  # used against its cap

        # personas: the principal binds them (the agent's ADL-Persona is refused by default)
        personas = printed(lines, "personas:")
        bind = re.fullmatch(r"bound by the principal: (.+ sessions open --persona NAME --data-dir \S+) \(the agent's "
                            r"ADL-Persona header is refused unless --agent-identity headers\)", personas)
        assert bind, personas
        done = shell(bind.group(1).replace("NAME", "searcher") + " --json")
        assert done.returncode == 0, (bind.group(1), done.stderr)
        assert json.loads(done.stdout)["identity"]["persona"] == "searcher", done.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        await mock.stop()


def test_the_persona_line_says_who_names_personas_under_each_identity_mode() -> None:
    from types import SimpleNamespace

    from governor.cli.banner import persona_line

    served, off = SimpleNamespace(control_url="http://127.0.0.1:1"), SimpleNamespace(control_url=None)
    trusted = persona_line(SimpleNamespace(agent_identity="headers"), served, "governor", "d")
    assert trusted.startswith("the agent names them with the ADL-Persona request header") and "trusts" in trusted
    bound = persona_line(SimpleNamespace(agent_identity="principal"), served, "governor", "d")
    assert "governor sessions open --persona NAME --data-dir d" in bound and "refused" in bound
    assert "control plane is off" in persona_line(SimpleNamespace(agent_identity="principal"), off, "governor", "d")


def test_a_session_that_halted_says_so_after_it_ended() -> None:
    from governor.cli.sessions import session_line

    halted = {"session": "s1", "state": "ended", "halt_cause": "on_budget_exhausted", "opened_by": "principal",
              "label": "nightly", "budgets": [{"dimension": "tokens", "scope": "per_session", "persona": None,
                                                "used": 1200.0, "limit": 1000.0}]}
    line = session_line(halted)
    assert line.startswith("s1  halted (on_budget_exhausted), ended  principal  nightly")
    assert "budgets: tokens 1200/1000 per_session" in line
    assert session_line({"session": "s2", "state": "active", "budgets": []}) == "s2  active"


def test_every_list_and_show_command_takes_json() -> None:
    from governor.cli import build_parser

    def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from commands(sub, path + (name,))
        yield path, parser

    found = [(path, parser) for path, parser in commands(build_parser()) if path and path[-1] in ("list", "show")]
    assert len(found) >= 5  # sessions list|show, locks list, approvals list|show
    for path, parser in found:
        assert any("--json" in action.option_strings for action in parser._actions), path


def test_a_pause_event_gives_expires_at_as_an_iso_time_like_the_others() -> None:
    """The PDP's pause events (a first review, and one asked again after a timeout) carry
    expires_at as the records' other times are written, not as a Unix float."""
    from governor.common.timefmt import iso_utc
    from governor.policy import ApprovalExpired, ToolCall
    from tests.test_policy_oversight import CONFIRM
    from tests.test_policy_support import T0, Driver, with_runtime

    driver = Driver(with_runtime(CONFIRM, degradation={"on_oversight_timeout": {"action": "pause"}}))
    first = driver.run(ToolCall("send_email", {"to": "a@example.com"}))
    assert first.event["detail"]["expires_at"] == iso_utc(T0 + 15 * 60) == "2025-10-09T09:08:20.000Z"
    assert first.approval.expires_at == T0 + 15 * 60  # the PDP's own clock arithmetic stays numeric
    again = driver.run(ApprovalExpired(first.approval.id), now=first.approval.expires_at + 1)
    assert again.event["detail"]["expires_at"] == iso_utc(again.approval.expires_at)
    assert again.event["detail"]["expires_at"].endswith("Z")
