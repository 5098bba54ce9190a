"""Sending into a live WebSocket, and ending it: the one place that reaches into mitmproxy's
WebSocket layer (as governor/proxy/transit.py does for HTTP).

mitmproxy lets an addon drop a message, change it, or inject one (`inject.websocket`), but
not close a socket: the governor's cut must end both sides with a close frame, so the
client's SDK raises and the upstream stops generating. `install()` wraps the layer's
`relay_messages` (once per process) to understand one more injected event, `GovernorSend`:

  * its message (an error event the adapter made) goes to the client as a text message,
    without passing the addons' hooks again;
  * with `close` = (code, reason), both sides then get a close frame with that code and
    both connections are closed, exactly as the layer does when a peer closes
    (websocket_end is called, the flow ends).

The wrapper also bounds what the layer holds of one message: mitmproxy reassembles a
fragmented message in memory without a limit before any hook sees it. Past
`max_message_bytes` (the addon sets it; default MAX_MESSAGE_BYTES) the socket is cut at
once with close code 1009 (message too big) and the flow is marked (OVERSIZE_KEY in its
metadata) for the addon to record at websocket_end. A message that arrives whole within one
read (a compressed one inflates at once) is not held across reads: `oversize(flow, size)`
is the addon's check of it in its hook, with the same verdict.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import wsproto.events
from mitmproxy import http, websocket
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.websocket import WebsocketEndHook, WebsocketLayer, WebSocketMessageInjected
from wsproto import ConnectionState
from wsproto.frame_protocol import Opcode

log = logging.getLogger("governor.proxy")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # far above any Realtime event (audio is sent in small appends)
OVERSIZE_KEY = "governor.ws_oversize"  # flow.metadata: (from_client, bytes held) of a message cut for its size
CLOSE_REASON_BYTES = 123  # RFC 6455: a close frame's reason is at most 123 bytes of UTF-8
_INSTALLED = "_governor_ws_transit"
_limits = {"max_message_bytes": MAX_MESSAGE_BYTES}  # set once at start-up (configure), read by the layer wrapper


@dataclass
class GovernorSend(WebSocketMessageInjected):
    """An event for the client from the governor, and possibly the end of the socket."""

    close: tuple[int, str] | None = None


def close_reason(text: str) -> str:
    """`text` cut to what a close frame can carry (123 bytes of UTF-8, on a character boundary)."""
    data = text.encode()[:CLOSE_REASON_BYTES]
    return data.decode("utf-8", "ignore")


def _closing(layer: WebsocketLayer, code: int, reason: str) -> Any:
    """The commands that end the socket: a close frame to each side still open, both
    connections closed, websocket_end; what the layer itself does when a peer closes."""
    flow = layer.flow
    assert flow.websocket is not None
    flow.websocket.timestamp_end = time.time()
    flow.websocket.closed_by_client = False
    flow.websocket.close_code = code
    flow.websocket.close_reason = reason
    close = wsproto.events.CloseConnection(code=code, reason=reason)
    for ws in (layer.server_ws, layer.client_ws):
        if ws.state in {ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING}:
            yield ws.send2(close)
        yield commands.CloseConnection(ws.conn)
    yield WebsocketEndHook(flow)
    flow.live = False
    layer._handle_event = layer.done


def _send(layer: WebsocketLayer, event: GovernorSend) -> Any:
    if layer._handle_event != layer.relay_messages:  # already over
        return
    message = event.message
    if message.content and layer.client_ws.state is ConnectionState.OPEN:
        assert layer.flow.websocket is not None
        layer.flow.websocket.messages.append(message)
        yield layer.client_ws.send2(wsproto.events.TextMessage(message.content.decode("utf-8", "replace")))
    if event.close is not None:
        yield from _closing(layer, event.close[0], close_reason(event.close[1]))


def _held(layer: WebsocketLayer) -> tuple[bool, int] | None:
    limit = _limits["max_message_bytes"]
    for from_client, ws in ((True, layer.client_ws), (False, layer.server_ws)):
        held = sum(map(len, ws.frame_buf))
        if held > limit:
            return from_client, held
    return None


def _bounded(original: Any) -> Any:
    def relay_messages(self: WebsocketLayer, event: events.Event) -> Any:
        if isinstance(event, GovernorSend):
            yield from _send(self, event)
            return
        yield from original(self, event)
        if isinstance(event, events.DataReceived) and self._handle_event == self.relay_messages:
            oversize = _held(self)
            if oversize is not None:
                from_client, held = oversize
                self.flow.metadata[OVERSIZE_KEY] = oversize
                for ws in (self.client_ws, self.server_ws):
                    ws.frame_buf = [b""]
                side = "client" if from_client else "upstream"
                yield commands.Log(f"governor: a {side} WebSocket message passed {held} bytes without its end "
                                   f"(at most {_limits['max_message_bytes']}); the socket is closed")
                yield from _closing(self, 1009, f"message larger than the governor's limit of "
                                                f"{_limits['max_message_bytes']} bytes")

    setattr(relay_messages, _INSTALLED, True)
    return relay_messages


def oversize(flow: http.HTTPFlow, from_client: bool, size: int) -> bool:
    """Whether a whole message of `size` bytes is past the bound; if so the flow is marked
    for the record, as a message cut while it was still arriving is."""
    if size <= _limits["max_message_bytes"]:
        return False
    flow.metadata[OVERSIZE_KEY] = (from_client, size)
    return True


def install(max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
    """Wrap the WebSocket layer (idempotent); `max_message_bytes` bounds one message."""
    _limits["max_message_bytes"] = max_message_bytes
    current = WebsocketLayer.relay_messages
    if not getattr(current, _INSTALLED, False):
        WebsocketLayer.relay_messages = _bounded(current)  # type: ignore[method-assign]


def send(proxyserver: Any, flow: http.HTTPFlow, event: bytes, close: tuple[int, str] | None = None) -> bool:
    """Send `event` (a text message) to the flow's client, then close the socket with
    `close` = (code, reason) when given; False when the socket is no longer live (nothing
    to do) or there is no proxy server to send through (a test without a master)."""
    if proxyserver is None or flow.websocket is None or flow.websocket.timestamp_end is not None:
        return False
    message = websocket.WebSocketMessage(Opcode.TEXT, False, event, injected=True)
    try:
        proxyserver.inject_event(GovernorSend(flow, message, close))
    except ValueError:  # the client's connection is gone
        return False
    return True


__all__ = ["GovernorSend", "install", "send", "oversize", "close_reason", "MAX_MESSAGE_BYTES", "OVERSIZE_KEY"]
