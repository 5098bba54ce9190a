"""`governor demo`: the first command to run (see governor.demo.run for what it shows)."""

from __future__ import annotations

import argparse
import asyncio


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="watch the governor govern a scripted agent (budgets, an approval, a halt, a verified record)",
        description="Start the governor on its embedded defaults with a mock LLM, a mock MCP tool server and a "
        "scripted agent, all on loopback in a temporary directory: watch the budget being consumed, approve a "
        "held tool call, see the token budget halt the agent, then verify the session's signed record offline. "
        "Finishes by itself in about ten seconds. Exit 0 when the governor did all of that, 1 otherwise.",
    )
    demo.add_argument("--fast", action="store_true", help="no pauses between steps (for scripts and tests)")
    demo.add_argument("--keep", action="store_true",
                      help="keep the temporary directory (record, public key, journal) and print its path")
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from governor.demo import DemoOptions, run_demo

    return asyncio.run(run_demo(DemoOptions(fast=args.fast, keep=args.keep)))
