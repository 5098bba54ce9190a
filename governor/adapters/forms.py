"""multipart/form-data request bodies, read within bounds (image edits and variations, audio
transcriptions and translations; file uploads, governor.adapters.uploads, which keep the
file's bytes).

The parsing is python-multipart's (`MultipartParser`, the push parser Starlette and FastAPI
use): fed the body once, it calls back for each part's headers and data. The governor keeps the
text fields (bounded) and only the size of each file part: nothing of an upload is copied,
unless the caller asks for the files' bytes (`keep_files`: a batch file is read). What a server
could read differently from the governor is refused (FormError, a 400) rather than guessed at:
no boundary or one RFC 2046 does not allow, a body that does not end with the closing boundary,
a part without a form-data name, a field sent twice (servers disagree on which one wins), a
transfer encoding (RFC 7578 forbids it, and a server that decoded it would read another value),
a text field that is not UTF-8, too many parts or headers, a text field past its bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

MAX_PARTS = 256  # parts in one form (OpenAI's edit takes at most 16 images, plus a dozen fields)
MAX_FIELD_BYTES = 1024 * 1024  # one text field (a 32,000-character prompt is at most 128 KiB)
MAX_HEADER_BYTES = 16 * 1024  # one part's headers, all together
MAX_BOUNDARY = 70  # RFC 2046 §5.1.1


class FormError(ValueError):
    """The body is not a multipart form the governor reads the way a server would."""


@dataclass(frozen=True, slots=True)
class FilePart:
    """A file field: its form name, file name, declared type and size in bytes (its bytes only
    when read_form was asked to keep them)."""

    name: str
    filename: str
    content_type: str
    size: int
    content: bytes = b""


@dataclass(slots=True)
class Form:
    fields: dict[str, str] = field(default_factory=dict)
    files: list[FilePart] = field(default_factory=list)

    def files_named(self, *names: str) -> list[FilePart]:
        return [part for part in self.files if part.name in names]


class _Reader:
    """The parser's callbacks: one part at a time, bounded."""

    def __init__(self, max_field_bytes: int, max_parts: int, keep_files: bool) -> None:
        self.form = Form()
        self.max_field_bytes = max_field_bytes
        self.max_parts = max_parts
        self.keep_files = keep_files
        self.in_headers = False  # between a part's boundary and the blank line after its headers
        self.parts = 0
        self.names: set[str] = set()
        self._reset()

    def _reset(self) -> None:
        self.headers: dict[str, str] = {}
        self.header_bytes = 0
        self.field_buf = bytearray()
        self.value_buf = bytearray()
        self.name: str | None = None
        self.filename: str | None = None
        self.data = bytearray()
        self.size = 0

    def part_begin(self) -> None:
        self.parts += 1
        if self.parts > self.max_parts:
            raise FormError(f"the form has more than {self.max_parts} parts")
        self._reset()
        self.in_headers = True

    def _grow(self, buffer: bytearray, data: bytes, start: int, end: int) -> None:
        self.header_bytes += end - start
        if self.header_bytes > MAX_HEADER_BYTES:
            raise FormError(f"a part's headers exceed {MAX_HEADER_BYTES} bytes")
        buffer += data[start:end]

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._grow(self.field_buf, data, start, end)

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._grow(self.value_buf, data, start, end)

    def header_end(self) -> None:
        name = self.field_buf.decode("latin-1").strip().lower()
        if name in self.headers:
            raise FormError(f"a part repeats its {name!r} header")
        self.headers[name] = self.value_buf.decode("latin-1").strip()
        self.field_buf, self.value_buf = bytearray(), bytearray()

    def headers_finished(self) -> None:
        self.in_headers = False
        encoding = self.headers.get("content-transfer-encoding", "binary").lower()
        if encoding not in ("binary", "8bit", "7bit"):
            raise FormError(f"a part has Content-Transfer-Encoding {encoding!r} (RFC 7578 forbids encoded parts)")
        kind, options = parse_options_header(self.headers.get("content-disposition", ""))
        name = options.get(b"name")
        if kind != b"form-data" or name is None:
            raise FormError("a part without a field name (a Content-Disposition: form-data with a name)")
        self.name = name.decode("utf-8", "replace")
        filename = options.get(b"filename")
        self.filename = filename.decode("utf-8", "replace") if filename is not None else None

    def part_data(self, data: bytes, start: int, end: int) -> None:
        self.size += end - start
        if self.filename is None:
            if self.size > self.max_field_bytes:
                raise FormError(f"form field {self.name!r} exceeds {self.max_field_bytes} bytes")
            self.data += data[start:end]
        elif self.keep_files:
            self.data += data[start:end]

    def part_end(self) -> None:
        name = self.name
        if name is None:
            raise FormError("a part ended before its headers")
        if self.filename is not None:
            self.form.files.append(FilePart(name, self.filename, self.headers.get("content-type", ""), self.size,
                                            bytes(self.data) if self.keep_files else b""))
            return
        # array fields (image[] of an edit) repeat by design; a scalar sent twice is ambiguous
        if name in self.names and not name.endswith("[]"):
            raise FormError(f"form field {name!r} given twice (servers differ on which one they read)")
        self.names.add(name)
        try:
            value = self.data.decode("utf-8")
        except UnicodeDecodeError:
            raise FormError(f"form field {name!r} is not UTF-8 text") from None
        if not name.endswith("[]"):
            self.form.fields[name] = value


def boundary_of(content_type: str | None) -> bytes:
    """The multipart boundary of a Content-Type, or FormError."""
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data":
        raise FormError(f"expected a multipart/form-data body, got Content-Type {content_type or 'none'!r}")
    boundary = options.get(b"boundary")
    if not boundary or len(boundary) > MAX_BOUNDARY:
        raise FormError("the multipart/form-data Content-Type has no valid boundary (1 to 70 characters)")
    return boundary


def read_form(content_type: str | None, body: bytes, *, max_field_bytes: int = MAX_FIELD_BYTES,
              max_parts: int = MAX_PARTS, keep_files: bool = False) -> Form:
    """The form in `body` (the whole request body, already bounded by the proxy), or FormError;
    with `keep_files`, each file part's bytes too."""
    reader = _Reader(max_field_bytes, max_parts, keep_files)
    callbacks = {
        "on_part_begin": reader.part_begin, "on_part_data": reader.part_data, "on_part_end": reader.part_end,
        "on_header_field": reader.header_field, "on_header_value": reader.header_value,
        "on_header_end": reader.header_end, "on_headers_finished": reader.headers_finished,
    }
    parser = MultipartParser(boundary_of(content_type), callbacks)  # type: ignore[arg-type]
    try:
        parser.write(body)
    except MultipartParseError as exc:
        if reader.in_headers:
            raise FormError(f"malformed multipart part headers (each a 'Name: value' line, then the blank line "
                            f"after its headers): {exc}") from None
        raise FormError(f"malformed multipart body: {exc}") from None
    if parser.state is not MultipartState.END:
        raise FormError("the multipart body does not end with its closing boundary")
    return reader.form


__all__ = ["Form", "FilePart", "FormError", "read_form", "boundary_of", "MAX_PARTS", "MAX_FIELD_BYTES"]
