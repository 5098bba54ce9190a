"""The `governor` command line, apart from the library it drives.

Each command is a module of this package with `register(subparsers)` (`evidence`: keygen and
verify; `passport`; `run`; `sessions` and locks; `approvals`; `demo`; `exec`) over the library
rooms it calls; this module only assembles them, lazily, so that an auditor's `governor
verify` imports nothing but `governor.evidence` (and `governor.common`).

Exit codes, for every command: 0 success; 1 the thing checked is invalid
(a rejected passport, a broken record); 2 usage or input errors.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from governor.common.version import package_version

# module -> registers these commands; imported lazily so `governor verify` does
# not pay for mitmproxy.
COMMAND_MODULES = (
    "governor.cli.evidence",  # keygen, verify
    "governor.cli.passport",  # passport verify|digest|sign
    "governor.cli.run",  # run
    "governor.cli.sessions",  # sessions open|list|show|end, locks list|lift
    "governor.cli.approvals",  # approvals list|show|approve|reject
    "governor.cli.envelope",  # envelope show|reset (the R3 statistical envelope)
    "governor.cli.demo",  # demo
    "governor.cli.exec",  # exec -- COMMAND (an agent that ignores proxy variables)
    "governor.cli.witness",  # witness (a C2SP tlog-witness)
    "governor.cli.audit",  # audit (a transparency log, its agents' sequences)
)


class UsageError(Exception):
    """Bad arguments or unreadable input: exit 2 with the message."""


class _VersionAction(argparse.Action):
    """`--version`: looked up only when asked, so other commands do not pay for it."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"governor {package_version()}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="governor", description="Runtime governor for ADL agents")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that area has no commands yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"governor {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

