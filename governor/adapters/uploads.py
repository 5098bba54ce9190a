"""Files uploaded through the governor: a multipart/form-data body read within bounds, and
what the file declares (governor.adapters.deferred.DeclaredFile).

OpenAI's `POST /v1/files` carries `purpose` and `file` as form fields (what the official SDK
sends: httpx's multipart encoder). A batch file (`purpose=batch`) is JSONL, one request a
line (`{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}`): each
line's body is estimated as the OpenAI adapter estimates that call, and the file declares
their sum, its one model and its one endpoint (OpenAI refuses a batch mixing models or
endpoints). A fine-tuning file declares its size and examples; any other file its size (a
vector store embeds it). A batch file the governor cannot read line by line is refused at
upload (400, naming the line): a batch naming it could not be reserved for.
"""

from __future__ import annotations

from typing import Callable

import orjson

from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.deferred import DeclaredFile
from governor.adapters.forms import FormError, read_form

# OpenAI's own bounds: 50,000 requests per batch file; a form has two fields (a few more are
# tolerated, never hundreds).
MAX_BATCH_LINES = 50_000
MAX_FORM_PARTS = 16
BATCH = "batch"
FINE_TUNE = "fine-tune"

# A line's (route, body bytes) -> (model, normalized endpoint, expected input, expected output)
Estimator = Callable[[str, bytes], tuple[str, str, int, int]]


def form_fields(content_type: str, content: bytes) -> dict[str, bytes]:
    """The form's fields by name (the file's bytes under its field name), read by the one
    multipart reader (governor.adapters.forms). A field named twice is refused: which one the
    server reads is not the governor's to guess."""
    try:
        form = read_form(content_type, content, max_parts=MAX_FORM_PARTS, keep_files=True)
    except FormError as exc:
        raise BadRequest(str(exc)) from None
    fields = {name: value.encode() for name, value in form.fields.items()}
    for part in form.files:
        if part.name in fields:
            raise BadRequest(f"multipart field {part.name!r} given twice")
        fields[part.name] = part.content
    return fields


def declare(content_type: str, content: bytes, estimate: Estimator) -> DeclaredFile:
    """What an upload declares (see the module's docstring); BadRequest when it cannot be read."""
    fields = form_fields(content_type, content)
    purpose_bytes, data = fields.get("purpose"), fields.get("file")
    if purpose_bytes is None or data is None:
        raise BadRequest("a file upload needs the form fields 'purpose' and 'file'")
    try:
        purpose = purpose_bytes.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise BadRequest("the upload's 'purpose' is not UTF-8 text") from None
    if purpose == BATCH:
        return _batch_file(data, estimate)
    if purpose == FINE_TUNE:
        return DeclaredFile(purpose, len(data), lines=sum(1 for line in data.split(b"\n") if line.strip()))
    return DeclaredFile(purpose, len(data))


def _batch_file(data: bytes, estimate: Estimator) -> DeclaredFile:
    model = endpoint = None
    total_in = total_out = lines = 0
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        lines += 1
        if lines > MAX_BATCH_LINES:
            raise BadRequest(f"batch file has more than {MAX_BATCH_LINES} requests (OpenAI's limit)")
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"batch file line {number} is not JSON (UTF-8): {exc}") from None
        if not isinstance(line, dict):
            raise BadRequest(f"batch file line {number} is not a JSON object")
        url, body, method = line.get("url"), line.get("body"), line.get("method")
        if method != "POST" or not isinstance(url, str) or not isinstance(body, dict):
            raise BadRequest(f"batch file line {number}: each request needs method 'POST', a 'url' and a 'body' object")
        try:
            line_model, line_endpoint, expected_in, expected_out = estimate(url, orjson.dumps(body))
        except BadRequest as exc:
            raise BadRequest(f"batch file line {number}: {exc.message}") from None
        if model is None:
            model, endpoint = line_model, line_endpoint
        elif line_model != model or line_endpoint != endpoint:
            raise BadRequest(f"batch file line {number}: a batch names one model and one endpoint "
                             f"({model!r} at {endpoint}; this line {line_model!r} at {line_endpoint})")
        total_in += expected_in
        total_out += expected_out
    if model is None or endpoint is None:
        raise BadRequest("batch file has no requests")
    return DeclaredFile(BATCH, len(data), lines=lines, model=model, endpoint=endpoint, input_tokens=total_in,
                        output_tokens=total_out)


def request_view(host: str, route: str, body: bytes) -> RequestView:
    """A request as an adapter would see it, for estimating a call carried in another's body."""
    return RequestView("POST", host, route, {"content-type": "application/json"}, body)


__all__ = ["BATCH", "FINE_TUNE", "MAX_BATCH_LINES", "Estimator", "declare", "form_fields", "request_view"]
