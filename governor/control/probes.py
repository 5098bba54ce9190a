"""The open endpoints probes and scrapers call (they carry no token):

  GET /healthz    the process answers: {"status": "alive"}
  GET /readyz     the runtime's readiness check (200 ready, 503 not, with why; 503 while draining)
  GET /metrics    the Prometheus exposition (pending approvals counted at scrape time)
"""

from __future__ import annotations

import asyncio
import inspect

from aiohttp import web

from governor.control.context import ControlContext
from governor.control.replies import ok
from governor.runtime.metrics import CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE


class Probes:
    def __init__(self, context: ControlContext) -> None:
        self.runtime = context.runtime
        self.metrics = context.metrics
        self.ready_timeout = context.ready_timeout
        self.draining = context.draining  # () -> str | None: a graceful stop has begun

    async def healthz(self, request: web.Request) -> web.Response:
        return ok({"status": "alive"})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.draining is not None and (why := self.draining()):  # a Service stops sending at once
            return ok({"ready": False, "draining": True, "reason": why}, status=503)
        check = getattr(self.runtime, "ready", None)
        if check is None:
            return ok({"ready": False, "reason": "the runtime does not report readiness"}, status=503)
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, self.ready_timeout)
        except asyncio.TimeoutError:
            return ok({"ready": False, "reason": f"readiness check took over {self.ready_timeout:g}s"}, status=503)
        except Exception as exc:  # the runtime's check failed: not ready, and say why
            return ok({"ready": False, "reason": f"readiness check failed: {exc}"}, status=503)
        body = dict(result) if isinstance(result, dict) else {"ready": bool(result)}
        return ok(body, status=200 if body.get("ready") else 503)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        self.metrics.set_pending_approvals(len(self.runtime.approvals()))
        if "application/openmetrics-text" in request.headers.get("Accept", ""):  # exemplars: trace ids
            return web.Response(body=self.metrics.exposition(openmetrics=True),
                                headers={"Content-Type": OPENMETRICS_CONTENT_TYPE})
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})


def add_routes(app: web.Application, context: ControlContext) -> None:
    probes = Probes(context)
    app.router.add_get("/healthz", probes.healthz)
    app.router.add_get("/readyz", probes.readyz)
    app.router.add_get("/metrics", probes.metrics_endpoint)
