"""A loopback OTLP trace receiver for the tracing tests: the official opentelemetry-proto
messages (ExportTraceServiceRequest) received over real gRPC (grpcio's server, the
TraceService the OpenTelemetry Collector implements) and over real HTTP (POST /v1/traces,
application/x-protobuf, as the Collector's otlphttp receiver). No registry reachable here
ships the Collector or Jaeger (PyPI, npm and Debian were searched), so this stands in: it
decodes exactly what the governor's exporter put on the wire, nothing is mocked on the
governor's side.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    resource: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


def spans_of(request: Any) -> list[ReceivedSpan]:
    out = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(ReceivedSpan(span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                                        span.kind, _attributes(span.attributes), span.status.code,
                                        span.status.message, resource))
    return out


@dataclass
class Receiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    port: int = 0
    _grpc: Any = None
    _runner: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def take(self, request: Any) -> None:
        self.requests += 1
        self.spans.extend(spans_of(request))

    # --- gRPC ---
    async def start_grpc(self) -> "Receiver":
        receiver = self

        class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
            async def Export(self, request, context):  # noqa: N802 (the proto's name)
                receiver.take(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._grpc = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), self._grpc)
        self.port = self._grpc.add_insecure_port("127.0.0.1:0")
        await self._grpc.start()
        return self

    # --- HTTP ---
    async def start_http(self) -> "Receiver":
        async def traces(request: web.Request) -> web.Response:
            body = await request.read()
            if request.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if request.content_type != "application/x-protobuf":
                return web.Response(status=415)
            self.take(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            return web.Response(body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                                content_type="application/x-protobuf")

        app = web.Application()
        app.router.add_post("/v1/traces", traces)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
        if self._runner is not None:
            await self._runner.cleanup()
