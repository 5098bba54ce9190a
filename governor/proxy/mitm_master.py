"""The embedded mitmproxy master's set-up: its options for the settings, and what tells
`serve` that its servers are up or why they could not come up (a port in use, a bad
certificate, mitmproxy's own advice rewritten to name the governor's options)."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from mitmproxy.addons import errorcheck

from governor.proxy.settings import Settings


class ListenAdvice(logging.Filter):
    """While the proxy starts: mitmproxy's "could not listen" error advises `--mode MODE@PORT`,
    a mitmproxy option the governor does not have; the advice is rewritten to name `--listen`,
    and the listen errors are kept for the StartupError (other errors are left as they are)."""

    MITMPROXY_ADVICE = re.compile(r"\s*Try specifying a different port by using `--mode [^`]*`\.?")
    ADVICE = "choose another address with --listen HOST:PORT"

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "failed to listen" in (text := record.getMessage()):
            message = self.MITMPROXY_ADVICE.sub("", text)
            self.errors.append(message)
            record.msg, record.args = f"{message}; {self.ADVICE}", None
        return True


class ProxyStartFailed(Exception):
    """mitmproxy logged errors while starting (a port in use, a bad certificate)."""


class StartupErrorCheck(errorcheck.ErrorCheck):
    """mitmproxy's start-up check, ending the proxy's task instead of the process
    (mitmproxy's calls sys.exit): `serve` then raises a StartupError that says why."""

    name = "errorcheck"  # the name mitmproxy's Master looks it up by

    async def shutdown_if_errored(self) -> None:
        await asyncio.sleep(0)  # as mitmproxy's: let the logging tasks finish first
        # Only mitmproxy's own errors mean its servers did not come up. The governor's are
        # reported where they happen (a duplicate identity found by the first sweep, a
        # webhook that failed) and its start-up failures are raised as StartupError.
        errors = [r for r in self.logger.has_errored if not r.name.startswith("governor")]
        if errors:
            raise ProxyStartFailed("; ".join(r.getMessage() for r in errors))


class Started:
    """Tells serve() when mitmproxy's servers are up (or failed to come up)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def running(self) -> None:
        self.event.set()


def master_options(settings: Settings) -> dict[str, Any]:
    """mitmproxy options for these settings (set once the addons that define them are added)."""
    opts: dict[str, Any] = dict(
        listen_host=settings.listen[0],
        listen_port=settings.listen[1],
        mode=[settings.mode] + ([f"transparent@{settings.transparent[0]}:{settings.transparent[1]}"]
                                if settings.transparent is not None else []),
        confdir=str(settings.data_dir),
        connection_strategy="lazy",
        ssl_insecure=settings.upstream_insecure,
        # mitmproxy's own inactivity bound, for what the connection guard does not time
        # (tunnels, a stream in flight): never shorter than the upstream's allowed silence
        tcp_timeout=int(max(600, settings.upstream_timeout + 60)),
        # what mitmproxy buffers of one body (every request; answers the governor reads whole):
        # without it a hostile agent or upstream had the governor hold any size in memory.
        # Nothing the governor reads is larger; streamed answers are not buffered, so not bound.
        body_size_limit=str(max(settings.max_body_bytes, settings.max_response_bytes)),
    )
    if settings.upstream_ca is not None:
        opts["ssl_verify_upstream_trusted_ca"] = str(settings.upstream_ca)
    return opts
