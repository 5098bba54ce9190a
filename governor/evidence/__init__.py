"""The evidence room: enforcement records, their hash chain and signature, the durable
session journal, the governor's key, and offline verification (Runtime §8).

Imports nothing outside governor.evidence, governor.common.canonical and the two shared
readers governor.common.documents and governor.common.ed25519_points (plus jsonschema and
cryptography), so an auditor's `governor verify` does not load the proxy or the
policy engine.

Typical use by the runtime:

    key, identifier = ensure_governor_key(data_dir)
    journal = Journal.create(journal_path(data_dir, session), SessionHeader(...))
    journal.append(cause, action, at=now, detail=...)        # durable before it returns
    record = sign_record(journal.record.build(outcome=..., end=now, iat=now, nonce=n), key)
"""

from governor.evidence.errors import (
    CorruptJournalError,
    DidDocumentError,
    DidResolutionError,
    EvidenceError,
    InputError,
    JournalClosedError,
    JournalError,
    KeyFileError,
    SchemaNotFoundError,
)
from governor.evidence.journal import Ending, Journal, Recovery, TornJournalError, TornTail, recover_journal
from governor.evidence.keys import (
    DEFAULT_IDENTIFIER,
    KeyFiles,
    assertion_keys,
    did_document,
    ensure_governor_key,
    generate_key,
    key_fingerprint,
    load_did_document,
    load_private_key,
    load_public_key,
    public_key_from_did_document,
    write_key_files,
)
from governor.evidence.passport_file import load_passport
from governor.evidence.record import (
    SessionHeader,
    SessionRecord,
    chain_events,
    iso_utc,
    journal_path,
    make_event,
    record_header,
    record_path,
    write_record,
)
from governor.evidence.signing import sign_record, signing_input
from governor.evidence.verify import (
    RecordVerificationError,
    StepResult,
    VerificationReport,
    check_chain,
    load_record,
    passport_digest,
    verify_record,
)

__all__ = [
    "CorruptJournalError", "DidDocumentError", "DidResolutionError", "EvidenceError", "InputError", "JournalClosedError",
    "JournalError", "KeyFileError", "RecordVerificationError", "SchemaNotFoundError", "TornJournalError",
    "Ending", "Journal", "Recovery", "TornTail", "recover_journal",
    "DEFAULT_IDENTIFIER", "KeyFiles", "assertion_keys", "did_document", "ensure_governor_key", "generate_key",
    "key_fingerprint", "load_did_document", "load_private_key", "load_public_key",
    "public_key_from_did_document", "write_key_files",
    "SessionHeader", "SessionRecord", "chain_events", "iso_utc", "journal_path", "make_event",
    "record_header", "record_path", "write_record",
    "sign_record", "signing_input",
    "StepResult", "VerificationReport", "check_chain", "load_passport", "load_record", "passport_digest",
    "verify_record",
]
