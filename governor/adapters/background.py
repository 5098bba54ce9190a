"""A background response's stream (OpenAI Responses with `background: true` and `stream: true`).

Its work goes on upstream when the stream ends before the response does (the agent left, the
governor cut it), so what the stream relayed is not what it cost: `BackgroundStream` wraps the
Responses watcher and, at a close without the response's completion, raises the final figure
to at least what the call reserved and remembers the response (its id, from
`response.created`) for the read that settles it (governor.adapters.deferred). A stream that
completes is charged its usage, as any.
"""

from __future__ import annotations

from typing import Any, Mapping

from governor.adapters.base import Exchange, StreamEvent, StreamWatcher
from governor.adapters.deferred import DeferredWork
from governor.adapters.sse import SSEDecoder
from governor.policy.steps import UsageReport

RESPONSE_USAGE = ("input_tokens", "output_tokens")  # a Responses object's usage fields


class BackgroundStream(StreamWatcher):
    """The inner watcher's events, and a final figure of at least the reservation when the
    response did not complete (the inner watcher's `completed`)."""

    def __init__(self, inner: StreamWatcher, exchange: Exchange, memory: DeferredWork) -> None:
        self.inner = inner
        self.exchange = exchange
        self.memory = memory
        self.response_id: str | None = None
        self._looking: SSEDecoder | None = SSEDecoder()  # until response.created gave the id

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        events = self.inner.feed(chunk)
        if self._looking is not None:
            self._look(self._looking.feed(chunk))
        return events

    def _look(self, events: list[Any]) -> None:
        for event in events:
            data = event.json()
            if isinstance(data, dict) and data.get("type") == "response.created":
                response = data.get("response")
                found = response.get("id") if isinstance(response, dict) else None
                self.response_id = found if isinstance(found, str) else None
                self._looking = None
                return

    def close(self) -> list[StreamEvent]:
        events = self.inner.close()
        if getattr(self.inner, "completed", False):
            return events
        state, exchange = self.exchange.state, self.exchange
        for index in range(len(events) - 1, -1, -1):
            report = events[index]
            if isinstance(report, UsageReport) and report.final:
                events[index] = report = UsageReport(
                    report.model, max(report.input_tokens, state["expected_input"]),
                    max(report.output_tokens, state["expected_output"]), persona=exchange.persona)
                if self.response_id is not None:
                    self.memory.charge(exchange.host, self.response_id, report.model, report.input_tokens,
                                       report.output_tokens, RESPONSE_USAGE)
                break
        return events

    def terminal(self, message: str, governor: Mapping[str, Any]) -> bytes:
        return self.inner.terminal(message, governor)

    @property
    def usage(self) -> UsageReport | None:
        return self.inner.usage


__all__ = ["BackgroundStream", "RESPONSE_USAGE"]
