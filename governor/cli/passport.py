"""`governor passport verify|digest|sign`: the passport room's commands.

They parse arguments, read files and print; `governor.passport` does the work.
Exit codes: 0 admitted / done, 1 rejected, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from governor.cli import UsageError
from governor.passport.admission import (
    DEFAULT_CLOCK_SKEW,
    DEVELOPMENT,
    ENFORCE,
    AdmissionConfig,
    admit,
    format_report,
)
from governor.passport.did import load_did_documents
from governor.passport.errors import PassportError
from governor.passport.loader import JSON, dump_passport, format_for_path, load_passport
from governor.passport.pin import passport_digest
from governor.passport.schema import parse_datetime
from governor.passport.signature import CANONICAL, DIGEST, sign_passport


def register(subparsers: argparse._SubParsersAction) -> None:
    passport = subparsers.add_parser(
        "passport", help="verify, digest or sign an ADL passport",
        description="Work with ADL passports (JSON or YAML).",
    )
    commands = passport.add_subparsers(dest="passport_command", metavar="COMMAND")
    commands.required = True

    verify = commands.add_parser(
        "verify", help="run admission (Trust §1.1) and print the per-step report",
        description="Admit a passport the way the governor does at session start (Trust §1.1 steps "
        "1.1.1-1.1.9) and print each step and the passport digest. Nothing is fetched: DID documents "
        "come from --did-documents. Exit 0 admitted, 1 rejected, 2 usage or input error.",
    )
    verify.add_argument("file", type=Path, metavar="FILE", help="the passport (.json, .yaml)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.add_argument("--strict", action="store_true", help="closed top level: unknown members fail")
    verify.add_argument("--did-documents", type=Path, metavar="PATH",
                        help="local DID documents: a JSON file {DID or URL: document}, or a directory of did.json files")
    verify.add_argument("--require-did", action="store_true", help="the did:web identity must resolve")
    verify.add_argument("--require-signature", action="store_true", help="refuse unsigned passports")
    verify.add_argument("--no-tofu", action="store_true",
                        help="do not trust an inline key on first use: it must match a resolved DID key")
    verify.add_argument("--provider-allowlist", metavar="HOST,...",
                        help="comma-separated provider host patterns (e.g. example.com,*.example.org)")
    verify.add_argument("--mode", choices=(ENFORCE, DEVELOPMENT), default=ENFORCE,
                        help="enforce (default) refuses draft passports; development admits them with a warning")
    verify.add_argument("--now", metavar="TIME", help="check validity at this RFC 3339 time instead of now")
    verify.add_argument("--max-clock-skew", type=float, metavar="SECONDS", default=DEFAULT_CLOCK_SKEW.total_seconds(),
                        help="refuse a passport issued further than this in the future (default: %(default)g)")
    verify.set_defaults(func=run_verify)

    digest = commands.add_parser(
        "digest", help="print the passport digest (the session pin)",
        description="Print base64url(SHA-256(JCS(passport))), signature included: the value records "
        "carry as subject.passport_digest.",
    )
    digest.add_argument("file", type=Path, metavar="FILE", help="the passport (.json, .yaml)")
    digest.set_defaults(func=run_digest)

    sign = commands.add_parser(
        "sign", help="sign a passport with an Ed25519 private key",
        description="Sign a passport (Core §10.2) with an Ed25519 private key (PEM). Adds the inline "
        "public key when absent and refuses a key that does not match it. Output format follows -o's "
        "extension (.yaml/.yml or .json); JSON on stdout by default. YAML comments are not kept.",
    )
    sign.add_argument("file", type=Path, metavar="FILE", help="the passport (.json, .yaml)")
    sign.add_argument("--key", type=Path, required=True, metavar="KEY.pem", help="Ed25519 private key (PKCS#8 PEM)")
    sign.add_argument("-o", "--output", type=Path, metavar="OUT", help="write here instead of stdout")
    sign.add_argument("--signed-content", choices=(CANONICAL, DIGEST), default=CANONICAL,
                      help="sign the canonical bytes (default) or their SHA-256 digest")
    sign.set_defaults(func=run_sign)


def run_verify(args: argparse.Namespace) -> int:
    document = _load(args.file)
    did_documents = {}
    if args.did_documents:
        try:
            did_documents = load_did_documents(args.did_documents)
        except PassportError as exc:
            raise UsageError(str(exc)) from None
    if args.now:
        now = parse_datetime(args.now)
        if now is None:
            raise UsageError(f"--now {args.now!r} is not an RFC 3339 date-time (e.g. 2026-05-01T00:00:00Z)")
    else:
        now = datetime.now(timezone.utc)
    if not args.max_clock_skew >= 0:
        raise UsageError("--max-clock-skew must be a number of seconds >= 0")
    allowlist = tuple(h.strip() for h in (args.provider_allowlist or "").split(",") if h.strip())
    config = AdmissionConfig(
        now=now,
        mode=args.mode,
        require_signature=args.require_signature,
        require_did_resolution=args.require_did,
        trust_on_first_use=not args.no_tofu,
        did_documents=did_documents,
        provider_allowlist=allowlist,
        strict=args.strict,
        max_clock_skew=timedelta(seconds=args.max_clock_skew),
    )
    report = admit(document, config)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(args.file, report))
    return 0 if report.verified else 1


def run_digest(args: argparse.Namespace) -> int:
    print(passport_digest(_load(args.file)))
    return 0


def run_sign(args: argparse.Namespace) -> int:
    document = _load(args.file)
    try:
        key_pem = args.key.read_bytes()
    except OSError as exc:
        raise UsageError(f"{args.key}: cannot read: {exc.strerror or exc}") from None
    try:
        signed = sign_passport(document, key_pem, signed_content=args.signed_content)
        output = dump_passport(signed, (format_for_path(args.output) if args.output else None) or JSON)
    except PassportError as exc:
        raise UsageError(str(exc)) from None
    if args.output is None:
        sys.stdout.write(output.decode("utf-8"))
        return 0
    try:
        args.output.write_bytes(output)
    except OSError as exc:
        raise UsageError(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    print(f"signed {args.file} -> {args.output} (digest {passport_digest(signed)})", file=sys.stderr)
    return 0


def _load(path: Path) -> dict:
    try:
        return load_passport(path)
    except PassportError as exc:
        raise UsageError(str(exc)) from None
