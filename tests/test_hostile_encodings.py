"""JSON bodies in the other encodings JSON allows (issue #29 item 4): a UTF-8 byte order
mark, UTF-16 or UTF-32 (with or without a BOM). Python's json.loads(bytes) reads them all,
so the official `mcp` server SDK runs such a tools/call; orjson does not, and the governor
used to treat them as unknown traffic and forward them unread: a tool that needs a
reviewer's confirmation ran without one, an undeclared tool ran, a delegation to a denied
A2A peer went out. Each test through the proxy here failed on that code (the unit tests of
RequestView pin the reading rules). JSON only Python's json reads (NaN, 1e400, a lone
surrogate escape, deep nesting) is refused in the protocol (400), not forwarded unread.

Real components: the real proxy on the real runtime, the `mcp` SDK's FastMCP notes server
(stateless, as deployed behind load balancers: with no Mcp-Session-Id header for the MCP
adapter to match on, the body alone decides; a stateful session's call was refused 400), the A2A test peer (aiohttp, which decodes with the charset the Content-Type
names), the loopback mock model upstream, approvals answered over the control plane.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import ssl

import httpx
import pytest

from governor.adapters import withhold
from governor.adapters.request_view import BadRequest, RequestView
from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE, body_messages
from tests.proxy_harness import real_sdk_env
from tests.test_a2a_proxy import governor, peers  # noqa: F401  (fixtures)
from tests.test_adapter_a2a import send
from tests.test_mcp_sdk import REVIEWER, _answer_when_pending
from tests.test_mcp_sdk_runtime import PASSPORT, notes_world, session_record

module_loop = pytest.mark.asyncio(loop_scope="module")

ACCEPT = "application/json, text/event-stream"  # what MCP's streamable HTTP clients send


def _utf16_le_bom(text: str) -> bytes:
    return codecs.BOM_UTF16_LE + text.encode("utf-16-le")


# id -> (the body's bytes from its JSON text, the Content-Type sent with it)
ENCODINGS = {
    "utf-8-bom": (lambda text: text.encode("utf-8-sig"), "application/json"),
    "utf-16-le-bom": (_utf16_le_bom, "application/json"),
    "utf-16-be": (lambda text: text.encode("utf-16-be"), "application/json"),
    "utf-32": (lambda text: text.encode("utf-32"), "application/json"),  # BOM, then the machine's order
    "utf-32-be-charset": (lambda text: text.encode("utf-32-be"), "application/json; charset=UTF-32BE"),
}


def _call(tool: str, arguments: dict, rpc_id: int = 7) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call",
                       "params": {"name": tool, "arguments": arguments}}, ensure_ascii=False)


@pytest.fixture
async def stateless(tmp_path):
    """The notes world (tests/test_mcp_sdk_runtime.py) with a stateless FastMCP server."""
    async with notes_world(tmp_path, stateless=True) as parts:
        yield parts


async def _post_mcp(governor, server, content: bytes, content_type: str) -> httpx.Response:
    async with httpx.AsyncClient(proxy=governor.proxy_url, trust_env=False, timeout=60) as http:
        return await http.post(server.url, content=content, headers={"content-type": content_type, "accept": ACCEPT})


def _rpc(response: httpx.Response) -> dict:
    """The one JSON-RPC message of an answer (JSON or SSE)."""
    [message] = body_messages(response.headers, response.content)
    return message


# --- MCP -----------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS.values(), ids=ENCODINGS.keys())
async def test_a_tool_needing_confirmation_is_held_for_review_in_any_encoding(stateless, encoding):
    server, runtime, governor, _ = stateless
    encode, content_type = encoding
    call = asyncio.create_task(_post_mcp(governor, server, encode(_call("delete_note", {"path": "/notes/old.md"})),
                                         content_type))
    approval = await _answer_when_pending(governor.control_url, "reject", "lab-lead")
    response = await asyncio.wait_for(call, 30)
    assert approval["tool"] == "delete_note" and approval["arguments"] == {"path": "/notes/old.md"}
    error = _rpc(response)["error"]
    assert error["code"] == GOVERNOR_ERROR_CODE and error["data"]["governor"]["action"] == "deny"
    assert not any(name == "delete_note" for name, _ in server.calls)


@pytest.mark.parametrize("encoding", ENCODINGS.values(), ids=ENCODINGS.keys())
async def test_an_undeclared_tool_is_refused_and_recorded_in_any_encoding(stateless, encoding):
    server, runtime, governor, _ = stateless
    encode, content_type = encoding
    response = await _post_mcp(governor, server, encode(_call("shell", {"cmd": "id"})), content_type)
    error = _rpc(response)["error"]
    assert error["code"] == GOVERNOR_ERROR_CODE
    assert error["data"]["governor"]["tool"] == "shell" and error["data"]["governor"]["action"] == "halt"
    assert not any(name == "shell" for name, _ in server.calls)
    record = await session_record(governor)
    assert any(e["detail"].get("tool") == "shell" for e in record["events"])


async def test_what_runs_is_what_the_reviewer_approved_and_plain_utf8_is_unchanged(stateless):
    """The governor forwards the agent's bytes; the server reads them as the governor did:
    the reviewed arguments (non-ASCII included) are the ones the tool ran with."""
    server, runtime, governor, _ = stateless
    plain = await _post_mcp(governor, server, _call("read_note", {"path": "/notes/a.md"}, 1).encode(),
                            "application/json")
    assert _rpc(plain)["result"]["content"][0]["text"] == "contents of /notes/a.md"
    path = "/notes/café-日本-🙂.md"
    call = asyncio.create_task(_post_mcp(governor, server, _utf16_le_bom(_call("delete_note", {"path": path}, 2)),
                                         "application/json; charset=utf-16"))
    approval = await _answer_when_pending(governor.control_url, "approve", "lab-lead")
    response = await asyncio.wait_for(call, 30)
    assert approval["arguments"] == {"path": path}
    assert _rpc(response)["result"]["content"][0]["text"] == f"deleted {path}"
    assert server.calls == [("read_note", {"path": "/notes/a.md"}), ("delete_note", {"path": path})]


async def test_a_reviewers_edit_of_a_utf32_call_goes_upstream_re_encoded(tmp_path):
    """Plan editing rewrites the body: the edited call goes upstream as orjson writes it (UTF-8,
    its charset parameter saying so) and the server runs exactly the edited arguments."""
    editing = {**PASSPORT, "human_oversight": {"triggers": ["a reviewer confirms every deletion"],
                                               "intervention_model": "plan_editing"}}
    async with notes_world(tmp_path, editing, stateless=True) as (server, runtime, governor, _):
        call = asyncio.create_task(_post_mcp(governor, server, _call("delete_note", {"path": "/notes/a.md"}).encode(
            "utf-32"), "application/json; charset=utf-32"))
        for _ in range(500):
            if runtime.approvals():
                break
            await asyncio.sleep(0.02)
        [approval] = runtime.approvals()
        edited = {"path": "/notes/ébauche-草稿.md"}
        async with httpx.AsyncClient(trust_env=False) as http:
            answer = await http.post(f"{governor.control_url}/v1/approvals/{approval['id']}",
                                     headers={"Authorization": f"Bearer {REVIEWER}"},
                                     json={"decision": "approve", "reviewer": "lab-lead", "edited_arguments": edited})
        assert answer.status_code == 200, answer.text
        response = await asyncio.wait_for(call, 30)
    assert _rpc(response)["result"]["content"][0]["text"] == f"deleted {edited['path']}"
    assert server.calls == [("delete_note", edited)]


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/json; charset=utf-16be",
                                          "application/json; charset=latin-1"])
async def test_a_charset_the_body_is_not_in_is_refused_not_guessed(stateless, content_type):
    """A UTF-16-LE body (with its BOM) whose Content-Type names another charset: the MCP SDK
    ignores the charset, aiohttp or Node would decode with it; the governor refuses (400)."""
    server, runtime, governor, _ = stateless
    response = await _post_mcp(governor, server, _utf16_le_bom(_call("delete_note", {"path": "/notes/x.md"})),
                               content_type)
    assert response.status_code == 400
    assert "charset" in response.json()["error"]["message"]
    assert not runtime.approvals() and server.calls == []


TEXT = '{"a": "é"}'


@pytest.mark.parametrize("content, content_type, refused", [
    (TEXT.encode(), "application/json; charset=utf-16", False),  # UTF-8: orjson reads it, nothing else is looked at
    (TEXT.encode("utf-16"), "application/json", False),
    (codecs.BOM_UTF16_BE + TEXT.encode("utf-16-be"), "application/json; charset=utf-16", False),
    (codecs.BOM_UTF16_BE + TEXT.encode("utf-16-be"), "application/json; charset=utf-16le", True),
    (TEXT.encode("utf-16-le"), 'application/json; charset="UTF-16LE"', False),
    (TEXT.encode("utf-16-le"), "application/json; charset=utf-16", True),  # no BOM: the byte order is unsaid
    (TEXT.encode("utf-8-sig"), "application/json;charset=utf8", False),
    (TEXT.encode("utf-32"), "application/json; charset=utf-16", True),
    (TEXT.encode("utf-32-be"), "application/json; charset=utf-32be, text/plain; charset=us-ascii", True),
], ids=["utf-8", "utf-16-bom", "utf-16-be-bom", "utf-16-be-bom-said-le", "utf-16-le", "utf-16-le-order-unsaid",
        "utf-8-bom", "utf-32-said-utf-16", "utf-32-be-two-charsets"])
def test_the_body_is_read_as_python_reads_it_and_its_charset_must_agree(content, content_type, refused):
    view = RequestView("POST", "tools.example", "/mcp", {"content-type": content_type}, content)
    assert view.json_or_none() == {"a": "é"}  # what adapters match on, refused or not
    if refused:
        with pytest.raises(BadRequest, match="charset"):
            view.json()
    else:
        assert view.json() == {"a": "é"}
    assert (view.encoding is None) == (content == TEXT.encode())


@pytest.mark.parametrize("content", ['{"a": 1'.encode("utf-32"), b"\xff\xfe\x00\xd8{\x00}\x00", b"\x00{\x00"],
                         ids=["utf-32-truncated", "utf-16-surrogate-outside-a-string", "nul-not-json"])
def test_what_is_json_to_no_parser_stays_unreadable(content):
    view = RequestView("POST", "tools.example", "/mcp", {"content-type": "application/json"}, content)
    assert view.json_or_none() is None and view.unparseable
    with pytest.raises(BadRequest, match="not valid JSON"):
        view.json()


# JSON orjson refuses and Python's json (the mcp SDK server's parser) accepts
LENIENT = {
    "nan": b'{"a": NaN}',
    "utf-16-nan": '{"a": NaN}'.encode("utf-16"),
    "huge-number": b'{"a": 1e400}',
    "lone-surrogate-in-a-string": b'{"a": "\\ud800"}',
    "nesting-past-1024": b'{"a": ' + b"[" * 1100 + b"]" * 1100 + b"}",
}


@pytest.mark.parametrize("content", LENIENT.values(), ids=LENIENT.keys())
def test_json_only_to_a_lenient_parser_is_matched_and_refused(content):
    json.loads(content)  # what the server would run
    view = RequestView("POST", "tools.example", "/mcp", {"content-type": "application/json"}, content)
    assert view.json_or_none() is not None and not view.unparseable  # its adapter matches it...
    with pytest.raises(BadRequest, match="lenient parser"):
        view.json()  # ...and refuses it


@pytest.mark.parametrize("argument", [b"NaN", b"1e400", b'"\\ud800"'], ids=["nan", "huge-number", "lone-surrogate"])
async def test_a_tool_call_only_a_lenient_parser_reads_is_refused_not_run(stateless, argument):
    """The mcp SDK server runs `delete_note` with such an argument (its json.loads reads it);
    the governor, which cannot read it as orjson writes and the reviewer would see it, used
    to forward it as unknown traffic, unreviewed. Now its adapter refuses it (400)."""
    server, runtime, governor, _ = stateless
    body = (b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "delete_note", '
            b'"arguments": {"path": "/notes/old.md", "x": ' + argument + b'}}}')
    response = await _post_mcp(governor, server, body, "application/json")
    assert response.status_code == 400
    assert "lenient parser" in response.json()["error"]["message"]
    assert not runtime.approvals() and server.calls == []


# --- A2A -----------------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-16"])
async def test_a_delegation_to_a_denied_peer_in_utf16_is_refused(governor, peers, content_type):  # noqa: F811
    peer = peers["untrusted-bot"]
    async with httpx.AsyncClient(proxy=governor.proxy_url, trust_env=False, timeout=30) as client:
        response = await client.post(f"{peer.url}/a2a", content=json.dumps(send()).encode("utf-16"),
                                     headers={"content-type": content_type, "ADL-Session": "utf16-delegation"})
    error = response.json()["error"]
    assert error["code"] == GOVERNOR_ERROR_CODE
    assert error["data"]["governor"]["cause"] == "on_delegation_denied"
    assert peer.received == []


# --- OpenAI: a rewritten body goes upstream in UTF-8, and says so ----------------------------

env = real_sdk_env("hostile-encodings")


@module_loop
async def test_a_utf16_chat_call_is_governed_and_its_rewrite_goes_upstream_as_utf8(env):
    """Was refused (400, not JSON to orjson); now read as a Python server reads it, an
    undeclared offered tool withheld, and the rewritten body sent in UTF-8 with its charset
    parameter saying so."""
    running, mock, _ = env
    mock.reset()
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
             for name in ("search_papers", "shell_exec")]
    body = {"model": "gpt-4o-mini", "max_tokens": 32, "messages": [{"role": "user", "content": "héllo"}],
            "tools": tools}
    context = ssl.create_default_context(cafile=str(running.ca_file))
    async with httpx.AsyncClient(proxy=running.proxy_url, verify=context, trust_env=False, timeout=30) as http:
        answer = await http.post(f"{mock.base_url}/v1/chat/completions",
                                 content=json.dumps(body, ensure_ascii=False).encode("utf-16"),
                                 headers={"content-type": "application/json; charset=utf-16",
                                          "ADL-Session": "utf16-chat"})
    assert answer.status_code == 200, answer.text
    assert answer.headers[withhold.HEADER] == "shell_exec"
    [received] = mock.requests
    assert received.body == {**body, "tools": tools[:1]}  # parsed by the mock as UTF-8 JSON
    headers = {name.lower(): value for name, value in received.headers.items()}
    assert headers["content-type"] == "application/json; charset=utf-8"
