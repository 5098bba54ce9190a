"""Loading passports (JSON, YAML) and pinning them (Runtime §1.3)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from governor.common.canonical import canonicalize, digest_of
from governor.passport import (
    AdmissionConfig,
    PassportError,
    PassportLoadError,
    PinnedPassport,
    admit,
    dump_passport,
    example_passport_path,
    load_passport,
    parse_passport,
    passport_digest,
)

EXAMPLE = example_passport_path()


# --- loading ------------------------------------------------------------------------------


def test_example_passport_is_found_from_the_package():
    assert EXAMPLE.is_file()
    assert EXAMPLE.name == "example-passport.yaml" and EXAMPLE.parent.name == "policies"
    assert load_passport(EXAMPLE)["name"] == "Research Assistant"


def test_yaml_timestamps_stay_strings_and_the_signed_bytes_do_not_change():
    quoted = EXAMPLE.read_text()
    unquoted = re.sub(r'"(\d{4}-\d\d-\d\dT[0-9:]+Z)"', r"\1", quoted)
    assert unquoted != quoted and "issued_at: 2026-11-21T00:00:00Z" in unquoted
    # a plain safe_load turns the unquoted times into datetimes ...
    assert isinstance(yaml.safe_load(unquoted)["security"]["attestation"]["issued_at"], datetime)
    # ... the passport loader keeps them as the strings that were signed
    document = parse_passport(unquoted)
    assert document["security"]["attestation"]["issued_at"] == "2026-11-21T00:00:00Z"
    assert document == parse_passport(quoted)
    report = admit(document, AdmissionConfig(now=datetime(2026, 12, 1, tzinfo=timezone.utc), require_signature=True))
    assert report.verified, report.to_dict()
    assert parse_passport("when: 2026-01-15T00:00:00Z\nday: 2026-01-15\n") == {
        "when": "2026-01-15T00:00:00Z", "day": "2026-01-15"}


def test_yaml_is_read_with_the_yaml_1_2_core_schema():
    document = parse_passport(
        "a: yes\nb: off\nc: 012\nd: 0o17\ne: 0x1F\nf: 1:20\ng: ~\nh: true\ni: 1.5e3\nj: -4\nk: null\n"
    )
    assert document == {"a": "yes", "b": "off", "c": 12, "d": 15, "e": 31, "f": "1:20", "g": None,
                        "h": True, "i": 1500.0, "j": -4, "k": None}


def test_json_and_yaml_renderings_load_to_the_same_value(tmp_path: Path):
    document = load_passport(EXAMPLE)
    as_json = tmp_path / "p.json"
    as_json.write_bytes(dump_passport(document, "json"))
    as_yaml = tmp_path / "p.yaml"
    as_yaml.write_bytes(dump_passport(document, "yaml"))
    assert load_passport(as_json) == load_passport(as_yaml) == document
    assert load_passport(as_json.read_bytes()) == document  # sniffed


@pytest.mark.parametrize(
    ("text", "fmt", "expected"),
    [
        ("{\"a\": 1, \"a\": 2}", "json", "duplicate key 'a'"),
        ("a: 1\nb: 2\na: 3\n", "yaml", "duplicate key 'a' at line 3"),
        ("{\"a\": NaN}", "json", "NaN is not a JSON value"),
        ("{\"a\": Infinity}", "json", "Infinity is not a JSON value"),
        ("{\"a\": 1e999}", "json", "out of range"),
        ("a: .inf\n", "yaml", "$.a: inf is not a JSON number"),
        ("a: [1, .nan]\n", "yaml", "$.a[1]: nan is not a JSON number"),
        ("a: !!binary aGVsbG8=\n", "yaml", "$.a: a bytes is not a JSON value"),
        ("a: !!timestamp 2026-01-01\n", "yaml", "$.a: a date is not a JSON value"),
        ("a: !!set {x}\n", "yaml", "$.a: a set is not a JSON value"),
        ("1: one\n", "yaml", "non-string key 1"),
        ("a: 9007199254740993\n", "yaml", "beyond 2**53"),
        ("a: !!python/object:os.system x\n", "yaml", "could not determine a constructor"),
        ("[1, 2]", "json", "must be a JSON object (mapping), got a JSON array"),
        ("- a\n- b\n", "yaml", "got a JSON array"),
        ("just a string\n", "yaml", "got a JSON string"),
        ("", "yaml", "got empty document"),
        ("{\"a\": 1,", "json", "invalid JSON at line 1 column 9"),
        ("a: [1, 2\nb: 3\n", "yaml", "invalid YAML"),
        ("a: 1\n---\nb: 2\n", "yaml", "expected a single document"),
    ],
)
def test_unusable_input_gets_a_one_line_error(text: str, fmt: str, expected: str):
    with pytest.raises(PassportLoadError) as caught:
        parse_passport(text, format=fmt)
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message and "Traceback" not in message


def test_file_errors_name_the_file(tmp_path: Path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PassportLoadError, match=f"{missing}: cannot read"):
        load_passport(missing)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(PassportLoadError, match="not UTF-8"):
        load_passport(binary)
    broken = tmp_path / "broken.json"
    broken.write_text('{"adl_spec": "0.3.0",\n  "name": }')
    with pytest.raises(PassportLoadError, match=r"broken.json: invalid JSON at line 2 column 11"):
        load_passport(broken)


# --- the pin ------------------------------------------------------------------------------


def test_digest_is_base64url_sha256_of_the_jcs_bytes_signature_included():
    document = load_passport(EXAMPLE)
    pin = PinnedPassport(document)
    assert pin.canonical_bytes == canonicalize(document)
    assert pin.digest == digest_of(document) == passport_digest(document)
    assert len(pin.digest) == 43 and "=" not in pin.digest
    unsigned = json.loads(json.dumps(document))
    del unsigned["security"]["attestation"]["signature"]
    assert passport_digest(unsigned) != pin.digest


def test_digest_is_stable_across_json_and_yaml_renderings(tmp_path: Path):
    document = load_passport(EXAMPLE)
    reordered = dict(reversed(list(document.items())))
    (tmp_path / "a.json").write_text(json.dumps(reordered, separators=(",", ":")))
    (tmp_path / "b.yaml").write_bytes(dump_passport(document, "yaml"))
    digests = {
        PinnedPassport(load_passport(EXAMPLE)).digest,
        PinnedPassport(load_passport(tmp_path / "a.json")).digest,
        PinnedPassport(load_passport(tmp_path / "b.yaml")).digest,
    }
    assert len(digests) == 1


def test_pinned_passport_cannot_be_changed():
    document = load_passport(EXAMPLE)
    pin = PinnedPassport(document)
    with pytest.raises(AttributeError):
        pin.digest = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        pin.canonical_bytes = b"{}"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del pin.digest
    with pytest.raises(TypeError):
        pin.budget["tokens"] = {"per_session": 10**9}  # type: ignore[index]
    with pytest.raises(TypeError):
        pin.budget["tokens"]["per_session"] = 10**9  # type: ignore[index]
    with pytest.raises(TypeError):
        pin.tools[0]["requires_confirmation"] = False  # type: ignore[index]
    with pytest.raises(AttributeError):
        pin.tools.append({})  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        pin.frozen["runtime"]["degradation"]["on_oversight_timeout"] = {"action": "continue"}  # type: ignore[index]
    # the caller's document is not shared with the pin
    document["permissions"]["resource_limits"]["budget"]["tokens"]["per_session"] = 1
    assert pin.budget["tokens"]["per_session"] == 20000
    # .document is a plain copy: changing it changes nothing pinned
    copy = pin.document
    copy["permissions"]["resource_limits"]["budget"]["tokens"]["per_session"] = 1
    assert pin.budget["tokens"]["per_session"] == 20000
    assert pin.check_presented(pin.document)


def test_pin_exposes_the_governed_members():
    pin = PinnedPassport(load_passport(EXAMPLE))
    assert (pin.id, pin.name, pin.version) == ("https://example.com/agents/research-assistant",
                                               "Research Assistant", "1.0.0")
    assert pin.resource_limits["max_concurrent"] == 4
    assert pin.budget["tokens"] == {"per_session": 20000, "per_day": 200000}
    assert [p["name"] for p in pin.sub_agents] == ["searcher", "summarizer"]
    assert pin.delegation["max_depth"] == 2
    assert {t["name"] for t in pin.tools if t.get("requires_confirmation")} == {"delete_note", "send_email"}
    assert pin.tool_invocation["loop_detection"]["window"] == 3
    assert pin.error_handling["on_tool_error"] == "retry"
    assert "on_oversight_timeout" not in pin.degradation and "on_budget_exhausted" in pin.degradation
    assert pin.human_oversight["intervention_model"] == "approve_reject"
    assert pin.anomaly_baseline["cost_per_session_usd"]["max"] == 0.4
    assert pin.data_classification["sensitivity"] == "internal"
    json.dumps(pin.document)  # plain JSON for other code
    bare = PinnedPassport({"adl_spec": "0.3.0", "name": "n", "description": "d", "version": "1.0.0",
                           "data_classification": {"sensitivity": "public"}})
    assert bare.budget is None and bare.tools is None and bare.degradation is None and bare.id is None


def test_check_presented_detects_any_change():
    document = load_passport(EXAMPLE)
    pin = PinnedPassport(document)
    assert pin.check_presented(EXAMPLE.read_bytes())  # the same passport as YAML bytes
    assert pin.check_presented(dump_passport(document, "json"))  # ... and as JSON bytes
    assert pin.check_presented(json.dumps(document))
    assert pin.matches_digest(passport_digest(document))

    changed = json.loads(json.dumps(document))
    changed["permissions"]["resource_limits"]["budget"]["tokens"]["per_session"] = 20001
    assert not pin.check_presented(changed)
    assert not pin.check_presented(dump_passport(changed, "json"))
    assert not pin.matches_digest(passport_digest(changed))

    resigned = json.loads(json.dumps(document))
    resigned["security"]["attestation"]["signature"]["signed_content"] = "digest"
    assert not pin.check_presented(resigned)
    assert not pin.check_presented(b"{not a passport")
    assert not pin.check_presented({"a": float("nan")})


def test_pin_refuses_what_is_not_plain_json():
    with pytest.raises(PassportError, match="not plain JSON"):
        PinnedPassport({"when": object()})
