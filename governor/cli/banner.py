"""What `governor run` prints once it serves: where everything is, and the commands to use it."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any


def governor_command(argv0: str | None = None, executable: str | None = None) -> str:
    """How to run this governor's CLI from any directory, as printed: `governor` only when that
    is what PATH finds; else the script's absolute path (`.venv/bin/governor` is not on PATH after
    `bash .ci/dev run`), or `PYTHON -m governor` when started so."""
    argv0, executable = argv0 or sys.argv[0], executable or sys.executable
    script = Path(argv0)
    if script.name == "governor" and script.exists():
        found = shutil.which("governor")
        if found and os.path.samefile(found, script):
            return "governor"
        return shlex.quote(os.path.abspath(script))
    return f"{shlex.quote(os.path.abspath(executable))} -m governor"


def instructions(running: Any, command: str | None = None) -> str:
    """The banner. Every command it prints runs as printed, from any directory."""
    command = command or governor_command()
    settings, runtime = running.settings, running.runtime
    data = settings.data_dir.resolve()
    data_arg = shlex.quote(str(data))
    lines = ["governor running"]
    report, pinned = getattr(runtime, "admission", None), getattr(runtime, "pinned", None)
    if report is not None and pinned is not None:
        lines.append(f"  passport:       {pinned.name} {pinned.version} ({settings.passport or 'bundled example'})")
        lines.append(f"                  digest {report.digest}")
        lines += [f"                  warning: {step.section} {step.message}" for step in report.warnings]
    limits = getattr(runtime, "limits", None)
    lines.append(f"  tier:           {limits.tier.value if limits is not None else settings.tier.value}")
    lines.append(f"  proxy:          {running.proxy_url} (mode {settings.mode})")
    if settings.transparent is not None:
        lines.append("  transparent:    {}:{} (connections redirected by iptables)".format(*settings.transparent))
    guard = getattr(running, "connections", None)
    if guard is not None:
        lines.append(f"  clients:        at most {guard.cap} connections; headers within {settings.client_header_timeout:g}s, "
                     f"bodies {settings.client_body_timeout:g}s, idle keep-alive closed after {settings.client_idle_timeout:g}s")
    if running.control_url:
        lines.append(f"  control plane:  {running.control_url}")
        token_file = getattr(running, "control_token_file", None)
        lines.append("  control token:  " + (f"{token_file} (mode 0600)" if token_file else "configured"))
        reviewer_file = getattr(running, "reviewer_token_file", None)
        lines.append("  approvals:      " + (f"reviewer token {reviewer_file} (mode 0600)" if reviewer_file else
                                             f"{len(settings.reviewer_tokens)} reviewer token(s) configured"
                     if settings.reviewer_tokens else "no reviewer token configured (GOVERNOR_REVIEWER_TOKEN): "
                     "paused steps can only time out"))
        if reviewer_file:
            lines.append(f"  list approvals: {command} approvals list --data-dir {data_arg}")
    if settings.webhooks is not None:
        from governor.notify.webhooks import redacted

        lines.append("  webhooks:       " + ", ".join(redacted(u) for u in settings.webhooks.urls)
                     + " (signed; reviews waiting, halts, locks, budget warnings)")
    if settings.unknown_traffic == "forward":
        lines.append("  other traffic:  FORWARDED UNGOVERNED (--unknown-traffic forward): uncounted, unrecorded")
    else:
        allowed = ", ".join(entry.describe() for entry in settings.allow[:4]) + (", ..." if len(settings.allow) > 4 else "")
        lines.append("  other traffic:  refused (default deny), unless allowed: " + (allowed or "no --allow entry"))
    lines.append(f"  data:           {data}")
    if getattr(runtime, "governor_id", None):
        lines.append(f"  governor id:    {runtime.governor_id}")
        from governor.evidence.keys import KeyFiles

        keys = KeyFiles(data / "keys")
        lines.append(f"  records:        {data / 'records'}")
        lines.append(f"  verify with:    {command} verify {shlex.quote(str(data / 'records'))}/SESSION.json --key "
                     f"{shlex.quote(str(keys.public_key))}  (or --did-document {shlex.quote(str(keys.did_document))})")
    lines += session_lines(settings, running, command)
    lines.append("Set in the agent's environment:")
    lines += [f"  export {key}={value}" for key, value in running.agent_environment().items()]
    if not settings.mode.startswith("reverse:"):
        lines.append(f"An agent that ignores those (Node 20's fetch, the npm openai client): {command} exec "
                     f"--data-dir {data_arg} -- node agent.js")
    lines.append("Ctrl-C stops.")
    return "\n".join(lines)


def session_lines(settings: Any, running: Any, command: str = "governor") -> list[str]:
    """How sessions are opened here (the banner): the operator must know how to start afresh."""
    data = shlex.quote(str(settings.data_dir.resolve()))
    default = {"auto": "token-less requests use a default session until a principal opens one here",
               "on": "token-less requests use the default session",
               "off": "token-less requests are refused"}[settings.default_session]
    lines = [f"  sessions:       {settings.sessions}; {default}"]
    if settings.sessions == "agent-named":
        lines.append(f"                  agent-named: any ADL-Session value opens a session (trusts the agent; "
                     f"at most {settings.agent_sessions_per_day} a day)")
    if running.control_url:
        lines.append(f"  open a session: {command} sessions open --data-dir {data}")
        lines.append(f"                  (or POST {running.control_url}/v1/sessions with the control token); the agent "
                     "sends the token it returns as ADL-Session")
        if settings.default_session == "auto":
            lines.append("                  once one is opened, token-less requests are refused here (403 "
                         "session_token_required); --default-session on keeps the default session")
        lines.append("                  a halted session stays halted: open a new one; "
                     + (f"a lock ({', '.join(settings.lock_on)}) stops every session until "
                        f"`{command} locks lift ID --by NAME --data-dir {data}`" if settings.lock_on else "no cause locks"))
    else:
        lines.append("  open a session: no control plane (--control off): only the default session is available")
    book = getattr(running, "sessions", None)
    if book is not None and book.locked:
        lines.append("  LOCKED:         " + "; ".join(f"{lock['id']} (session {lock['session']}, {lock['cause']})"
                                                     for lock in book.locks_view() if lock["state"] == "locked"))
    lines.append("  personas:       " + persona_line(settings, running, command, data))
    return lines


def persona_line(settings: Any, running: Any, command: str, data: str) -> str:
    """Who names a session's persona here: the principal (the default; the agent's ADL-Persona
    header is refused), or the agent's header under the `--agent-identity headers` opt-in."""
    if getattr(settings, "agent_identity", "principal") == "headers":
        return "the agent names them with the ADL-Persona request header (--agent-identity headers: trusts the agent)"
    if not running.control_url:
        return "bound by a principal when it opens a session, and the control plane is off: none here"
    return (f"bound by the principal: {command} sessions open --persona NAME --data-dir {data} "
            "(the agent's ADL-Persona header is refused unless --agent-identity headers)")
