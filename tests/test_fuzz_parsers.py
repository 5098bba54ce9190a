"""Property-based fuzzing of the parsers that read agent- or auditor-supplied bytes (#20):
passports (bytes and documents), the ADL-Passport header, DID documents, records and
journals as `governor verify` and recovery read them.

Each property: any input gives the parser's own clear error (or a value), never another
exception, within bounds. Example counts are bounded so each property takes seconds.
"""

from __future__ import annotations

import copy
import json
import random

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from governor.cli import main
from governor.evidence import Journal, sign_record
from governor.evidence.errors import DidDocumentError, InputError, JournalError
from governor.evidence.journal import recover_journal
from governor.evidence.keys import assertion_keys, write_key_files
from governor.evidence.verify import parse_record, verify_record
from governor.passport import AdmissionConfig, PassportError, admit, load_passport, parse_passport
from governor.passport.did import resolve_did_web
from governor.passport.resources import example_passport_path
from governor.proxy.presented import PresentedPassportError, presented_digest
from tests.hostile_documents import alias_bomb, header_value, nested_json, nested_yaml
from tests.test_evidence_record import EVENTS, START, header, session_record

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])

LONE_SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udc00"])  # JSON can escape them; not Unicode text
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**60, 2**60) | st.floats(allow_nan=True) | st.text(max_size=20)
    | LONE_SURROGATES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)

YAML_PIECES = ["a: 1\n", "- x\n", "&a ", "*a ", "!!binary ", "!!python/object ", "{", "}", "[", "]", ": ", ", ",
               "? ", "--- ", "...\n", "%YAML 1.2\n", "'", '"', "\t", "\n  ", "#", "|\n  ", ">\n  ", "0x1F", "1e999",
               ".nan", "~", "<<: ", "\\u0000", "\ufeff"]
yaml_ish = st.lists(st.sampled_from(YAML_PIECES) | st.text(max_size=6), max_size=40).map("".join)


def mutated_example(draw_bytes: bytes) -> bytes:
    """The example passport with a few bytes replaced, inserted or dropped (seeded by hypothesis)."""
    text = bytearray(example_passport_path().read_bytes())
    rng = random.Random(draw_bytes)
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(len(text))
        choice = rng.random()
        if choice < 0.4:
            text[at] = rng.randrange(256)
        elif choice < 0.7:
            text[at:at] = rng.choice([b"&x ", b"*x", b"[", b"{", b": ", b"\n- ", b"!!set ", b"\x00"])
        else:
            del text[at:at + rng.randint(1, 20)]
    return bytes(text)


# --- passports -----------------------------------------------------------------------------


def loads_or_refuses(data: bytes | str) -> None:
    try:
        value = parse_passport(data)
    except PassportError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
        return
    assert isinstance(value, dict)
    json.dumps(value, allow_nan=False)  # plain JSON, no aliases left to expand


@FUZZ
@given(st.binary(max_size=2000))
@example(alias_bomb(9))
@example(nested_json(50_000))
@example(nested_yaml(50_000))
@example(b"\xef\xbb\xbf{}")
@example(b'{"a": "\\ud800"}')
@example(b'{"\\udfff": 1}')
def test_passport_bytes(data):
    loads_or_refuses(data)


@FUZZ
@given(yaml_ish)
def test_passport_yaml_shapes(text):
    loads_or_refuses(text)


@FEW
@given(st.binary(min_size=1, max_size=16))
def test_passport_mutated_example(seed):
    loads_or_refuses(mutated_example(seed))


@FEW
@given(json_values, st.binary(min_size=1, max_size=8))
def test_admission_never_raises_on_a_mangled_passport(value, seed):
    document = copy.deepcopy(load_passport(example_passport_path()))
    rng = random.Random(seed)
    target, path = document, []
    while isinstance(target, dict) and target and rng.random() < 0.7:
        key = rng.choice(sorted(target))
        path.append(key)
        if not isinstance(target[key], dict) or rng.random() < 0.3:
            target[key] = value
            break
        target = target[key]
    report = admit(document, AdmissionConfig(now=START))
    assert report.verified in (True, False)
    report.to_dict()


# --- the ADL-Passport header -------------------------------------------------------------------


def header_digest_or_refusal(value: str) -> None:
    try:
        digest = presented_digest(value)
    except PresentedPassportError as exc:
        assert exc.reason and len(exc.digest) == 43
        return
    assert isinstance(digest, str) and len(digest) <= 128


@FUZZ
@given(st.text(max_size=300))
@example("sha256=" + "A" * 10_000)
@example(header_value(alias_bomb(9)))
@example(header_value(b"[" * 60_000))
@example("A" * 100_000)
@example(header_value(b'{"a": "\\ud800"}'))
def test_header_any_text(value):
    header_digest_or_refusal(value)


@FUZZ
@given(st.binary(max_size=1500) | yaml_ish.map(str.encode) | json_values.map(lambda v: json.dumps(v).encode()))
def test_header_carrying_any_document(document):
    header_digest_or_refusal(header_value(document))


@FEW
@given(st.binary(min_size=1, max_size=16))
def test_header_carrying_a_mutated_passport(seed):
    header_digest_or_refusal(header_value(mutated_example(seed)))


# --- DID documents -------------------------------------------------------------------------------


@FUZZ
@given(json_values, st.sampled_from(["publicKeyMultibase", "publicKeyBase64", "publicKeyJwk", "publicKeyBase58"]))
def test_did_documents_in_both_rooms(value, member):
    did = "did:web:peer.example"
    document = {"id": did, "verificationMethod": [{"id": "#k", "type": "Ed25519VerificationKey2020", member: value}],
                "assertionMethod": ["#k", value]}
    try:
        assertion_keys(document, did)
    except DidDocumentError as exc:
        assert str(exc)
    try:
        resolve_did_web(did, {did: document})
    except PassportError as exc:
        assert str(exc)


# --- records and journals, as governor verify and recovery read them ------------------------------


def _record_bytes() -> bytes:
    return json.dumps(sign_record(session_record().build(outcome="halted", end=START + 60, iat=START + 61),
                                  _KEY)).encode()


_KEY = ed25519.Ed25519PrivateKey.generate()


@FUZZ
@given(st.binary(max_size=2000) | json_values.map(lambda v: json.dumps(v).encode()))
@example(nested_json(100_000))
@example(b'{"a": "\\ud800"}')
def test_record_bytes(data):
    try:
        record = parse_record(data)
    except InputError as exc:
        assert str(exc)
        return
    report = verify_record(record, public_key=_KEY.public_key())
    assert report.ok in (True, False)


@FUZZ
@given(st.binary(min_size=1, max_size=16), json_values)
def test_record_mangled_then_verified(seed, value):
    record = json.loads(_record_bytes())
    rng = random.Random(seed)
    target = record
    for _ in range(rng.randint(1, 3)):
        if isinstance(target, dict) and target:
            key = rng.choice(sorted(target))
            if rng.random() < 0.5 or not isinstance(target[key], (dict, list)):
                target[key] = value
                break
            target = target[key]
        elif isinstance(target, list) and target:
            index = rng.randrange(len(target))
            if rng.random() < 0.5 or not isinstance(target[index], (dict, list)):
                target[index] = value
                break
            target = target[index]
    assert verify_record(record, public_key=_KEY.public_key()).ok in (True, False)


@pytest.fixture(scope="module")
def verify_keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("verify")
    return directory, write_key_files(directory / "keys", key=_KEY)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=1500) | st.binary(min_size=1, max_size=16).map(lambda seed: b"seed:" + seed))
def test_governor_verify_cli_exits_1_or_2_with_a_message(verify_keys, capsys, data):
    directory, keys = verify_keys
    if data.startswith(b"seed:"):
        raw = bytearray(_record_bytes())
        rng = random.Random(data)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        data = bytes(raw)
    path = directory / "record.json"
    path.write_bytes(data)
    code = main(["verify", str(path), "--offline", "--key", str(keys.public_key)])
    out, err = capsys.readouterr()
    assert code in (1, 2), (code, out, err)
    assert (err.strip() if code == 2 else "INVALID" in out)


def _journal_bytes(tmp_path) -> bytes:
    journal = Journal.create(tmp_path / "j.jsonl", header())
    for offset, (cause, action, detail) in enumerate(EVENTS):
        journal.append(cause, action, START + offset + 1, detail)
    journal.close()
    return (tmp_path / "j.jsonl").read_bytes()


@FEW
@given(data=st.binary(max_size=1500) | st.binary(min_size=1, max_size=16).map(lambda seed: b"seed:" + seed))
def test_journal_recovery(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("journal")
    if data.startswith(b"seed:"):
        raw = bytearray(_journal_bytes(directory))
        rng = random.Random(data)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(raw))
            if rng.random() < 0.5:
                raw[at] = rng.randrange(256)
            else:
                raw[at:at] = rng.choice([b"[" * 2000, b"\n", b"{}", b'"', b"\\u0000"])
        data = bytes(raw)
    path = directory / "fuzzed.jsonl"
    path.write_bytes(data)
    try:
        recovered = recover_journal(path)
    except JournalError as exc:
        assert str(exc)
        return
    assert recovered.header is not None
