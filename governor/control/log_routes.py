"""The transparency log as C2SP tlog-tiles (docs/transparency-log.md):

  GET /log/checkpoint                       the latest signed checkpoint (text/plain)
  GET /log/tile/<L>/<N>[.p/<W>]             a Merkle tile
  GET /log/tile/entries/<N>[.p/<W>]         an entry bundle
  GET /log/log.vkey                         the checkpoint key (signed-note vkey)

Open to anyone by default (a log is for third parties); with the runtime's log set to
require a token, reads take the control token like the other reads. Full tiles and
partial tiles of a width never change: their cache headers say so. The files served are
those under DATA_DIR/log/, which a static web server can serve the same way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from governor.control.context import ControlContext
from governor.control.replies import error, operator_refusal
from governor.evidence.tlog.tiles import TileError, parse_tile_path

IMMUTABLE = "public, max-age=31536000, immutable"
MUTABLE = "no-cache, max-age=5"


class LogRoutes:
    def __init__(self, context: ControlContext) -> None:
        self.log = getattr(context.runtime, "transparency_log", None)
        self.operators = context.operators
        self.reviewers = context.reviewers
        self.require_token = context.log_require_token

    def _refusal(self, request: web.Request) -> web.Response | None:
        if self.log is None:
            return error(404, "no_log", "this governor keeps no transparency log (--log off)")
        if self.require_token:
            return operator_refusal(request, self.operators, self.reviewers)
        return None

    async def checkpoint(self, request: web.Request) -> web.Response:
        if refusal := self._refusal(request):
            return refusal
        note = await asyncio.to_thread(self.log.checkpoint)
        return web.Response(body=note, headers={"Content-Type": "text/plain; charset=utf-8", "Cache-Control": MUTABLE})

    async def vkey(self, request: web.Request) -> web.Response:
        if refusal := self._refusal(request):
            return refusal
        return web.Response(body=(self.log.signer.vkey() + "\n").encode(),
                            headers={"Content-Type": "text/plain; charset=utf-8", "Cache-Control": MUTABLE})

    async def tile(self, request: web.Request) -> web.Response:
        if refusal := self._refusal(request):
            return refusal
        relative = "tile/" + request.match_info["path"]
        try:
            tile = parse_tile_path(relative)
        except TileError as exc:
            return error(400, "tile_path_malformed", str(exc))
        path: Path = self.log.dir / tile.path()  # canonical: no `..`, no other file
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except (FileNotFoundError, NotADirectoryError):
            return error(404, "tile_not_found", f"{relative} is not in the log (yet)")
        return web.Response(body=data, headers={"Content-Type": "application/octet-stream", "Cache-Control": IMMUTABLE})


def add_routes(app: web.Application, context: ControlContext) -> None:
    routes = LogRoutes(context)
    app.router.add_get("/log/checkpoint", routes.checkpoint)
    app.router.add_get("/log/log.vkey", routes.vkey)
    app.router.add_get("/log/tile/{path:.+}", routes.tile)
