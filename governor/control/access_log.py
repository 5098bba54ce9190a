"""The control plane's access log: probes and scrapes at DEBUG, everything else at INFO.

A kubelet probing /healthz and /readyz and Prometheus scraping /metrics every few seconds
would otherwise fill the log with one INFO line each (aiohttp's default access logger).
A probe or scrape that fails (status >= 400) is still logged at INFO: that is news."""

from __future__ import annotations

import logging

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
ACCESS_LOGGER = "governor.control.access"


class ControlAccessLogger(AbstractAccessLogger):
    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        path = request.path
        level = logging.DEBUG if path in QUIET_PATHS and response.status < 400 else logging.INFO
        if not self.logger.isEnabledFor(level):
            return
        self.logger.log(level, '%s "%s %s" %d %.3fs', request.remote, request.method, path, response.status, time,
                        extra={"method": request.method, "path": path, "status": response.status,
                               "duration_seconds": round(time, 6)})

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.DEBUG) or self.logger.isEnabledFor(logging.INFO)
