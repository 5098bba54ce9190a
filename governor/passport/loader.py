"""Reading passport bytes into a plain JSON value (governor.common.documents), and writing it back.

A passport is signed over its JCS bytes, so loading must not change any value:
YAML is read with the YAML 1.2 core schema (timestamps, `yes`/`no`, `0777` and
`1:20` stay what JSON would make of them; PyYAML's default YAML 1.1 resolver
would turn ISO times into datetime objects and so change the signed bytes).
Anything JSON cannot carry (NaN, infinities, binary, sets, non-string keys,
integers beyond 2**53 that JCS would round) and duplicate keys are refused with
the JSON path of the offending value.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from governor.common.documents import (
    JSON,
    MAX_DOCUMENT_BYTES,
    YAML,
    DocumentError,
    first_non_json_value,
    parse_document,
    read_document_file,
    type_name,
)
from governor.passport.errors import PassportError, PassportLoadError

__all__ = ["JSON", "YAML", "dump_passport", "first_non_json_value", "format_for_path", "load_passport",
           "parse_passport", "type_name"]


def parse_passport(data: bytes | str, *, format: str | None = None, source: str = "passport",
                   max_bytes: int = MAX_DOCUMENT_BYTES) -> dict[str, Any]:
    """Parse passport text (JSON or YAML; sniffed when `format` is None) into a JSON object.

    Bounded (governor.common.documents): at most `max_bytes`, MAX_DEPTH levels, no YAML anchors or aliases."""
    try:
        return parse_document(data, format=format, source=source, what="passport", max_bytes=max_bytes)
    except DocumentError as exc:
        raise PassportLoadError(str(exc)) from None


def load_passport(source: str | os.PathLike[str] | bytes, *, format: str | None = None) -> dict[str, Any]:
    """Load a passport from a file path, or from bytes (JSON or YAML).

    A path's suffix picks the format (.json; .yaml/.yml); otherwise it is sniffed.
    Raises PassportLoadError with a one-line reason for anything unusable.
    """
    if isinstance(source, bytes):
        return parse_passport(source, format=format)
    path = Path(source)
    data = read_document_file(path, PassportLoadError)
    if format is None:
        format = format_for_path(path)
    return parse_passport(data, format=format, source=str(path))


def format_for_path(path: str | os.PathLike[str]) -> str | None:
    suffix = Path(path).suffix.lower()
    return {".json": JSON, ".yaml": YAML, ".yml": YAML}.get(suffix)


def dump_passport(document: dict[str, Any], format: str = JSON) -> bytes:
    """Serialize a passport for humans (indented JSON, or block YAML).

    The YAML is read back with the passport loader and must give the same value,
    so a signed document stays signed once written.
    """
    if format == JSON:
        return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    if format != YAML:
        raise ValueError(f"unknown passport format {format!r}")
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
    if parse_passport(text, format=YAML) != document:
        raise PassportError("the document does not survive a YAML round trip; write it as JSON")
    return text.encode("utf-8")
