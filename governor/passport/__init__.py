"""The passport room: load, validate, verify, digest and pin an ADL passport.

    document = load_passport("agent.yaml")
    report = admit(document, AdmissionConfig(now=datetime.now(timezone.utc)))
    if report.verified:
        pin = report.pinned          # PinnedPassport: immutable, .digest, governed members

Admission follows Trust §1.1 (steps 1.1.1-1.1.9) and reports every step in the
shape of the official verify vectors; the pin is Runtime §1.3's.
"""

from governor.passport.admission import (
    AdmissionConfig,
    AdmissionReport,
    Retrieval,
    UNSIGNED_PASSPORT,
    UNSIGNED_PASSPORT_MEMBER,
    StepOutcome,
    admit,
    format_report,
)
from governor.passport.did import load_did_documents
from governor.passport.errors import (
    DidResolutionError,
    PassportError,
    PassportKeyError,
    PassportLoadError,
    SignatureInvalidError,
    SigningError,
    UnsupportedAlgorithmError,
    WeakKeyError,
)
from governor.passport.loader import dump_passport, load_passport, parse_passport
from governor.passport.pin import PinnedPassport, passport_digest
from governor.passport.resources import example_passport_path
from governor.passport.schema import SchemaIssue
from governor.passport.signature import sign_passport

__all__ = [
    "UNSIGNED_PASSPORT", "UNSIGNED_PASSPORT_MEMBER",
    "AdmissionConfig",
    "AdmissionReport",
    "DidResolutionError",
    "PassportError",
    "PassportKeyError",
    "PassportLoadError",
    "PinnedPassport",
    "Retrieval",
    "SchemaIssue",
    "SignatureInvalidError",
    "SigningError",
    "StepOutcome",
    "UnsupportedAlgorithmError",
    "WeakKeyError",
    "admit",
    "format_report",
    "dump_passport",
    "example_passport_path",
    "load_did_documents",
    "load_passport",
    "parse_passport",
    "passport_digest",
    "sign_passport",
]
