"""MCP over streamable HTTP: tools/call is a ToolCall step, tools/list is filtered.

Recognised by body shape, never by host: a POST whose body is a JSON-RPC 2.0
message with an MCP method (initialize, tools/call, notifications/..., ...), or
any request carrying the transport's `Mcp-Session-Id` / `Mcp-Protocol-Version` /
`Mcp-Method` headers (the GET event stream, DELETE, the client's replies to server
requests). Both revisions: 2025-11-25 and before (the initialize handshake, sessions) and
2026-07-28 (stateless: `server/discover`, per-request `_meta`, routing headers that must
mirror the body, `mcp_headers.py`; tasks and subscriptions pass).

- tools/call -> ToolCall(tool, arguments, target_path). The target path is the
  first top-level string argument named (case-insensitively) path, file_path,
  filepath, file, filename, target_path, target, uri, url, directory or dir;
  a `file://` URI gives its path. The tool's declared data classes are the policy
  engine's to add (it holds the passport).
- A refusal is a JSON-RPC error with the request's id (see `jsonrpc`): the `mcp`
  SDK raises McpError carrying `error.data.governor`.
- tools/list: the answer (JSON or SSE) keeps only the tools the session (or the
  persona) may use, from the runtime's `allowed_tools(session, persona)`, given
  to the adapter as `AdapterConfig.extra["allowed_tools"]`. This is for the
  agent's benefit only: every tools/call is decided anyway.
- A tools/call answer with `isError: true`, a JSON-RPC error or an HTTP 5xx is a
  ToolError step (on_tool_error).
- JSON-RPC batches (MCP 2025-03-26) pass when they hold no tools/call or tools/list;
  a batch that does is refused (400): the protocol dropped batching in 2025-06-18
  and a refusal inside a batch could not name the call it refuses. So is a
  tools/call without a string name or with non-object arguments, a batch holding
  anything but message objects (`[[...]]`), and a request only a server sends to its
  client (`sampling/createMessage`, `elicitation/create`, `roots/list`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping
from urllib.parse import unquote, urlsplit

import orjson

from governor.adapters import jsonrpc, mcp_headers, withhold
from governor.adapters.endpoints import GOVERNED as GOVERNED_STEP, Endpoint, Probe
from governor.adapters.base import Adapter, Exchange, Observation, Reply, StreamEvent, StreamWatcher
from governor.adapters.request_view import BadRequest, RequestView
from governor.common.canonical import inexact_json
from governor.policy.steps import Decision, Step, ToolCall, ToolError

MCP_METHODS = frozenset({
    "initialize", "ping",
    "tools/list", "tools/call",
    "resources/list", "resources/templates/list", "resources/read", "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list", "prompts/get",
    "completion/complete", "logging/setLevel",
    "sampling/createMessage", "elicitation/create", "roots/list",
    # 2026-07-28: discovery instead of the handshake, subscriptions, the tasks extension
    "server/discover", "subscriptions/listen", "tasks/get", "tasks/list", "tasks/cancel", "tasks/result",
})
GOVERNED = frozenset({"tools/call", "tools/list"})
# Requests a server sends to its client (MCP 2025-06-18): a client never sends them to a
# server, so one that does is refused, not forwarded (a relay that ran sampling/createMessage
# would be a model call outside any budget)
SERVER_TO_CLIENT = frozenset({"sampling/createMessage", "elicitation/create", "roots/list"})
SESSION_HEADERS = ("mcp-session-id", "mcp-protocol-version", mcp_headers.METHOD_HEADER)
PATH_ARGUMENTS = ("path", "file_path", "filepath", "file", "filename", "target_path", "target", "uri", "url",
                  "directory", "dir")
MAX_ERROR_MESSAGE = 500

AllowedTools = Callable[[str, "str | None"], Any]  # -> frozenset[str] | None, or an awaitable of it


def target_path(arguments: Mapping[str, Any]) -> str | None:
    """The argument the policy matches path patterns against (rule in the module doc)."""
    by_name = {k.lower(): v for k, v in arguments.items() if isinstance(k, str) and isinstance(v, str)}
    for name in PATH_ARGUMENTS:
        value = by_name.get(name)
        if value:
            if value.startswith("file://"):
                return unquote(urlsplit(value).path) or value
            return value
    return None


def tool_failure(response: Mapping[str, Any]) -> str | None:
    """Why a tools/call response reports a failure, or None when it succeeded."""
    if "error" in response:
        error = response["error"]
        message = error.get("message") if isinstance(error, dict) else None
        return f"JSON-RPC error: {message or error}"[:MAX_ERROR_MESSAGE]
    result = response.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        texts = [c.get("text", "") for c in result.get("content") or () if isinstance(c, dict)]
        return ("; ".join(t for t in texts if isinstance(t, str) and t) or "tool reported isError")[:MAX_ERROR_MESSAGE]
    return None


UNREADABLE_TOOLS_LIST = ("governor: the tool server's tools/list answer could not be read, so the tools this "
                         "session may not use could not be withheld from it; it was not delivered")


def filter_tools(response: dict[str, Any], allowed: frozenset[str]) -> list[str] | None:
    """Keep only allowed tools in a tools/list result, in place; the names withheld, or None
    when nothing was (withhold.filter_listed: exact names; one without a string name goes)."""
    result = response.get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return None
    filtered = withhold.filter_listed(tools, allowed)
    if filtered is None:
        return None
    result["tools"], withheld = filtered
    return withheld


class MCPAdapter(Adapter):
    name = "mcp"

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self._allowed_tools: AllowedTools | None = self.config.extra.get("allowed_tools")

    def match(self, request: RequestView) -> bool:
        if any(request.headers.get(h) for h in SESSION_HEADERS):
            return True
        if request.method != "POST":
            return False
        return jsonrpc.is_call(request.json_or_none(), MCP_METHODS, ("notifications/",))

    def open(self, request: RequestView, *, session: str, persona: str | None) -> Exchange:
        body = request.json() if request.content else None
        exchange = Exchange(self, request.method, request.host, request.path, body, session, persona)
        if (mismatch := mcp_headers.routing_mismatch(request.headers, body)) is not None:
            raise BadRequest(f"{mismatch}: what is routed on would not be what the governor decided on "
                             "(MCP 2026-07-28 routing headers must mirror the body)")
        if isinstance(body, list):
            if not all(isinstance(m, dict) for m in body):  # a nested batch [[...]]: no JSON-RPC message
                raise BadRequest("a JSON-RPC batch holds only message objects; this one holds something else "
                                 "(a nested batch?), which the governor does not forward unread")
            governed = [m["method"] for m in body
                        if isinstance(m.get("method"), str) and m["method"] in GOVERNED | SERVER_TO_CLIENT]
            if governed:
                raise BadRequest(f"a JSON-RPC batch holding {', '.join(governed)} is not governed; send each "
                                 "call in its own request (MCP 2025-06-18 removed batching)")
            return exchange
        method = body.get("method") if isinstance(body, dict) else None
        if isinstance(method, str) and method in SERVER_TO_CLIENT:
            raise BadRequest(f"{method} is a request an MCP server sends to its client; a client does not send "
                             "it to a server, and the governor refuses it rather than forward a model call "
                             "ungoverned")
        if not isinstance(method, str) or method not in GOVERNED:
            return exchange
        exchange.state["method"] = body["method"]
        exchange.state["rpc_id"] = body.get("id")
        if body["method"] == "tools/call":
            params = body.get("params")
            name = params.get("name") if isinstance(params, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest("tools/call needs params.name, the tool's name as a string")
            arguments = params.get("arguments")
            if arguments is None:
                arguments = {}
            if not isinstance(arguments, dict):
                raise BadRequest(f"tools/call {name}: params.arguments must be an object")
            if (inexact := inexact_json(arguments)) is not None:  # digested, shown to reviewers, recorded
                raise BadRequest(f"tools/call {name}: params.arguments{inexact}: the step reviewed and recorded "
                                 "would not be the call that runs (send a large number as a string)")
            exchange.state["tool"] = name
            exchange.state["arguments"] = arguments
        return exchange

    async def steps(self, exchange: Exchange) -> list[Step]:
        method = exchange.state.get("method")
        if method == "tools/call":
            arguments = exchange.state["arguments"]
            return [ToolCall(tool=exchange.state["tool"], arguments=arguments, target_path=target_path(arguments),
                             persona=exchange.persona)]
        if method == "tools/list" and self._allowed_tools is not None:
            allowed = self._allowed_tools(exchange.session, exchange.persona)
            if inspect.isawaitable(allowed):
                allowed = await allowed
            exchange.state["allowed_tools"] = allowed
        return []

    def edit_request(self, exchange: Exchange, arguments: Mapping[str, Any]) -> bool:
        """A tools/call sent upstream with the reviewer's arguments (same id, name, _meta)."""
        if exchange.state.get("method") != "tools/call" or not isinstance(exchange.body, dict):
            return False
        body = dict(exchange.body)
        body["params"] = {**body["params"], "arguments": dict(arguments)}
        exchange.body = body
        exchange.state["arguments"] = dict(arguments)
        exchange.state["edited_body"] = orjson.dumps(body)
        return True

    def rewrite_request(self, exchange: Exchange, decision: Decision) -> bytes | None:
        return exchange.state.get("edited_body")

    def observe_response(self, exchange: Exchange, status: int, headers: Mapping[str, str],
                         body: bytes) -> Observation:
        method = exchange.state.get("method")
        if method is None:
            return Observation()
        if method == "tools/call" and status >= 500:
            return Observation(steps=[self._tool_error(exchange, f"tool server answered HTTP {status}")])
        if status != 200:
            return Observation()
        rpc_id = exchange.state["rpc_id"]
        response = jsonrpc.response_for(jsonrpc.body_messages(headers, body), rpc_id)
        if response is None:
            if method == "tools/list" and exchange.state.get("allowed_tools") is not None:
                # an answer the governor cannot read (a lone surrogate orjson refuses, but the
                # agent's parser may take) could offer any tool: not delivered (fail closed)
                refusal = jsonrpc.error(rpc_id, jsonrpc.GOVERNOR_ERROR_CODE, UNREADABLE_TOOLS_LIST)
                return Observation(replace_body=jsonrpc.sse_event(refusal) if jsonrpc.is_sse(headers)
                                   else orjson.dumps(refusal))
            return Observation()
        if method == "tools/call":
            failure = tool_failure(response)
            return Observation(steps=[self._tool_error(exchange, failure)] if failure else [])
        allowed = exchange.state.get("allowed_tools")
        withheld = filter_tools(response, allowed) if allowed is not None else None
        if withheld is None:
            return Observation()
        exchange.state["withheld"] = withheld  # the agent never sees them (ADL-Withheld-Tools)
        if jsonrpc.is_sse(headers):
            return Observation(replace_body=jsonrpc.replace_sse_response(body, rpc_id, response))
        return Observation(replace_body=orjson.dumps(response))

    def stream_watcher(self, exchange: Exchange, status: int, headers: Mapping[str, str]) -> StreamWatcher | None:
        # tools/list answers are buffered so they can be filtered; every other event
        # stream (tool calls with progress, the long-lived GET stream) flows through.
        if not jsonrpc.is_sse(headers) or exchange.state.get("method") == "tools/list":
            return None
        if exchange.state.get("method") != "tools/call":
            return jsonrpc.RpcStreamWatcher(exchange.state.get("rpc_id"))

        def on_response(response: dict[str, Any]) -> list[StreamEvent]:
            failure = tool_failure(response)
            return [self._tool_error(exchange, failure)] if failure else []

        return jsonrpc.RpcStreamWatcher(exchange.state["rpc_id"], on_response)

    def error_response(self, status: int, message: str, governor: Mapping[str, Any] | None,
                       exchange: Exchange | None = None) -> Reply:
        return jsonrpc.error_reply(status, message, governor, exchange)

    def fallback_response(self, exchange: Exchange, decision: Decision, governor: Mapping[str, Any]) -> Reply:
        """A §6 fallback for a tools/call: a successful tool result holding the declared value
        (or message), an object value also as structuredContent, the governor object in `_meta`."""
        result: dict[str, Any] = {"content": [{"type": "text", "text": jsonrpc.fallback_text(decision)}],
                                  "isError": False, "_meta": {"governor": dict(governor)}}
        if isinstance(decision.fallback_value, dict):
            result["structuredContent"] = decision.fallback_value
        return Reply.json(200, jsonrpc.result(exchange.state.get("rpc_id"), result))

    @staticmethod
    def _tool_error(exchange: Exchange, message: str) -> ToolError:
        return ToolError(exchange.state["tool"], message, exchange.persona)


ADAPTERS = (MCPAdapter,)


ENDPOINTS = (
    Endpoint("MCP", "tools/call", "POST", "{any path: matched by JSON-RPC body}", GOVERNED_STEP, "mcp",
             Probe("POST", "/mcp", b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
                                   b'"params":{"name":"read_file","arguments":{"path":"/tmp/a"}}}',
                   headers=(("accept", "application/json, text/event-stream"),)),
             "a ToolCall step: declared tools only, oversight, loops; tools/list filtered"),
    Endpoint("MCP", "tools/call (2026-07-28, stateless)", "POST", "{any path: matched by JSON-RPC body}",
             GOVERNED_STEP, "mcp",
             Probe("POST", "/mcp", b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file",'
                                   b'"arguments":{"path":"/tmp/a"},"_meta":{"io.modelcontextprotocol/protocolVersion":'
                                   b'"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}',
                   headers=(("accept", "application/json, text/event-stream"), ("mcp-protocol-version", "2026-07-28"),
                            ("mcp-method", "tools/call"), ("mcp-name", "read_file"))),
             "as tools/call; the routing headers must mirror the body, or it is refused"),
)
