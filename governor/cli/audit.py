"""`governor audit`: read a governor's transparency log (from its control plane's /log/ or
a directory laid out as DATA_DIR/log/), verify its checkpoint, recompute its tree, check it
against a checkpoint saved earlier and each agent's sequence (governor.evidence.logaudit).
Exit 0 clean, 1 something found, 2 usage or the log unreachable."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path

from governor.cli import UsageError
from governor.cli.witness import read_vkey
from governor.evidence.logaudit import (
    AuditReport,
    DirectorySource,
    MissingFile,
    SourceError,
    TooLarge,
    audit_log,
    check_records,
)
from governor.evidence.tlog.note import MAX_NOTE_BYTES

TIMEOUT_SECONDS = 30.0


def register(subparsers: argparse._SubParsersAction) -> None:
    audit = subparsers.add_parser(
        "audit",
        help="audit a transparency log: signatures, tree, consistency, each agent's sequence",
        description="Fetch a governor's transparency log (its checkpoint, tiles and entry bundles), verify the "
        "checkpoint's signature and witness cosignatures, recompute the tree from the entries, check it "
        "extends a checkpoint saved earlier, and list each agent's entries with any gap in its sequence, "
        "broken link, fork or rollback. Exit 0 clean, 1 found, 2 usage or unreachable.",
    )
    audit.add_argument("--log", required=True, metavar="URL|DIR",
                       help="the control plane's log prefix (http://HOST:PORT/log) or a directory like DATA_DIR/log")
    audit.add_argument("--log-key", required=True, metavar="VKEY", help="the log's verifier key (text or file)")
    audit.add_argument("--witness-key", action="append", default=[], metavar="VKEY",
                       help="a witness's cosignature verifier key (text or file); repeatable")
    audit.add_argument("--quorum", type=int, metavar="K",
                       help="witness cosignatures required (default: every --witness-key)")
    audit.add_argument("--since", type=Path, metavar="CHECKPOINT_FILE", help="a checkpoint saved by an earlier audit")
    audit.add_argument("--save", type=Path, metavar="CHECKPOINT_FILE",
                       help="save the checkpoint audited (only when the audit is clean)")
    audit.add_argument("--records", type=Path, metavar="DIR",
                       help="also check the final records in DIR (DATA_DIR/records): each entry's record is there, "
                       "each record there is logged")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    audit.set_defaults(func=run_audit)


class HttpSource:
    """The log's files under a URL prefix (the control plane's /log)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def read(self, path: str, max_bytes: int) -> bytes:
        try:
            with urllib.request.urlopen(f"{self.url}/{path}", timeout=TIMEOUT_SECONDS) as answer:
                data = answer.read(max_bytes + 1)
        except urllib.error.HTTPError as problem:
            if path == "checkpoint" and problem.code != 404:
                raise SourceError(f"{self.url}/checkpoint answered {problem.code}") from None
            raise MissingFile(f"{path} answered {problem.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as problem:
            raise SourceError(f"{self.url}/{path} is unreachable ({problem})") from None
        if len(data) > max_bytes:
            raise TooLarge(f"{path} is over {max_bytes} bytes")
        return data


def run_audit(args: argparse.Namespace) -> int:
    log_key = read_vkey(args.log_key, "--log-key")
    witnesses = [read_vkey(value, "--witness-key") for value in args.witness_key]
    quorum = len(witnesses) if args.quorum is None else args.quorum
    if not 0 <= quorum <= len(witnesses):
        raise UsageError(f"--quorum {quorum} is not between 0 and the {len(witnesses)} witness keys given")
    since = None
    if args.since is not None:
        try:
            since = args.since.read_bytes()[: MAX_NOTE_BYTES + 1]
        except OSError as problem:
            raise UsageError(f"--since {args.since}: {problem.strerror}") from None
    try:
        source = HttpSource(args.log) if args.log.startswith(("http://", "https://")) else DirectorySource(Path(args.log))
        report = audit_log(source, log_key, witnesses, quorum, since)
        if args.records is not None and report.checkpoint is not None:
            if not args.records.is_dir():
                raise UsageError(f"--records {args.records}: not a directory")
            check_records(args.records, report)
    except SourceError as problem:
        raise UsageError(str(problem)) from None
    if args.save is not None and report.clean:
        args.save.write_bytes(report.checkpoint_note)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(format_report(report))
    return 0 if report.clean else 1


def format_report(report: AuditReport) -> str:
    lines = []
    cp = report.checkpoint
    if cp is not None:
        lines.append(f"log {cp.origin}: {cp.size} entries, root {cp.root.hex()}")
        lines.append(f"cosigned by: {', '.join(report.witnesses) or 'no witness checked'}")
        for digest, agent in sorted(report.agents.items()):
            seqs = [e["seq"] for e in agent.entries]
            lines.append(f"agent {digest}: {len(seqs)} entries, seq {seqs[0]}..{seqs[-1]}")
            for e in agent.entries:
                lines.append(f"  #{e['index']} seq {e['seq']} session {e['session']} {e['tier']} "
                             f"{e['window']['start']}..{e['window']['end']} record {e['record_sha256'][:16]}")
    if report.clean:
        lines.append("CLEAN: the checkpoint verifies, the tree is the entries', every agent's sequence is whole")
    else:
        lines.append(f"FOUND {len(report.findings)} problem(s):")
        lines += [f"  {f.kind.upper()}: {f.message}" for f in report.findings]
    return "\n".join(lines)


