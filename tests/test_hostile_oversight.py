"""Hostile input against the oversight surfaces added after issue #20 (holds, the reviewer
console and approvals, webhooks, output fitting, withheld tools): each test replays an
attack that got through, through the real proxy and control plane, and fails on the code
before its fix. The attacks that held are listed in the red-team report, not here.
"""

from __future__ import annotations

import asyncio
import json
import ssl

import httpx
import pytest
import pytest_asyncio

from governor.adapters import withhold
from governor.proxy.server import Settings, serve
from tests.proxy_harness import AGENT_NAMED
from tests.upstreams import MockLLM, make_tls

module_loop = pytest.mark.asyncio(loop_scope="module")

DECLARED = "search_papers"  # the bundled example passport declares it (and no `mcp` tool)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory):
    """The real proxy on the real runtime with the bundled example passport (R2), in front of
    a loopback TLS mock model that records what it received."""
    tmp = tmp_path_factory.mktemp("hostile-oversight")
    tls = make_tls(tmp / "tls")
    mock = MockLLM(tls)
    await mock.start()
    running = await serve(Settings(**AGENT_NAMED, listen=("127.0.0.1", 0), control=None, data_dir=tmp / "data",
                                   upstream_ca=tls.ca_file, tick_interval=0))
    yield running, mock
    await running.stop()
    await mock.stop()


async def _post(running, mock, path, body, session, headers=None) -> httpx.Response:
    context = ssl.create_default_context(cafile=str(running.ca_file))
    async with httpx.AsyncClient(proxy=running.proxy_url, verify=context, trust_env=False, timeout=30) as http:
        return await http.post(f"{mock.base_url}{path}", content=json.dumps(body).encode(),
                               headers={"content-type": "application/json", "ADL-Session": session, **(headers or {})})


# --- withheld tools ------------------------------------------------------------------------


@module_loop
async def test_anthropic_mcp_servers_are_offered_tools_and_withheld_when_undeclared(env):
    """Anthropic's MCP connector (`mcp_servers`, beta mcp-client-2025-04-04) gives the model a
    remote server's tools, run by the provider: the governor never sees those calls. Was:
    forwarded as sent, next to a `tools` array the governor had carefully withheld from."""
    running, mock = env
    mock.reset()
    server = {"type": "url", "url": "https://mcp.example.com/sse", "name": "shell-box",
              "tool_configuration": {"enabled": True, "allowed_tools": ["run_shell"]}}
    body = {"model": "claude-sonnet-4", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": DECLARED, "input_schema": {"type": "object"}}], "mcp_servers": [server]}
    answer = await _post(running, mock, "/v1/messages", body, "mcp-connector",
                         {"anthropic-beta": "mcp-client-2025-04-04"})
    assert answer.status_code == 200, answer.text
    [received] = mock.requests
    assert "mcp_servers" not in received.body  # the passport declares no `mcp` tool
    assert received.body["tools"] == body["tools"]
    assert answer.headers[withhold.HEADER] == "mcp"
    # an entry the governor cannot read is refused before anything goes upstream
    mock.reset()
    answer = await _post(running, mock, "/v1/messages", {**body, "mcp_servers": ["https://mcp.example.com"]},
                         "mcp-connector-bad")
    assert answer.status_code == 400 and "mcp_servers[0]" in answer.text
    assert mock.requests == []


@module_loop
async def test_openai_chat_web_search_options_is_an_offered_tool_withheld_when_undeclared(env):
    """OpenAI chat's `web_search_options` switches on provider-run web search with no `tools`
    entry at all. Was: forwarded as sent, so a passport declaring no search still had the
    provider search the web for the agent."""
    running, mock = env
    mock.reset()
    body = {"model": "gpt-4o-search-preview", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
            "web_search_options": {"search_context_size": "low"}}
    answer = await _post(running, mock, "/v1/chat/completions", body, "web-search-options")
    assert answer.status_code == 200, answer.text
    [received] = mock.requests
    assert "web_search_options" not in received.body  # the passport declares no `web_search` tool
    assert received.body["messages"] == body["messages"]
    assert answer.headers[withhold.HEADER] == withhold.WEB_SEARCH
    # an entry the governor cannot read is refused before anything goes upstream
    mock.reset()
    answer = await _post(running, mock, "/v1/chat/completions", {**body, "web_search_options": "high"},
                         "web-search-options-bad")
    assert answer.status_code == 400 and "web_search_options" in answer.text
    assert mock.requests == []


# --- output fitting ------------------------------------------------------------------------


async def test_fitting_reserves_the_larger_of_two_output_limits_and_reads_counts_strictly(tmp_path):
    """Was: a chat call naming max_completion_tokens 1 and max_tokens 50,000 reserved 1 token
    and went upstream with both, unfitted: a provider reading max_tokens (many compatible
    servers read only that one) generated up to 50,000 against a 10,000-token cap. And `n`
    given as "5" or 5.0 was read as 1 answer while a lenient provider generates five."""
    from governor.adapters.fitting import FITTED_HEADER
    from tests.test_fitting_proxy import Governed

    async with Governed(tmp_path, {"tokens": {"per_session": 10_000}}) as gov:
        url = f"{gov.mock.base_url}/v1/chat/completions"
        base = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "write on"}]}
        async with gov.client() as client:
            answer = await client.post(url, json={**base, "max_completion_tokens": 1, "max_tokens": 50_000},
                                       headers={"ADL-Session": "two-limits"})
            assert answer.status_code == 200, answer.text
            [sent] = gov.mock.requests
            assert sent.body["max_tokens"] <= 10_000 and sent.body["max_completion_tokens"] == 1
            assert int(answer.headers[FITTED_HEADER]) == sent.body["max_tokens"]
            gov.mock.reset()
            for count in ("5", 5.0, 0, -2, True):
                for field in ("n", "best_of"):
                    refused = await client.post(url, json={**base, "max_tokens": 16, field: count},
                                                headers={"ADL-Session": "counts"})
                    assert refused.status_code == 400 and f"'{field}' must be a positive integer" in refused.text, \
                        (field, count, refused.status_code, refused.text)
            assert gov.mock.requests == []


# --- holds ---------------------------------------------------------------------------------


async def test_one_session_cannot_hold_more_than_max_pending_reviews_steps(tmp_path):
    """Was: every distinct tools/call of a tool that requires confirmation became one more
    pending approval and hold, without bound (2,000 from one session were all held, about
    12 KB each, and listed to the reviewer, burying the reviews that matter). Past
    MAX_PENDING_REVIEWS a further one is denied at once, recorded; the session goes on."""
    from governor.runtime.metrics import Metrics
    from governor.policy.run import MAX_PENDING_REVIEWS
    from tests.oversight_world import REVIEWER
    from tests.test_mcp_sdk import NotesServer
    from tests.test_mcp_sdk_runtime import PASSPORT
    from tests.test_oversight_request_holds import _world

    server = NotesServer().start()
    gov = await _world(tmp_path, PASSPORT, Metrics(), review_hold=0.2, review_retry_after=1)
    try:
        async with httpx.AsyncClient(proxy=gov.proxy_url, trust_env=False, timeout=30,
                                     limits=httpx.Limits(max_connections=16)) as http:
            async def call(index: int) -> dict:
                body = {"jsonrpc": "2.0", "id": index, "method": "tools/call",
                        "params": {"name": "delete_note", "arguments": {"path": f"/notes/{index}.md"}}}
                answer = await http.post(server.url, json=body, headers={
                    "ADL-Session": "flood", "accept": "application/json, text/event-stream"})
                return answer.json()["error"]["data"]["governor"]

            held = await asyncio.wait_for(asyncio.gather(*[call(i) for i in range(MAX_PENDING_REVIEWS)]), 120)
            assert {g["cause"] for g in held} == {"review_pending"}, held
            for index in range(MAX_PENDING_REVIEWS, MAX_PENDING_REVIEWS + 3):
                refused = await call(index)
                assert refused["action"] == "deny" and refused["cause"] == "on_governor_oversight_trigger", refused
            again = await call(0)  # a retry of a held step still attaches to its hold
            assert again["cause"] == "review_pending"
        async with httpx.AsyncClient(base_url=gov.control_url, trust_env=False, timeout=30) as control:
            listed = (await control.get("/v1/approvals", headers={"Authorization": f"Bearer {REVIEWER}"})).json()
            record = (await control.get("/v1/sessions/flood/record")).json()
        assert len(listed["approvals"]) == MAX_PENDING_REVIEWS
        denied = [e for e in record["events"] if e["detail"].get("max_pending_reviews")]
        assert len(denied) == 3 and {e["action"] for e in denied} == {"fallback"}  # the record's word for it
        assert denied[0]["detail"]["max_pending_reviews"] == MAX_PENDING_REVIEWS
        assert len(gov.chain.holds.by_key) == MAX_PENDING_REVIEWS
        assert not server.calls  # nothing held or denied reached the tool
    finally:
        await gov.stop()
        server.stop()


DEEP = json.loads("[" * 100 + "]" * 100)  # past the digest's 64 levels, within the body's 254
DEEPER = json.loads("[" * 300 + "]" * 300)  # past the 254 levels any body may nest


@pytest.mark.parametrize("extra, said", [
    ({"account": 2**53 + 1}, "params.arguments.account is an integer beyond 2**53"),
    ({"x": DEEP}, "params.arguments.x" + "[0]" * 63 + " nests deeper than 64 levels"),
    ({"x": DEEPER}, "request body nests deeper than 254 levels"),
], ids=["rounded-integer", "100-deep", "300-deep"])
async def test_tool_arguments_that_cannot_be_digested_exactly_are_refused_before_review(tmp_path, extra, said):
    """Was: a tools/call with {"account": 9007199254740993} was held under the step digest of
    9007199254740992 (RFC 8785 numbers are doubles), and `governor approvals show` (canonical
    JSON) and the console (JavaScript numbers) showed the reviewer ...992, while the approved
    call sent the tool ...993: a reviewer approved one account and the tool got another. And
    arguments nested 300 deep were paused (a pending approval for the reviewer), then the
    hold's request identity (orjson writes at most 254 levels) raised: 503 internal error,
    the approval left pending with no request to take it. Now a 400 before anything."""
    from governor.runtime.metrics import Metrics
    from tests.oversight_world import REVIEWER
    from tests.test_mcp_sdk import NotesServer
    from tests.test_mcp_sdk_runtime import PASSPORT
    from tests.test_oversight_request_holds import _world

    server = NotesServer().start()
    gov = await _world(tmp_path, PASSPORT, Metrics(), review_hold=0.2, review_retry_after=1)
    try:
        async with httpx.AsyncClient(proxy=gov.proxy_url, trust_env=False, timeout=30) as http:
            body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                    "params": {"name": "send_email", "arguments": {"to": "a@example.org", "subject": "s",
                                                                   "body": "b", **extra}}}
            answer = await http.post(server.url, content=json.dumps(body).encode(), headers={
                "ADL-Session": "inexact", "content-type": "application/json",
                "accept": "application/json, text/event-stream"})
        assert answer.status_code == 400 and said in answer.text, answer.text
        async with httpx.AsyncClient(base_url=gov.control_url, trust_env=False, timeout=30) as control:
            listed = (await control.get("/v1/approvals", headers={"Authorization": f"Bearer {REVIEWER}"})).json()
        assert listed["approvals"] == [] and not server.calls
    finally:
        await gov.stop()
        server.stop()


# --- webhooks ------------------------------------------------------------------------------


async def test_a_review_whose_arguments_orjson_cannot_write_is_still_notified():
    """Was: a held step's arguments nested past 254 levels (a model's proposed call: the
    upstream's bytes) made the approval.pending payload unwritable; emit logged an error and
    the reviewer was never told a review waits. Now it goes out without the arguments."""
    from governor.notify.events import approval_pending
    from governor.notify.webhooks import WebhookConfig, WebhookNotifier
    from tests.test_webhooks import SECRET, Receiver

    receiver = await Receiver().start()
    notifier = WebhookNotifier(WebhookConfig((receiver.url,), SECRET, timeout=5, attempts=1), governor="did:web:test")
    try:
        deep = json.loads("[" * 300 + "]" * 300)
        notifier.emit(approval_pending("agent", "s", "apr-1", tool="delete_note", arguments={"x": deep},
                                       persona=None, reason="r", trigger="t", expires_at="2026-01-01T00:00:00Z"))
        await receiver.wait_for(lambda: receiver.seen, "the approval.pending delivery")
        [payload] = receiver.verified()
        assert payload["event"] == "approval.pending" and payload["data"]["approval_id"] == "apr-1"
        assert payload["data"]["arguments"] is None and payload["data"]["arguments_omitted"] == "nested too deep"
    finally:
        await notifier.close(drain=2)
        await receiver.stop()
