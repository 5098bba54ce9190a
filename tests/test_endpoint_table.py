"""The endpoint table (governor/adapters/endpoints.py): docs/reference/endpoints.md is what the
code says, and every row is well formed."""

from __future__ import annotations

from pathlib import Path

from governor.adapters import endpoints

ROOT = Path(__file__).resolve().parent.parent


def test_the_endpoint_document_is_generated_from_the_registry() -> None:
    document = (ROOT / "docs" / "reference" / "endpoints.md").read_text()
    assert document == endpoints.markdown(), (
        "docs/reference/endpoints.md is stale: python -m governor.adapters.endpoints > docs/reference/endpoints.md")


def test_every_row_has_a_probe_of_its_own_method_and_a_known_verdict() -> None:
    rows = endpoints.table()
    assert rows
    for row in rows:
        assert row.verdict in endpoints.VERDICTS, row
        assert row.probe.method == row.method, row
        assert row.probe.path.startswith("/"), row
        assert row.provider and row.family, row
