"""`governor exec -- COMMAND...`: run an agent command with every outbound connection relayed
through a running governor, for clients that ignore HTTPS_PROXY (Node's fetch, the npm
`openai` client). The mechanism is `governor.proxy.netns` (Linux user and network
namespaces). Exit code: the command's; 2 usage, or the namespace could not be set up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from governor.cli import UsageError

DEFAULT_PROXY = "http://127.0.0.1:8080"
CA_FILE = "mitmproxy-ca-cert.pem"  # where `governor run` keeps its proxy CA, in its data directory


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "exec", help="run an agent command with all its outbound traffic through a running governor",
        description="Runs COMMAND in its own network namespace in which every TCP connection to a relayed port "
        "(80 and 443; --port adds more) goes to the governor's proxy, whatever proxy settings the command "
        "ignores; any other port, and every other protocol, reaches nothing. DNS is answered locally. The "
        "command trusts the governor's CA through SSL_CERT_FILE, REQUESTS_CA_BUNDLE and NODE_EXTRA_CA_CERTS. "
        "Linux, with unprivileged user namespaces (or as root).")
    parser.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                        help="the running governor's data directory [$GOVERNOR_DATA_DIR, default .governor]: its "
                        "control.json names the proxy, its CA is trusted")
    parser.add_argument("--proxy", default=None, metavar="URL",
                        help=f"the governor's explicit proxy [$GOVERNOR_PROXY, else control.json, else {DEFAULT_PROXY}]")
    parser.add_argument("--ca", type=Path, default=None, metavar="FILE",
                        help=f"the governor's CA certificate [default <data-dir>/{CA_FILE}]")
    parser.add_argument("--port", type=int, action="append", default=[], metavar="N",
                        help="also relay connections to this destination port (repeatable; 80 and 443 always)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the agent command")
    parser.set_defaults(func=run_exec)


def _data_dir(args: argparse.Namespace) -> Path:
    return args.data_dir or Path(os.environ.get("GOVERNOR_DATA_DIR") or ".governor")


def proxy_address(args: argparse.Namespace) -> tuple[str, int]:
    url = args.proxy or os.environ.get("GOVERNOR_PROXY")
    if not url:
        try:
            url = json.loads((_data_dir(args) / "control.json").read_text(encoding="utf-8")).get("proxy")
        except (OSError, ValueError, AttributeError):
            url = None
    url = url or DEFAULT_PROXY
    parts = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise UsageError(f"--proxy {url!r}: expected http://HOST:PORT, the governor's explicit proxy")
    return parts.hostname, port


def run_exec(args: argparse.Namespace) -> int:
    from governor.proxy import netns

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("name the agent command after --, e.g. governor exec -- node agent.js")
    ports = tuple(dict.fromkeys([80, 443, *args.port]))
    if any(not 0 < port < 65536 or port == 53 for port in ports):
        raise UsageError(f"--port: expected destination ports 1-65535 other than 53, got {args.port}")
    ca = args.ca or _data_dir(args) / CA_FILE
    if not ca.is_file():
        raise UsageError(f"the governor's CA {ca} does not exist: start `governor run --data-dir {_data_dir(args)}` "
                         "first, or give --ca")
    plan = netns.ExecPlan(command=command, proxy=proxy_address(args), ca_file=ca.resolve(), ports=ports,
                          environment=dict(os.environ))
    try:
        return netns.run(plan)
    except netns.ExecError as exc:
        print(f"governor exec: {exc}", file=sys.stderr)
        return 2
