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


def test_every_test_a_row_names_exists():
    missing = []
    for row in _rows():
        assert row["tests"] or row["status"] == "missing", f"row {row['id']} names no test"
        for name in row["tests"]:
            path, _, function = name.partition("::")
            file = REPO / path
            if not (path.startswith("tests/") and function and file.is_file()
                    and re.search(rf"^(async )?def {re.escape(function)}\(", file.read_text(encoding="utf-8"), re.M)):
                missing.append(f"{row['id']}: {name}")
    assert not missing, missing


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
