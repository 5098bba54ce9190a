"""Conformance evidence against the official ADL test data (../shared/adl).

- the 23 verify vectors, every expected field and step outcome;
- the official examples admitted, the invalid conformance files rejected (strict);
- the project's own schemas give the same verdict as the official ones on every
  official document and on a set of mutations of them, open and strict.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any, Callable

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from governor.passport import AdmissionConfig, Retrieval, admit, example_passport_path, load_passport
from governor.passport.schema import FORMAT_CHECKER, GOVERNANCE_PROFILE, validate
from tests.conftest import shared_path

# Vector 051 expects a near-expiry warning for expires_at 2026-06-30T14:25:18Z: the
# clock must sit within the 30 days before it (and after the vectors' issued_at).
VECTOR_CLOCK = datetime(2026, 6, 15, tzinfo=timezone.utc)


# The official data's case names, fixed here rather than read from ../shared at collection
# time: without ../shared every case is still a test, skipped by name with the reason
# (tests/conftest.py). test_official_data_is_all_here keeps these lists equal to the data.
VECTORS = (
    "001-valid-self-signed-tofu", "002-valid-did-resolved-cross-checked", "003-retrieval-local-file",
    "004-retrieval-missing-authority", "010-schema-missing-required-field", "011-schema-invalid-sensitivity-enum",
    "020-did-resolution-404", "021-did-document-no-assertion-method", "022-did-method-unsupported",
    "030-key-mismatch-inline-vs-did", "040-signature-tampered-post-signing", "041-signature-missing-when-required",
    "042-signature-wrong-key", "050-attestation-expired", "051-attestation-near-expiry-warn",
    "060-lifecycle-retired", "061-lifecycle-deprecated-warn", "062-lifecycle-draft-blocked",
    "070-provider-not-allowlisted", "071-provider-allowlisted", "080-classification-requesting-too-low",
    "081-classification-requesting-equal", "082-classification-requesting-higher",
)
# paths under ../shared/adl, sorted
OFFICIAL_DOCUMENTS = (
    "conformance/invalid/missing-required-name.yaml",
    "conformance/invalid/unknown-top-level-member.yaml",
    "conformance/valid/minimal.yaml",
    "conformance/valid/production.yaml",
    "examples/minimal.yaml",
    "examples/production.yaml",
    "examples/with-tools.yaml",
    "governance-examples/compliance-agent-tier3.json",
    "governance-examples/compliance-agent.json",
)
VALID_DOCUMENTS = tuple(d for d in OFFICIAL_DOCUMENTS if not d.startswith("conformance/invalid/"))
INVALID_DOCUMENTS = tuple(d for d in OFFICIAL_DOCUMENTS if d.startswith("conformance/invalid/"))


def _label(document: str) -> str:
    """A document's short name in test ids: its folder and file name."""
    return "/".join(document.split("/")[-2:])


def _vector_file(name: str) -> Path:
    return shared_path("adl", "verify-vectors", "vectors", f"{name}.json")


def _official_document(document: str) -> Path:
    return shared_path("adl", *document.split("/"))


def test_official_data_is_all_here():
    """The fixed case lists are exactly the official data: a vector or document added to
    ../shared (or removed from it) fails here rather than going untested."""
    adl = shared_path("adl")
    assert tuple(p.stem for p in sorted((adl / "verify-vectors" / "vectors").glob("*.json"))) == VECTORS
    found = [*adl.glob("examples/*"), *adl.glob("governance-examples/*.json"), *adl.glob("conformance/*/*")]
    assert tuple(sorted(p.relative_to(adl).as_posix() for p in found)) == OFFICIAL_DOCUMENTS


# --- verify vectors --------------------------------------------------------------------


def _vector_run(vector: dict[str, Any], now: datetime = VECTOR_CLOCK):
    config, given = vector["config"], vector["input"]
    # All "HTTP" is answered from the vector: a 200 body is a local DID document,
    # any other status leaves the URL unresolvable.
    documents = {
        url: response["body"]
        for url, response in (given.get("did_resolution_responses") or {}).items()
        if response["status"] == 200
    }
    documents.update(config.get("didLocalOverrides") or {})
    admission = AdmissionConfig(
        now=now,
        mode=config["mode"],
        require_signature=config["requireSignature"],
        require_did_resolution=config["requireDidResolution"],
        trust_on_first_use=config["trustOnFirstUse"],
        did_documents=documents,
        provider_allowlist=tuple(config["providerAllowlist"]),
        require_provider_coherence=config["requireProviderCoherence"],
    )
    retrieval = Retrieval(given["retrieval"]["channel"], given["retrieval"].get("authority"))
    return admit(given["passport"], admission, retrieval=retrieval, requesting_agent=given.get("requesting_agent"))


@pytest.mark.parametrize("name", VECTORS)
def test_verify_vector(name: str):
    vector = json.loads(_vector_file(name).read_text())
    expected = vector["expected"]
    report = _vector_run(vector)

    assert report.verified is expected["verified"], report.to_dict()
    assert report.public_key_source == expected["public_key_source"]
    assert report.blocked_at_section == expected["blocked_at_section"]
    for outcome in expected["step_outcomes"]:
        step = report.step(outcome["section"])
        assert step is not None, f"no outcome for {outcome['section']}: {report.to_dict()}"
        assert (step.passed, step.severity) == (outcome["passed"], outcome["severity"]), step
    # a blocked admission stops at the blocking step, which is the last one reported
    if expected["blocked_at_section"]:
        assert report.steps[-1].section == expected["blocked_at_section"]
        assert report.pinned is None
    else:
        assert report.pinned is not None and report.pinned.digest == report.digest


def test_vector_outcomes_depend_on_the_clock():
    """The fixed clock is what makes 051 a warning: a year later it is expired."""
    vector = json.loads(_vector_file("051-attestation-near-expiry-warn").read_text())
    assert _vector_run(vector).step("1.1.6").severity == "warn"
    expired = _vector_run(vector, now=datetime(2027, 1, 1, tzinfo=timezone.utc))
    assert expired.blocked_at_section == "1.1.6"
    assert "expired" in expired.step("1.1.6").message


# --- official examples ---------------------------------------------------------------


@pytest.mark.parametrize("document", VALID_DOCUMENTS, ids=_label)
def test_official_example_is_admitted(document: str):
    # Unsigned examples: a configuration that does not require a signature admits
    # them, and says they are unsigned.
    report = admit(load_passport(_official_document(document)), AdmissionConfig(now=VECTOR_CLOCK))
    assert report.verified, report.to_dict()
    signature = report.step("1.1.5")
    assert (signature.passed, signature.severity) == (True, "warn")
    assert "unsigned" in signature.message
    assert report.digest and report.pinned.digest == report.digest


@pytest.mark.parametrize("document", INVALID_DOCUMENTS, ids=lambda d: d.split("/")[-1])
def test_official_invalid_document_is_rejected_in_strict_mode(document: str):
    path = _official_document(document)
    report = admit(load_passport(path), AdmissionConfig(now=VECTOR_CLOCK, strict=True))
    assert not report.verified
    assert report.blocked_at_section == "1.1.2"
    issue_paths = [issue.path for issue in report.step("1.1.2").issues]
    assert issue_paths == {"missing-required-name.yaml": ["$.name"],
                           "unknown-top-level-member.yaml": ["$.notarealfield"]}[path.name]


def test_example_passport_meets_the_official_schemas():
    document = load_passport(example_passport_path())
    official = _official_validators()
    assert not list(official["open"].iter_errors(document))
    assert not list(official["governance"].iter_errors(document))
    assert not list(official["governance_strict"].iter_errors(document))


# --- schema verdicts: ours == official -------------------------------------------------------


@cache
def _official_validators() -> dict[str, Draft202012Validator]:
    schemas = {
        name: json.loads(shared_path("adl", "schemas", name).read_text())
        for name in ("schema.json", "schema-strict.json", "governance-profile.schema.json")
    }
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas.values())
    governance = schemas["governance-profile.schema.json"]
    # Spec §13.1: with profiles, the closed check applies once over base + profiles.
    governance_strict = {"$schema": governance["$schema"], "allOf": [{"$ref": governance["$id"]}],
                         "unevaluatedProperties": False}

    def build(schema: dict[str, Any]) -> Draft202012Validator:
        return Draft202012Validator(schema, registry=registry, format_checker=FORMAT_CHECKER)

    return {
        "open": build(schemas["schema.json"]),
        "strict": build(schemas["schema-strict.json"]),
        "governance": build(governance),
        "governance_strict": build(governance_strict),
    }


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = document
        for name in parents:
            node = node.setdefault(name, {})
        node[last] = value
    return mutate


def _delete(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda document: document.pop(name, None)


MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "as-is": lambda document: None,
    "no-name": _delete("name"),
    "no-data-classification": _delete("data_classification"),
    "unknown-member": _set("notarealfield", 1),
    "bad-version": _set("version", "1.0"),
    "bad-sensitivity": _set("data_classification.sensitivity", "secret"),
    "empty-categories": _set("data_classification.categories", []),
    "bad-lifecycle": _set("lifecycle", {"status": "paused"}),
    "bad-expiry": _set("security.attestation", {"type": "self", "expires_at": "next year"}),
    "signature-without-content": _set("security.attestation", {"signature": {"algorithm": "Ed25519", "value": "x"}}),
    "zero-budget": _set("permissions.resource_limits", {"budget": {"tokens": {"per_session": 0}}}),
    "budget-extra": _set("permissions.resource_limits", {"budget": {"tokens": {"per_hour": 5}}}),
    "good-budget": _set("permissions.resource_limits", {"max_concurrent": 2, "budget": {"cost_usd": {"per_session": 1, "per_day": 9}}}),
    "bad-degradation-action": _set("runtime.degradation", {"on_budget_exhausted": {"action": "explode"}}),
    "bad-degradation-cause": _set("runtime.degradation", {"budget_exhausted": {"action": "halt"}}),
    "good-degradation": _set("runtime.degradation", {"on_anomaly": {"action": "pause", "notify": True}}),
    "bad-tool-name": _set("tools", [{"name": "Bad Tool", "description": "x"}]),
    "nameless-persona": _set("permissions.sub_agents", [{"description": "no name"}]),
    "deep-delegation-zero": _set("permissions.delegation", {"match": ["*"], "max_depth": 0}),
    "loop-window-1": _set("runtime.tool_invocation", {"loop_detection": {"window": 1}}),
    "bad-extension-key": _set("extensions", {"nodots": {}}),
    "bad-tag": _set("metadata", {"tags": ["Bad Tag"]}),
    "prompt-object-extra": _set("system_prompt", {"template": "t", "x": 1}),
}
GOVERNANCE_MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "no-autonomy": _delete("autonomy"),
    "tier3-without-evaluation": lambda d: (d["autonomy"].update(tier=3), d.pop("evaluation_attestation", None)),
    "tier2-without-disclosure": lambda d: (d["autonomy"].update(tier=2), d.pop("disclosure", None)),
    "empty-triggers": _set("human_oversight.triggers", []),
    "bad-intervention": _set("human_oversight.intervention_model", "veto"),
    "trigger-empty-when": _set("human_oversight.triggers", [{"when": {}}]),
    "trigger-bad-predicate": _set("human_oversight.triggers", [{"when": {"cost_over": 1}}]),
    "share-above-one": _set("anomaly_baseline", {"expected_tools": [{"name": "x", "share": 1.5}]}),
    "bad-framework": _set("compliance_framework.primary_framework", "MADE_UP"),
}


def _cases() -> list[tuple[str, str]]:
    cases = []
    for document in OFFICIAL_DOCUMENTS:
        label = _label(document)
        cases += [(label, name) for name in MUTATIONS]
        if document.startswith("governance-examples/"):
            cases += [(label, name) for name in GOVERNANCE_MUTATIONS]
    for name in VECTORS:
        cases.append((f"vectors/{name}.json", "as-is"))
    return cases


def _document(label: str) -> dict[str, Any]:
    folder, name = label.split("/")
    if folder == "vectors":
        return json.loads(_vector_file(name.removesuffix(".json")).read_text())["input"]["passport"]
    [document] = [d for d in OFFICIAL_DOCUMENTS if _label(d) == label]
    return load_passport(_official_document(document))


@pytest.mark.parametrize(("label", "mutation"), _cases())
def test_our_schema_gives_the_official_verdict(label: str, mutation: str):
    document = copy.deepcopy(_document(label))
    {**MUTATIONS, **GOVERNANCE_MUTATIONS}[mutation](document)
    official = _official_validators()
    governed = GOVERNANCE_PROFILE in document.get("profiles", [])
    official_open = official["governance" if governed else "open"]
    official_strict = official["governance_strict" if governed else "strict"]

    assert (not validate(document)) == official_open.is_valid(document), validate(document)
    assert (not validate(document, strict=True)) == official_strict.is_valid(document), validate(document, strict=True)


def test_governance_members_without_the_profile_deliberate_difference():
    """Open mode checks human_oversight even when the profile is not declared (the
    official open schema does not): the governor acts on it, so it must be well formed.
    Strict mode refuses the member unless the profile is declared, like the official one."""
    document = load_passport(shared_path("adl", "conformance", "valid", "minimal.yaml"))
    document["human_oversight"] = {"triggers": [], "intervention_model": "approve_reject"}
    official = _official_validators()
    assert official["open"].is_valid(document)
    assert [str(i) for i in validate(document)] == ["$.human_oversight.triggers: [] should be non-empty"]
    document["human_oversight"]["triggers"] = ["a person looks at every report"]
    assert validate(document) == []
    assert not official["strict"].is_valid(document)
    assert [str(i) for i in validate(document, strict=True)] == [
        f"$.human_oversight: allowed only when `profiles` declares {GOVERNANCE_PROFILE}"
    ]
