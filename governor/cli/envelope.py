"""`governor envelope show|reset`: the R3 statistical envelope of a running governor's agent
(docs/reference/deciding.md). `reset` clears the agent's sticky deviation: the principal's act
(the control token), recorded in the audit journal with --by. The control plane and its
token are found as for `governor sessions` (--control-url, --token-file, <data-dir>).
Exit codes: 0 done; 1 the governor refused; 2 usage, or no governor to talk to."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from governor.cli.client import Refused, call


def register(subparsers: argparse._SubParsersAction) -> None:
    command = subparsers.add_parser(
        "envelope", help="show or reset the agent's statistical envelope (R3)",
        description="At R3 the governor keeps the agent's rates across sessions over tumbling windows; a "
        "window beyond the envelope is a deviation that stops every session of the agent (on_anomaly) until "
        "the principal resets it.")
    actions = command.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    shown = actions.add_parser("show", help="the standing deviation, the baseline and the current window")
    reset = actions.add_parser("reset", help="clear the agent's deviation (the control token; recorded)")
    reset.add_argument("--by", required=True, help="who resets it (recorded)")
    for parser in (shown, reset):
        parser.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                            help="the governor's data directory [$GOVERNOR_DATA_DIR, default ./.governor]")
        parser.add_argument("--control-url", metavar="URL", help="the control plane [$GOVERNOR_CONTROL_URL, "
                            "default: <data-dir>/control.json]")
        parser.add_argument("--token-file", type=Path, metavar="FILE",
                            help="the control token [$GOVERNOR_CONTROL_TOKEN, default <data-dir>/control-token]")
        parser.add_argument("--json", action="store_true", help="print the control plane's JSON answer")
        parser.set_defaults(func=run_envelope)


def run_envelope(args: argparse.Namespace) -> int:
    try:
        if args.action == "show":
            answer = call(args, "GET", "/v1/envelope")
            deviation = answer.get("deviation")
            text = (f"agent {answer['agent']}: {answer['closed_windows']} window(s) closed"
                    + (" (cold start: no verdict yet)" if answer.get("cold_start") else "")
                    + ("\nno deviation" if deviation is None else
                       f"\nDEVIATION in window {deviation['window']}: "
                       + ", ".join(d.get("metric") or d.get("tool") or d["kind"] for d in deviation["deviations"])
                       + "\nevery session of the agent records it as on_anomaly until `governor envelope reset`"))
        else:
            answer = call(args, "POST", "/v1/envelope/reset", {"by": args.by})
            text = (f"the envelope of agent {answer['agent']} reset by {args.by}" if answer.get("reset")
                    else f"agent {answer['agent']} had no deviation to reset (recorded)")
    except Refused as exc:
        print(f"governor envelope {args.action}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2) if args.json else text)
    return 0
