"""Tampering is rejected at the right §8.6 step; random records verify, random mutations fail.

Without the key, any edit fails at step 3 (the signature covers everything). A
party holding the key who edits an event and re-signs without re-chaining is
caught at step 6 — except for the last event (or a truncated tail): nothing
chains over it, so the signature alone seals it (§8.4) and a key holder can
rewrite it. Completeness is explicitly not provided (§8.1).
"""

from __future__ import annotations

import copy
import math

import jcs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from governor.common.canonical import b64url, b64url_decode
from governor.evidence import check_chain, did_document, generate_key, sign_record, verify_record
from governor.evidence.keys import public_key_bytes
from tests.test_evidence_record import EVENTS, GOVERNOR, START, SessionHeader, SessionRecord, signed_record, spec_chain_ok

N = len(EVENTS)
assert N >= 4 and all(detail for _, _, detail in EVENTS)


@pytest.fixture(scope="module")
def key():
    return generate_key()


@pytest.fixture(scope="module")
def record(key):
    return signed_record(key, nonce="nonce-abc")


def first_failing_step(record, key, **kwargs) -> int | None:
    report = verify_record(record, public_key=key.public_key(), **kwargs)
    return None if report.ok else report.first_failure.number


def resign(record, key):
    """What a key holder does: re-sign the edited record without re-chaining."""
    return sign_record(record, key)


def test_untouched_record_passes(record, key):
    report = verify_record(record, public_key=key.public_key(), expected_nonce="nonce-abc")
    # a pinned key (not resolved) and a nonce without its time to live: nothing fails, not VALID
    assert report.ok and [s.status for s in report.steps] == ["pass", "partial", "pass", "skip", "partial", "pass"]
    assert report.verdict == "INCOMPLETE"


EVENT_EDITS = {
    "seq": lambda e: e["seq"] + 10,
    "cause": lambda e: "on_anomaly" if e["cause"] != "on_anomaly" else "on_tool_error",
    "action": lambda e: "continue" if e["action"] != "continue" else "halt",
    "at": lambda e: "2030-01-01T00:00:00.000Z",
    "prev_hash": lambda e: b64url(bytes(32)),
    "detail": lambda e: {**e["detail"], "observed": "edited"},
}


@pytest.mark.parametrize("field", sorted(EVENT_EDITS))
@pytest.mark.parametrize("index", range(N))
def test_every_event_field_edit(record, key, index, field):
    edited = copy.deepcopy(record)
    edited["events"][index][field] = EVENT_EDITS[field](edited["events"][index])
    assert first_failing_step(edited, key) == 3
    resigned = resign(edited, key)
    if index < N - 1 or field in ("seq", "prev_hash"):
        report = verify_record(resigned, public_key=key.public_key())
        assert report.first_failure.number == 6
        message = report.first_failure.message
        if field == "prev_hash":  # indistinguishable from a change to the event before: both are named
            changed = "the record header" if index == 0 else f"event {index - 1}"
            assert message == (f"{changed} was changed: its hash no longer matches event {index}'s prev_hash "
                               f"(or event {index}'s prev_hash was changed)")
        elif field == "seq":
            assert message == f"event {index} was changed: its seq is {index + 10}, expected {index}"
        else:  # the changed event is named, not the next link (#33 item 5)
            assert message == (f"event {index} was changed: its hash no longer matches event {index + 1}'s prev_hash "
                               f"(or event {index + 1}'s prev_hash was changed)")
    else:  # the last event's content is sealed by the signature only: a key holder can rewrite it
        assert first_failing_step(resigned, key) is None


@pytest.mark.parametrize("i,j", [(i, j) for i in range(N) for j in range(i + 1, N)])
def test_every_swap_of_two_events(record, key, i, j):
    edited = copy.deepcopy(record)
    edited["events"][i], edited["events"][j] = edited["events"][j], edited["events"][i]
    assert first_failing_step(edited, key) == 3
    report = verify_record(resign(edited, key), public_key=key.public_key())
    assert report.first_failure.number == 6
    where = "the record header" if i == 0 else f"event {i - 1}"
    follows = j if j - 1 == i else j - 1  # where event j's predecessor now is
    assert report.first_failure.message == (
        f"events out of order: event {i} (seq {j}) follows event {follows} in the chain, not {where}")


@pytest.mark.parametrize("index", range(N))
def test_every_single_deletion(record, key, index):
    edited = copy.deepcopy(record)
    del edited["events"][index]
    assert first_failing_step(edited, key) == 3
    if index < N - 1:
        assert verify_record(resign(edited, key), public_key=key.public_key()).first_failure.number == 6
        assert check_chain(resign(edited, key)) == (
            f"an event was removed before event {index}: its seq is {index + 1} and its prev_hash matches no "
            "event in the record")


@pytest.mark.parametrize("keep", [0, 1, N - 1])
def test_truncated_events(record, key, keep):
    edited = copy.deepcopy(record)
    edited["events"] = edited["events"][:keep]
    assert first_failing_step(edited, key) == 3


HEADER_EDITS = {
    "adl_enforcement_record": (lambda r: r.update(adl_enforcement_record="1.1"), 1),
    "governor": (lambda r: r.update(governor="did:web:other.example"), 3),
    "subject.id": (lambda r: r["subject"].update(id="https://agents.example/agents/other"), 3),
    "subject.passport_digest": (lambda r: r["subject"].update(passport_digest=b64url(bytes(32))), 3),
    "session": (lambda r: r.update(session="sess-43"), 3),
    "tier": (lambda r: r.update(tier="R3"), 3),
    "window.start": (lambda r: r["window"].update(start="2020-01-01T00:00:00.000Z"), 3),
    "window.end": (lambda r: r["window"].update(end="2030-01-01T00:00:00.000Z"), 3),
    "iat": (lambda r: r.update(iat="2030-01-01T00:00:00.000Z"), 3),
    "nonce": (lambda r: r.update(nonce="nonce-xyz"), 3),
    "nonce removed": (lambda r: r.pop("nonce"), 3),
    "limits": (lambda r: r["limits"]["resource_limits"]["budget"]["tokens"].update(per_session=10**6), 3),
    "limits removed": (lambda r: r.pop("limits"), 3),
    "outcome": (lambda r: r.update(outcome="completed"), 3),
}


@pytest.mark.parametrize("name", sorted(HEADER_EDITS))
def test_every_header_field_edit(record, key, name):
    mutate, step = HEADER_EDITS[name]
    edited = copy.deepcopy(record)
    mutate(edited)
    assert first_failing_step(edited, key) == step
    if step == 3:  # re-signed by a key holder: event 0 no longer anchors to the header
        report = verify_record(resign(edited, key), public_key=key.public_key())
        assert report.first_failure.number == 6
        assert report.first_failure.message == (
            "the record header was changed: its hash no longer matches event 0's prev_hash (or event 0's prev_hash was changed)")


def test_governor_swap_fails_key_resolution_with_a_did_document(record, key):
    edited = copy.deepcopy(record)
    edited["governor"] = "did:web:other.example"
    report = verify_record(edited, did_document=did_document(GOVERNOR, key.public_key()))
    assert report.first_failure.number == 2 and "not for did:web:other.example" in report.first_failure.message


def test_changed_nonce(record, key):
    edited = copy.deepcopy(record)
    edited["nonce"] = "nonce-replayed"
    assert first_failing_step(edited, key, expected_nonce="nonce-abc") == 3
    report = verify_record(resign(edited, key), public_key=key.public_key(), expected_nonce="nonce-abc")
    assert [s.number for s in report.steps if s.status == "fail"] == [5, 6]
    assert "not the issued nonce" in report.step(5).message


def test_stale_record_without_the_issued_nonce(key):
    stale = signed_record(key, nonce=None)
    report = verify_record(stale, public_key=key.public_key(), expected_nonce="fresh-1")
    assert report.first_failure.number == 5 and "carries no nonce" in report.first_failure.message


@pytest.mark.parametrize("position", [0, 31, 63])
def test_flipped_signature_byte(record, key, position):
    edited = copy.deepcopy(record)
    raw = bytearray(b64url_decode(edited["signature"]["value"]))
    raw[position] ^= 0x01
    edited["signature"]["value"] = b64url(bytes(raw))
    assert first_failing_step(edited, key) == 3


def test_signature_with_malleable_trailing_bits_is_rejected(record, key):
    edited = copy.deepcopy(record)
    value = edited["signature"]["value"]  # 86 chars: the last one carries 4 unused bits
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    edited["signature"]["value"] = value[:-1] + alphabet[alphabet.index(value[-1]) ^ 1]
    assert b64url_decode(edited["signature"]["value"]) == b64url_decode(value)
    report = verify_record(edited, public_key=key.public_key())
    assert report.first_failure.number == 3 and "canonical base64url" in report.first_failure.message


def test_record_signed_by_another_key(record, key):
    other = generate_key()
    forged = sign_record(record, other)
    assert first_failing_step(forged, key) == 3
    assert first_failing_step(forged, other) is None
    report = verify_record(forged, did_document=did_document(GOVERNOR, key.public_key()))
    assert report.first_failure.number == 3 and "does not verify" in report.first_failure.message


def test_later_steps_are_reported_after_the_first_failure(record, key):
    edited = copy.deepcopy(record)
    edited["events"][1]["cause"] = "on_anomaly"
    report = verify_record(edited, public_key=key.public_key())
    assert [s.status for s in report.steps] == ["pass", "partial", "fail", "skip", "skip", "fail"]
    assert report.first_failure.number == 3
    assert report.step(6).message == (
        "event 1 was changed: its hash no longer matches event 2's prev_hash (or event 2's prev_hash was changed)")


def test_schema_failure_stops_there(record, key):
    edited = copy.deepcopy(record)
    edited["events"][2]["action"] = "explode"
    report = verify_record(edited, public_key=key.public_key())
    assert report.first_failure.number == 1 and "events/2/action" in report.first_failure.message
    assert all(s.skipped for s in report.steps[1:])
    assert verify_record(["not", "a", "record"], public_key=key.public_key()).first_failure.number == 1


def test_uncanonicalizable_record_is_rejected_not_crashed(record, key):
    edited = copy.deepcopy(record)
    edited["events"][0]["detail"]["text"] = "\ud800"  # a lone surrogate: JSON can carry it, UTF-8 cannot
    report = verify_record(edited, public_key=key.public_key())
    assert report.first_failure.number == 3 and "canonicalized" in report.first_failure.message


# --- property tests ---------------------------------------------------------------------

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
event_strategy = st.tuples(
    st.from_regex(r"on_[a-z0-9_]{1,12}", fullmatch=True),
    st.sampled_from(["halt", "pause", "fallback", "continue"]),
    st.floats(0, 10**6),
    st.none() | st.dictionaries(st.text(max_size=8), json_value, max_size=5),
)
PROPERTY_KEY = generate_key()


def build_signed(events, nonce, outcome):
    session = SessionRecord(SessionHeader(GOVERNOR, "urn:adl:agent:t:a:1.0.0", "digest", "s", "R2", START))
    for cause, action, offset, detail in events:
        session.add(cause, action, START + offset, detail)
    return sign_record(session.build(outcome=outcome, end=START + 10**6, iat=START + 10**6, nonce=nonce), PROPERTY_KEY)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(event_strategy, max_size=8),
    nonce=st.none() | st.text(min_size=1, max_size=16),
    outcome=st.sampled_from(["completed", "halted", "paused"]),
)
def test_random_records_verify(events, nonce, outcome):
    record = build_signed(events, nonce, outcome)
    report = verify_record(record, public_key=PROPERTY_KEY.public_key(), expected_nonce=nonce)
    assert report.ok, report.summary()
    assert spec_chain_ok(record)


def _paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, path + (i,))


def _mutated(value, choice: int):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1 + choice
    if isinstance(value, float):
        return value + 1.5 if math.isfinite(value + 1.5) else 0.5
    if isinstance(value, str):
        return value[:-1] if value and choice % 2 else value + "x"
    if value is None:
        return "null"
    if isinstance(value, dict):
        if value and choice % 2:
            return {k: v for i, (k, v) in enumerate(value.items()) if i != choice % len(value)}
        return {**value, "zz_added": choice}
    if isinstance(value, list):
        if value and choice % 2:
            return value[: choice % len(value)] + value[choice % len(value) + 1:]
        return value + [choice]
    raise AssertionError(value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(event_strategy, min_size=1, max_size=5), pick=st.integers(0, 10**6), choice=st.integers(0, 10**6))
def test_random_mutations_fail(events, pick, choice):
    record = build_signed(events, "n", "halted")
    paths = [p for p in _paths(record) if p]  # every member and item at any depth
    path = paths[pick % len(paths)]
    mutated = copy.deepcopy(record)
    parent = mutated
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = _mutated(parent[path[-1]], choice)
    assume(jcs.canonicalize(mutated) != jcs.canonicalize(record))  # 1 and 1.0 are the same JSON number
    report = verify_record(mutated, public_key=PROPERTY_KEY.public_key(), expected_nonce="n")
    assert not report.ok, path


def test_keys_in_a_did_document_match_the_signing_key(key):
    document = did_document(GOVERNOR, key.public_key())
    from governor.evidence import public_key_from_did_document

    assert public_key_bytes(public_key_from_did_document(document, GOVERNOR)) == public_key_bytes(key)


def test_raise_for_failure_names_the_step(record, key):
    from governor.evidence import RecordVerificationError

    verify_record(record, public_key=key.public_key()).raise_for_failure()  # valid: no error
    edited = copy.deepcopy(record)
    edited["session"] = "other"
    with pytest.raises(RecordVerificationError) as caught:
        verify_record(edited, public_key=key.public_key()).raise_for_failure()
    assert caught.value.step.number == 3
    assert str(caught.value).startswith("invalid enforcement record: step 3 (signature)")


def test_inconsistent_nonce_arguments_are_usage_errors(record, key):
    with pytest.raises(ValueError, match="go together"):
        verify_record(record, public_key=key.public_key(), expected_nonce="n", nonce_ttl=5)
    with pytest.raises(ValueError, match="needs the expected nonce"):
        verify_record(record, public_key=key.public_key(), nonce_issued_at="2026-01-01T00:00:00Z", nonce_ttl=5)


def test_nonce_issued_within_the_records_millisecond_is_fresh(key):
    from datetime import datetime, timedelta, timezone

    from tests.test_evidence_record import START, signed_record

    record = signed_record(key, nonce="n-1")  # iat = START + 61, stated to the millisecond
    iat = datetime.fromtimestamp(START + 61, tz=timezone.utc)
    same_ms = iat + timedelta(microseconds=400)  # the nonce was issued later in that millisecond
    report = verify_record(record, public_key=key.public_key(), expected_nonce="n-1",
                           nonce_issued_at=same_ms, nonce_ttl=timedelta(seconds=60))
    assert report.ok, report.first_failure
    later = iat + timedelta(milliseconds=2)  # a record from before the challenge is still refused
    report = verify_record(record, public_key=key.public_key(), expected_nonce="n-1",
                           nonce_issued_at=later, nonce_ttl=timedelta(seconds=60))
    assert report.first_failure.number == 5
