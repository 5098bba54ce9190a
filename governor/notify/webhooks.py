"""Webhook delivery: signed JSON POSTs from background tasks, never in enforcement's way.

`emit` is synchronous and cheap: it serializes the event once and appends it to each
target's bounded queue (full: the oldest waiting delivery is dropped and counted), then
returns. One task per target URL delivers its queue in order, so a receiver that is down
or slow delays only its own deliveries: each attempt is bounded by `timeout`, failed
attempts are retried up to `attempts` times with exponential backoff and full jitter,
and what still fails is logged and counted (governor_webhook_deliveries_total). Redirects
are not followed (a 3xx is a failure): the URL is the operator's, and the governor's
outbound call goes nowhere else. URLs are logged by scheme, host and port only: incoming
webhook URLs of chat tools carry their secret in the path.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import orjson

from governor.notify.signing import EVENT_HEADER, ID_HEADER, sign

log = logging.getLogger("governor.notify")

MAX_BODY = 64 * 1024  # a payload past this drops its tool arguments (a tool call's body may be megabytes)
MIN_SECRET_LENGTH = 16
RETRY_STATUSES = frozenset({408, 425, 429}) | frozenset(range(500, 600))


class WebhookConfigError(ValueError):
    """Unusable webhook settings (a URL that is not http(s), no or a short secret)."""


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    urls: tuple[str, ...]
    secret: str
    timeout: float = 5.0  # seconds for one attempt, connect to response headers
    attempts: int = 5  # tries per delivery, the first included
    backoff: float = 1.0  # the first retry waits up to this (full jitter), doubling per retry
    max_backoff: float = 60.0
    queue: int = 1000  # deliveries waiting per URL; past it the oldest is dropped

    def __post_init__(self) -> None:
        for url in self.urls:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise WebhookConfigError(f"webhook {redacted(url)!r}: expected an http:// or https:// URL")
        if len(self.secret) < MIN_SECRET_LENGTH:
            raise WebhookConfigError(f"the webhook secret must be at least {MIN_SECRET_LENGTH} characters "
                                     "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
        if not (self.timeout > 0 and self.attempts >= 1 and self.backoff >= 0 and self.queue >= 1):
            raise WebhookConfigError("webhook timeout, attempts, backoff and queue must be positive")


def redacted(url: str) -> str:
    """scheme://host:port of a URL: what the log may show of it."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{parts.hostname}{port}" if parts.hostname else "<malformed URL>"
    except ValueError:
        return "<malformed URL>"


class NullNotifier:
    """No webhooks configured: every event is dropped here, at no cost."""

    def emit(self, event: dict[str, Any]) -> None:
        pass

    async def close(self, drain: float = 0.0) -> None:
        pass


NULL_NOTIFIER = NullNotifier()


@dataclass(slots=True)
class _Delivery:
    event: str
    id: str
    body: bytes


class _Target:
    def __init__(self, url: str, size: int) -> None:
        self.url = url
        self.name = redacted(url)
        self.waiting: collections.deque[_Delivery] = collections.deque()
        self.size = size
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None


class WebhookNotifier:
    def __init__(self, config: WebhookConfig, *, governor: str, metrics: Any = None,
                 clock: Callable[[], float] = time.time, user_agent: str = "adl-governor") -> None:
        self.config = config
        self.governor = governor
        self.metrics = metrics
        self.clock = clock
        self.user_agent = user_agent
        self._targets = [_Target(url, config.queue) for url in config.urls]
        self._session: Any = None
        self._closed = False

    # --- the runtime's side: never blocks, never raises ---------------------------------

    def emit(self, event: dict[str, Any]) -> None:
        try:
            self._emit(event)
        except Exception:  # a notification must never fail the step that caused it
            log.exception("webhook: could not queue a %s notification", event.get("event"))

    def _emit(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if self._closed:
            self._count(kind, "dropped")
            return
        delivery_id = uuid.uuid4().hex
        payload = {"id": delivery_id, "event": kind, "time": _iso(self.clock()), "governor": self.governor,
                   "text": event["text"], "data": event["data"]}
        try:
            body = orjson.dumps(payload, default=str)
        except orjson.JSONEncodeError:  # arguments nested past what orjson writes (a model's proposal)
            if "arguments" not in payload["data"]:
                raise
            body = b""
        if (not body or len(body) > MAX_BODY) and "arguments" in payload["data"]:
            omitted = {"arguments_omitted_bytes": len(body)} if body else {"arguments_omitted": "nested too deep"}
            payload["data"] = {**payload["data"], "arguments": None, **omitted}
            body = orjson.dumps(payload, default=str)
        self._start()
        for target in self._targets:
            if len(target.waiting) >= target.size:
                dropped = target.waiting.popleft()
                self._count(dropped.event, "dropped")
                log.warning("webhook %s: queue full (%d); dropped the oldest %s notification %s",
                            target.name, target.size, dropped.event, dropped.id)
            target.waiting.append(_Delivery(kind, delivery_id, body))
            target.wake.set()

    def _start(self) -> None:
        for target in self._targets:
            if target.task is None:
                target.task = asyncio.get_running_loop().create_task(self._deliver_forever(target),
                                                                     name=f"webhook {target.name}")

    # --- delivery -----------------------------------------------------------------------

    async def _deliver_forever(self, target: _Target) -> None:
        while True:
            await target.wake.wait()
            target.wake.clear()
            while target.waiting:
                delivery = target.waiting.popleft()
                await self._deliver(target, delivery)

    async def _deliver(self, target: _Target, delivery: _Delivery) -> None:
        why = ""
        for attempt in range(1, self.config.attempts + 1):
            if attempt > 1:
                self._count(delivery.event, "retry", family="retries")
                cap = min(self.config.max_backoff, self.config.backoff * 2 ** (attempt - 2))
                await asyncio.sleep(random.uniform(0, cap))  # full jitter: receivers coming back are not stampeded
            retry, why = await self._attempt(target, delivery)
            if not why:
                self._count(delivery.event, "delivered")
                return
            if not retry:
                break
        self._count(delivery.event, "failed")
        log.warning("webhook %s: %s notification %s not delivered after %d attempt(s): %s",
                    target.name, delivery.event, delivery.id, attempt, why)

    async def _attempt(self, target: _Target, delivery: _Delivery) -> tuple[bool, str]:
        """(retry?, why it failed); why is "" when the receiver took it (2xx)."""
        import aiohttp

        headers = {"Content-Type": "application/json", "User-Agent": self.user_agent,
                   EVENT_HEADER: delivery.event, ID_HEADER: delivery.id,
                   **sign(self.config.secret, delivery.body, int(self.clock()))}
        try:
            async with self._client().post(target.url, data=delivery.body, headers=headers,
                                           allow_redirects=False) as response:
                status = response.status
        except asyncio.TimeoutError:
            return True, f"no answer within {self.config.timeout:g}s"
        except (aiohttp.ClientError, OSError) as exc:
            return True, f"{type(exc).__name__}: {exc}"
        if 200 <= status < 300:
            return False, ""
        if 300 <= status < 400:
            return False, f"HTTP {status}: a redirect, not followed"
        return status in RETRY_STATUSES, f"HTTP {status}"

    def _client(self) -> Any:
        import aiohttp

        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.config.timeout)
            # trust_env=False: never through HTTP(S)_PROXY (the governor's own proxy, in a pod)
            self._session = aiohttp.ClientSession(timeout=timeout, trust_env=False,
                                                  connector=aiohttp.TCPConnector(limit_per_host=4))
        return self._session

    def _count(self, event: str, outcome: str, family: str = "deliveries") -> None:
        if self.metrics is not None:
            self.metrics.webhook(event, outcome, family)

    # --- shutdown -----------------------------------------------------------------------

    def pending(self) -> int:
        return sum(len(t.waiting) for t in self._targets)

    async def close(self, drain: float = 2.0) -> None:
        """Give waiting deliveries up to `drain` seconds, then stop; what is left is counted dropped."""
        self._closed = True
        deadline = time.monotonic() + drain
        while self.pending() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for target in self._targets:
            if target.task is not None:
                target.task.cancel()
                try:
                    await target.task
                except (asyncio.CancelledError, Exception):
                    pass
            for delivery in target.waiting:
                self._count(delivery.event, "dropped")
            target.waiting.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
