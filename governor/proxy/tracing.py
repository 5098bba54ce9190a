"""OpenTelemetry traces of governed steps (docs/tracing.md), when the `otel` extra is installed
and the standard OTEL_* variables configure an exporter; otherwise nothing of this runs.

One span per request the proxy sees, a child of the agent's `traceparent` when it sent one,
passed upstream as the parent of the upstream's own spans. Its first governed step names it
after the GenAI semantic conventions: `chat {model}` for a model call, `execute_tool {tool}`
for a tool call (`gen_ai.*` attributes). Each decision is an `apply_guardrail` child span:
the action, the cause, the passport's digest as the policy version, the seqs of the events it
journaled. A refused request's span ends with the refusal (status ERROR, `error.type` the
cause). While a flow's span is current (the hooks of its flow), log records carry its
`trace_id` and `span_id` (governor.common.logjson writes them) and the latency histograms
keep them as exemplars (OpenMetrics).

mitmproxy runs each hook of a flow as its own task: `Tracing.opening`, the chain's first
addon, makes the flow's span current in that task's context; what the later addons do in the
same hook (the runtime called through `TracedRuntime`) sees it. Nothing is global: the tracer
provider is the governor's own, shut down (spans flushed) when the governor stops.
"""

from __future__ import annotations

import logging
import os
from contextvars import ContextVar
from typing import Any, Callable, Mapping

from governor.policy.steps import ModelCall, ToolCall

log = logging.getLogger("governor.tracing")

SPAN_KEY = "governor.span"  # flow.metadata: the flow's span, from its request to its end
ACTION_HEADER = "adl-governor-action"  # on answers the governor made (governor.proxy.refusing)
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")

# the span of the flow whose hook this task runs (set by Tracing.opening in each hook's task)
_current: ContextVar[Any] = ContextVar("governor_flow_span", default=None)


class TracingError(ValueError):
    """The OTEL_* variables ask for something the governor cannot do; says which."""


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the OTEL_* variables ask for traces: not OTEL_SDK_DISABLED, and an exporter
    named (OTEL_TRACES_EXPORTER) or an OTLP endpoint given. The SDK's own default (OTLP to
    localhost) is not taken: a governor nobody asked to trace exports nothing."""
    if _true(environ.get("OTEL_SDK_DISABLED")):
        return False
    exporter = (environ.get("OTEL_TRACES_EXPORTER") or "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def from_environment(environ: Mapping[str, str], version: str = "") -> "Tracing | None":
    """The governor's tracing as the OTEL_* variables configure it, or None (not asked for,
    or the `otel` extra is not installed: then a warning says how to install it)."""
    if not wanted(environ):
        return None
    exporters = [name.strip().lower() for name in (environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")]
    unknown = [name for name in exporters if name not in EXPORTERS]
    if unknown:
        raise TracingError(f"OTEL_TRACES_EXPORTER: {', '.join(unknown)} not supported (use otlp, console or none)")
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if "otlp" in exporters and protocol not in PROTOCOLS:
        raise TracingError(f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} not "
                           f"supported (use {' or '.join(PROTOCOLS)})")
    try:
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_* variables ask for traces but the otel extra is not installed "
                    "(pip install 'adl-governor[otel]'): no traces")
        return None
    detected = OTELResourceDetector().detect()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    own = {"service.version": version} if version else {}
    if "service.name" not in detected.attributes:
        own["service.name"] = "adl-governor"
    provider = TracerProvider(resource=Resource.create(own).merge(detected))  # OTEL_TRACES_SAMPLER read here
    for name in exporters:
        if name == "otlp":
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(protocol)))  # OTEL_BSP_* read here
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    return Tracing(provider, protocol)


def start(environ: Mapping[str, str] | None, metrics: Any = None) -> "Tracing | None":
    """The governor's tracing for `governor run` (environ None: the process's variables):
    log records and the metrics' latency exemplars carry the trace ids from now on."""
    from governor.common.version import package_version

    traces = from_environment(os.environ if environ is None else environ, package_version())
    if traces is not None:
        traces.install()
        if metrics is not None and hasattr(metrics, "exemplar"):
            metrics.exemplar = traces.exemplar
        log.info("governor: traces exported (%s)", traces.protocol)
    return traces


def _otlp_exporter(protocol: str) -> Any:
    # each exporter reads its endpoint, headers, timeout, compression and certificates from
    # the OTEL_EXPORTER_OTLP_* variables itself
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


class _Headers:
    """mitmproxy's Headers as a propagator's carrier (getter and setter)."""

    @staticmethod
    def get(carrier: Any, key: str) -> list[str] | None:
        value = carrier.get(key)
        return None if value is None else [value]

    @staticmethod
    def keys(carrier: Any) -> list[str]:
        return list(carrier.keys())

    @staticmethod
    def set(carrier: Any, key: str, value: str) -> None:
        carrier[key] = value


class Tracing:
    """The governor's tracer and what it adds to the chain (`opening`, `closing`), to the
    runtime calls (`traced`), to log records and to the histograms' exemplars."""

    def __init__(self, provider: Any, protocol: str = "http/protobuf") -> None:
        from opentelemetry import trace
        from opentelemetry.propagate import get_global_textmap  # OTEL_PROPAGATORS (default W3C tracecontext, baggage)

        from governor.common.version import package_version

        self.provider = provider
        self.protocol = protocol
        self.tracer = provider.get_tracer("adl-governor", package_version())
        self.propagator = get_global_textmap()
        self._trace = trace
        self._factory: Any = None  # the log record factory this replaced, while installed
        self.opening = _Opening(self)
        self.closing = _Closing(self)

    # --- the flow's span -----------------------------------------------------------------

    def start(self, flow: Any) -> Any:
        trace = self._trace
        request = flow.request
        parent = self.propagator.extract(request.headers, getter=_Headers)  # the agent's traceparent
        span = self.tracer.start_span(request.method, context=parent, kind=trace.SpanKind.CLIENT, attributes={
            "http.request.method": request.method, "server.address": request.host, "server.port": request.port,
            "url.path": request.path.split("?", 1)[0]})
        # the upstream continues the trace under this span (the agent's traceparent replaced)
        self.propagator.inject(request.headers, context=trace.set_span_in_context(span), setter=_Headers)
        flow.metadata[SPAN_KEY] = span
        return span

    def end(self, flow: Any, error: str | None = None) -> None:
        span = flow.metadata.pop(SPAN_KEY, None)
        if span is None:
            return
        response = flow.response
        status = self._trace.StatusCode
        if response is not None:
            span.set_attribute("http.response.status_code", response.status_code)
            action = response.headers.get(ACTION_HEADER)
            if action:
                span.set_attribute("governor.decision.action", action)
            if response.status_code >= 400 and span.status.status_code is not status.ERROR:
                # a refusal decided by a step already said why (Tracing.decided)
                span.set_attribute("error.type", span.attributes.get("error.type") or str(response.status_code))
                span.set_status(status.ERROR, f"{'refused' if action else 'upstream answered'} "
                                              f"{response.status_code}")
        elif error is not None:
            span.set_attribute("error.type", span.attributes.get("error.type") or "exchange_failed")
            span.set_status(status.ERROR, error)
        span.end()

    # --- the steps decided under it ------------------------------------------------------

    def named(self, span: Any, step: Any, adapter: str = "") -> None:
        """The flow's span named by its first governed step (GenAI semantic conventions)."""
        if span.attributes.get("gen_ai.operation.name"):
            return
        if type(step) is ModelCall:
            operation = "embeddings" if "embedding" in str(span.attributes.get("url.path", "")) else "chat"
            span.update_name(f"{operation} {step.model}")
            span.set_attributes({"gen_ai.operation.name": operation, "gen_ai.request.model": step.model,
                                 "gen_ai.provider.name": step.provider or adapter or "unknown"})
            if step.expected_output_tokens:
                span.set_attribute("gen_ai.request.max_tokens", step.expected_output_tokens)
        elif type(step) is ToolCall and step.origin == "agent":
            span.update_name(f"execute_tool {step.tool}")
            span.set_attributes({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": step.tool})

    def decided(self, span: Any, guard: Any, step: Any, admission: Any, policy_version: str | None) -> None:
        decision = admission.decision
        action = getattr(decision.action, "value", str(decision.action))
        attributes: dict[str, Any] = {"governor.decision.action": action,
                                      "governor.decision.enforced": decision.enforced,
                                      "governor.step": type(step).__name__,
                                      "governor.session.id": admission.session}
        if decision.cause:
            attributes["governor.decision.cause"] = decision.cause
        if policy_version:
            attributes["governor.policy.version"] = policy_version
        if admission.seqs:
            attributes["governor.event.seq"] = list(admission.seqs)
        if type(step) is ToolCall:
            attributes["gen_ai.tool.name"] = step.tool
        guard.set_attributes(attributes)
        if decision.blocks:
            message = admission.governor_object.get("reason") or decision.cause or action
            guard.set_status(self._trace.StatusCode.ERROR, str(message))
            span.set_attributes({"error.type": decision.cause or action, "governor.decision.action": action,
                                 **({"governor.decision.cause": decision.cause} if decision.cause else {})})
            span.set_status(self._trace.StatusCode.ERROR, f"refused: {message}")
        guard.end()

    def guard(self, span: Any) -> Any:
        return self.tracer.start_span("apply_guardrail", context=self._trace.set_span_in_context(span),
                                      attributes={"gen_ai.operation.name": "apply_guardrail"})

    # --- logs and exemplars ------------------------------------------------------------------

    @staticmethod
    def current_ids() -> tuple[str, str] | None:
        """(trace_id, span_id) of the flow whose hook runs now, hex as in traceparent."""
        span = _current.get()
        if span is None:
            return None
        context = span.get_span_context()
        return format(context.trace_id, "032x"), format(context.span_id, "016x")

    def exemplar(self) -> dict[str, str] | None:
        ids = self.current_ids()
        return None if ids is None else {"trace_id": ids[0], "span_id": ids[1]}

    def install(self) -> None:
        """Log records made while a flow's span is current carry its trace and span ids."""
        if self._factory is not None:
            return
        previous = self._factory = logging.getLogRecordFactory()
        ids = self.current_ids

        def record(*args: Any, **kwargs: Any) -> logging.LogRecord:
            made = previous(*args, **kwargs)
            current = ids()
            if current is not None:
                made.trace_id, made.span_id = current
            return made

        logging.setLogRecordFactory(record)

    def shutdown(self) -> None:
        """Spans still queued exported (bounded by OTEL_BSP_EXPORT_TIMEOUT), the exporters closed."""
        if self._factory is not None:
            logging.setLogRecordFactory(self._factory)
            self._factory = None
        self.provider.shutdown()

    # --- the runtime, traced -----------------------------------------------------------------

    def traced(self, runtime: Any, policy_version: Callable[[], str | None]) -> "TracedRuntime":
        return TracedRuntime(runtime, self, policy_version)


class _Opening:
    """The chain's first addon: a flow's span started (request) and made current in each of
    its hooks' tasks."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def request(self, flow: Any) -> None:
        try:
            span = flow.metadata.get(SPAN_KEY) or self.tracing.start(flow)
        except Exception:  # a trace never stops a request
            log.exception("governor: a span could not be started")
            return
        _current.set(span)

    def _resume(self, flow: Any) -> None:
        _current.set(flow.metadata.get(SPAN_KEY))

    responseheaders = response = error = _resume


class _Closing:
    """The chain's last addon: a flow's span ended with its answer or its error."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def response(self, flow: Any) -> None:
        self._end(flow, None)

    def error(self, flow: Any) -> None:
        self._end(flow, flow.error.msg if flow.error else "exchange failed")

    def _end(self, flow: Any, error: str | None) -> None:
        try:
            self.tracing.end(flow, error)
        except Exception:
            log.exception("governor: a span could not be ended")
        _current.set(None)


class TracedRuntime:
    """The runtime as the proxy's calls see it with tracing on: each admitted step is an
    `apply_guardrail` span under the flow's span (which the first step names), a model call's
    final usage the span's `gen_ai.usage.*`. Everything else is the runtime's own."""

    def __init__(self, runtime: Any, tracing: Tracing, policy_version: Callable[[], str | None]) -> None:
        self._runtime = runtime
        self._tracing = tracing
        self._policy_version = policy_version

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def admit(self, session: str, step: Any) -> Any:
        span = _current.get()
        if span is None or not span.is_recording():
            return await self._runtime.admit(session, step)
        tracing = self._tracing
        try:
            tracing.named(span, step)
            guard = tracing.guard(span)
        except Exception:
            log.exception("governor: a step's span could not be started")
            return await self._runtime.admit(session, step)
        admission = await self._runtime.admit(session, step)
        try:
            tracing.decided(span, guard, step, admission, self._policy_version())
        except Exception:
            log.exception("governor: a decision's span could not be ended")
        return admission

    async def usage(self, session: str, ticket: Any, report: Any) -> Any:
        decision = await self._runtime.usage(session, ticket, report)
        span = _current.get()
        if span is not None and report.final and span.is_recording():
            span.set_attributes({"gen_ai.usage.input_tokens": report.input_tokens,
                                 "gen_ai.usage.output_tokens": report.output_tokens})
            if decision.blocks:
                span.set_attributes({"error.type": decision.cause or "refused",
                                     "governor.decision.action": getattr(decision.action, "value", "")})
        return decision
