"""A bound on HTTP/1 message heads, which mitmproxy reads without one.

mitmproxy's HTTP/1 layers hold every byte of a request or response head until its blank
line ("FIXME: protect against header size DoS", mitmproxy/proxy/layers/http/_http1.py): a
client, or an upstream, sending one endless header line had the governor hold it all. The
connection guard's header deadline bounds the time, not the bytes (gigabytes fit in its 30 s
on loopback). Past `MAX_HEAD_BYTES` without the blank line:

  * a client gets **431** and is disconnected (what mitmproxy does with a head it cannot
    parse);
  * an upstream is disconnected, and the agent gets mitmproxy's 502 for the failed answer
    (the governor's error hook releases what the exchange held).

1 MiB: far above any real head (servers refuse past 8 to 64 KiB) and above the largest
header the governor reads (an `ADL-Passport` of 64 KiB, base64url: ~87 KiB), so that one
still gets its own clear 400. Installed once per process by `install()` (the proxy's
start), wrapping the two layers' `read_headers`; the wrapper costs one length test per
chunk of a head, nothing once the head is read.
"""

from __future__ import annotations

from typing import Any

from h11._receivebuffer import ReceiveBuffer
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import ErrorCode, ResponseProtocolError

MAX_HEAD_BYTES = 1024 * 1024
_INSTALLED = "_governor_bounded_head"


def _reading_head(layer: Any, wrapper: Any) -> bool:
    return getattr(layer.state, "__func__", None) is wrapper


def _bounded_server(original: Any) -> Any:
    def read_headers(self: Any, event: events.ConnectionEvent) -> Any:
        yield from original(self, event)
        if isinstance(event, events.DataReceived) and _reading_head(self, read_headers) \
                and len(self.buf) > MAX_HEAD_BYTES:
            held = len(self.buf)
            self.buf = ReceiveBuffer()
            yield commands.Log(f"governor: a client sent {held} bytes of request head without its end "
                               f"(at most {MAX_HEAD_BYTES}); disconnected")
            yield commands.SendData(self.conn, _http1.make_error_response(
                431, f"request head larger than the governor's limit of {MAX_HEAD_BYTES} bytes"))
            yield commands.CloseConnection(self.conn)
            self.state = self.done

    setattr(read_headers, _INSTALLED, True)
    return read_headers


def _bounded_client(original: Any) -> Any:
    def read_headers(self: Any, event: events.ConnectionEvent) -> Any:
        yield from original(self, event)
        if isinstance(event, events.DataReceived) and _reading_head(self, read_headers) \
                and self.stream_id is not None and len(self.buf) > MAX_HEAD_BYTES:
            held = len(self.buf)
            self.buf = ReceiveBuffer()
            # only the error: the exchange's stream answers the agent 502 and closes the
            # upstream connection itself. Closing it here too (CloseConnection, as mitmproxy
            # does for an unparseable head) cancelled this connection's own task inside the
            # hooks, which skipped the socket's close: the upstream was never disconnected.
            yield ReceiveHttp(ResponseProtocolError(
                self.stream_id, f"the upstream sent {held} bytes of response head without its end "
                f"(the governor reads at most {MAX_HEAD_BYTES})", ErrorCode.GENERIC_SERVER_ERROR))
            self.state = self.done

    setattr(read_headers, _INSTALLED, True)
    return read_headers


def install() -> None:
    """Bound both HTTP/1 layers' heads (idempotent)."""
    for cls, bounded in ((_http1.Http1Server, _bounded_server), (_http1.Http1Client, _bounded_client)):
        current = cls.read_headers
        if not getattr(current, _INSTALLED, False):
            cls.read_headers = bounded(current)  # type: ignore[method-assign]
