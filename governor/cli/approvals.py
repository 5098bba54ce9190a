"""`governor approvals list|show|approve|reject`: the reviewer's commands, over a running
governor's control plane (usable over SSH: plain text, or --json).

Where the control plane is: --control URL / $GOVERNOR_CONTROL_URL, else
<data-dir>/control.json (written by `governor run`). The reviewer token: --token-file,
else $GOVERNOR_REVIEWER_TOKEN, else <data-dir>/reviewer-token (mode 0600, written by
`governor run` when no reviewer token is configured). `list` and `show` fall back to the
control token when no reviewer token is found (a read needs either). Requests and errors
go through the commands' shared client (`client`). Exit codes: 0 done; 1 the governor refused (an
unknown or already answered approval, a wrong token); 2 usage, or no governor to talk to.

Everything shown comes from the agent (tool, arguments, session, persona): text mode
escapes every non-printable character, so a terminal control sequence in a tool argument
is shown as `\\x1b`, never run by the reviewer's terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from governor.cli import UsageError
from governor.control.auth import REVIEWER_TOKEN_ENV
from governor.cli.client import Refused, call, control_token, data_dir, quote, token_from

REVIEWER_TOKEN_FILE = "reviewer-token"


def register(subparsers: argparse._SubParsersAction) -> None:
    approvals = subparsers.add_parser(
        "approvals", help="list, show, approve and reject the steps held for a reviewer (§5)",
        description="A step the passport says needs confirmation is held until a reviewer answers. "
        "These commands talk to the control plane of a running `governor run`, locally or over SSH.")
    actions = approvals.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    listed = actions.add_parser("list", help="the steps waiting for a reviewer")
    shown = actions.add_parser("show", help="one held step: tool, canonical arguments, reason, session, time left")
    shown.add_argument("approval", metavar="ID")
    approve = actions.add_parser("approve", help="release the held step (once, bound to its digest)")
    approve.add_argument("approval", metavar="ID")
    approve.add_argument("--as", dest="reviewer", required=True, metavar="NAME", help="who approves (recorded)")
    approve.add_argument("--reason", default="", help="a note recorded with the approval")
    reject = actions.add_parser("reject", help="refuse the held step (the session goes on)")
    reject.add_argument("approval", metavar="ID")
    reject.add_argument("--as", dest="reviewer", required=True, metavar="NAME", help="who rejects (recorded)")
    reject.add_argument("--reason", required=True, help="why (recorded, and told to the agent's operator)")
    for parser in (listed, shown, approve, reject):
        _common(parser)
        parser.set_defaults(func=run_approvals)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                        help="the governor's data directory [$GOVERNOR_DATA_DIR, default ./.governor]")
    parser.add_argument("--control", "--control-url", dest="control_url", metavar="URL",
                        help="the control plane [$GOVERNOR_CONTROL_URL, default: <data-dir>/control.json]")
    parser.add_argument("--token-file", type=Path, metavar="FILE",
                        help=f"the reviewer token [${REVIEWER_TOKEN_ENV}, default <data-dir>/{REVIEWER_TOKEN_FILE}]")
    parser.add_argument("--json", action="store_true", help="print the control plane's JSON answer")


def reviewer_token(args: argparse.Namespace) -> str | None:
    """--token-file, else $GOVERNOR_REVIEWER_TOKEN, else <data-dir>/reviewer-token, else None."""
    return token_from(args, REVIEWER_TOKEN_ENV, REVIEWER_TOKEN_FILE, "reviewer")


def _read_token(args: argparse.Namespace) -> str | None:
    # a read takes a reviewer or the control token: the reviewer's first
    return reviewer_token(args) or control_token(args)


def _answer_token(args: argparse.Namespace) -> str:
    token = reviewer_token(args)
    if token is None:
        raise UsageError(f"no reviewer token: give --token-file FILE, set ${REVIEWER_TOKEN_ENV}, or run where "
                         f"{data_dir(args) / REVIEWER_TOKEN_FILE} exists")
    return token


def run_approvals(args: argparse.Namespace) -> int:
    try:
        if args.action == "list":
            answer = call(args, "GET", "/v1/approvals", token_of=_read_token)
            rows = answer.get("approvals", [])
            text = "\n".join(_row(a) for a in rows) if rows else "no approvals pending"
        elif args.action == "show":
            answer = _find(args, args.approval)
            text = _details(answer)
        else:
            if not args.reviewer.strip():
                raise UsageError("--as: name who answers")
            if args.action == "reject" and not args.reason.strip():
                raise UsageError("--reason: say why the step is rejected")
            decision = "approve" if args.action == "approve" else "reject"
            body = {"decision": decision, "reviewer": args.reviewer}
            if args.reason.strip():
                body["reason"] = args.reason
            answer = call(args, "POST", f"/v1/approvals/{quote(args.approval)}", body, token_of=_answer_token)
            outcome = answer.get("outcome") or decision
            text = f"approval {inert(args.approval)} {outcome} by {inert(args.reviewer)} (session {inert(answer.get('session'))})"
    except Refused as exc:
        print(f"governor approvals {args.action}: {_refusal_text(exc)}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2) if args.json else text)
    return 0


def _find(args: argparse.Namespace, approval_id: str) -> dict[str, Any]:
    answer = call(args, "GET", "/v1/approvals", token_of=_read_token)
    for view in answer.get("approvals", []):
        if view.get("id") == approval_id:
            return view
    raise Refused(404, {"error": {"code": "approval_not_pending",
                                  "message": f"no pending approval {approval_id!r} (unknown, already answered or timed out)"}})


def _refusal_text(exc: Refused) -> str:
    hint = f" (check --token-file / ${REVIEWER_TOKEN_ENV})" if exc.status == 401 else ""
    return inert(str(exc)) + hint


# --- rendering (text mode) ---------------------------------------------------------------


def inert(value: Any) -> str:
    """`value` as text a terminal shows and never interprets: every non-printable character
    (C0/C1 controls, ESC, bidi overrides, line breaks) becomes its escape."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def canonical_arguments(arguments: Any) -> str:
    """The tool arguments as canonical JSON (RFC 8785, the bytes the step digest covers)."""
    from governor.common.canonical import canonicalize

    try:
        return canonicalize(arguments).decode("utf-8")
    except Exception:  # not JSON-canonicalizable (a float NaN...): show it plainly
        return json.dumps(arguments, sort_keys=True, ensure_ascii=True, default=str)


def time_left(expires_at: str | None, now: float | None = None) -> str:
    if not expires_at:
        return "?"
    try:
        at = datetime.fromisoformat(expires_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "?"
    left = int(at - (time.time() if now is None else now))
    if left <= 0:
        return "expired"
    hours, rest = divmod(left, 3600)
    minutes, seconds = divmod(rest, 60)
    return (f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s") + " left"


def _row(view: dict[str, Any]) -> str:
    who = inert(view.get("session")) + (f"/{inert(view['persona'])}" if view.get("persona") else "")
    return (f"{inert(view.get('id'))}  {inert(view.get('tool') or '(model call)')}  session {who}  "
            f"{inert(view.get('reason'))}  {time_left(view.get('expires_at'))}")


def _details(view: dict[str, Any]) -> str:
    fields = [
        ("approval", view.get("id")),
        ("session", view.get("session")),
        ("persona", view.get("persona") or "-"),
        ("tool", view.get("tool") or "(model call)"),
        ("arguments", canonical_arguments(view.get("arguments") or {})),
        ("reason", view.get("reason")),
        ("trigger", view.get("trigger")),
        ("step digest", view.get("step_digest")),
        ("expires", f"{view.get('expires_at')} ({time_left(view.get('expires_at'))})"),
    ]
    return "\n".join(f"{name:<12} {inert(value)}" for name, value in fields)
