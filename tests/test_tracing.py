"""OpenTelemetry traces (governor/proxy/tracing.py, docs/tracing.md), received by a real OTLP
receiver over gRPC and over HTTP (tests/otlp_receiver.py: the official opentelemetry-proto
messages; no registry reachable here ships an official Collector or Jaeger: docs/tracing.md).

One world per protocol: the real governor on the real runtime (the notes passport of
tests/test_mcp_sdk_runtime.py), the official `openai` SDK in a subprocess sending its own
`traceparent`, the `mcp` SDK. A governed chat call, an MCP tool call, an MCP call the passport
refuses (it halts the session), then a chat call refused by the halt: asserted span by span,
the traceparent the mock upstream received, the trace ids in the logs and in the OpenMetrics
exemplars. The hostile side: traceparent headers that are not W3C's start a new trace and the
request is governed as any other.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import aiohttp
import orjson
import pytest
from mcp.shared.exceptions import McpError

from governor.adapters.base import AdapterConfig
from governor.common.logjson import JSONFormatter
from governor.proxy import tracing
from governor.proxy.server import Settings, serve
from governor.runtime.metrics import Metrics
from tests.control_harness import real_runtime
from tests.otlp_receiver import Receiver
from tests.proxy_harness import AGENT_NAMED, run_python, sdk_environment
from tests.test_mcp_sdk import NotesServer, mcp_session
from tests.test_mcp_sdk_runtime import PASSPORT, session_record
from tests.upstreams import MockLLM, make_tls

AGENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
AGENT_SPAN = "00f067aa0ba902b7"
CLIENT = 3  # SpanKind.CLIENT in the OTLP enum (SPAN_KIND_CLIENT)
ERROR = 2  # STATUS_CODE_ERROR

CHAT = """
import json, openai
client = openai.OpenAI(max_retries=0, timeout=30)
try:
    answer = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}],
                                            extra_headers={"traceparent": %r})
    print(json.dumps({"status": 200, "input": answer.usage.prompt_tokens, "output": answer.usage.completion_tokens}))
except openai.APIStatusError as exc:
    print(json.dumps({"status": exc.status_code}))
"""


def _environment(monkeypatch: pytest.MonkeyPatch, receiver: Receiver, protocol: str) -> None:
    for name in ("OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_RESOURCE_ATTRIBUTES",
                 "OTEL_TRACES_SAMPLER", "OTEL_PROPAGATORS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                       receiver.endpoint if protocol == "grpc" else f"{receiver.endpoint}/v1/traces")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "governor-under-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")


async def _world(tmp_path, monkeypatch, protocol: str):
    receiver = await (Receiver().start_grpc() if protocol == "grpc" else Receiver().start_http())
    _environment(monkeypatch, receiver, protocol)
    metrics = Metrics()
    runtime, _ = real_runtime(PASSPORT, tmp_path, metrics=metrics, sweep_interval_sec=0.05)
    tls = make_tls(tmp_path / "tls")
    mock = MockLLM(tls)
    await mock.start()
    server = NotesServer().start()
    settings = Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path,
                        session="notes-1", upstream_ca=tls.ca_file,
                        adapters=AdapterConfig(extra={"allowed_tools": runtime.allowed_tools}))
    governor = await serve(settings, runtime, metrics=metrics)
    return receiver, runtime, mock, server, governor


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_a_trace_of_a_chat_a_tool_call_and_refusals(tmp_path, monkeypatch, caplog, protocol):
    receiver, runtime, mock, server, governor = await _world(tmp_path, monkeypatch, protocol)
    stopped = False
    try:
        assert governor.tracing is not None
        env = sdk_environment(governor, mock)
        caplog.set_level(logging.INFO, logger="governor")
        chat = await run_python(CHAT % f"00-{AGENT_TRACE}-{AGENT_SPAN}-01", env)
        assert chat["status"] == 200
        async with mcp_session(server.url, governor.proxy_url) as session:
            read = await session.call_tool("read_note", {"path": "/notes/a.md"})
            with pytest.raises(McpError):
                await session.call_tool("shell", {"cmd": "id"})
        assert read.content[0].text == "contents of /notes/a.md"
        refused = await run_python(CHAT % f"00-{AGENT_TRACE}-{AGENT_SPAN}-01", env)
        assert refused["status"] >= 400  # the session is halted
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{governor.control_url}/metrics",
                                headers={"Accept": "application/openmetrics-text"}) as resp:
                assert resp.status == 200 and "openmetrics" in resp.headers["Content-Type"]
                exposition = await resp.text()
        record = await session_record(governor)
        digest = runtime.pinned.digest
    finally:
        await governor.stop()  # the spans flushed
        stopped = True
        server.stop()
        await mock.stop()
        await receiver.stop()
    assert stopped and receiver.requests >= 1
    spans = receiver.spans
    by_id = {span.span_id: span for span in spans}
    tops = [span for span in spans if span.name != "apply_guardrail"]
    names = [span.name for span in tops if not span.name.startswith(("POST", "GET", "DELETE"))]
    assert names == ["chat gpt-4o-mini", "execute_tool read_note", "execute_tool shell", "chat gpt-4o-mini"], names
    assert all(span.resource["service.name"] == "governor-under-test" for span in spans)

    def guards(parent: Any) -> list[Any]:
        return [span for span in spans if span.name == "apply_guardrail" and span.parent_span_id == parent.span_id]

    chat_span, read_span, shell_span, refused_span = [span for span in tops if span.name in names]
    # the chat: the agent's trace continued, passed upstream under the governor's span
    assert (chat_span.trace_id, chat_span.parent_span_id, chat_span.kind) == (AGENT_TRACE, AGENT_SPAN, CLIENT)
    assert chat_span.attributes["gen_ai.operation.name"] == "chat"
    assert chat_span.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert chat_span.attributes["gen_ai.provider.name"] == "openai"
    assert chat_span.attributes["gen_ai.usage.input_tokens"] == chat["input"]
    assert chat_span.attributes["gen_ai.usage.output_tokens"] == chat["output"]
    assert chat_span.attributes["http.response.status_code"] == 200 and chat_span.status_code != ERROR
    upstream = [r for r in mock.requests if r.path.endswith("/chat/completions")]
    assert len(upstream) == 1  # the refused call never went upstream
    assert upstream[0].headers["traceparent"] == f"00-{AGENT_TRACE}-{chat_span.span_id}-01"
    [chat_guard] = guards(chat_span)
    assert chat_guard.attributes["governor.decision.action"] == "permit"
    assert chat_guard.attributes["governor.policy.version"] == digest
    assert chat_guard.attributes["governor.session.id"] == "notes-1"
    assert chat_guard.trace_id == AGENT_TRACE
    # the tool call the passport declares: permitted
    assert read_span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert read_span.attributes["gen_ai.tool.name"] == "read_note" and read_span.status_code != ERROR
    [read_guard] = guards(read_span)
    assert read_guard.attributes["governor.decision.action"] == "permit"
    assert "governor.event.seq" not in read_guard.attributes  # a plain permit records no event
    # the one it does not: refused, its decision's event named by seq, as in the record
    [shell_guard] = guards(shell_span)
    shell_events = [e for e in record["events"] if (e.get("detail") or {}).get("tool") == "shell"]
    assert shell_events
    assert shell_guard.attributes["governor.event.seq"] == [e["seq"] for e in shell_events]
    assert shell_guard.attributes["governor.decision.action"] == shell_events[-1]["action"] == "halt"
    assert shell_guard.attributes["governor.decision.cause"] == shell_events[-1]["cause"]
    assert shell_guard.status_code == ERROR
    assert shell_span.status_code == ERROR and shell_span.attributes["error.type"] == shell_events[-1]["cause"]
    # the chat refused by the halt: its span ends with the refusal
    assert refused_span.trace_id == AGENT_TRACE and refused_span.status_code == ERROR
    assert refused_span.attributes["http.response.status_code"] == refused["status"]
    assert refused_span.attributes["governor.decision.action"] == "halt"
    [refused_guard] = guards(refused_span)
    assert refused_guard.attributes["governor.decision.action"] == "halt"
    assert all(by_id.get(span.parent_span_id) or span.parent_span_id in ("", AGENT_SPAN) for span in spans)
    # logs: the halt's warning carries the shell call's trace and span
    halted = [r for r in caplog.records if "HALTED" in r.getMessage()]
    assert halted and (halted[0].trace_id, halted[0].span_id) == (shell_span.trace_id, shell_span.span_id)
    line = orjson.loads(JSONFormatter().format(halted[0]))  # --log-format json
    assert (line["trace_id"], line["span_id"]) == (shell_span.trace_id, shell_span.span_id)
    # exemplars: the decision latency histogram names traces the receiver got
    exemplars = re.findall(r'^governor_decision_seconds_bucket\{[^}]*\} [0-9.]+ # \{span_id="([0-9a-f]{16})",'
                           r'trace_id="([0-9a-f]{32})"\}', exposition, re.M)
    assert exemplars and all(trace in {s.trace_id for s in spans} for _, trace in exemplars), exposition[:2000]


@pytest.mark.parametrize("header", [
    "not-a-traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
    "00-" + "g" * 32 + "-00f067aa0ba902b7-01", "ff-" + AGENT_TRACE + "-" + AGENT_SPAN + "-01",  # version ff is invalid
    "00-" + AGENT_TRACE + "-" + AGENT_SPAN + "-01" + "x" * 8000,
])
async def test_a_hostile_traceparent_starts_a_new_trace(tmp_path, monkeypatch, header):
    receiver, runtime, mock, server, governor = await _world(tmp_path, monkeypatch, "http/protobuf")
    try:
        env = sdk_environment(governor, mock)
        chat = await run_python(CHAT % header, env)
        assert chat["status"] == 200  # governed as any other request
    finally:
        await governor.stop()
        server.stop()
        await mock.stop()
        await receiver.stop()
    [span] = [s for s in receiver.spans if s.name == "chat gpt-4o-mini"]
    assert span.parent_span_id == "" and span.trace_id not in (AGENT_TRACE, "0" * 32)
    [upstream] = [r for r in mock.requests if r.path.endswith("/chat/completions")]
    # sampled (01), and with W3C Trace Context level 2's random flag (02) for a trace the governor began
    assert re.fullmatch(f"00-{span.trace_id}-{span.span_id}-0[13]", upstream.headers["traceparent"])


def test_no_exporter_configured_is_no_tracing():
    assert tracing.from_environment({}) is None
    assert tracing.from_environment({"OTEL_SERVICE_NAME": "x"}) is None
    assert tracing.from_environment({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert tracing.from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                                     "OTEL_SDK_DISABLED": "true"}) is None


def test_an_unsupported_exporter_or_protocol_is_refused_naming_the_variable():
    with pytest.raises(tracing.TracingError, match="OTEL_TRACES_EXPORTER: zipkin"):
        tracing.from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(tracing.TracingError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL.*http/json"):
        tracing.from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                                  "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


async def test_without_tracing_the_chain_has_no_tracing_addon(tmp_path, monkeypatch):
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    from tests.proxy_harness import real_governor

    async with real_governor(tmp_path) as (running, _mock):
        assert running.tracing is None
        assert not any(type(addon).__module__ == tracing.__name__ for addon in running.chain.members)
        assert running.metrics.exemplar is None
        assert type(running.chain.members[1].calls.runtime).__name__ != "TracedRuntime"


STREAMED = """
import json, openai
client = openai.OpenAI(max_retries=0, timeout=30)
stream = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True,
                                        stream_options={"include_usage": True})
usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
print(json.dumps({"input": usage.prompt_tokens, "output": usage.completion_tokens}))
"""


async def test_a_streamed_chat_span_carries_its_usage(tmp_path, monkeypatch):
    receiver, runtime, mock, server, governor = await _world(tmp_path, monkeypatch, "grpc")
    try:
        streamed = await run_python(STREAMED, sdk_environment(governor, mock))
    finally:
        await governor.stop()
        server.stop()
        await mock.stop()
        await receiver.stop()
    [span] = [s for s in receiver.spans if s.name == "chat gpt-4o-mini"]
    assert span.attributes["gen_ai.usage.input_tokens"] == streamed["input"]
    assert span.attributes["gen_ai.usage.output_tokens"] == streamed["output"]
    assert span.attributes["http.response.status_code"] == 200 and span.status_code != ERROR
    [guard] = [s for s in receiver.spans if s.name == "apply_guardrail" and s.parent_span_id == span.span_id]
    assert guard.attributes["governor.decision.action"] == "permit"
