"""`governor run`'s signals: SIGHUP reloads what can change safely, SIGTERM (and SIGINT) drains.

SIGHUP re-reads the settings as `governor run` read them at start (the command line, the
environment, the --config file, and the files they name: reviewer tokens, the control
token, the webhook secret), validates them whole, and applies what can change while running:

    reviewer_tokens, control_token   the control plane's token sets (the next request sees them)
    webhook (and its secret, webhook_*)  a new notifier; the old one finishes what it was sending
    log_level                        every logger's level
    allow, routes                    the adapter registry's allow-list and routes (the next request)
    drain_timeout                    read when SIGTERM comes

Every other setting that changed is logged as not reloaded ("restart to change it"): the
passport, listen addresses, the store, the data directory, ... A config file that fails to
parse or validate is rejected whole (logged), and the running settings stay. A reload never
ends the process.

SIGTERM or SIGINT: the drain (governor.proxy.drain), then the stop that writes every open
session's record; a second one during the drain stops at once (the records are still written).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import signal
from pathlib import Path
from typing import Any, Callable

from governor.cli import UsageError

log = logging.getLogger("governor")

# settings a reload applies; every other one needs a restart
RELOADABLE = ("reviewer_tokens", "control_token", "webhooks", "allow", "routes", "drain_timeout")
# Settings fields under the option names an operator knows them by
NAMES = {"webhooks": "webhook", "reviewer_tokens": "reviewer tokens", "control_token": "control token",
         "adapters": "adapter settings (fit_output, fit_floor, deployments, bytes_per_token, ...)",
         "extra": "runtime settings", "control_hosts": "control_host"}


class Shutdown:
    """SIGTERM / SIGINT: the first asks for a drain, a second (during it) for a stop at once."""

    def __init__(self, running: Any) -> None:
        self.running = running
        self.requested = asyncio.Event()  # the first signal came
        self.hurry = asyncio.Event()  # a second one: stop at once
        self.draining = False

    def signalled(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if not self.requested.is_set():
            log.info("governor: %s: draining (at most %gs), then stopping", name, self.running.settings.drain_timeout)
            self.requested.set()
        elif not self.hurry.is_set():
            log.warning("governor: %s again: stopping at once (the calls in flight are cut, the records written)", name)
            self.hurry.set()

    def ignored(self, sig: int) -> None:
        log.info("governor: %s while stopping: the records are being written", signal.Signals(sig).name)

    async def drain(self) -> None:
        self.draining = True
        try:
            await self.running.drain(self.running.settings.drain_timeout, self.hurry)
        except Exception:  # the stop goes on: the sessions must still end and be recorded
            log.exception("governor: the drain failed; stopping")


class Reloader:
    """SIGHUP: re-read the settings, apply what can change, log what cannot."""

    def __init__(self, running: Any, read: Callable[[], tuple[Any, str | None]] | None, *,
                 log_level: str | None = None, shutdown: Shutdown | None = None) -> None:
        self.running = running
        self.read = read  # the settings and log level, read as at start (UsageError: invalid); None: none to read
        self.shutdown = shutdown
        self.passport_digest = _digest(running.settings.passport)
        self.log_level = log_level
        self._task: asyncio.Task | None = None
        self._again = False

    def signalled(self) -> None:
        if self.shutdown is not None and self.shutdown.requested.is_set():
            log.info("governor: SIGHUP while stopping: not reloaded")
            return
        if self._task is not None and not self._task.done():
            self._again = True  # one more reload once this one is over
            return
        self._task = asyncio.get_running_loop().create_task(self._reload_until_settled(), name="governor reload")

    async def _reload_until_settled(self) -> None:
        while True:
            self._again = False
            try:
                await self.reload()
            except Exception:  # a reload never ends the process
                log.exception("governor: reload failed; the running settings stay")
            if not self._again:
                return

    async def settle(self) -> None:
        """Wait for a reload in progress (a stop does not interrupt one half applied)."""
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task], timeout=10)

    async def reload(self) -> dict[str, list[str]]:
        """Re-read and apply; returns {"reloaded": [...], "restart": [...]} (empty when rejected)."""
        if self.read is None:
            log.warning("governor: SIGHUP: this governor was not started by `governor run`: nothing to reload")
            return {"reloaded": [], "restart": []}
        try:
            new, level = self.read()
        except UsageError as exc:
            log.error("governor: SIGHUP: reload rejected, the running settings stay: %s", exc)
            return {"reloaded": [], "restart": []}
        old = self.running.settings
        changed = [f.name for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)]
        restart = [name for name in changed if name not in RELOADABLE]
        if _digest(new.passport) != self.passport_digest and "passport" not in restart:
            restart.append("passport")  # the same path, another passport
        reloaded: list[str] = []
        # the registry first: it checks the routes, and a reload that cannot apply them changes nothing
        if "allow" in changed or "routes" in changed:
            try:
                self.running.chain.registry.reconfigure(new.routes, new.allow)
            except ValueError as exc:
                log.error("governor: SIGHUP: reload rejected, the running settings stay: %s", exc)
                return {"reloaded": [], "restart": []}
            for name in ("allow", "routes"):
                if name in changed:
                    setattr(old, name, getattr(new, name))
                    reloaded.append(name)
        context = self.running.control_context
        for name in ("reviewer_tokens", "control_token"):
            if name not in changed:
                continue
            if context is None:
                restart.append(name)  # no control plane: nothing reads them
                continue
            if name == "reviewer_tokens":
                context.reviewers.replace(new.reviewer_tokens)
            else:
                context.operators.replace([new.control_token] if new.control_token else [])
            setattr(old, name, getattr(new, name))
            reloaded.append(name)
        if "webhooks" in changed:
            await self.running.replace_webhooks(new.webhooks)
            reloaded.append("webhooks")
        if "drain_timeout" in changed:
            old.drain_timeout = new.drain_timeout
            reloaded.append("drain_timeout")
        if level != self.log_level:
            _apply_level(level)
            self.log_level = level
            reloaded.append("log_level")
        for name in reloaded:
            log.info("governor: SIGHUP: reloaded %s%s", NAMES.get(name, name), _summary(name, old))
        for name in restart:
            log.warning("governor: SIGHUP: %s changed but cannot be reloaded: restart to change it (the running "
                        "value stays)", NAMES.get(name, name))
        if not reloaded and not restart:
            log.info("governor: SIGHUP: settings re-read; nothing changed")
        return {"reloaded": reloaded, "restart": restart}


def _summary(name: str, settings: Any) -> str:
    if name == "allow":
        return f": {len(settings.allow)} entr{'y' if len(settings.allow) == 1 else 'ies'}"
    if name == "routes":
        return f": {len(settings.routes)} route(s)"
    if name == "reviewer_tokens":
        return f": {len(settings.reviewer_tokens)} token(s)"
    if name == "webhooks":
        return f": {len(settings.webhooks.urls)} URL(s)" if settings.webhooks is not None else ": none"
    if name == "drain_timeout":
        return f": {settings.drain_timeout:g}s"
    return ""


def _digest(passport: Path | None) -> str | None:
    """The passport file's bytes, hashed (None: the bundled example, or unreadable)."""
    if passport is None:
        return None
    try:
        return hashlib.sha256(Path(passport).read_bytes()).hexdigest()
    except OSError:
        return None


def _apply_level(level: str | None) -> None:
    """As configure_logging sets them: the root logger (the governor's), and mitmproxy's."""
    logging.getLogger().setLevel(level or "INFO")
    logging.getLogger("mitmproxy").setLevel(level or "WARNING")


__all__ = ["Reloader", "Shutdown", "RELOADABLE"]
