"""Ending or holding one stream of an HTTP/2 upstream connection (transit's HTTP/2 side).

An HTTP/2 upstream multiplexes the flows of a client connection on one connection.
Closing that connection (what `transit` falls back to) would reset every sibling
stream too, and end the client's response with a stream reset: no terminal event, no
clean end (the openai SDK saw a connection error, not the governor's error). Here one
stream is handled, in mitmproxy's own terms:

* `end_stream`: the upstream stream is reset (RST_STREAM CANCEL: generation stops, the
  connection and its other streams go on) and the flow's HTTP stream is handed an end
  of message, as if the upstream had ended it. mitmproxy then calls the relay one last
  time (which emits the adapter's terminal event) and ends the client's response cleanly.
* `gate`: the upstream's end of the stream is withheld (the HTTP/2 client layer's
  StreamEnded for it is kept back) until `release`, which delivers it.
* `answer`: no response headers yet: the governor's complete response is handed to the
  flow's stream as the upstream's, and the upstream stream is reset.

These run inside mitmproxy's event processing, serialised with every other event of the
connection: a Wakeup event (mitmproxy routes one to the layer that asked for it) addressed
to an injector registered as its source in every HttpLayer on the way to the flow's stream,
delivered by the connection handler's `server_event`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable, Iterator

import h2.events
from mitmproxy import http
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.http import HttpLayer, HttpStream
from mitmproxy.proxy.layers.http import SendHttp
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import (
    ErrorCode,
    RequestProtocolError,
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
)
from mitmproxy.proxy.layers.http._http2 import Http2Client, StreamState

logger = logging.getLogger(__name__)

_GATES = "_governor_gates"  # on an Http2Client: our stream id -> its Gate
_tasks: set[asyncio.Task] = set()  # injections in progress (kept from the garbage collector)


class _Injector:
    """Stands, for one Wakeup, where the flow's stream would in its HttpLayer: the commands
    it yields are the HttpLayer's to route (ReceiveHttp to the flow's stream, SendHttp to
    the upstream connection's layers)."""

    def __init__(self, work: Callable[[], Iterator[commands.Command]]) -> None:
        self.work = work

    def handle_event(self, event: events.Event) -> Iterator[commands.Command]:
        yield from self.work()


class _Stream:
    """Where a flow's response comes from: its HttpStream, the HTTP/2 client layer of its
    upstream connection, and the stream ids on either side of that layer."""

    def __init__(self, handler: Any, stream: HttpStream, client: Http2Client, ours: int) -> None:
        self.handler = handler
        self.stream = stream
        self.client = client
        self.theirs = stream.stream_id  # the id the flow's HttpLayer routes by
        self.ours = ours  # the upstream connection's stream id

    def state(self) -> StreamState | None:
        """EXPECTING_HEADERS / HEADERS_RECEIVED while the upstream has not ended it; None after."""
        return self.client.streams.get(self.ours)

    def reset(self) -> Iterator[commands.Command]:
        """Forget the upstream stream (no later event of it reaches the flow) and reset it:
        a protocol error sent through the HttpLayer to the connection's layers, whose HTTP/2
        client sends RST_STREAM (through the TLS layer: nothing bypasses it)."""
        self.client.streams.pop(self.ours, None)
        yield SendHttp(RequestProtocolError(self.theirs, "cut by the governor", ErrorCode.CANCEL),
                       self.stream.flow.server_conn)

    def inject(self, work: Callable[[], Iterator[commands.Command]]) -> bool:
        return _inject(self.handler, self.stream, work)


def _inject(handler: Any, stream: HttpStream, work: Callable[[], Iterator[commands.Command]]) -> bool:
    """Run `work` inside the connection's event processing, soon, where the HttpLayer of
    `stream` routes its commands. False when that cannot be arranged (nothing is scheduled)."""
    layers = stream.context.layers
    if not layers or layers[-1] is not stream:
        return False
    command = commands.RequestWakeup(0)
    injector = _Injector(work)
    sources = []
    for i, node in enumerate(layers[:-1]):
        if isinstance(node, HttpLayer):
            child = layers[i + 1]
            sources.append((node, injector if child is stream else child))
    if not sources or sources[-1][1] is not injector:
        return False
    for node, child in sources:
        node.command_sources[command] = child
    task = asyncio.get_running_loop().create_task(handler.server_event(events.Wakeup(command)))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return True


def _http_stream(flow: http.HTTPFlow, layers: Iterable[Any]) -> HttpStream | None:
    for node in layers:
        if isinstance(node, HttpStream) and getattr(node, "flow", None) is flow:
            return node
    return None


class QueuedEnd:
    """The upstream's end of a flow that had already been read (either HTTP version) and
    queued at the flow's stream, paused on a hook while the upstream finished: taken off
    that queue, so the stream does not end, and handed back to it on `release`."""

    withheld = True

    def __init__(self, handler: Any, stream: HttpStream, event: ResponseEndOfMessage) -> None:
        self.handler = handler
        self.stream = stream
        self.event = event
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        event = self.event

        def deliver() -> Iterator[commands.Command]:
            yield ReceiveHttp(event)

        if not _inject(self.handler, self.stream, deliver):
            logger.warning("governor: cannot deliver the held end of %s", self.stream.flow.request.url)


def end_queued(flow: http.HTTPFlow, layers: Iterable[Any]) -> bool:
    """Whether the upstream's end of `flow` was read already and waits in its stream's event
    queue (the stream is replaying what came while it waited for a hook): it will end the
    response, and there is no upstream body left to stop."""
    stream = _http_stream(flow, layers)
    return stream is not None and any(isinstance(event, ResponseEndOfMessage) and event.stream_id == stream.stream_id
                                      for event in stream._paused_event_queue)


def take_queued_end(handler: Any, flow: http.HTTPFlow, layers: Iterable[Any]) -> QueuedEnd | None:
    """A QueuedEnd when the upstream's end of `flow` waits in its stream's event queue."""
    stream = _http_stream(flow, layers)
    if stream is None:
        return None
    queue = stream._paused_event_queue
    for event in queue:
        if isinstance(event, ResponseEndOfMessage) and event.stream_id == stream.stream_id:
            queue.remove(event)
            return QueuedEnd(handler, stream, event)
    return None


def _find(handler: Any, flow: http.HTTPFlow, layers: Iterable[Any]) -> _Stream | None:
    """The flow's HTTP/2 upstream stream, or None (an HTTP/1 upstream, a finished flow)."""
    stream = client = None
    for node in layers:
        if isinstance(node, HttpStream) and getattr(node, "flow", None) is flow:
            stream = node
        elif isinstance(node, Http2Client) and node.conn is flow.server_conn:
            client = node
    if stream is None or client is None:
        return None
    ours = client.our_stream_id.get(stream.stream_id)
    if ours is None:
        return None
    return _Stream(handler, stream, client, ours)


class Gate:
    """Withholds the end of one HTTP/2 upstream stream until released (transit.Gate's
    HTTP/2 counterpart): data still flows (the relay keeps it back), the StreamEnded of
    the upstream is kept; released after it was, the end is delivered to the flow."""

    def __init__(self, found: _Stream) -> None:
        self.found = found
        self.released = False
        self.withheld = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        found = self.found
        _gates(found.client).pop(found.ours, None)
        if self.withheld:
            def deliver() -> Iterator[commands.Command]:
                yield ReceiveHttp(ResponseEndOfMessage(found.theirs))
            if not found.inject(deliver):
                logger.warning("governor: cannot deliver the held end of %s", found.stream.flow.request.url)


def _gates(client: Http2Client) -> dict[int, Gate]:
    """The client layer's gates; installs, once per layer, the handler that consults them."""
    gates = client.__dict__.get(_GATES)
    if gates is None:
        gates = {}
        setattr(client, _GATES, gates)
        original = client.handle_h2_event

        def handle_h2_event(event: h2.events.Event) -> Iterator[commands.Command]:
            gate = gates.get(getattr(event, "stream_id", 0)) if gates else None
            if gate is not None and isinstance(event, h2.events.StreamEnded) and not gate.released:
                gate.withheld = True  # the stream is over upstream: forget it, keep its end
                client.streams.pop(event.stream_id, None)
                return False
            return (yield from original(event))

        client.handle_h2_event = handle_h2_event  # type: ignore[method-assign]
    return gates


def gate(handler: Any, flow: http.HTTPFlow, layers: Iterable[Any]) -> Gate | None:
    """A Gate on the flow's HTTP/2 upstream stream while its body is being read, else None."""
    found = _find(handler, flow, layers)
    if found is None or found.state() is not StreamState.HEADERS_RECEIVED:
        return None
    gates = _gates(found.client)
    existing = gates.get(found.ours)
    if existing is not None and not existing.released:
        return existing
    gates[found.ours] = installed = Gate(found)
    return installed


def end_stream(handler: Any, flow: http.HTTPFlow, layers: Iterable[Any]) -> bool:
    """Cut the flow's streamed response from an HTTP/2 upstream: reset the upstream stream,
    end the client's response cleanly. False when it is not an HTTP/2 upstream stream."""
    found = _find(handler, flow, layers)
    if found is None:
        return False

    def cut() -> Iterator[commands.Command]:
        held = _gates(found.client).pop(found.ours, None)
        if held is not None:
            held.released = True
        if held is not None and held.withheld:  # the upstream had ended; its end was kept
            yield ReceiveHttp(ResponseEndOfMessage(found.theirs))
        elif found.state() is StreamState.HEADERS_RECEIVED:
            yield from found.reset()
            yield ReceiveHttp(ResponseEndOfMessage(found.theirs))
        # else: the upstream's end reached the flow first; the relay ends it with the terminal

    return found.inject(cut)


def answer(handler: Any, flow: http.HTTPFlow, layers: Iterable[Any], response: http.Response) -> bool:
    """Answer a flow whose HTTP/2 upstream sent no response headers yet with `response`,
    and reset the upstream stream. False when it is not such a flow."""
    found = _find(handler, flow, layers)
    if found is None or found.state() is not StreamState.EXPECTING_HEADERS:
        return False
    body = response.raw_content or b""

    def respond() -> Iterator[commands.Command]:
        if found.state() is not StreamState.EXPECTING_HEADERS:
            return  # the upstream's headers came first: the response hook replaces the answer
        yield from found.reset()
        yield ReceiveHttp(ResponseHeaders(found.theirs, response, end_stream=not body))
        if body:
            yield ReceiveHttp(ResponseData(found.theirs, body))
            yield ReceiveHttp(ResponseEndOfMessage(found.theirs))

    return found.inject(respond)
