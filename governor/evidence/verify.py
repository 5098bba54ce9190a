"""Offline verification of an enforcement record (Runtime §8.6, steps 1-6).

Imports nothing from the proxy or the policy engine: an auditor verifies a record
with this module, the record, and the governor's public key or DID document.

Every step is run and reported (so a tampered record shows each check it breaks),
except where a step cannot run without an earlier one: nothing runs on a record
that is not schema-valid, and the signature is not checked without a key. The
first failing step, in the spec's order, decides the verdict and the message.

Three verdicts (docs/reference/records.md, "Verdicts"): VALID only when all six
steps ran in full; INCOMPLETE when none failed but one was skipped or ran only in
part (no passport, no nonce decision, a nonce whose time to live was not checked,
a governor key that was not resolved from the record's identifier); INVALID when
one failed. The governor key is resolved by a `DidResolver` handed in (the CLI's
HTTPS fetcher): this room does no I/O of its own.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Mapping

import jsonschema
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from governor.common.canonical import b64url, b64url_decode, digest_of, sha256_b64url
from governor.common.documents import JSON, DocumentError, parse_document, read_document_file
from governor.common.ed25519_points import ed25519_key_problem
from governor.evidence._jcs import canonical
from governor.evidence.errors import (
    DidDocumentError,
    DidResolutionError,
    EvidenceError,
    InputError,
    SchemaNotFoundError,
)
from governor.evidence.keys import assertion_keys, did_web_for_https, key_fingerprint, public_key_bytes
from governor.evidence.record import parse_iso, record_header
from governor.evidence.signing import SIGNATURE_ALGORITHM, SIGNED_CONTENT, signing_input

SCHEMA_FILE = "enforcement-record.schema.json"
# Source checkout or editable install: <repo>/schemas. A built wheel: governor/data
# (package data), where a symlink to the schema makes setuptools ship a copy.
SCHEMA_LOCATIONS = (
    Path(__file__).resolve().parents[2] / "schemas" / SCHEMA_FILE,
    Path(__file__).resolve().parents[1] / "data" / SCHEMA_FILE,
)

# did -> its DID document, fetched (did:web over HTTPS); raises DidResolutionError.
DidResolver = Callable[[str], Mapping[str, Any]]

VALID, INCOMPLETE, INVALID = "VALID", "INCOMPLETE", "INVALID"

STEP_NAMES = {1: "schema", 2: "governor key", 3: "signature", 4: "passport binding", 5: "nonce", 6: "hash chain"}

# What a valid record proves and does not (§8.1, §8.6 step 7), said with every verdict.
PROVES_TAMPER_EVIDENCE = (
    "The holder of the governor key signed exactly these events, in this order, for this session, "
    "passport digest and tier; none was altered, reordered or removed since (tamper-evidence)."
)
PROVES_FRESHNESS = "The record carries the nonce you issued, so it was produced after your challenge (freshness)."
NO_FRESHNESS = "No nonce was checked: the record may have been produced at any earlier time (freshness not shown)."
NO_PASSPORT_BINDING = (
    "No passport was given: subject.passport_digest was not compared with the passport you admitted."
)
NOT_ALL_STEPS = (
    "Not every §8.6 step ran in full (see the SKIP and PARTIAL steps): the record is not rejected, "
    "but it is not verified either."
)
NOT_COMPLETENESS = (
    "It does NOT prove completeness: a governor can leave events unrecorded, so a valid record is not "
    "proof that no unrecorded violation occurred (Runtime §8.1, §8.6 step 7)."
)


@dataclass(frozen=True, slots=True)
class StepResult:
    number: int
    name: str
    passed: bool
    skipped: bool = False
    message: str = ""
    partial: bool = False  # ran, and passed, but did less than §8.6 asks (INCOMPLETE)

    @property
    def status(self) -> str:
        if self.skipped:
            return "skip"
        if not self.passed:
            return "fail"
        return "partial" if self.partial else "pass"

    def to_json(self) -> dict[str, Any]:
        return {"step": self.number, "name": self.name, "status": self.status, "message": self.message}


@dataclass(frozen=True, slots=True)
class VerificationReport:
    steps: tuple[StepResult, ...]
    fresh: bool = False  # step 5 compared the record's nonce with an issued one

    @property
    def first_failure(self) -> StepResult | None:
        return next((s for s in self.steps if not s.passed and not s.skipped), None)

    @property
    def ok(self) -> bool:
        """No step failed (some may have been skipped: see `verdict`)."""
        return self.first_failure is None

    @property
    def not_checked(self) -> tuple[StepResult, ...]:
        """The steps that were skipped or ran only in part."""
        return tuple(s for s in self.steps if s.status in ("skip", "partial"))

    @property
    def verdict(self) -> str:
        """VALID (all six steps ran in full and passed), INCOMPLETE (none failed, one did
        not run in full) or INVALID (one failed)."""
        if not self.ok:
            return INVALID
        return INCOMPLETE if self.not_checked else VALID

    def step(self, number: int) -> StepResult:
        return next(s for s in self.steps if s.number == number)

    def summary(self) -> str:
        failure = self.first_failure
        if failure is None:
            if self.not_checked:
                steps = ", ".join(f"{s.number} ({s.name})" for s in self.not_checked)
                return f"incomplete verification: step {steps} not run in full"
            return "valid enforcement record"
        return f"invalid enforcement record: step {failure.number} ({failure.name}): {failure.message}"

    def interpretation(self) -> list[str]:
        """What this verdict means, in the spec's terms (§8.1): never more than it proves."""
        if not self.ok:
            return ["The record is rejected: it is not evidence of anything."]
        lines = [PROVES_TAMPER_EVIDENCE]
        lines.append(PROVES_FRESHNESS if self.fresh and self.step(5).passed else NO_FRESHNESS)
        if self.step(4).skipped:
            lines.append(NO_PASSPORT_BINDING)
        if self.verdict == INCOMPLETE:
            lines.append(NOT_ALL_STEPS)
        lines.append(NOT_COMPLETENESS)
        return lines

    def raise_for_failure(self) -> None:
        if not self.ok:
            raise RecordVerificationError(self)

    def to_json(self) -> dict[str, Any]:
        failure = self.first_failure
        return {
            "valid": self.verdict == VALID,
            "verdict": self.verdict,
            "not_checked": [s.number for s in self.not_checked],
            "first_failure": failure.to_json() if failure else None,
            "steps": [s.to_json() for s in self.steps],
            "interpretation": self.interpretation(),
        }


class RecordVerificationError(EvidenceError):
    """A record failed §8.6 verification; `step` is the first failing step."""

    def __init__(self, report: VerificationReport) -> None:
        self.report = report
        self.step: StepResult = report.first_failure  # type: ignore[assignment]
        super().__init__(report.summary())


class _Fail(Exception):
    """A step's failure, with the reason to report."""


class _Partial(Exception):
    """A step that passed what it checked but did not check all §8.6 asks."""


# --- step 1 ---------------------------------------------------------------------------


def schema_path() -> Path:
    for path in SCHEMA_LOCATIONS:
        if path.is_file():
            return path
    raise SchemaNotFoundError(
        f"{SCHEMA_FILE} not found (looked in {', '.join(str(p) for p in SCHEMA_LOCATIONS)})"
    )


@functools.cache
def record_validator() -> jsonschema.protocols.Validator:
    """The project's record schema, compiled once."""
    schema = json.loads(schema_path().read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _check_schema(record: Any) -> str:
    validator = record_validator()
    error = jsonschema.exceptions.best_match(validator.iter_errors(record))
    if error is None:
        return f"valid against {SCHEMA_FILE}"
    where = "/".join(str(p) for p in error.absolute_path) or "(record)"
    raise _Fail(f"at {where}: {error.message}")


# --- step 2 ---------------------------------------------------------------------------


def _did_of(governor: str) -> str:
    """The did:web a record's governor identifier resolves through (§8.2)."""
    if governor.startswith("did:web:"):
        return governor
    did = did_web_for_https(governor) if governor.startswith("https://") else None
    if did is None:
        raise _Fail(f"the governor identifier {governor!r} is neither a did:web nor an HTTPS URI: it cannot be resolved")
    return did


def _document_keys(document: Mapping[str, Any], governor: str) -> list[Ed25519PublicKey]:
    try:
        return assertion_keys(document, governor)
    except DidDocumentError as exc:
        raise _Fail(str(exc)) from None


def _bound(keys: list[Ed25519PublicKey], public_key: Ed25519PublicKey | None, governor: str) -> list[Ed25519PublicKey]:
    """The given key when the document names it (it is then bound to `governor`); all of them without one."""
    if public_key is None:
        return keys
    if all(public_key_bytes(k) != public_key_bytes(public_key) for k in keys):
        raise _Fail(f"the given key {key_fingerprint(public_key)} is not in {governor}'s DID document")
    return [public_key]


def _resolve_governor_keys(
    governor: str,
    keys_out: list[Ed25519PublicKey],
    public_key: Ed25519PublicKey | None = None,
    did_document: Mapping[str, Any] | None = None,
    resolver: DidResolver | None = None,
) -> str:
    """Put the keys a record by `governor` may be signed with in `keys_out`; say how they were found (§8.2).

    Resolved (the resolver fetched the identifier's DID document): pass. A local DID
    document, or a pinned key alone, gives usable keys but not a resolution: partial.
    """
    if public_key is not None and (problem := ed25519_key_problem(public_key_bytes(public_key))) is not None:
        raise _Fail(f"the given key: {problem} is refused")
    if resolver is not None and did_document is None:
        did = _did_of(governor)
        try:
            document = resolver(did)
        except DidResolutionError as exc:
            raise _Fail(f"{governor} did not resolve: {exc} (to check a pinned key without resolving: --offline)") from None
        keys_out.extend(_bound(_document_keys(document, governor), public_key, governor))
        names = ", ".join(key_fingerprint(k) for k in keys_out)
        return f"{governor} resolved over HTTPS to its DID document, naming {names}"
    if did_document is not None:
        keys_out.extend(_bound(_document_keys(did_document, governor), public_key, governor))
        names = ", ".join(key_fingerprint(k) for k in keys_out)
        raise _Partial(
            f"{governor} was not resolved: a local copy of its DID document names {names} "
            "(resolve it over HTTPS to bind the key to the identifier)"
        )
    if public_key is None:
        raise _Fail("no governor key given: pass the governor's public key or its DID document, or resolve it")
    keys_out.append(public_key)
    raise _Partial(
        f"pinned key {key_fingerprint(public_key)} given by the verifier is not bound to {governor} "
        "(the identifier was not resolved: nothing ties this key to the record's governor)"
    )


# --- step 3 ---------------------------------------------------------------------------


def _check_signature(record: Mapping[str, Any], keys: list[Ed25519PublicKey], signed_bytes: bytes) -> str:
    signature = record["signature"]
    if signature["algorithm"] != SIGNATURE_ALGORITHM:
        raise _Fail(f"unsupported signature algorithm {signature['algorithm']!r} (this verifier checks Ed25519)")
    if signature["signed_content"] != SIGNED_CONTENT:
        raise _Fail(f"signed_content {signature['signed_content']!r} is not supported (expected 'canonical')")
    try:
        value = b64url_decode(signature["value"])
    except ValueError:
        raise _Fail("signature value is not base64url") from None
    if b64url(value) != signature["value"]:  # one signature, one spelling: no malleable padding bits
        raise _Fail("signature value is not canonical base64url (unpadded, zero trailing bits)")
    if len(value) != 64:
        raise _Fail(f"signature value is {len(value)} bytes; an Ed25519 signature is 64")
    for key in keys:
        try:
            key.verify(value, signed_bytes)
        except InvalidSignature:
            continue
        return f"Ed25519 signature over the canonical record verifies with {key_fingerprint(key)}"
    raise _Fail(
        "Ed25519 signature does not verify with the governor key "
        f"({', '.join(key_fingerprint(k) for k in keys)}): the record was altered or signed by another key"
    )


# --- step 4 ---------------------------------------------------------------------------


def passport_digest(passport: Mapping[str, Any]) -> str:
    """base64url(SHA-256(JCS(the whole admitted passport, signature included))): the §1.3 pin."""
    return digest_of(passport)


def _check_passport(record: Mapping[str, Any], passport: Mapping[str, Any]) -> str:
    subject = record["subject"]
    try:
        digest = passport_digest(passport)
    except (ValueError, TypeError) as exc:
        raise _Fail(f"the passport cannot be canonicalized: {exc}") from None
    if subject["passport_digest"] != digest:
        raise _Fail(
            f"subject.passport_digest {subject['passport_digest']} is not the digest of the given passport "
            f"({digest}): the record is for a different passport version"
        )
    if "id" in passport and passport["id"] != subject["id"]:
        raise _Fail(f"subject.id {subject['id']!r} is not the passport's id {passport['id']!r}")
    return f"subject.passport_digest matches the given passport ({digest})"


# --- step 5 ---------------------------------------------------------------------------


def _check_nonce(
    record: Mapping[str, Any], expected: str, issued_at: datetime | None, ttl: timedelta | None
) -> str:
    if "nonce" not in record:
        raise _Fail(f"the record carries no nonce; the issued nonce is {expected!r}")
    if record["nonce"] != expected:
        raise _Fail(f"the record's nonce {record['nonce']!r} is not the issued nonce {expected!r}")
    if issued_at is None or ttl is None:
        raise _Partial(
            "the record carries the issued nonce, but its time to live was not checked "
            "(give when the nonce was issued and its time to live)"
        )
    try:
        iat = parse_iso(record["iat"])
    except ValueError as exc:
        raise _Fail(f"iat: {exc}") from None
    # records state iat to the millisecond, truncated: compare the nonce's issue time at
    # that precision, or a record issued in the same millisecond would look older
    if iat < issued_at.replace(microsecond=issued_at.microsecond // 1000 * 1000):
        raise _Fail(f"the record was issued at {record['iat']}, before the nonce was issued ({issued_at.isoformat()})")
    if iat > issued_at + ttl:
        raise _Fail(
            f"the record was issued at {record['iat']}, after the nonce expired "
            f"({(issued_at + ttl).isoformat()})"
        )
    return f"the record carries the issued nonce and was issued within its time to live ({ttl.total_seconds():g} s)"


# --- step 6 ---------------------------------------------------------------------------


def check_chain(record: Mapping[str, Any], event_bytes: list[bytes] | None = None) -> str | None:
    """The first broken §8.4 link in a (schema-valid) record, said as what was changed, or None.

    A changed event shows at the next link (its hash no longer matches the next event's
    prev_hash): the message names the changed event, not the link (#33 item 5). A link
    that matches another event's hash is a reordering; a seq that jumps is a removal.
    `event_bytes`: the JCS bytes of record["events"], when already computed.
    """
    events = record["events"]
    if event_bytes is None:
        event_bytes = [canonical(e) for e in events]
    hashes = [sha256_b64url(b) for b in event_bytes]
    header_hash = sha256_b64url(canonical(record_header(record)))
    for index, event in enumerate(events):
        expected = header_hash if index == 0 else hashes[index - 1]
        if event["prev_hash"] != expected:
            return _broken_link(index, event, hashes)
        if event["seq"] != index:
            return f"event {index} was changed: its seq is {event['seq']}, expected {index}"
    return None


def _broken_link(index: int, event: Mapping[str, Any], hashes: list[str]) -> str:
    before = "the record header" if index == 0 else f"event {index - 1}"
    linked = next((j for j, h in enumerate(hashes) if h == event["prev_hash"] and j != index), None)
    if linked is not None:
        return (f"events out of order: event {index} (seq {event['seq']}) follows event {linked} in the chain, "
                f"not {before}")
    if event["seq"] != index:
        return (f"an event was removed before event {index}: its seq is {event['seq']} and its prev_hash "
                "matches no event in the record")
    return (f"{before} was changed: its hash no longer matches event {index}'s prev_hash "
            f"(or event {index}'s prev_hash was changed)")


# --- the procedure --------------------------------------------------------------------


def _as_datetime(value: datetime | str) -> datetime:
    moment = parse_iso(value) if isinstance(value, str) else value
    if moment.tzinfo is None:
        raise ValueError("nonce_issued_at must carry a time zone")
    return moment


def verify_record(
    record: Any,
    *,
    public_key: Ed25519PublicKey | None = None,
    did_document: Mapping[str, Any] | None = None,
    passport: Mapping[str, Any] | None = None,
    expected_nonce: str | None = None,
    nonce_issued_at: datetime | str | None = None,
    nonce_ttl: float | timedelta | None = None,
    no_nonce: bool = False,
    resolver: DidResolver | None = None,
) -> VerificationReport:
    """Run §8.6 steps 1-6 on a parsed record and report each.

    public_key / did_document: the governor key, pinned or from the governor's DID
    document (whose id must be the record's governor). passport: the admitted
    passport document (step 4; skipped when None). expected_nonce, with optionally
    nonce_issued_at and nonce_ttl (seconds): step 5 (skipped when no nonce).
    no_nonce: the counterparty declares it issued no nonce (step 5 then has nothing to
    check and passes; without a nonce or this declaration step 5 is skipped).
    resolver: fetches the governor's DID document (step 2 resolved, not partial).
    Raises ValueError for inconsistent arguments; never for a bad record.
    """
    if no_nonce and expected_nonce is not None:
        raise ValueError("a nonce and no_nonce exclude each other")
    if (nonce_issued_at is None) != (nonce_ttl is None):
        raise ValueError("nonce_issued_at and nonce_ttl go together")
    if nonce_issued_at is not None and expected_nonce is None:
        raise ValueError("a nonce time to live needs the expected nonce")
    issued_at = _as_datetime(nonce_issued_at) if nonce_issued_at is not None else None
    ttl = None if nonce_ttl is None else nonce_ttl if isinstance(nonce_ttl, timedelta) else timedelta(seconds=nonce_ttl)

    results: list[StepResult] = []

    def run(number: int, check) -> bool:
        try:
            message = check()
        except _Fail as exc:
            results.append(StepResult(number, STEP_NAMES[number], False, False, str(exc)))
            return False
        except _Partial as exc:
            results.append(StepResult(number, STEP_NAMES[number], True, False, str(exc), partial=True))
            return True
        results.append(StepResult(number, STEP_NAMES[number], True, False, message))
        return True

    def skip(number: int, why: str) -> None:
        results.append(StepResult(number, STEP_NAMES[number], False, True, why))

    if not run(1, lambda: _check_schema(record)):
        for number in range(2, 7):
            skip(number, "not run: the record is not schema-valid")
        return VerificationReport(tuple(results))

    # One canonical pass serves both the signature (step 3) and the chain (step 6).
    try:
        event_bytes = [canonical(e) for e in record["events"]]
        signed_bytes = signing_input(record, event_bytes)
        canonical_error = None
    except (ValueError, TypeError) as exc:  # e.g. a lone surrogate in a string
        event_bytes, signed_bytes, canonical_error = [], b"", f"the record cannot be canonicalized (JCS): {exc}"

    keys: list[Ed25519PublicKey] = []

    def step2() -> str:
        return _resolve_governor_keys(record["governor"], keys, public_key, did_document, resolver)

    def step3() -> str:
        if canonical_error:
            raise _Fail(canonical_error)
        return _check_signature(record, keys, signed_bytes)

    def step6() -> str:
        if canonical_error:
            raise _Fail(canonical_error)
        broken = check_chain(record, event_bytes)
        if broken:
            raise _Fail(broken)
        count = len(record["events"])
        return (
            f"{count} event{'s' if count != 1 else ''} linked: event 0 to the record header, each later one to its predecessor"
            if count
            else "no events: nothing to chain"
        )

    if run(2, step2) or keys:
        run(3, step3)
    else:
        skip(3, "not run: no governor key")
    if passport is None:
        skip(4, "no passport given: subject.passport_digest not compared with an admitted passport")
    else:
        run(4, lambda: _check_passport(record, passport))
    held = f" (the record carries nonce {record['nonce']!r})" if "nonce" in record else ""
    if no_nonce:
        run(5, lambda: f"no nonce was issued by this counterparty: nothing to check, freshness not shown{held}")
    elif expected_nonce is None:
        skip(5, f"no nonce given, and no declaration that none was issued: freshness not checked{held}")
    else:
        run(5, lambda: _check_nonce(record, expected_nonce, issued_at, ttl))
    run(6, step6)
    return VerificationReport(tuple(results), fresh=expected_nonce is not None)


# --- inputs ---------------------------------------------------------------------------


def parse_record(data: bytes | str, source: str = "record") -> dict[str, Any]:
    """A record parsed as strict I-JSON (a JSON object: no duplicate members, no NaN or
    out-of-range numbers), by the reader passports use; InputError otherwise."""
    try:
        return parse_document(data, format=JSON, source=source, what="record")
    except DocumentError as exc:
        raise InputError(str(exc)) from None


def load_record(path: Path | str) -> Any:
    return parse_record(read_document_file(path, InputError), str(path))
