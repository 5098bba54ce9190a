"""One multipart reader (governor.adapters.forms, python-multipart) serves both the media
endpoints and file uploads (governor.adapters.uploads): an upload's file bytes come through it
exactly, and what a server could read otherwise is refused in both."""

from __future__ import annotations

import httpx
import pytest

from governor.adapters.forms import FormError, read_form
from governor.adapters.request_view import BadRequest
from governor.adapters.uploads import MAX_FORM_PARTS, form_fields


def encoded(fields: dict[str, str], files: list[tuple[str, bytes]]) -> tuple[str, bytes]:
    """A form as httpx (the openai SDK's client) encodes it."""
    request = httpx.Request("POST", "https://api.openai.com/v1/files", data=fields,
                            files=[(name, ("in.jsonl", data)) for name, data in files])
    return request.headers["content-type"], request.read()


def test_an_uploaded_files_bytes_come_through_the_shared_reader_exactly():
    # bytes that look like boundaries and CRLFs, and bytes that are not UTF-8
    data = b'{"a": 1}\r\n--not-the-boundary\r\n\r\n\xff\xfe\x00' * 50
    content_type, body = encoded({"purpose": "batch"}, [("file", data)])
    assert form_fields(content_type, body) == {"purpose": b"batch", "file": data}
    # the media endpoints' reading of the same form keeps only the file's size
    form = read_form(content_type, body)
    assert form.fields == {"purpose": "batch"} and [(f.name, f.size, f.content) for f in form.files] == \
        [("file", len(data), b"")]


def test_a_file_field_given_twice_is_refused():
    content_type, body = encoded({"purpose": "batch"}, [("file", b"a"), ("file", b"b")])
    with pytest.raises(BadRequest, match="'file' given twice"):
        form_fields(content_type, body)
    content_type, body = encoded({"file": "text"}, [("file", b"bytes")])
    with pytest.raises(BadRequest, match="'file' given twice"):
        form_fields(content_type, body)


def test_an_upload_with_more_parts_than_a_file_form_has_is_refused_where_a_media_form_is_read():
    content_type, body = encoded({f"f{i}": "x" for i in range(MAX_FORM_PARTS)}, [("file", b"data")])
    with pytest.raises(BadRequest, match=f"more than {MAX_FORM_PARTS} parts"):
        form_fields(content_type, body)
    assert len(read_form(content_type, body).fields) == MAX_FORM_PARTS


@pytest.mark.parametrize("body, says", [
    (b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\nno colon here\r\n\r\nx\r\n--b--\r\n", "headers"),
    (b"--b\r\nContent-Disposition: form-data; name=\"a\"; filename=\"f\"\r\n\r\nx\r\n--b", "closing boundary"),
    (b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n\xff\r\n--b--\r\n", "not UTF-8"),
])
def test_hostile_forms_are_refused_alike_by_both_readers(body, says):
    with pytest.raises(FormError, match=says):
        read_form("multipart/form-data; boundary=b", body)
    with pytest.raises(BadRequest, match=says):
        form_fields("multipart/form-data; boundary=b", body)
