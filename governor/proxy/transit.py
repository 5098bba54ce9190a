"""Ending a flow that is already in transit: the one place that reaches into mitmproxy's layers.

mitmproxy can kill a flow only from inside an event hook (mitmproxy#4711), and a
stream callback is synchronous, while the governor's verdict on a stream (a cap
crossed, a wall-clock limit, a denied tool call) arrives asynchronously. So the
proxy ends in-transit flows from the *server side*, which keeps the client side
entirely in mitmproxy's hands and therefore protocol-correct:

`proxyserver` is the master's Proxyserver addon (which holds the live connections).

* `end_stream(proxyserver, flow)` — mid-body cut. The HTTP/1 reader of the upstream
  connection is told that end-of-file ends the body, and the upstream connection
  is closed: the upstream sees the disconnect (generation stops), mitmproxy sees a
  normal end of message, calls the stream callback one last time (which emits the
  adapter's terminal event) and finishes the client's response with correct
  framing, so the client's keep-alive connection stays usable. When the upstream's end was
  read already and waits at the flow's stream (the whole answer came while the flow waited
  for a hook), that end finishes the response and nothing upstream is left to stop.

* `gate(proxyserver, flow)` — hold the end of a streamed body (a tool call the
  model asked for awaits admission): the upstream's end-of-message is kept until
  the gate is released, so the client never sees a clean end before the verdict.

* `ping(proxyserver, flow, data)` — send `data` down a streamed response now, between the
  upstream's chunks (an SSE comment keeping a stream held for a reviewer alive). It goes
  as an injected message (mitmproxy routes those through every layer, TLS included, to
  the flow's stream) that the stream turns into response data: the stream callable and
  the client's framing are mitmproxy's own.

* `answer(proxyserver, flow, raw)` — no response headers yet (a hung upstream). The upstream
  reader is handed a complete HTTP/1.1 response (the governor's error in the
  provider's format) as if the upstream had sent it, and the upstream connection
  is closed. The client gets a clean error response on its kept-alive connection.

Each works on the HTTP/1 client layer of the flow's upstream connection; against an
HTTP/2 upstream, `transit_h2` does the same for the flow's one stream of the connection
(its siblings go on). When neither can be found (a changed mitmproxy), they fall back
to closing the upstream connection, which ends the client's response abruptly but
still stops generation (fail closed), and return False so the caller can log it.
The tests in tests/test_proxy_transit.py and tests/test_stream_cuts.py pin this behaviour.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator

import h11
from h11._receivebuffer import ReceiveBuffer
from mitmproxy import http
from mitmproxy.connection import ConnectionState
from mitmproxy.net.http.http1.read import read_response_head
from mitmproxy.proxy import events, layer
from mitmproxy.proxy.layers.http import HttpLayer, HttpStream, ResponseData
from mitmproxy.proxy.layers.http._base import HttpEvent
from mitmproxy.proxy.layers.http._http1 import Http1Client

from governor.proxy import transit_h2

logger = logging.getLogger(__name__)


class _EndAtEOF:
    """A body reader for a cut body: swallows whatever the upstream still sends, and
    reports end-of-message when the connection closes."""

    def __call__(self, buf: ReceiveBuffer) -> None:
        buf.maybe_extract_at_most(len(buf))
        return None

    def read_eof(self) -> h11.EndOfMessage:
        return h11.EndOfMessage()


def _handler(proxyserver: Any, flow: http.HTTPFlow) -> Any | None:
    """The connection handler serving the flow's client (mitmproxy's Proxyserver addon keeps them)."""
    return proxyserver.connections.get(flow.client_conn.id) if proxyserver is not None else None


def _layers(root: layer.Layer) -> Iterator[layer.Layer]:
    seen: set[int] = set()
    todo: list[Any] = [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        for attr in ("layer", "child_layer"):
            child = getattr(node, attr, None)
            if isinstance(child, layer.Layer):
                todo.append(child)
        # Mode layers (HttpProxy) hand their events straight to a child they keep
        # only as the bound method that replaced their own _handle_event.
        delegate = getattr(getattr(node, "_handle_event", None), "__self__", None)
        if isinstance(delegate, layer.Layer):
            todo.append(delegate)
        if isinstance(node, HttpLayer):
            todo.extend(node.connections.values())
            todo.extend(node.streams.values())


def _http1_client(handler: Any, flow: http.HTTPFlow) -> Http1Client | None:
    return _http1_client_in(_layers(handler.layer), flow)


def _http1_client_in(layers: Any, flow: http.HTTPFlow) -> Http1Client | None:
    for node in layers:
        if isinstance(node, Http1Client) and node.conn is flow.server_conn:
            return node
    return None


def _close_upstream(handler: Any, flow: http.HTTPFlow) -> None:
    """Close the upstream connection so that its reader ends at end-of-file: mitmproxy then
    hands the layers what it read already, and the close (which ends a cut body).

    Not `handler.close_connection`: it cancels the connection's reader task, and a reader
    cancelled while it waits to hand over data it read already (the cut ran inside another
    event, e.g. a hook's completion replaying the body that came meanwhile) never reports
    the close: the cut body never ended, the client hung, the socket stayed open."""
    conn = flow.server_conn
    io = handler.transports.get(conn)
    if io is None or not conn.connected:
        return
    transport = getattr(io.writer, "transport", None)
    if transport is None:  # not an asyncio stream (a changed mitmproxy): its own close
        handler.close_connection(conn)
        return
    conn.state = ConnectionState.CLOSED  # as close_connection marks it: nothing more is written
    transport.abort()  # the reader sees end-of-file once it has handed over what it holds


class Gate:
    """Withholds the end of an upstream body until released.

    Installed as the upstream reader's body reader while a streamed tool call waits
    for admission: data still flows (the relay keeps it back), but the upstream's
    end-of-message is kept until `release()`. Released after the end was withheld,
    the gate closes the upstream connection, whose end-of-file then delivers it.
    """

    def __init__(self, handler: Any, flow: http.HTTPFlow, inner: Any, client: Any = None) -> None:
        self.handler = handler
        self.flow = flow
        self.inner = inner
        self.client = client  # the reader it is installed on, to step aside once released
        self.released = False
        self.withheld = False  # the upstream's end-of-message arrived and is kept

    def __call__(self, buf: ReceiveBuffer) -> Any:
        if self.withheld:
            buf.maybe_extract_at_most(len(buf))
            return None
        event = self.inner(buf)
        if isinstance(event, h11.EndOfMessage) and not self.released:
            self.withheld = True
            return None
        return event

    def read_eof(self) -> Any:
        if self.withheld:
            return h11.EndOfMessage()
        return self.inner.read_eof()

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self.withheld:
            _close_upstream(self.handler, self.flow)
        elif self.client is not None and self.client.body_reader is self:
            # nothing withheld: the reader goes back as it was, so a stream held many times
            # (each tool call, each growth of its reservation) does not stack gates
            self.client.body_reader = self.inner


HELD_END = "governor.held_end"  # flow.metadata: the upstream's end, read already and kept (transit_h2.QueuedEnd)


def gate(proxyserver: Any, flow: http.HTTPFlow) -> Gate | transit_h2.Gate | transit_h2.QueuedEnd | None:
    """Install a Gate on the flow's upstream body (None when it cannot be done)."""
    handler = _handler(proxyserver, flow)
    if handler is None or not flow.live:
        return None
    layers = list(_layers(handler.layer))
    # the upstream ended while the flow's stream waited for a hook: its end is queued there
    queued = transit_h2.take_queued_end(handler, flow, layers)
    if queued is not None:
        flow.metadata[HELD_END] = queued
        return queued
    client = _http1_client_in(layers, flow)
    if client is None:
        return transit_h2.gate(handler, flow, layers)
    if client.state != client.read_body:
        return None
    installed = Gate(handler, flow, client.body_reader, client)
    client.body_reader = installed  # type: ignore[assignment]
    return installed


@dataclass
class _Ping(events.MessageInjected, HttpEvent):
    """Data for a flow's client: routed like an injected message, accepted by the HTTP stream."""


async def ping(proxyserver: Any, flow: http.HTTPFlow, data: bytes) -> bool:
    """Send `data` to the client of a streamed response as if the upstream had sent it
    (through the stream callable). False when the response is not streaming any more."""
    handler = _handler(proxyserver, flow)
    if handler is None or not flow.live:
        return False
    layers = list(_layers(handler.layer))
    stream = next((n for n in layers if isinstance(n, HttpStream) and getattr(n, "flow", None) is flow), None)
    # mitmproxy routes an injected message to the stream through the HTTP/1 client layer of
    # the upstream connection: not done over an HTTP/2 upstream (no keep-alive there)
    if (stream is None or stream.server_state != stream.state_stream_response_body
            or _http1_client_in(layers, flow) is None):
        return False
    streaming = stream.server_state

    def inject(event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.MessageInjected) and event.flow is flow:
            stream.server_state = streaming
            yield from streaming(ResponseData(stream.stream_id, data))
        else:  # whatever else comes first is the stream's as usual
            yield from streaming(event)

    stream.server_state = inject
    try:
        await handler.server_event(_Ping(stream.stream_id, flow, data))
    finally:
        if stream.server_state is inject:  # not delivered (the stream moved on): nothing sent
            stream.server_state = streaming
            return False
    return True


def end_stream(proxyserver: Any, flow: http.HTTPFlow) -> bool:
    """Cut a streaming response now: stop the upstream, end the client's response cleanly.

    Returns True when the clean path was taken, False when only the upstream
    connection could be closed (or the flow is no longer live).
    """
    handler = _handler(proxyserver, flow)
    if handler is None or not flow.live:
        return False
    queued = flow.metadata.pop(HELD_END, None)
    if queued is not None and not queued.released:  # the upstream is done: hand its end back
        queued.release()
        return True
    layers = list(_layers(handler.layer))
    client = _http1_client_in(layers, flow)
    if client is None and transit_h2.end_stream(handler, flow, layers):
        return True  # the one HTTP/2 stream reset, the connection kept for its siblings
    clean = client is not None and client.state == client.read_body
    if clean:
        assert client is not None
        client.body_reader = _EndAtEOF()  # type: ignore[assignment]
        client.buf = ReceiveBuffer()
    elif transit_h2.end_queued(flow, layers):
        return True  # the upstream sent it all; its end, queued at the flow, ends the response
    else:
        logger.warning("governor: cannot end %s cleanly; closing the upstream connection", flow.request.url)
    _close_upstream(handler, flow)
    return clean


def answer(proxyserver: Any, flow: http.HTTPFlow, raw_response: bytes) -> bool:
    """Answer a flow still waiting for its upstream's response headers with raw_response
    (a complete HTTP/1.1 response with Content-Length and Connection: close), and
    close the upstream connection. False when the flow is not in that state."""
    handler = _handler(proxyserver, flow)
    if handler is None or not flow.live or flow.response is not None:
        return False
    client = _http1_client(handler, flow)
    if client is None and transit_h2.answer(handler, flow, list(_layers(handler.layer)), _parsed(raw_response)):
        return True
    if client is None or client.state != client.read_headers or not client.request_done:
        logger.warning("governor: cannot answer %s in transit; closing the upstream connection", flow.request.url)
        _close_upstream(handler, flow)
        return False
    read_headers = client.read_headers
    client.buf = ReceiveBuffer()
    client.buf += raw_response

    def on_close(event: events.Event) -> layer.CommandGenerator[None]:
        # The upstream connection closing is the cue to parse the response we planted.
        client.state = read_headers
        yield from read_headers(events.DataReceived(client.conn, b""))

    client.state = on_close
    _close_upstream(handler, flow)
    return True


def _parsed(raw_response: bytes) -> http.Response:
    """`answer`'s raw HTTP/1.1 response as a Response (for an HTTP/2 upstream's stream)."""
    head, _, body = raw_response.partition(b"\r\n\r\n")
    response = read_response_head(head.split(b"\r\n"))
    response.content = body
    return response
