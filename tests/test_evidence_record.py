"""Records (Runtime §8.3) and the §8.4 chain, checked the way a third party would:
with `jcs` and hashlib straight from the spec text, and against the official schema.

The helpers at the top are shared by the other evidence test modules.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from datetime import UTC, datetime

import jcs
import jsonschema
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from governor.evidence import (
    SessionHeader,
    SessionRecord,
    generate_key,
    iso_utc,
    make_event,
    record_header,
    sign_record,
    verify_record,
    write_record,
)
from governor.evidence.verify import record_validator
from tests.conftest import REPO, shared_path

GOVERNOR = "did:web:governor.example:gov"
START = 1_795_000_000.0  # 2026-11-18T11:06:40Z


def header(**overrides) -> SessionHeader:
    fields = dict(
        governor=GOVERNOR,
        subject_id="https://agents.example/agents/doc-helper",
        passport_digest="n4bQgYhMfWWaL-qgxVrQFaO_TxsrC4Is0V1sFbDwCgg",
        session="sess-42",
        tier="R2",
        start=START,
        limits={"resource_limits": {"budget": {"tokens": {"per_session": 1000, "per_day": 5000}}}},
    )
    fields.update(overrides)
    return SessionHeader(**fields)


EVENTS = [
    ("on_budget_exhausted", "halt", {"dimension": "tokens", "scope": "per_session", "observed": 1040, "limit": 1000}),
    ("on_tool_error", "continue", {"tool": "search", "message": "upstream 503", "persona": "doc-reviewer"}),
    ("on_iteration_limit", "fallback", {"limit": 8, "observed": 9, "value": "stopped early"}),
    ("on_oversight_timeout", "pause", {"trigger": "cost over 0.50", "cost_usd": 0.75}),
    ("on_governor_session_integrity", "halt", {"reason": "passport digest changed", "presented": "xyz"}),
]


def session_record(events=EVENTS, **overrides) -> SessionRecord:
    record = SessionRecord(header(**overrides))
    for offset, (cause, action, detail) in enumerate(events):
        record.add(cause, action, START + 1.5 * (offset + 1), detail)
    return record


def signed_record(key: Ed25519PrivateKey, events=EVENTS, nonce: str | None = "nonce-abc", **overrides) -> dict:
    built = session_record(events, **overrides).build(
        outcome="halted", end=START + 60, iat=START + 61, nonce=nonce
    )
    return sign_record(built, key)


# --- a verifier written from the spec text alone (§8.3, §8.4), not from our code ----------


def spec_chain_ok(record: dict) -> bool:
    def h(value) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(jcs.canonicalize(value)).digest()).rstrip(b"=").decode()

    head = {k: v for k, v in record.items() if k not in ("events", "signature")}
    expected = h(head)
    for index, event in enumerate(record["events"]):
        if event["seq"] != index or event["prev_hash"] != expected:
            return False
        expected = h(event)
    return True


def spec_signature_ok(record: dict, public_key: Ed25519PublicKey) -> bool:
    signature = record["signature"]
    value = base64.urlsafe_b64decode(signature["value"] + "=" * (-len(signature["value"]) % 4))
    body = {k: v for k, v in record.items() if k != "signature"}
    try:
        public_key.verify(value, jcs.canonicalize(body))
    except Exception:
        return False
    return signature["algorithm"] == "Ed25519" and signature["signed_content"] == "canonical"


def official_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(shared_path("adl", "schemas", "schema-enforcement-record.json").read_text())
    return jsonschema.Draft202012Validator(schema)


# --- tests ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return generate_key()


def test_record_shape_and_event_fields(key):
    record = signed_record(key)
    assert record["adl_enforcement_record"] == "1.0"
    assert record["governor"] == GOVERNOR
    assert record["subject"] == {"id": "https://agents.example/agents/doc-helper",
                                 "passport_digest": "n4bQgYhMfWWaL-qgxVrQFaO_TxsrC4Is0V1sFbDwCgg"}
    assert record["window"] == {"start": iso_utc(START), "end": iso_utc(START + 60)}
    assert record["iat"] == iso_utc(START + 61) and record["nonce"] == "nonce-abc"
    assert record["outcome"] == "halted" and record["tier"] == "R2"
    assert [e["seq"] for e in record["events"]] == list(range(len(EVENTS)))
    assert [(e["cause"], e["action"], e["detail"]) for e in record["events"]] == EVENTS
    assert set(record["signature"]) == {"algorithm", "value", "signed_content"}
    assert record["signature"]["algorithm"] == "Ed25519" and record["signature"]["signed_content"] == "canonical"
    assert "=" not in record["signature"]["value"]


def test_chain_and_signature_follow_the_spec_text(key):
    record = signed_record(key)
    assert spec_chain_ok(record)
    assert spec_signature_ok(record, key.public_key())
    # event 0 is anchored to the header exactly as it appears in the final record
    head = record_header(record)
    assert set(head) == set(record) - {"events", "signature"}
    digest = base64.urlsafe_b64encode(hashlib.sha256(jcs.canonicalize(head)).digest()).rstrip(b"=").decode()
    assert record["events"][0]["prev_hash"] == digest


def test_each_issued_record_chains_over_its_own_header(key):
    """A mid-session record (fresh iat and nonce) re-anchors the chain: both verify."""
    session = session_record()
    first = sign_record(session.build(outcome="paused", end=START + 10, iat=START + 10, nonce="n-1"), key)
    session.add("on_anomaly", "continue", START + 11, {"tool": "shell", "share": 0.9})
    second = sign_record(session.build(outcome="completed", end=START + 20, iat=START + 20, nonce="n-2"), key)
    assert first["events"][0]["prev_hash"] != second["events"][0]["prev_hash"]
    assert len(second["events"]) == len(first["events"]) + 1
    for record, nonce in ((first, "n-1"), (second, "n-2")):
        assert spec_chain_ok(record) and spec_signature_ok(record, key.public_key())
        assert verify_record(record, public_key=key.public_key(), expected_nonce=nonce).ok


def test_empty_record_without_nonce_or_limits(key):
    record = sign_record(SessionRecord(header(limits=None)).build(outcome="completed", end=START, iat=START), key)
    assert record["events"] == [] and "nonce" not in record and "limits" not in record
    report = verify_record(record, public_key=key.public_key())
    assert report.ok and "no events" in report.step(6).message


@pytest.mark.parametrize("variant", ["full", "empty", "no-nonce", "governor-causes", "https-governor", "r3"])
def test_records_validate_against_official_and_own_schema(key, variant):
    events = {
        "empty": [],
        "governor-causes": [("on_governor_error", "halt", {"error": "store down"}),
                            ("on_governor_oversight_trigger", "pause", {"approval": "a-1"}),
                            ("on_governor_session_integrity", "halt", None)],
    }.get(variant, EVENTS)
    overrides = {"https-governor": {"governor": "https://gov.example/governor"}, "r3": {"tier": "R3"}}.get(variant, {})
    record = signed_record(key, events=events, nonce=None if variant == "no-nonce" else "n", **overrides)
    official = official_validator()
    assert list(official.iter_errors(record)) == []
    assert list(record_validator().iter_errors(record)) == []
    for stamp in [record["iat"], *record["window"].values(), *(e["at"] for e in record["events"])]:
        assert datetime.fromisoformat(stamp).tzinfo is not None  # date-time, which jsonschema does not assert


def test_own_schema_is_a_valid_2020_12_schema_and_no_looser_than_the_official(key):
    own = json.loads((REPO / "schemas" / "enforcement-record.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(own)
    official = official_validator()
    base = signed_record(key)
    rejected_by_official = [
        lambda r: r.pop("signature"),
        lambda r: r.update(tier="R4"),
        lambda r: r.update(outcome="aborted"),
        lambda r: r["events"][0].update(action="deny"),
        lambda r: r["events"][0].update(cause="budget"),
        lambda r: r["events"][1].update(extra=1),
        lambda r: r["signature"].update(key_id="k1"),
        lambda r: r.update(adl_enforcement_record="2.0"),
        lambda r: r["subject"].pop("passport_digest"),
        lambda r: r.update(unknown=True),
    ]
    for mutate in rejected_by_official:
        record = copy.deepcopy(base)
        mutate(record)
        assert not official.is_valid(record)
        assert not record_validator().is_valid(record)


def test_cause_and_action_are_checked_when_recorded():
    record = SessionRecord(header())
    with pytest.raises(ValueError, match="cause"):
        record.add("budget_exhausted", "halt", START)
    with pytest.raises(ValueError, match="action"):
        record.add("on_budget_exhausted", "deny", START)
    with pytest.raises(ValueError, match="detail"):
        record.add("on_budget_exhausted", "halt", START, detail="text")
    with pytest.raises(ValueError, match="timestamp"):
        record.add("on_budget_exhausted", "halt", "yesterday")
    assert len(record) == 0


def test_details_are_recorded_whatever_their_python_types():
    import enum

    class Action(str, enum.Enum):
        HALT = "halt"

    event = make_event("on_budget_exhausted", Action.HALT, START, {
        "tools": frozenset({"b", "a"}), "pair": (1, 2), "nan": float("nan"), "when": datetime(2026, 1, 1, tzinfo=UTC),
        3: "int key", "nested": {"action": Action.HALT},
    })
    assert event["action"] == "halt"
    assert event["detail"] == {"tools": ["a", "b"], "pair": [1, 2], "nan": "nan", "when": "2026-01-01 00:00:00+00:00",
                               "3": "int key", "nested": {"action": "halt"}}
    jcs.canonicalize(event)  # plain JSON now


def test_timestamps():
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1_795_000_000.1239) == "2026-11-18T11:06:40.123Z"
    assert iso_utc(1_795_000_000.9999) == "2026-11-18T11:06:40.999Z"  # truncated, never ahead
    record = SessionRecord(header(start="2026-11-21T22:17:52.123Z"))
    record.add("on_anomaly", "continue", "2026-11-21T22:17:53+01:00")
    built = record.build(outcome="completed", end=START, iat=START)
    assert built["window"]["start"] == "2026-11-21T22:17:52.123Z"
    assert built["events"][0]["at"] == "2026-11-21T22:17:53+01:00"


@pytest.mark.parametrize("bad", [
    {"governor": "http://insecure.example"}, {"governor": "did:key:z6Mk"}, {"tier": "R0"}, {"session": ""},
    {"limits": ["not", "an", "object"]}, {"start": "soon"},
])
def test_session_header_rejects_what_a_record_cannot_hold(bad):
    with pytest.raises(ValueError):
        header(**bad)


def test_build_rejects_unknown_outcome_and_empty_nonce():
    with pytest.raises(ValueError, match="outcome"):
        session_record().build(outcome="done", end=START, iat=START)
    with pytest.raises(ValueError, match="nonce"):
        session_record().build(outcome="halted", end=START, iat=START, nonce="")


def test_write_record_is_atomic_and_round_trips(tmp_path, key):
    record = signed_record(key)
    path = write_record(tmp_path / "records" / "sess-42.json", record)
    assert json.loads(path.read_text()) == record
    assert [p.name for p in path.parent.iterdir()] == ["sess-42.json"]  # no temp file left behind
    assert verify_record(json.loads(path.read_text()), public_key=key.public_key()).ok
