"""`governor witness`: run a C2SP tlog-witness for the logs whose keys it is given
(docs/transparency-log.md, "Witness and audit")."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from governor.cli import UsageError
from governor.evidence.tlog.note import ED25519, NoteError, Verifier, parse_vkey


def register(subparsers: argparse._SubParsersAction) -> None:
    witness = subparsers.add_parser(
        "witness",
        help="run a C2SP tlog-witness that cosigns the checkpoints of the given logs",
        description="Serve POST /add-checkpoint (c2sp.org/tlog-witness): verify each checkpoint against the "
        "log keys and a consistency proof from the checkpoint last cosigned, refuse rollbacks and forks, "
        "and answer with a cosignature/v1 line. The witness's key is made in DIR at the first start; its "
        "verifier key is written to DIR/witness.vkey.",
    )
    witness.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to listen on (port 0: any)")
    witness.add_argument("--data-dir", required=True, type=Path, metavar="DIR",
                         help="the witness's key and the state it cosigned")
    witness.add_argument("--log-key", action="append", required=True, metavar="VKEY",
                         help="a log's Ed25519 verifier key (signed-note vkey text, or a file holding it); "
                         "its name is the log's origin; repeatable")
    witness.add_argument("--name", metavar="NAME", help="the witness's key name (default: the one in "
                         "DIR/witness.vkey, else governor-witness); fixed at the first start")
    witness.set_defaults(func=run_witness)


def read_vkey(value: str, what: str) -> Verifier:
    """A vkey given as its text or as a file holding it."""
    text = value
    path = Path(value)
    if "+" not in value or path.is_file():
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as problem:
            raise UsageError(f"{what} {value!r}: not a vkey and not a readable file ({problem})") from None
    try:
        return parse_vkey(text)
    except NoteError as problem:
        raise UsageError(f"{what} {value!r}: {problem}") from None


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen {value!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def run_witness(args: argparse.Namespace) -> int:
    from governor.evidence.tlog.witness import Witness
    from governor.witness.server import create_app
    from governor.witness.state import StateFile, WitnessSetupError, load_or_create_signer

    host, port = parse_listen(args.listen)
    logs: dict[str, list[Verifier]] = {}
    for value in args.log_key:
        key = read_vkey(value, "--log-key")
        if getattr(key, "signature_type", None) != ED25519:
            raise UsageError(f"--log-key {key.name}: a log signs its checkpoints with Ed25519 (type 0x01)")
        logs.setdefault(key.name, []).append(key)
    try:
        signer = load_or_create_signer(args.data_dir, args.name)
        state = StateFile(args.data_dir)
    except (WitnessSetupError, OSError) as problem:
        raise UsageError(str(problem)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_app(Witness(signer, logs), state)

    print(f"witness {signer.vkey()} for {', '.join(sorted(logs))}", file=sys.stderr, flush=True)
    try:
        asyncio.run(serve(app, host, port))
    except OSError as problem:
        raise UsageError(f"cannot listen on {args.listen}: {problem}") from None
    return 0


async def serve(app, host: str, port: int) -> None:
    """Serves until SIGTERM or SIGINT; prints the bound address (port 0 picks one)."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    print(f"listening on http://{host}:{bound[1]}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
