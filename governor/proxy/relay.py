"""The relay of a governed stream (`StreamRelay`, the stream's `flow.response.stream` callable).

The relay runs synchronously in mitmproxy's per-chunk path: it forwards whole SSE events,
hands what the adapter's watcher saw to the answers' addon (its `on_events`, which checks
them asynchronously), keeps output back while a step awaits admission, and once cut
forwards only the adapter's terminal event. Cuts go through the `Enforcer`
(governor.proxy.enforcing) it is given.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping

from mitmproxy import http

from governor.adapters import ndjson, sse
from governor.adapters.base import StreamWatcher, UnreadableAnswer
from governor.policy.steps import Action, Decision, Step, UsageReport
from governor.proxy import holds, refusals, transit
from governor.proxy.enforcing import Enforcer
from governor.proxy.flow_state import Flight
from governor.proxy.refusing import governor_error_object

log = logging.getLogger("governor.proxy")


class StreamRelay:
    """The `flow.response.stream` callable of a governed stream.

    Synchronous (mitmproxy calls it per chunk): it forwards whole SSE events as they
    arrive, hands the watcher's findings to `on_events` (which checks them
    asynchronously) and, once the stream is cut, forwards nothing more
    but the adapter's terminal event. It never returns b"" for a chunk (mitmproxy
    would frame it as the chunked-encoding terminator and corrupt the connection).
    """

    def __init__(self, flow: http.HTTPFlow, flight: Flight, watcher: StreamWatcher,
                 on_events: Callable[["StreamRelay", list[Any]], None], enforcer: Enforcer,
                 max_held_bytes: int) -> None:
        self.on_events = on_events  # called synchronously with what the watcher saw in a chunk
        self.enforcer = enforcer
        self.max_held_bytes = max_held_bytes  # output kept back while a step awaits admission: cut past it
        self.flow = flow
        self.flight = flight
        self.watcher = watcher
        # the incomplete tail of the last event, forwarded once whole: an SSE event ends at a blank
        # line, an NDJSON one (Ollama) at each newline, a binary frame (Bedrock's event stream) at
        # the length its prelude says (the watcher's own framer)
        framer = watcher.framer()
        line_framed = framer is None and watcher.line_framed
        self.sse = framer is None and not line_framed  # SSE: a comment line fits between events
        self.held: Any = framer if framer is not None else ndjson.LineFramer() if line_framed else sse.EventFramer()
        # a chunk ending here is whole events (None: binary framing, every chunk is framed)
        self.boundary: bytes | None = None if framer is not None else b"\n" if line_framed else b"\n\n"
        self.terminal: bytes | None = None
        self.ended = False
        self.final_events: list[Any] = []
        self.latest_usage: UsageReport | None = None
        self.checked_usage: UsageReport | None = None
        self.checking = False
        self.over = False  # a running usage past the call's reservation holds the output (see hold)
        self.pending_steps: list[Step] = []
        self.admitting = False
        self.holds = 0  # streamed tool calls awaiting admission: output is kept back meanwhile
        self.held_steps: set[int] = set()  # ids of the steps holding the stream
        self.kept: list[bytes] = []  # whole events kept back while holds > 0 (a list: no quadratic copies)
        self.kept_bytes = 0  # their size, bounded by the policy's max_held_stream_bytes
        self.gate: transit.Gate | None = None
        self.pings = 0  # a keep-alive comment line on its way to the client (a held stream)

    def __call__(self, data: bytes) -> list[bytes]:
        if data == b"":
            return self.end()
        if self.pings and data == holds.KEEPALIVE:  # ours, not the upstream's: straight to the client
            self.pings -= 1
            return [data]
        self.flight.last_activity = time.monotonic()
        if self.terminal is not None:
            return []
        try:
            events = self.watcher.feed(data)
        except sse.EventTooLarge as exc:
            return self._overflow(str(exc))
        except UnreadableAnswer as exc:  # not JSON where the protocol sends JSON: cut, not relayed unread
            return self._overflow(str(exc), refusals.UNREADABLE_ANSWER)
        except Exception:  # a watcher bug must not break the relay: log, keep counting nothing
            log.exception("governor: stream watcher failed on %s", self.flow.request.url)
            events = []
        if events:
            self.on_events(self, events)
            if self.terminal is not None:  # cut synchronously (eager tasks): not even this chunk
                return []
        held = self.held
        boundary = self.boundary
        if not held.pending and not self.holds and not self.kept and boundary is not None and data.endswith(boundary):
            return [data]  # whole events, nothing kept back: the usual chunk, as it came
        out = held.feed(data)
        if held.pending > sse.MAX_EVENT_BYTES:  # e.g. comment lines without a blank line, forever
            return self._overflow(f"the upstream sent {held.pending} bytes without an event boundary "
                                  f"(the governor holds at most {sse.MAX_EVENT_BYTES})")
        if self.holds:
            if out:
                limit = self.max_held_bytes
                if self.kept_bytes + len(out) > limit:  # an upstream flooding while a step awaits admission
                    return self._overflow(
                        f"the upstream sent more than {limit} bytes while the governor held its output back "
                        f"(a step awaited admission); the stream was cut", refusals.HELD_OUTPUT_EXCEEDED)
                self.kept.append(out)
                self.kept_bytes += len(out)
            return []
        if self.kept:
            out = b"".join(self.kept) + out
            self.kept, self.kept_bytes = [], 0
        return [out] if out else []

    def _overflow(self, reason: str, code: str = refusals.EVENT_TOO_LARGE) -> list[bytes]:
        """The upstream's output outgrew what the governor holds: cut the stream (fail closed),
        and record the cut in the session (governor.proxy.refusals)."""
        log.warning("governor: %s; cutting the stream of %s", reason, self.flow.request.pretty_url)
        session = self.flight.exchange.session
        gov = {"cause": None, "action": "deny", "reason": reason, "session": session}
        self.held.clear()
        self.enforcer.enforce(self.flow, self.flight, Decision(action=Action.DENY), gov)
        # the relay is synchronous: recorded by a task (the terminal event goes out meanwhile) that a stop awaits
        self.enforcer.record_refusal(session, code, refusals.detail(code, 502, self.flow.request, reason))
        return []

    async def ping(self, data: bytes) -> bool:
        """Send an SSE comment line to the client while the stream is held for a reviewer.
        Whole events only were forwarded so far, so a comment line fits between them.
        False when it could not be sent (the stream over, or not in a state to take it)."""
        if self.terminal is not None or self.ended or not self.sse:
            return False  # (NDJSON and binary framing have no comment line: a client would fail on one)
        self.pings += 1
        try:
            return await self.enforcer.ping(self.flow, data)
        finally:
            self.pings = 0  # delivered synchronously, or not at all

    def hold(self) -> None:
        """Keep output back (and the upstream's end) until `unhold` balances this."""
        self.holds += 1
        if self.gate is None:
            self.gate = self.enforcer.gate(self.flow)

    def unhold(self) -> None:
        self.holds -= 1
        if self.holds == 0 and self.terminal is None:
            self.flight.last_activity = time.monotonic()
            if self.gate is not None:
                gate, self.gate = self.gate, None
                gate.release()

    def cut(self, message: str, governor_obj: Mapping[str, Any]) -> bool:
        """Stop forwarding and arrange for the terminal event; False when already over."""
        if self.terminal is not None or (self.ended and not self.holds):
            return False
        try:
            self.terminal = self.watcher.terminal(message, governor_obj)
        except Exception:
            log.exception("governor: stream watcher could not build a terminal event")
            self.terminal = b""
        self.held.clear()
        self.kept, self.kept_bytes = [], 0  # never forwarded now: freed at once
        return True

    def end(self) -> list[bytes]:
        """The upstream message ended (naturally, or because the governor cut it)."""
        self.ended = True
        try:
            self.final_events = self.watcher.close()
        except Exception:
            log.exception("governor: stream watcher failed at end of stream")
            self.final_events = []
        if self.terminal is None and self.holds:
            # the upstream ended while a tool call it asked for was still being admitted (or
            # its usage past the reservation was being charged) and its end could not be
            # withheld: fail closed, do not deliver it
            what = "usage past its reservation was charged" if self.over else "its tool calls were admitted"
            self.cut(f"governor: the stream ended before {what}",
                     governor_error_object(self.flight.exchange.session))
        if self.terminal is not None:
            return [self.terminal] if self.terminal else []
        tail = b"".join(self.kept) + self.held.take()
        self.kept, self.kept_bytes = [], 0
        return [tail] if tail else []
