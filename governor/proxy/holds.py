"""Held steps that outlast their client (§5 human oversight; docs/oversight.md).

A tool call the model asks for that needs a reviewer holds the model's answer. A review
takes minutes or hours; clients wait seconds (the openai SDK's `timeout=5`) and then
re-send the identical request, which without this module reached the model again: one
more model call, one more iteration, one more approval for the same step.

Here a held answer is a `Hold`, found by the request that produced it (session, persona,
method, host, path and the body the agent sent, hashed):

* the identical request while the review is pending is attached to the hold: no model
  call, no step, no approval; it waits like the original;
* a connection waits at most its hold time (`--review-hold-seconds`, shortened to fit the
  client's own read timeout when it says it: the openai and anthropic SDKs send
  `X-Stainless-Read-Timeout`); then it is answered 429 `review_pending` naming the approval,
  with `Retry-After`, which the SDKs retry and agents can catch;
* the review's outcome (the approved answer, or the refusal: 403 on a rejection) goes to
  every connection still waiting; when none was left to take it, it is kept for the next
  identical request (KEEP_ANSWER_SEC), which gets it exactly once.

A held stream has already sent its headers: it stays on its connection, kept alive by SSE
comment lines (`: waiting for review`) that every SSE client ignores and that reset the
client's read timeout (see `keep_alive`). The identical request meanwhile (its client gave up
on the stream) is answered 429 too; a stream cannot be replayed, so once the review is over
the identical request is a new step.

A step held at the *request* (an MCP `tools/call` of a tool that requires confirmation, an
oversight trigger on a model call) is a Hold too (`shared=False`): its review runs apart
from any connection, and its outcome (the request's admissions, see governor.proxy.held_steps)
is taken by exactly one identical request, which then goes upstream: the newest connection
still waiting when the review ends (an older one was most likely given up by its client),
else the next identical request. Nothing went upstream before the review; the upstream is
called once, after it. For JSON-RPC (MCP, A2A) the request's `id` is not part of what names
it: an SDK retry is a new call with a new id.

Cheap on the request path: a session with no hold costs one dict lookup; the request is
hashed only in a session that has one.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import orjson
from mitmproxy import http

log = logging.getLogger("governor.proxy.holds")

DEFAULT_HOLD_SEC = 300.0  # under the 600 s read timeout of the openai and anthropic SDKs
DEFAULT_RETRY_AFTER_SEC = 10.0
MIN_HOLD_SEC = 0.5
KEEP_ANSWER_SEC = 900.0  # an outcome nobody was left to take waits this long for the identical request
# the read timeout the openai and anthropic SDKs say they have, in seconds (each sends the first)
TIMEOUT_HEADERS = ("x-stainless-read-timeout", "x-stainless-timeout")
KEEPALIVE = b": waiting for review\n\n"  # an SSE comment: ignored by every SSE parser
MAX_KEEPALIVE_SEC = 15.0
PENDING_CAUSE = "review_pending"
ACTION_HEADER = "ADL-Governor-Action"
# the read timeout a client has when it does not say (the mcp SDK: MCP_DEFAULT_SSE_READ_TIMEOUT)
DEFAULT_CLIENT_TIMEOUT = {"mcp": 300.0}
# what the holds counted (governor_review_holds_total{outcome})
ATTACHED, REFUSED_PENDING, ANSWERED = "attached", "refused_pending", "answered"


def request_key(session: str, persona: str | None, method: str, host: str, port: int, path: str,
                body: bytes) -> bytes:
    """What makes two requests the same step's retries: everything but headers (the SDKs
    change their retry counters there)."""
    h = hashlib.blake2b(digest_size=20)
    for part in (session, persona or "", method, host, str(port), path):
        encoded = part.encode("utf-8", "surrogateescape")
        h.update(len(encoded).to_bytes(4, "big"))
        h.update(encoded)
    h.update(body)
    return h.digest()


def identity(exchange: Any, content: bytes) -> bytes:
    """The body bytes that name a request: as sent, but a JSON-RPC call without its `id`
    (the mcp SDK's retry is a new call, with a new id, of the same step)."""
    body = exchange.body
    if "rpc_id" in exchange.state and isinstance(body, dict):
        return orjson.dumps({k: v for k, v in body.items() if k != "id"})
    return content


def client_timeout(headers: Any) -> float | None:
    """The read timeout the client says it has (X-Stainless-Read-Timeout), when it is a sane number."""
    if headers is None:
        return None
    raw = headers.get(TIMEOUT_HEADERS[0]) or headers.get(TIMEOUT_HEADERS[1])
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def hold_time(headers: Any, configured: float, default_timeout: float | None = None) -> float:
    """How long one connection is held before it is told the review is pending: the
    configured hold, cut to end before the client's own read timeout fires (the one it
    states, else `default_timeout`, its SDK's default)."""
    timeout = client_timeout(headers) or default_timeout
    if timeout is None:
        return configured
    return max(MIN_HOLD_SEC, min(configured, timeout - min(1.5, timeout * 0.3)))


def keepalive_interval(headers: Any) -> float:
    """How often a held stream sends a comment line: well inside the client's read timeout."""
    timeout = client_timeout(headers)
    return MAX_KEEPALIVE_SEC if timeout is None else max(0.25, min(MAX_KEEPALIVE_SEC, timeout / 2))


@dataclass(eq=False)
class Hold:
    """One held answer: its review runs in `task`, whose result is the answer's response."""

    key: bytes
    session: str
    approval_id: str
    expires_at: Any
    task: asyncio.Task
    waiting: int = 0
    done_at: float | None = None
    taken: bool = False
    answer: Any = None  # an http.Response to copy (shared), or the outcome one request takes
    replayable: bool = True  # False: the review's result is not an answer to give (a held stream's)
    shared: bool = True  # False: a step held at the request, whose outcome one request takes
    waiters: list[Any] = field(default_factory=list)  # flows attending an unshared hold, oldest first
    taker: Any = None  # the flow chosen to take an unshared hold's outcome
    forget: Callable[[Any], None] | None = None  # an outcome nobody took, when it is dropped


@dataclass
class Holds:
    """The held answers of one proxy, by request key."""

    hold_sec: float = DEFAULT_HOLD_SEC
    retry_after: float = DEFAULT_RETRY_AFTER_SEC
    by_key: dict[bytes, Hold] = field(default_factory=dict)
    per_session: dict[str, int] = field(default_factory=dict)
    counted: Counter = field(default_factory=Counter)  # outcome -> count
    on_count: Callable[[str], None] | None = None  # governor.runtime.metrics.Metrics.review_hold
    released: asyncio.Event | None = None  # set at a drain's end: every connection waiting is answered now

    def release_waiting(self) -> None:
        """A graceful stop's drain is over: every connection waiting for a review is answered
        at once as its hold time would answer it (429 review_pending, Retry-After)."""
        if self.released is None:
            self.released = asyncio.Event()
        self.released.set()

    async def _wait(self, task: asyncio.Task, timeout: float) -> None:
        if self.released is None:
            self.released = asyncio.Event()
        if self.released.is_set():
            return
        release = asyncio.ensure_future(self.released.wait())
        try:
            await asyncio.wait({task, release}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            release.cancel()

    def _count(self, outcome: str) -> None:
        self.counted[outcome] += 1
        if self.on_count is not None:
            self.on_count(outcome)

    def find(self, session: str, key_of: Callable[[], bytes]) -> Hold | None:
        """The hold the identical request left in this session, if any (`key_of` hashes the
        request only when the session has one)."""
        if not self.per_session.get(session):
            return None
        self._sweep()
        hold = self.by_key.get(key_of())
        if hold is not None:
            self._count(ATTACHED)
        return hold

    def start(self, key: bytes, session: str, approval_id: str, expires_at: Any, review: Awaitable[Any], *,
              shared: bool = True, forget: Callable[[Any], None] | None = None) -> Hold:
        """A held answer: `review` waits for the reviewer and makes the answer (an
        http.Response to give the waiting; anything else: nothing to give, a held stream's).
        Unshared: a step held at its request, whose outcome one request takes (`attend`);
        `forget` gets an outcome nobody took."""
        self._sweep()
        old = self.by_key.get(key)
        if old is not None:  # a new hold for the same request replaces an answered one
            self._drop(old)
            if not old.taken and old.forget is not None and old.answer is not None:
                old.forget(old.answer)
        task = asyncio.get_running_loop().create_task(review)  # type: ignore[arg-type]
        hold = Hold(key, session, approval_id, expires_at, task, shared=shared, forget=forget)
        self.by_key[key] = hold
        self.per_session[session] = self.per_session.get(session, 0) + 1
        task.add_done_callback(lambda _t: self._answered(hold))
        return hold

    def _answered(self, hold: Hold) -> None:
        if hold.done_at is not None:
            return
        hold.done_at = time.monotonic()
        if hold.task.cancelled():
            hold.answer = None
            return
        if (error := hold.task.exception()) is not None:  # fail closed: the waiting get a governor error
            log.error("governor: the review of approval %s failed", hold.approval_id, exc_info=error)
            hold.answer = None
            return
        result = hold.task.result()
        if not hold.shared:  # the newest connection still there takes it (older ones were given up)
            hold.answer = result
            hold.taker = next((f for f in reversed(hold.waiters) if f.client_conn.connected), None)
            return
        if isinstance(result, http.Response):
            hold.answer = result
        else:  # a held stream's admission: it went to the stream's own connection
            hold.replayable = False
            self._drop(hold)

    def _drop(self, hold: Hold) -> None:
        if self.by_key.get(hold.key) is hold:
            del self.by_key[hold.key]
            left = self.per_session.get(hold.session, 1) - 1
            if left > 0:
                self.per_session[hold.session] = left
            else:
                self.per_session.pop(hold.session, None)

    def _sweep(self) -> None:
        """Forget answers nobody came back for (a pass over the holds: there are as many as
        pending or recent reviews, not requests)."""
        now = time.monotonic()
        for hold in [h for h in self.by_key.values() if h.done_at is not None and now - h.done_at > KEEP_ANSWER_SEC]:
            self._drop(hold)
            if not hold.taken and hold.forget is not None and hold.answer is not None:
                hold.forget(hold.answer)

    async def serve(self, flow: http.HTTPFlow, hold: Hold, pending: Callable[[Hold, float], http.Response],
                    failed: Callable[[], http.Response]) -> str:
        """Answer `flow` from the hold: its outcome when it comes within this connection's
        hold time, else `pending(hold, retry_after)` (the 429). Returns what it answered:
        "answer" or "pending", or "gone" (nothing answered: the hold had no answer to give)."""
        if not hold.task.done():
            hold.waiting += 1
            try:
                await self._wait(hold.task, hold_time(flow.request.headers, self.hold_sec))
            finally:
                hold.waiting -= 1
        if not hold.task.done():
            flow.response = pending(hold, self.retry_after)
            self._count(REFUSED_PENDING)
            return "pending"
        if hold.done_at is None:  # done, its callback not run yet
            self._answered(hold)
        if not hold.replayable:
            return "gone"
        answer = hold.answer
        flow.response = answer.copy() if answer is not None else failed()
        if flow.client_conn.connected:  # delivered (a client that left takes nothing)
            hold.taken = True
            self._drop(hold)
            self._count(ANSWERED)
        return "answer"

    async def attend(self, flow: http.HTTPFlow, hold: Hold, pending: Callable[[Hold, float], http.Response],
                     default_timeout: float | None = None) -> tuple[str, Any]:
        """A request at a step held at the request (unshared): wait for the review within
        this connection's hold time. Returns ("take", outcome) to the one request that goes
        on with the reviewed step (outcome None: the review failed), ("pending", None) when
        `flow` was answered `pending(...)` (the 429), or ("gone", None) when another request
        took the step: this one is a new step."""
        if not hold.task.done():
            hold.waiters.append(flow)
            try:
                await self._wait(hold.task, hold_time(flow.request.headers, self.hold_sec, default_timeout))
            finally:
                hold.waiters.remove(flow)
        if not hold.task.done():
            flow.response = pending(hold, self.retry_after)
            self._count(REFUSED_PENDING)
            return "pending", None
        if hold.done_at is None:  # done, its callback not run yet
            self._answered(hold)
        if not flow.client_conn.connected:  # a client that left takes nothing and starts nothing
            if hold.taker is flow:  # the next identical request takes it instead
                hold.taker = None
            flow.response = pending(hold, self.retry_after)
            return "pending", None
        if hold.taken or (hold.taker is not None and hold.taker is not flow):
            return "gone", None
        hold.taken = True
        self._drop(hold)
        self._count(ANSWERED)
        return "take", hold.answer


def pending_response(adapter: Any, exchange: Any, session: str, hold: Hold, retry_after: float) -> http.Response:
    """429 review_pending in the protocol's error format: the SDKs retry it after
    Retry-After, and an agent that catches it knows which approval it waits for."""
    seconds = max(1, math.ceil(retry_after))
    gov = {"cause": PENDING_CAUSE, "action": "pause", "session": session, "approval_id": hold.approval_id,
           "expires_at": hold.expires_at, "retry_after": seconds,
           "reason": "the step is held for human review; send the identical request again to get the "
                     "reviewer's outcome"}
    message = (f"governor: review pending (approval {hold.approval_id}): the step is held for a human reviewer; "
               f"send the identical request again after {seconds}s")
    reply = adapter.error_response(429, message, gov, exchange)
    headers = {**reply.headers, ACTION_HEADER: "pause", "retry-after": str(seconds), "x-should-retry": "true"}
    # the reply's own status: 429, but a JSON-RPC error with the call's id goes out as HTTP 200
    # (governor.adapters.jsonrpc: the mcp SDK raises on an HTTP error without reading the body)
    return http.Response.make(reply.status, reply.body, headers)


def shadow_of(flow: http.HTTPFlow) -> http.HTTPFlow:
    """A flow that carries the upstream's answer through a review which may outlast the
    client's connection: what the review makes of it is the hold's answer, while the
    original flow may already have been answered 429."""
    shadow = http.HTTPFlow(flow.client_conn, flow.server_conn)
    shadow.request = flow.request
    shadow.response = flow.response
    return shadow


async def keep_alive(relay: Any, interval: float) -> None:
    """Send an SSE comment line down a held stream every `interval` seconds until cancelled."""
    told = False
    while True:
        await asyncio.sleep(interval)
        sent = await relay.ping(KEEPALIVE)
        if not sent and not told and relay.terminal is None and not relay.ended:  # said once
            told = True
            log.warning("governor: a keep-alive line could not be sent on the held stream of %s; "
                        "its client may time out before the review ends", relay.flow.request.pretty_url)
