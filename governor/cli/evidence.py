"""`governor keygen` and `governor verify`: the evidence room's commands.

Kept apart from the library: the commands parse arguments, read files and print;
`governor.evidence` does the work.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from governor.cli import UsageError
from governor.evidence.errors import InputError, SchemaNotFoundError
from governor.evidence.keys import (
    DEFAULT_IDENTIFIER,
    check_identifier,
    did_for,
    did_web_document_url,
    key_fingerprint,
    load_did_document,
    load_private_key,
    load_public_key,
    write_key_files,
)
from governor.evidence.passport_file import load_passport
from governor.evidence.logproof import verify_logged_record
from governor.evidence.tlog.merkle import ProofError
from governor.evidence.tlog.note import COSIGNATURE_V1, ED25519, NoteError, parse_vkey
from governor.evidence.verify import INCOMPLETE, VALID, VerificationReport, load_record, verify_record
from governor.cli.did_web import DEFAULT_TIMEOUT_SEC, HttpsDidResolver

# `governor verify`'s exit codes (docs/reference/records.md, "Verdicts")
EXIT_VALID, EXIT_INVALID, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3


def register(subparsers: argparse._SubParsersAction) -> None:
    keygen = subparsers.add_parser(
        "keygen",
        help="create the governor's Ed25519 signing key and DID document",
        description="Create the governor's Ed25519 key pair (private key mode 0600) and a did.json "
        "publishing the public key as its assertionMethod.",
    )
    keygen.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory to write the key files into")
    keygen.add_argument(
        "--id", dest="identifier", default=DEFAULT_IDENTIFIER, metavar="ID",
        help=f"the governor's identifier, did:web:... or https://... (default: {DEFAULT_IDENTIFIER})",
    )
    keygen.add_argument("--force", action="store_true", help="replace an existing key")
    keygen.set_defaults(func=run_keygen)

    verify = subparsers.add_parser(
        "verify",
        help="verify an enforcement record offline (Runtime §8.6)",
        description="Verify an enforcement record: schema, governor key, signature, passport binding, "
        "nonce and hash chain (Runtime §8.6 steps 1-6). The governor's did:web is resolved over HTTPS "
        "unless --offline or --did-document. Exit 0 VALID (all six steps ran in full and passed), "
        "1 INVALID (a step failed), 2 usage or input error, 3 INCOMPLETE (none failed, but a step was "
        "skipped or ran in part: no --passport, no --nonce/--no-nonce, a nonce without its time to live, "
        "a governor key not resolved from the record's identifier).",
    )
    verify.add_argument("record", type=Path, metavar="RECORD", help="the record (JSON)")
    key = verify.add_mutually_exclusive_group()
    key.add_argument("--key", type=Path, metavar="PUB.pem", help="the governor's public key (pinned)")
    key.add_argument(
        "--did-document", type=Path, metavar="did.json",
        help="the governor's DID document (fetched from its did:web location); its id must be the record's governor",
    )
    verify.add_argument("--offline", action="store_true",
                        help="do not resolve the governor's did:web (step 2 is then PARTIAL: the verdict is at best INCOMPLETE)")
    verify.add_argument("--ca-bundle", type=Path, metavar="PEM",
                        help="the CA certificates trusted for the did:web fetch, and only those (default: the system's)")
    verify.add_argument("--resolve-timeout", type=float, default=DEFAULT_TIMEOUT_SEC, metavar="SECONDS",
                        help=f"give up the did:web fetch after this long (default {DEFAULT_TIMEOUT_SEC:g})")
    verify.add_argument("--passport", type=Path, metavar="FILE", help="the admitted passport (JSON or YAML), for step 4")
    nonce = verify.add_mutually_exclusive_group()
    nonce.add_argument("--nonce", metavar="VALUE", help="the nonce you issued (step 5; give --nonce-issued-at and --nonce-ttl too)")
    nonce.add_argument("--no-nonce", action="store_true", help="you issued no nonce: step 5 has nothing to check")
    verify.add_argument("--nonce-issued-at", metavar="ISO", help="when you issued it (ISO 8601 with a zone)")
    verify.add_argument("--nonce-ttl", type=float, metavar="SECONDS", help="its time to live")
    verify.add_argument("--proof", type=Path, metavar="FILE",
                        help="the record's transparency-log proof (C2SP tlog-proof, from ?proof=1 or "
                        "`sessions end --proof`): checks that the record is in the governor's log")
    verify.add_argument("--log-key", metavar="VKEY", help="the log's verifier key (a vkey, or a file holding one: "
                        "DATA_DIR/log/log.vkey); needed with --proof")
    verify.add_argument("--witness-key", action="append", default=[], metavar="VKEY",
                        help="a witness's cosignature vkey (or a file holding one); repeat for each witness")
    verify.add_argument("--quorum", type=int, metavar="K",
                        help="cosignatures required from the --witness-key witnesses (default: all of them)")
    verify.add_argument("--json", action="store_true", help="print a machine-readable report")
    verify.add_argument(
        "--events", action="store_true",
        help="also list the record's events, one a line: seq, time, cause, action, short detail",
    )
    verify.set_defaults(func=run_verify)


# --- keygen ---------------------------------------------------------------------------


def run_keygen(args: argparse.Namespace) -> int:
    try:
        check_identifier(args.identifier)
        files = write_key_files(args.out, args.identifier, force=args.force)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except FileExistsError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write into {args.out}: {exc.strerror or exc}") from None
    key = load_private_key(files.private_key)
    publish = did_web_document_url(did_for(args.identifier))
    print(f"private key   {files.private_key}  (mode 0600: keep it secret)")
    print(f"public key    {files.public_key}  ({key_fingerprint(key)})")
    print(f"DID document  {files.did_document}  (publish it at {publish})")
    print(f"identifier    {args.identifier}")
    return 0


# --- verify ---------------------------------------------------------------------------


def _resolver(args: argparse.Namespace) -> HttpsDidResolver | None:
    if args.offline or args.did_document is not None:
        if args.ca_bundle is not None:
            raise UsageError("--ca-bundle is for the did:web fetch, which --offline and --did-document skip")
        return None
    if not args.resolve_timeout > 0:
        raise UsageError("--resolve-timeout must be a number of seconds > 0")
    try:
        return HttpsDidResolver(args.ca_bundle, timeout=args.resolve_timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run_verify(args: argparse.Namespace) -> int:
    if args.offline and args.key is None and args.did_document is None:
        raise UsageError("--offline needs a governor key: pass --key PUB.pem or --did-document did.json")
    if (args.nonce_issued_at is None) != (args.nonce_ttl is None):
        raise UsageError("--nonce-issued-at and --nonce-ttl go together")
    if args.nonce_issued_at is not None and args.nonce is None:
        raise UsageError("--nonce-issued-at/--nonce-ttl need --nonce")
    if args.nonce_ttl is not None and not args.nonce_ttl >= 0:
        raise UsageError("--nonce-ttl must be a number of seconds >= 0")
    proof = _log_proof_arguments(args)
    resolver = _resolver(args)
    try:
        record = load_record(args.record)
        public_key = load_public_key(args.key) if args.key else None
        did_document = load_did_document(args.did_document) if args.did_document else None
        passport = load_passport(args.passport) if args.passport else None
        report = verify_record(
            record,
            public_key=public_key,
            did_document=did_document,
            passport=passport,
            expected_nonce=args.nonce,
            nonce_issued_at=args.nonce_issued_at,
            nonce_ttl=args.nonce_ttl,
            no_nonce=args.no_nonce,
            resolver=resolver,
        )
    except (InputError, SchemaNotFoundError) as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # inconsistent nonce arguments, a malformed --nonce-issued-at
        raise UsageError(str(exc)) from None
    logged, log_problem = None, None
    if proof is not None:
        try:
            logged = verify_logged_record(record, proof[0], proof[1], witnesses=proof[2], quorum=proof[3])
        except ProofError as exc:
            log_problem = str(exc)
    if args.json:
        out = {"record": str(args.record), **report.to_json()}
        if proof is not None:
            out["log_proof"] = {"valid": logged is not None, "problem": log_problem,
                                **(logged.to_json() if logged else {})}
        print(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        _print_report(args.record, record, report)
        if proof is not None:
            _print_log_proof(logged, log_problem)
        if args.events:
            for line in event_lines(record):
                print(line)
    if not report.ok or log_problem is not None:
        return EXIT_INVALID
    return EXIT_VALID if report.verdict == VALID else EXIT_INCOMPLETE


def _vkey(text: str, what: str) -> Any:
    path = Path(text)
    try:
        if path.is_file():
            text = path.read_text(encoding="utf-8").strip()
        return parse_vkey(text)
    except (OSError, UnicodeDecodeError, NoteError) as exc:
        raise UsageError(f"{what} {text!r}: {exc}") from None


def _log_proof_arguments(args: argparse.Namespace) -> tuple[bytes, Any, list[Any], int] | None:
    """(proof bytes, log key, witness keys, quorum) from --proof and its companions, or None."""
    if args.proof is None:
        if args.log_key or args.witness_key or args.quorum is not None:
            raise UsageError("--log-key, --witness-key and --quorum go with --proof")
        return None
    if not args.log_key:
        raise UsageError("--proof needs --log-key (the log's vkey: DATA_DIR/log/log.vkey)")
    log_key = _vkey(args.log_key, "--log-key")
    if log_key.signature_type != ED25519:
        raise UsageError("--log-key: a log signs its checkpoints with an Ed25519 (type 0x01) key")
    witnesses = [_vkey(text, "--witness-key") for text in args.witness_key]
    if any(w.signature_type != COSIGNATURE_V1 for w in witnesses):
        raise UsageError("--witness-key: a witness's key is a cosignature/v1 (type 0x04) vkey")
    quorum = len(witnesses) if args.quorum is None else args.quorum
    if not 0 <= quorum <= len(witnesses):
        raise UsageError(f"--quorum must be between 0 and the {len(witnesses)} witness keys given")
    try:
        data = args.proof.read_bytes()
    except OSError as exc:
        raise UsageError(f"--proof {args.proof}: {exc.strerror or exc}") from None
    return data, log_key, witnesses, quorum


def _print_log_proof(logged: Any, problem: str | None) -> None:
    if logged is None:
        print(f"LOG PROOF INVALID: {problem}")
        return
    cosigned = f", cosigned by {', '.join(logged.witnesses)}" if logged.witnesses else ""
    print(f"LOG PROOF VALID: entry {logged.index} of {logged.origin} at tree size {logged.tree_size}{cosigned}; "
          f"this agent's entry {logged.entry['seq']} in the log.")
    print("The record is anchored in the append-only log: an auditor of the log sees every record of this "
          "agent in sequence, so one left out is a gap there.")


def _describe(record: Any) -> list[str]:
    if not isinstance(record, dict):
        return []
    subject = record.get("subject") if isinstance(record.get("subject"), dict) else {}
    window = record.get("window") if isinstance(record.get("window"), dict) else {}
    events = record.get("events") if isinstance(record.get("events"), list) else []
    return [
        f"  governor  {record.get('governor')}",
        f"  subject   {subject.get('id')}  (passport digest {subject.get('passport_digest')})",
        f"  session   {record.get('session')}  tier {record.get('tier')}  outcome {record.get('outcome')}",
        f"  window    {window.get('start')} .. {window.get('end')}  issued {record.get('iat')}",
        f"  events    {len(events)}",
    ]


DETAIL_WIDTH = 120  # characters of an event's detail shown by --events


def _shown(value: Any) -> str:
    """One printable token: the record is untrusted, so no control characters reach the terminal."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _short(detail: Any) -> str:
    if detail is None:
        return ""
    text = _shown(json.dumps(detail, ensure_ascii=False, separators=(",", ":"), sort_keys=True))
    return text if len(text) <= DETAIL_WIDTH else text[: DETAIL_WIDTH - 3] + "..."


def event_lines(record: Any) -> list[str]:
    """The record's events as printed by `verify --events` (whatever the verdict: an
    invalid record's events are shown too, marked by the INVALID line above them)."""
    events = record.get("events") if isinstance(record, dict) else None
    if not isinstance(events, list):
        return ["Events: none (the record has no events list)"]
    lines = [f"Events ({len(events)})"]
    for event in events:
        if not isinstance(event, dict):
            lines.append(f"  ?     not an object: {_short(event)}")
            continue
        lines.append(
            f"  {_shown(event.get('seq', '?')):>4}  {_shown(event.get('at', '?'))}  "
            f"{_shown(event.get('cause', '?'))}  {_shown(event.get('action', '?'))}  {_short(event.get('detail'))}"
        )
    return lines


def _print_report(path: Path, record: Any, report: VerificationReport) -> None:
    out = sys.stdout
    print(f"Enforcement record {path}", file=out)
    for line in _describe(record):
        print(line, file=out)
    print(file=out)
    width = max(len(s.name) for s in report.steps)
    for step in report.steps:
        print(f"  {step.status.upper():7}  {step.number} {step.name:<{width}}  {step.message}", file=out)
    print(file=out)
    failure = report.first_failure
    if report.verdict == VALID:
        print("VALID", file=out)
    elif report.verdict == INCOMPLETE:
        steps = ", ".join(f"{s.number} ({s.name}) {s.status}" for s in report.not_checked)
        print(f"INCOMPLETE: not every step ran in full: {steps}", file=out)
    else:
        print(f"INVALID: step {failure.number} ({failure.name}): {failure.message}", file=out)
    for line in report.interpretation():
        print(f"  {line}", file=out)
