"""Persona instances through the control plane (docs/personas.md):

  GET  /v1/sessions/{session}/personas              the session's live persona instances
  POST /v1/sessions/{session}/personas/{persona}/end  end one: body {"instance": "<id>"}, or
                                                      no body for the implicit instance

Both take the control token when one is set, as the other /v1 endpoints. Ending an
instance records its end in the session's record and frees its parallel slot.
"""

from __future__ import annotations

from aiohttp import web

from governor.control.app import OPERATORS, REVIEWERS, RUNTIME
from governor.control.replies import checked_body, error, ok, operator_refusal, unknown_session
from governor.personas import MAX_INSTANCE_LENGTH, MAX_PERSONA_LENGTH


def _registry(request: web.Request):
    return getattr(request.app[RUNTIME], "personas", None)


async def list_instances(request: web.Request) -> web.Response:
    if refusal := operator_refusal(request, request.app[OPERATORS], request.app[REVIEWERS]):
        return refusal
    session = request.match_info["session"]
    registry = _registry(request)
    if registry is None or not request.app[RUNTIME].has_session(session):
        return unknown_session(session)
    return ok({"session": session, "instances": registry.instances(session)})


async def end_instance(request: web.Request) -> web.Response:
    body, refusal = await checked_body(request, operator_refusal(request, request.app[OPERATORS], request.app[REVIEWERS]), optional=True)
    if refusal:
        return refusal
    session, persona = request.match_info["session"], request.match_info["persona"]
    instance = body.get("instance")
    if instance is not None and (not isinstance(instance, str) or not 0 < len(instance) <= MAX_INSTANCE_LENGTH):
        return error(400, "bad_instance", f'"instance" must be an instance id of 1-{MAX_INSTANCE_LENGTH} characters')
    if len(persona) > MAX_PERSONA_LENGTH:
        return error(400, "bad_persona", f"a persona name has at most {MAX_PERSONA_LENGTH} characters")
    registry = _registry(request)
    if registry is None:
        return unknown_session(session)
    try:
        ended = await registry.end(session, persona, instance, "ended_by_control")
    except KeyError:
        which = f"instance {instance!r}" if instance is not None else "the implicit instance"
        return error(404, "unknown_persona_instance", f"session {session!r} has no live {which} of persona {persona!r}")
    return ok(ended)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/sessions/{session}/personas", list_instances)
    app.router.add_post("/v1/sessions/{session}/personas/{persona}/end", end_instance)
