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
import sys
from pathlib import Path
from typing import Any, Callable

from governor.cli.client import Refused, call, quote


def register(subparsers: argparse._SubParsersAction) -> None:
    actions = _command(
        subparsers, "sessions", help="open, list, show and end sessions of a running governor (the principal's side)",
        description="Sessions are opened by a principal: `open` returns a session token the agent sends "
        "in its ADL-Session header. Talks to the control plane of a running `governor run`.")
    opened = actions.add_parser("open", help="open a session; prints its id and token")
    opened.add_argument("--label", help="a label for people reading the session list")
    opened.add_argument("--nonce", help="a counterparty nonce (§8.5) the session's record will carry")
    opened.add_argument("--persona", help="the declared persona (permissions.sub_agents) the session acts as: its "
                        "max_parallel and budget_share count every request of the session (docs/sessions.md#identity)")
    opened.add_argument("--instance", help="the persona instance the session is (default: the session's one)")
    opened.add_argument("--parent", metavar="ID", help="the session of this governor that delegated this one: the "
                        "lineage, and the depth of its delegated calls, continue from it")
    opened.add_argument("--delegation", metavar="TOKEN", help="a delegation token (`governor sessions delegation "
                        "ID`) issued for the parent session, instead of --parent")
    delegated = actions.add_parser("delegation", help="a signed delegation token for children of a session")
    delegated.add_argument("session", metavar="ID")
    listed = actions.add_parser("list", help="the governor's sessions")
    shown = actions.add_parser("show", help="one session's state and budgets")
    shown.add_argument("session", metavar="ID")
    ended = actions.add_parser("end", help="end a session: its record is signed and its token refused from now on")
    ended.add_argument("session", metavar="ID")
    ended.add_argument("--proof", type=Path, metavar="FILE",
                       help="also fetch the final record's transparency-log proof (C2SP tlog-proof) and write it to "
                       "FILE, the record beside it as FILE.record.json (docs/transparency-log.md)")
    _actions_run(run_sessions, opened, listed, shown, ended, delegated)

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
        body = {k: getattr(args, k) for k in ("label", "nonce", "persona", "instance", "parent", "delegation")
                if getattr(args, k, None) is not None}
        answer = call(args, "POST", "/v1/sessions", body)
        text = (f"session {answer['session']} opened\n"
                f"token   {answer['token']}\n"
                f"the agent sends it in every request: ADL-Session: {answer['token']}")
        if answer.get("locked"):
            text += "\nnote: the agent is LOCKED; requests are refused until the lock is lifted (governor locks list)"
    elif args.action == "delegation":
        answer = call(args, "POST", f"/v1/sessions/{quote(args.session)}/delegation")
        text = (f"delegation token for children of {args.session} (depth {answer['depth']}; valid one hour):\n"
                f"{answer['delegation']}")
    elif args.action == "list":
        answer = call(args, "GET", "/v1/sessions")
        rows = [session_line(s) for s in answer.get("sessions", [])]
        text = "\n".join(rows) if rows else "no sessions"
        if answer.get("next"):
            text += f"\n(more: GET /v1/sessions?after={answer['next']})"
    elif args.action == "show":
        answer = call(args, "GET", f"/v1/sessions/{quote(args.session)}")
        text = json.dumps(answer, indent=2)
    else:
        proof_file = getattr(args, "proof", None)
        if proof_file is None:
            answer = call(args, "POST", f"/v1/sessions/{quote(args.session)}/end")
        else:
            answer = call(args, "POST", f"/v1/sessions/{quote(args.session)}/end?proof=1")
            record_file = proof_file.with_name(proof_file.name + ".record.json")
            proof_file.write_text(answer["tlog_proof"], encoding="utf-8")
            record_file.write_text(json.dumps(answer["record"], indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            answer = answer["record"]
        text = (f"session {args.session} ended ({answer.get('outcome')}); its signed record has "
                f"{len(answer.get('events', []))} event(s)")
        if proof_file is not None:
            text += f"\nits log proof is in {proof_file}, the record as logged in {record_file}"
    return answer, text


def state_of(view: dict[str, Any]) -> str:
    """A session's state as a reader needs it: one that halted says so (and why) after it ended."""
    state = view.get("state", "?")
    if view.get("halt_cause"):
        return f"halted ({view['halt_cause']})" + (", ended" if state == "ended" else "")
    return state


def budget_text(budget: dict[str, Any]) -> str:
    used, limit = budget.get("used", 0), budget.get("limit")
    amount = f"{used:g}" if limit is None else f"{used:g}/{limit:g}"
    where = budget.get("scope", "") + (f" persona {budget['persona']}" if budget.get("persona") else "")
    return f"{budget.get('dimension')} {amount} {where}".rstrip()


def session_line(view: dict[str, Any]) -> str:
    """One line of `sessions list`: id, state, who opened it, label, then its budgets against their caps."""
    head = "  ".join(str(part) for part in (view.get("session"), state_of(view), view.get("opened_by") or "",
                                            view.get("label") or "") if part)
    budgets = [budget_text(b) for b in view.get("budgets") or () if b.get("limit") is not None or b.get("used")]
    return head + ("\n    budgets: " + "; ".join(budgets) if budgets else "")


def run_locks(args: argparse.Namespace) -> int:
    return _answered(args, "locks", lambda: _locks(args))


def _locks(args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "list":
        answer = call(args, "GET", "/v1/locks")
        rows = [f"{lock['id']}  {lock['state']}  session {lock['session']}  {lock['cause']}"
                + (f"  lifted by {lock['lifted_by']}" if lock.get("lifted_by") else "")
                for lock in answer.get("locks", [])]
        text = "\n".join(rows) if rows else "no locks"
    else:
        answer = call(args, "POST", f"/v1/locks/{quote(args.lock)}/lift", {"by": args.by})
        text = f"lock {args.lock} lifted by {args.by}" + ("" if not answer.get("locked") else
                                                          "; other locks are still in force")
    return answer, text
