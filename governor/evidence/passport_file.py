"""Reading the admitted passport for §8.6 step 4, without importing the passport room.

The digest in a record is base64url(SHA-256(JCS(passport))) of the document as the
governor loaded it, so the verifier reads a passport with the very same code the
passport room uses (governor.common.documents: JSON, or YAML under the 1.2 core schema).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from governor.common.documents import JSON, YAML, DocumentError, parse_document, read_document_file
from governor.evidence.errors import InputError

_FORMATS = {".json": JSON, ".yaml": YAML, ".yml": YAML}


def load_passport(path: Path | str) -> dict[str, Any]:
    """The passport document in `path` (the format follows the suffix, else the first character);
    InputError says why it cannot be read."""
    path = Path(path)
    data = read_document_file(path, InputError)
    try:
        return parse_document(data, format=_FORMATS.get(path.suffix.lower()), source=str(path), what="passport")
    except DocumentError as exc:
        raise InputError(str(exc)) from None
