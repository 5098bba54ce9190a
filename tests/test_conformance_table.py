"""docs/reference/conformance.md: every row names tests that exist, quotes the spec
verbatim, and every MUST/SHOULD/REQUIRED sentence of the spec (§1–§8, the Conformance
Tiers, the Security Considerations) has a row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import shared_path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "docs" / "reference" / "conformance.md"
STATUSES = {"done", "partial", "missing"}


def _rows() -> list[dict[str, str]]:
    rows = []
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) != 5 or cells[0] in ("id", "---"):
            continue
        rid, quote, status, tests, note = cells
        rows.append({"id": rid, "quote": quote.strip("“”"), "status": status, "note": note,
                     "tests": re.findall(r"`([^`]+)`", tests)})
    return rows


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _requirement_sentences(spec: str) -> list[tuple[str, str]]:
    """(section, sentence) for each sentence with MUST, SHOULD or REQUIRED, §1 to the References."""
    body = spec[spec.index("\n1 "):spec.index("\nReferences\n")]
    found, section = [], "?"
    for line in body.split("\n"):
        heading = re.match(r"^(\d+(?:\.\d+)*) ", line)
        if heading and len(line) < 120:
            section = heading.group(1)
            continue
        if line.strip() in ("Conformance Tiers", "Security Considerations", "IANA Considerations"):
            section = line.strip()
            continue
        for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z•(])", line):
            if re.search(r"\b(MUST|SHOULD|REQUIRED)\b", sentence):
                found.append((section, _normal(sentence.strip())))
    return found


def test_the_table_has_rows_with_known_statuses_and_unique_ids():
    rows = _rows()
    assert len(rows) >= 60
    assert all(r["status"] in STATUSES for r in rows), [r["id"] for r in rows if r["status"] not in STATUSES]
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(r["note"] for r in rows if r["status"] != "done"), "a partial or missing row says what is missing"
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    assert f"{len(rows)} rows: {counts['done']} done, {counts['partial']} partial, {counts['missing']} missing." \
        in TABLE.read_text(encoding="utf-8")


def _missing_tests(rows: list[dict]) -> list[str]:
    """The test node ids the rows name that do not exist: a file under tests/ defining the function."""
    missing = []
    for row in rows:
        if not row["tests"] and row["status"] != "missing":
            missing.append(f"{row['id']}: names no test")
        for name in row["tests"]:
            path, _, function = name.partition("::")
            file = REPO / path
            if not (path.startswith("tests/") and function and file.is_file()
                    and re.search(rf"^(async )?def {re.escape(function)}\(", file.read_text(encoding="utf-8"), re.M)):
                missing.append(f"{row['id']}: {name}")
    return missing


def test_every_test_a_row_names_exists():
    missing = _missing_tests(_rows())
    assert not missing, missing


@pytest.mark.parametrize("name", [
    "tests/test_causes.py::test_no_such_test",  # a file that exists, a function that does not
    "tests/test_no_such_file.py::test_approvals_and_fitting_are_not_recorded_as_continue",
    "tests/test_causes.py",  # no function named
    "governor/policy/causes.py::cause_table_markdown",  # not a test
    "tests/test_causes.py::test_approvals",  # a prefix of a test's name is not that test
])
def test_the_existence_check_can_fail(name):
    real = "tests/test_causes.py::test_approvals_and_fitting_are_not_recorded_as_continue"
    row = {"id": "x", "status": "done", "tests": [real, name]}
    assert _missing_tests([row]) == [f"x: {name}"]
    assert _missing_tests([{"id": "y", "status": "done", "tests": []}]) == ["y: names no test"]


def test_every_quote_is_in_the_spec_and_every_requirement_sentence_has_a_row():
    spec = shared_path("spec", "runtime-protocol.txt").read_text(encoding="utf-8")
    text = _normal(spec)
    rows = [r for r in _rows() if r["quote"] != "—"]
    assert not [r["id"] for r in rows if _normal(r["quote"]) not in text]
    sentences = _requirement_sentences(spec)
    assert len(sentences) >= 50
    uncovered = [f"{section}: {sentence[:90]}" for section, sentence in sentences
                 if not any(_normal(r["quote"]) in sentence for r in rows)]
    assert not uncovered, uncovered


@pytest.mark.parametrize("sentence", [
    "The governor MUST log every request.",  # a requirement the table does not list is caught
])
def test_the_coverage_check_can_fail(sentence):
    spec = "\n1 Intro\n" + sentence + "\nReferences\n"
    assert _requirement_sentences(spec) == [("1", sentence)]
    assert not any(_normal(r["quote"]) in sentence for r in _rows() if r["quote"] != "—")
