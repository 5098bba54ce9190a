"""The control plane's answers and the checks every endpoint shares: JSON responses, JSON
errors ({"error": {"code", "message"}}), bearer-token refusals and reading a JSON body.

Plain functions: each takes what it checks (the request, the token sets) as arguments,
so `app` and the route modules use them alike without importing one another.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Collection

from aiohttp import web

from governor.control.auth import TokenSet, bearer
from governor.control.guard import Refusal, json_object


def jsonable(value: Any) -> Any:
    """`default` for the JSON encoders: enums, sets and dataclasses the runtime's views hold."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(data: Any) -> str:
    return json.dumps(data, default=jsonable, ensure_ascii=False)


def ok(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(data, status=status, headers=headers, dumps=_dumps)


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


def unknown_session(session: str) -> web.Response:
    return error(404, "unknown_session", f"no session {session!r} on this governor")


def bearer_refusal(request: web.Request, *accepted: Collection[str], required: str, invalid: str,
                   realm: str = "governor") -> web.Response | None:
    """None when the request's bearer token is in one of `accepted`, else the 401 that says
    what is `required` (no token) or that the token is `invalid`: the check every guarded
    endpoint makes (each decides itself what a missing configuration means)."""
    token = bearer(request.headers.get("Authorization"))
    if token is None:
        return error(401, "token_required", required, headers={"WWW-Authenticate": f'Bearer realm="{realm}"'})
    if any(token in tokens for tokens in accepted):
        return None
    return error(401, "token_invalid", invalid,
                 headers={"WWW-Authenticate": f'Bearer realm="{realm}", error="invalid_token"'})


def operator_refusal(request: web.Request, operators: TokenSet, reviewers: TokenSet) -> web.Response | None:
    """The read check: None when no control token is configured (reads are open) or the
    bearer is a control or reviewer token, else the 401."""
    if not operators:
        return None
    return bearer_refusal(request, operators, reviewers,
                          required="this control plane requires `Authorization: Bearer <control token>`",
                          invalid="the bearer token is not a control or reviewer token")


async def checked_body(request: web.Request, refusal: web.Response | None, *,
                       optional: bool = False) -> tuple[dict[str, Any] | None, web.Response | None]:
    """An endpoint's preamble: its access check's `refusal` when there is one, else the
    request's JSON object body (or why it is refused)."""
    if refusal is not None:
        return None, refusal
    return await json_body(request, optional=optional)


async def json_body(request: web.Request, *, optional: bool = False) -> tuple[dict[str, Any] | None, web.Response | None]:
    """The request's JSON object body, or the 400 that says why not (`optional`: no body is {})."""
    raw = await request.read()
    if not raw.strip():
        if optional:
            return {}, None
        return None, error(400, "body_required", "a JSON object body is required")
    try:
        return json_object(raw), None
    except Refusal as refusal:  # not JSON, not an object, nested too deep: a clear 400
        return None, error(refusal.status, refusal.code, refusal.message)
