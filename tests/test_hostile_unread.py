"""What a hostile agent sends hoping it is forwarded unread (issue 29, item 4), on the
governor's default options: each is governed (a step counted in its session) or refused
with the governor's error and recorded, never forwarded ungoverned.

  * JSON-RPC without `"jsonrpc"`, nested batches `[[...]]` and MCP `sampling/createMessage`
    sent by a client, to the official `mcp` SDK's FastMCP server (tests/test_mcp_sdk.py), with
    and without the transport's `Mcp-Session-Id` header (which makes any body MCP's);
  * a chat body inside a JSON string, the model in the query string, base64 and gzip bodies,
    upper-case keys, to the loopback mock upstream (tests/upstreams.py), which records every
    request that reaches it: on a model endpoint and on a path no adapter claims.

Whatever reaches the upstream must have been counted in its session (the walk's invariant,
tests/test_endpoint_table.py); whatever did not must carry the governor's error.
"""

from __future__ import annotations

import base64
import gzip
import json
import ssl
from typing import Any

import httpx
import pytest
import pytest_asyncio

from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE, body_messages
from tests.proxy_harness import real_governor
from tests.test_mcp_sdk_runtime import notes_world, session_record

ACCEPT = "application/json, text/event-stream"
MCP_SESSION = {"mcp-session-id": "f" * 32}  # stateless servers ignore it; the governor reads it as MCP's

CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


def _rpc(method: str, params: dict, *, jsonrpc: bool = True, rpc_id: int = 3) -> dict:
    message = {"id": rpc_id, "method": method, "params": params}
    return {"jsonrpc": "2.0", **message} if jsonrpc else message


SAMPLING = {"messages": [{"role": "user", "content": {"type": "text", "text": "write a novel"}}], "maxTokens": 100000}

# id -> (the body, extra headers, the tool that must not run): none of these may run a tool
MCP_CASES = {
    "no-jsonrpc": (_rpc("tools/call", {"name": "delete_note", "arguments": {"path": "/n"}}, jsonrpc=False), {}),
    "no-jsonrpc-with-session-header": (_rpc("tools/call", {"name": "shell", "arguments": {"cmd": "id"}},
                                            jsonrpc=False), MCP_SESSION),
    "nested-batch": ([[_rpc("tools/call", {"name": "delete_note", "arguments": {"path": "/n"}})]], {}),
    "nested-batch-with-session-header": ([[_rpc("tools/call", {"name": "delete_note", "arguments": {"path": "/n"}})]],
                                         MCP_SESSION),
    "sampling-by-a-client": (_rpc("sampling/createMessage", SAMPLING), {}),
    "sampling-in-a-batch": ([_rpc("ping", {}, rpc_id=1), _rpc("sampling/createMessage", SAMPLING)], MCP_SESSION),
}


def _governor_of(response: httpx.Response) -> dict[str, Any] | None:
    """The governor object of the governor's own answer, in its protocol's shape, or None."""
    if response.headers.get("adl-governor-action") is None:
        return None
    try:
        body = response.json()
    except ValueError:
        messages = body_messages(response.headers, response.content)
        body = messages[0] if messages else None
    if not isinstance(body, dict):
        return None
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    data = error.get("data") if isinstance(error.get("data"), dict) else {}
    return error.get("governor") or data.get("governor") or body.get("governor") or (
        {"reason": error.get("message")} if "governor" in str(error.get("message", "")) else None)


@pytest.mark.parametrize("case", MCP_CASES.values(), ids=MCP_CASES.keys())
async def test_an_mcp_body_the_governor_cannot_govern_is_refused_and_runs_nothing(tmp_path, case):
    body, headers = case
    async with notes_world(tmp_path, stateless=True) as (server, runtime, governor, _):
        async with httpx.AsyncClient(proxy=governor.proxy_url, trust_env=False, timeout=30) as http:
            response = await http.post(server.url, content=json.dumps(body).encode(),
                                       headers={"content-type": "application/json", "accept": ACCEPT, **headers})
        gov = _governor_of(response)
        assert gov is not None, (response.status_code, response.text)
        assert server.calls == []  # no tool ran
        record = await session_record(governor)
        refusals = [e for e in record["events"] if e["cause"] in ("on_governor_request_refused", "on_governor_tool_denied")]
        assert refusals, record["events"]  # and the refusal is in the session's record
        if headers is MCP_SESSION and isinstance(body, dict) and body["params"].get("name") == "shell":
            # governed as the tools/call it is, and refused by the passport (shell is undeclared)
            assert response.json()["error"]["code"] == GOVERNOR_ERROR_CODE and gov["cause"] == "on_governor_tool_denied"


# --- model calls in disguise, to the mock upstream ------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def llm(tmp_path_factory):
    async with real_governor(tmp_path_factory.mktemp("unread")) as (running, mock):
        agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30,
                                  verify=ssl.create_default_context(cafile=str(running.ca_file)))
        try:
            yield running, mock, agent
        finally:
            await agent.aclose()


CHAT_BYTES = json.dumps(CHAT).encode()
UPPER = json.dumps({"Model": "gpt-4o-mini", "Messages": CHAT["messages"], "Max_Tokens": 20}).encode()
NO_MODEL = json.dumps({"messages": CHAT["messages"], "max_tokens": 20}).encode()
JSON = {"content-type": "application/json"}

# id -> (path, body, headers, the refusal reason expected, or None: governed or refused by the adapter)
DISGUISES = {
    "chat-inside-a-json-string-to-a-gateway": ("/gateway/llm", json.dumps(CHAT_BYTES.decode()).encode(), JSON,
                                               "unknown_traffic"),
    "chat-inside-a-json-string-to-chat": ("/v1/chat/completions", json.dumps(CHAT_BYTES.decode()).encode(), JSON, None),
    "model-in-the-query-to-a-gateway": ("/gateway/llm?model=gpt-4o-mini", NO_MODEL, JSON, "unknown_traffic"),
    "model-in-the-query-to-chat": ("/v1/chat/completions?model=gpt-4o-mini", NO_MODEL, JSON, None),
    "base64-encoding-to-a-gateway": ("/gateway/llm", base64.b64encode(CHAT_BYTES),
                                     {**JSON, "content-encoding": "base64"}, "encoding_unsupported"),
    "base64-encoding-to-chat": ("/v1/chat/completions", base64.b64encode(CHAT_BYTES),
                                {**JSON, "content-encoding": "base64"}, "encoding_unsupported"),
    "base64-text-to-a-gateway": ("/gateway/llm", base64.b64encode(CHAT_BYTES), JSON, "unknown_traffic"),
    "gzip-to-a-gateway": ("/gateway/llm", gzip.compress(CHAT_BYTES), {**JSON, "content-encoding": "gzip"},
                          "unclaimed_model_call"),
    "gzip-of-base64-to-a-gateway": ("/gateway/llm", gzip.compress(base64.b64encode(CHAT_BYTES)),
                                    {**JSON, "content-encoding": "gzip"}, "unknown_traffic"),
    "gzip-to-chat": ("/v1/chat/completions", gzip.compress(CHAT_BYTES), {**JSON, "content-encoding": "gzip"}, None),
    "upper-case-keys-to-a-gateway": ("/gateway/llm", UPPER, JSON, "unknown_traffic"),
    # Ollama's adapter (Go folds the case of keys: Ollama would read it): refused, not misread
    "upper-case-keys-to-ollama": ("/api/chat", UPPER, JSON, "bad_request"),
    "upper-case-keys-to-chat": ("/v1/chat/completions", UPPER, JSON, None),
}


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("case", DISGUISES.values(), ids=DISGUISES.keys())
async def test_a_model_call_in_disguise_is_governed_or_refused_never_forwarded_unread(llm, case, request):
    running, mock, agent = llm
    path, body, headers, reason = case
    session = "unread-" + request.node.callspec.id
    mark = len(mock.requests)
    response = await agent.post(f"{mock.base_url}{path}", content=body, headers={**headers, "ADL-Session": session})
    reached = mock.requests[mark:]
    view = await running.runtime.session_view(session)
    if reached:  # governed: counted in its session
        assert view is not None and view["iterations"] >= 1, (path, response.status_code, response.text)
    else:
        gov = _governor_of(response)
        assert response.status_code >= 400 and gov is not None, (response.status_code, response.text)
    if reason is not None:
        assert not reached, path
        detail = [e["detail"] for e in running.runtime.record(session)["events"] if e["cause"] == "on_governor_request_refused"]
        assert [d["reason"] for d in detail] == [reason], detail
