"""The witness's HTTP interface (c2sp.org/tlog-witness), as an aiohttp app:

  POST /add-checkpoint              old size, consistency proof, signed checkpoint ->
                                    the witness's cosignature line (text/plain)
  GET  /<sha256(origin) hex>/checkpoint   the checkpoint last cosigned, with its signatures

Each add-checkpoint is checked and persisted with no await in between, so requests are
serialized on the event loop: the check of the old size and the write of the new state
are atomic, as the spec requires.
"""

from __future__ import annotations

import hashlib
import logging

from aiohttp import web

from governor.evidence.tlog.witness import (
    MAX_REQUEST_BYTES,
    SIZE_CONTENT_TYPE,
    Witness,
    WitnessRefusal,
    parse_add_checkpoint,
)
from governor.witness.state import StateFile

log = logging.getLogger("governor.witness")
TEXT = "text/plain; charset=utf-8"


class WitnessRoutes:
    def __init__(self, witness: Witness, state: StateFile) -> None:
        self.witness = witness
        self.state = state

    async def add_checkpoint(self, request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > MAX_REQUEST_BYTES:
            return refusal(WitnessRefusal(413, f"the request is over {MAX_REQUEST_BYTES} bytes"))
        try:
            body = await request.read()  # the whole body, bounded by the app's client_max_size
        except web.HTTPRequestEntityTooLarge:
            return refusal(WitnessRefusal(413, f"the request is over {MAX_REQUEST_BYTES} bytes"))
        except (ValueError, ConnectionError) as problem:
            return refusal(WitnessRefusal(400, f"unreadable body: {problem}"))
        try:
            parsed = parse_add_checkpoint(body)
            checkpoint = self.witness.check(parsed, self.state)
            signature, new_state = self.witness.cosign(parsed, checkpoint)
            self.state.put(checkpoint.origin, new_state)  # durable before the answer
        except WitnessRefusal as problem:
            if problem.status in (403, 422):  # possible evidence of a misbehaving log
                log.warning("add-checkpoint refused (%s): %s", problem.status, problem)
            return refusal(problem)
        log.info("cosigned %s at size %d", checkpoint.origin, checkpoint.size)
        return web.Response(body=signature.line().encode("utf-8"), content_type="text/plain", charset="utf-8")

    async def checkpoint(self, request: web.Request) -> web.Response:
        wanted = request.match_info["origin_hash"]
        for origin, state in self.state.states.items():
            if hashlib.sha256(origin.encode("utf-8")).hexdigest() == wanted and state.note:
                return web.Response(body=state.note, content_type="text/plain", charset="utf-8")
        return web.Response(status=404, text="no checkpoint cosigned for that log\n")


def refusal(problem: WitnessRefusal) -> web.Response:
    if problem.status == 409:
        return web.Response(status=409, body=f"{problem.latest_size}\n".encode("ascii"),
                            headers={"Content-Type": SIZE_CONTENT_TYPE})
    return web.Response(status=problem.status, text=f"{problem}\n")


def create_app(witness: Witness, state: StateFile) -> web.Application:
    routes = WitnessRoutes(witness, state)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app.router.add_post("/add-checkpoint", routes.add_checkpoint)
    app.router.add_get("/{origin_hash:[0-9a-f]{64}}/checkpoint", routes.checkpoint)
    return app
