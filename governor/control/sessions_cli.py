"""`governor sessions open|list|show|end` and `governor locks list|lift`: the principal's
commands, over a running governor's control plane.

Where the control plane is and its token: --control-url / $GOVERNOR_CONTROL_URL, else
<data-dir>/control.json (written by `governor run`); --token-file, else
$GOVERNOR_CONTROL_TOKEN, else <data-dir>/control-token (mode 0600, written by
`governor run` when no control token is configured). Exit codes: 0 done; 1 the
governor refused (an unknown session or lock, a wrong token); 2 usage, or no
governor to talk to.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from governor.cli import UsageError

TIMEOUT = 30.0


def register(subparsers: argparse._SubParsersAction) -> None:
    actions = _command(
        subparsers, "sessions", help="open, list, show and end sessions of a running governor (the principal's side)",
        description="Sessions are opened by a principal: `open` returns a session token the agent sends "
        "in its ADL-Session header. Talks to the control plane of a running `governor run`.")
    opened = actions.add_parser("open", help="open a session; prints its id and token")
    opened.add_argument("--label", help="a label for people reading the session list")
    opened.add_argument("--nonce", help="a counterparty nonce (§8.5) the session's record will carry")
    listed = actions.add_parser("list", help="the governor's sessions")
    shown = actions.add_parser("show", help="one session's state and budgets")
    shown.add_argument("session", metavar="ID")
    ended = actions.add_parser("end", help="end a session: its record is signed and its token refused from now on")
    ended.add_argument("session", metavar="ID")
    _actions_run(run_sessions, opened, listed, shown, ended)

    lock_actions = _command(
        subparsers, "locks", help="list and lift the locks that stop every session of the agent",
        description="A halt with a locking cause (--lock-on) locks the agent: every session is refused "
        "until a principal lifts the lock.")
    lock_list = lock_actions.add_parser("list", help="locks in force and lifted")
    lift = lock_actions.add_parser("lift", help="lift a lock (recorded with who lifted it)")
    lift.add_argument("lock", metavar="LOCK_ID")
    lift.add_argument("--by", required=True, help="who lifts it (recorded)")
    _actions_run(run_locks, lock_list, lift)


def _command(subparsers: argparse._SubParsersAction, name: str, *, help: str,
             description: str) -> argparse._SubParsersAction:
    """A `governor NAME ACTION` command: its parser and the (required) actions under it."""
    command = subparsers.add_parser(name, help=help, description=description)
    actions = command.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    return actions


def _actions_run(func: Callable[[argparse.Namespace], int], *parsers: argparse.ArgumentParser) -> None:
    for parser in parsers:
        _common(parser)
        parser.set_defaults(func=func)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                        help="the governor's data directory [$GOVERNOR_DATA_DIR, default ./.governor]")
    parser.add_argument("--control-url", metavar="URL", help="the control plane [$GOVERNOR_CONTROL_URL, "
                        "default: <data-dir>/control.json]")
    parser.add_argument("--token-file", type=Path, metavar="FILE",
                        help="the control token [$GOVERNOR_CONTROL_TOKEN, default <data-dir>/control-token]")
    parser.add_argument("--json", action="store_true", help="print the control plane's JSON answer")


class Refused(Exception):
    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"{status} {error.get('code', '')}: {error.get('message', body)}")
        self.status = status


def _data_dir(args: argparse.Namespace) -> Path:
    return args.data_dir or Path(os.environ.get("GOVERNOR_DATA_DIR") or ".governor")


def _control_url(args: argparse.Namespace) -> str:
    url = args.control_url or os.environ.get("GOVERNOR_CONTROL_URL")
    if url:
        return url.rstrip("/")
    path = _data_dir(args) / "control.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))["url"].rstrip("/")
    except FileNotFoundError:
        raise UsageError(f"no running governor found: {path} does not exist (is `governor run --data-dir "
                         f"{_data_dir(args)}` running?); or give --control-url") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: unreadable ({exc})") from None


def _token(args: argparse.Namespace) -> str | None:
    path = args.token_file
    if path is None:
        env = os.environ.get("GOVERNOR_CONTROL_TOKEN", "").strip()
        if env:
            return env
        path = _data_dir(args) / "control-token"
        if not path.exists():
            return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise UsageError(f"control token file {path}: {exc.strerror or exc}") from None


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None,
          token_of: Callable[[argparse.Namespace], str | None] | None = None) -> Any:
    """The control plane's JSON answer; Refused for an HTTP error, UsageError when it cannot be
    reached. `token_of` finds the bearer token (default: the control token, `_token`)."""
    url = _control_url(args) + path
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    token = (token_of or _token)(args)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through the governor's proxy
    try:
        with opener.open(request, timeout=TIMEOUT) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = raw.decode("utf-8", "replace")
        raise Refused(exc.code, answer) from None
    except (urllib.error.URLError, OSError) as exc:
        raise UsageError(f"cannot reach the control plane at {url}: {getattr(exc, 'reason', exc)}") from None


def _print(args: argparse.Namespace, answer: Any, text: str) -> None:
    print(json.dumps(answer, indent=2) if args.json else text)


def _answered(args: argparse.Namespace, command: str, ask: Callable[[], tuple[Any, str]]) -> int:
    """Run one control plane exchange (`ask` returns the answer and its text): 0 printed, 1 the
    control plane refused (its reason on stderr)."""
    try:
        answer, text = ask()
    except Refused as exc:
        print(f"governor {command} {args.action}: {exc}", file=sys.stderr)
        return 1
    _print(args, answer, text)
    return 0


def run_sessions(args: argparse.Namespace) -> int:
    return _answered(args, "sessions", lambda: _sessions(args))


def _sessions(args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "open":
        body = {k: v for k, v in (("label", args.label), ("nonce", args.nonce)) if v is not None}
        answer = _call(args, "POST", "/v1/sessions", body)
        text = (f"session {answer['session']} opened\n"
                f"token   {answer['token']}\n"
                f"the agent sends it in every request: ADL-Session: {answer['token']}")
        if answer.get("locked"):
            text += "\nnote: the agent is LOCKED; requests are refused until the lock is lifted (governor locks list)"
    elif args.action == "list":
        answer = _call(args, "GET", "/v1/sessions")
        rows = [f"{s.get('session')}  {s.get('state', '?')}  {s.get('opened_by') or ''}  {s.get('label') or ''}".rstrip()
                for s in answer.get("sessions", [])]
        text = "\n".join(rows) if rows else "no sessions"
    elif args.action == "show":
        answer = _call(args, "GET", f"/v1/sessions/{_quote(args.session)}")
        text = json.dumps(answer, indent=2)
    else:
        answer = _call(args, "POST", f"/v1/sessions/{_quote(args.session)}/end")
        text = (f"session {args.session} ended ({answer.get('outcome')}); its signed record has "
                f"{len(answer.get('events', []))} event(s)")
    return answer, text


def run_locks(args: argparse.Namespace) -> int:
    return _answered(args, "locks", lambda: _locks(args))


def _locks(args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "list":
        answer = _call(args, "GET", "/v1/locks")
        rows = [f"{lock['id']}  {lock['state']}  session {lock['session']}  {lock['cause']}"
                + (f"  lifted by {lock['lifted_by']}" if lock.get("lifted_by") else "")
                for lock in answer.get("locks", [])]
        text = "\n".join(rows) if rows else "no locks"
    else:
        answer = _call(args, "POST", f"/v1/locks/{_quote(args.lock)}/lift", {"by": args.by})
        text = f"lock {args.lock} lifted by {args.by}" + ("" if not answer.get("locked") else
                                                          "; other locks are still in force")
    return answer, text


def _quote(value: str) -> str:
    import urllib.parse

    return urllib.parse.quote(value, safe="")
