"""Persona instances through the control plane (docs/personas.md):

  GET  /v1/sessions/{session}/personas              the session's live persona instances
  POST /v1/sessions/{session}/personas/{persona}/end  end one: body {"instance": "<id>"}, or
                                                      no body for the implicit instance

Both take the control token when one is set, as the other /v1 endpoints. Ending an
instance records its end in the session's record and frees its parallel slot.
"""

from __future__ import annotations

from aiohttp import web

from governor.control.context import ControlContext
from governor.control.replies import checked_body, error, ok, operator_refusal, unknown_session
from governor.runtime.personas import MAX_INSTANCE_LENGTH, MAX_PERSONA_LENGTH


class PersonaRoutes:
    """The endpoints above, over the runtime of a `ControlContext` (its persona registry)."""

    def __init__(self, context: ControlContext) -> None:
        self.runtime = context.runtime
        self.operators = context.operators
        self.reviewers = context.reviewers

    def _registry(self):
        return getattr(self.runtime, "personas", None)

    async def list_instances(self, request: web.Request) -> web.Response:
        if refusal := operator_refusal(request, self.operators, self.reviewers):
            return refusal
        session = request.match_info["session"]
        registry = self._registry()
        if registry is None or not self.runtime.has_session(session):
            return unknown_session(session)
        return ok({"session": session, "instances": registry.instances(session)})

    async def end_instance(self, request: web.Request) -> web.Response:
        refusal = operator_refusal(request, self.operators, self.reviewers)
        body, refusal = await checked_body(request, refusal, optional=True)
        if refusal:
            return refusal
        session, persona = request.match_info["session"], request.match_info["persona"]
        instance = body.get("instance")
        if instance is not None and (not isinstance(instance, str) or not 0 < len(instance) <= MAX_INSTANCE_LENGTH):
            return error(400, "bad_instance", f'"instance" must be an instance id of 1-{MAX_INSTANCE_LENGTH} characters')
        if len(persona) > MAX_PERSONA_LENGTH:
            return error(400, "bad_persona", f"a persona name has at most {MAX_PERSONA_LENGTH} characters")
        registry = self._registry()
        if registry is None:
            return unknown_session(session)
        try:
            ended = await registry.end(session, persona, instance, "ended_by_control")
        except KeyError:
            which = f"instance {instance!r}" if instance is not None else "the implicit instance"
            return error(404, "unknown_persona_instance", f"session {session!r} has no live {which} of persona {persona!r}")
        return ok(ended)


def add_routes(app: web.Application, context: ControlContext) -> None:
    routes = PersonaRoutes(context)
    app.router.add_get("/v1/sessions/{session}/personas", routes.list_instances)
    app.router.add_post("/v1/sessions/{session}/personas/{persona}/end", routes.end_instance)
