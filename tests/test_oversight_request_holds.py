"""Retry-proof holds at the request (issue #21 items 1-2): a step held before anything went
upstream (an MCP `tools/call` of a tool that requires confirmation; an oversight trigger
on a model call) outlasts its client, and the client's retry attaches to it.

Through the real governor with the real runtime and a real reviewer on the control plane:
the `mcp` SDK's ClientSession (a pending review is a JSON-RPC error naming the approval,
raised as McpError; the identical call again gets the approved tool's result) and the
openai SDK at `timeout=5` with its default retries (429 review_pending + Retry-After, which
it retries). In each: the upstream is called once, after the approval; one approval; the
step counted once. A rejection; a retry with a changed argument is a different step; the
counters on /metrics.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from mcp.shared.exceptions import McpError

from governor.adapters.base import AdapterConfig
from governor.adapters.jsonrpc import GOVERNOR_ERROR_CODE
from governor.runtime.metrics import Metrics
from governor.proxy.server import Settings, serve
from tests.control_harness import real_runtime
from tests.oversight_world import PLAIN_AND_STREAMED, REVIEWER, Reviewer, ToolThenText, World, run_sdk
from tests.proxy_harness import AGENT_NAMED, sdk_environment
from tests.test_mcp_sdk import NotesServer, mcp_session
from tests.test_mcp_sdk_runtime import PASSPORT
from tests.upstreams import make_tls

ANSWER = {"tool": "delete_note", "args": '{"path":"/workspace/notes/old.md"}'}
# every model call is reviewed (a session-level cost trigger: any priced call projects more)
REVIEWED_MODEL = {**PASSPORT, "tools": [{**t, "requires_confirmation": False} for t in PASSPORT["tools"]],
                  "human_oversight": {"triggers": [{"description": "a reviewer sees the first model call",
                                                    "when": {"cost_usd_over": 1e-9}}]}}


async def _metrics(control_url: str) -> dict[str, float]:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        text = (await http.get(f"{control_url}/metrics")).text
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("governor_review_holds_total{")}


async def _world(tmp, document, metrics, **settings):
    tmp.mkdir(exist_ok=True)
    runtime, _ = real_runtime(document, tmp, metrics=metrics)
    options = dict(**AGENT_NAMED, listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp,
                   reviewer_tokens=(REVIEWER,), adapters=AdapterConfig(extra={"allowed_tools": runtime.allowed_tools}))
    return await serve(Settings(**{**options, **settings}), runtime, metrics=metrics)


async def _pauses(control: httpx.AsyncClient, session: str) -> list[dict]:
    resp = await control.get(f"/v1/sessions/{session}/record")
    assert resp.status_code == 200, resp.text
    # an approval is recorded as `pause` too, closing the pause it answers (detail.review)
    return [e for e in resp.json()["events"] if e["action"] == "pause" and "review" not in (e.get("detail") or {})]


# --- MCP: a tools/call of a tool that requires confirmation ----------------------------------


@pytest.fixture
async def mcp_world(tmp_path):
    metrics = Metrics()
    server = NotesServer().start()
    governor = await _world(tmp_path, PASSPORT, metrics, session="notes-1", review_hold=1.0, review_retry_after=2)
    control = httpx.AsyncClient(base_url=governor.control_url, trust_env=False, timeout=30)
    try:
        yield server, World(governor, None, control, {}), governor
    finally:
        await control.aclose()
        await governor.stop()
        server.stop()


async def _call_until_answered(session, tool: str, arguments: dict, tries: int = 20) -> tuple[object, list]:
    """What an agent does with review_pending: wait Retry-After, call again (bounded)."""
    pending = []
    for _ in range(tries):
        try:
            return await session.call_tool(tool, arguments), pending
        except McpError as exc:
            gov = (exc.error.data or {}).get("governor") or {}
            if gov.get("cause") != "review_pending":
                raise
            pending.append((exc.error.code, gov))
            await asyncio.sleep(gov["retry_after"])
    raise AssertionError(f"still pending after {tries} tries")


async def test_an_mcp_call_outlasting_its_client_is_one_step_and_its_retry_gets_the_tool_result(mcp_world):
    server, world, governor = mcp_world
    reviewer = Reviewer(world, "notes-1", 5.0).start()  # answered while no try waits: kept
    try:
        async with mcp_session(server.url, governor.proxy_url) as session:
            result, pending = await _call_until_answered(session, "delete_note", {"path": "/notes/old.md"})
    finally:
        await reviewer.stop()
    assert result.content[0].text == "deleted /notes/old.md"
    # each held try ended (after 1 s) in a JSON-RPC error naming the one approval, with Retry-After
    assert len(pending) >= 2, pending
    assert {code for code, _ in pending} == {GOVERNOR_ERROR_CODE}
    assert {gov["approval_id"] for _, gov in pending} == set(reviewer.answered) and len(reviewer.seen) == 1
    assert all(gov["action"] == "pause" and gov["retry_after"] == 2 for _, gov in pending)
    # the tool ran once, after the approval; one approval; one tool call counted
    assert server.calls.count(("delete_note", {"path": "/notes/old.md"})) == 1
    assert len(await _pauses(world.control, "notes-1")) == 1
    assert (await world.control.get("/v1/sessions/notes-1")).json()["tool_calls"] == 1
    counted = await _metrics(governor.control_url)
    assert counted["refused_pending"] == len(pending) and counted["answered"] == 1
    assert counted["attached"] == len(pending)  # every try but the first attached (the last took it)


async def test_an_mcp_rejection_reaches_the_retry_and_the_tool_never_runs(mcp_world):
    server, world, governor = mcp_world
    reviewer = Reviewer(world, "notes-1", 1.5, "reject").start()
    try:
        async with mcp_session(server.url, governor.proxy_url) as session:
            with pytest.raises(McpError) as refused:
                await _call_until_answered(session, "send_email", {"to": "a@example.org", "subject": "s", "body": "b"})
    finally:
        await reviewer.stop()
    gov = refused.value.error.data["governor"]
    assert gov["action"] == "deny" and gov["approval_id"] == reviewer.answered[0]
    assert not any(name == "send_email" for name, _ in server.calls)
    assert len(await _pauses(world.control, "notes-1")) == 1


async def test_an_mcp_retry_with_a_changed_argument_is_a_different_step(mcp_world):
    server, world, governor = mcp_world
    async with mcp_session(server.url, governor.proxy_url) as session:
        ids = []
        for path in ("/notes/a.md", "/notes/b.md", "/notes/a.md"):
            with pytest.raises(McpError) as pending:
                await session.call_tool("delete_note", {"path": path})
            ids.append(pending.value.error.data["governor"]["approval_id"])
    assert ids[0] == ids[2] != ids[1]  # the identical call attaches; the changed one is its own step
    listed = (await world.control.get("/v1/approvals")).json()["approvals"]
    assert sorted(a["arguments"]["path"] for a in listed) == ["/notes/a.md", "/notes/b.md"]
    assert not any(name == "delete_note" for name, _ in server.calls)


# --- a model call held by an oversight trigger --------------------------------------------------


@pytest.fixture
async def model_world(tmp_path):
    tls = make_tls(tmp_path / "tls")
    mock = ToolThenText(tls)
    await mock.start()
    metrics = Metrics()
    governor = await _world(tmp_path / "data", REVIEWED_MODEL, metrics, upstream_ca=tls.ca_file, review_retry_after=2)
    control = httpx.AsyncClient(base_url=governor.control_url, trust_env=False, timeout=30)
    try:
        yield World(governor, mock, control, sdk_environment(governor, mock))
    finally:
        await control.aclose()
        await governor.stop()
        await mock.stop()


async def test_a_reviewed_model_call_at_timeout_5_is_one_model_call_plain_and_streamed(model_world):
    world = model_world
    plain, streamed = Reviewer(world, "plain", 7), Reviewer(world, "streamed", 7)
    out = await run_sdk(world, PLAIN_AND_STREAMED, plain, streamed)
    for name, reviewer in (("plain", plain), ("streamed", streamed)):
        assert out[name] == ANSWER, out
        assert out[name + "_seconds"] > 7  # through the SDK's 5 s timeout: 429 at 3.5 s, retried after 2 s
        assert world.calls(name) == 1  # the model was called once, after the approval
        assert len(reviewer.seen) == 1 and len(reviewer.answered) == 1
        assert len(await _pauses(world.control, name)) == 1
        assert (await world.control.get(f"/v1/sessions/{name}")).json()["iterations"] == 1
    counted = await _metrics(world.running.control_url)
    assert counted["refused_pending"] >= 2 and counted["attached"] >= 2 and counted["answered"] == 2


async def test_a_rejected_model_call_never_reaches_the_model_and_the_retry_gets_the_403(model_world):
    world = model_world
    code = """
client = openai.OpenAI(timeout=3, max_retries=0)
run = chat(client, "rejected")
record("first", run)
time.sleep(2.5)
record("again", run)
record("once_more", run)
"""
    reviewer = Reviewer(world, "rejected", 4, "reject")  # rejected while no try waits
    out = await run_sdk(world, code, reviewer)
    first = out["first"]
    assert first["status"] == 429 and first["retry_after"] == "2", out
    assert first["body"]["governor"]["approval_id"] == reviewer.answered[0]
    again = out["again"]
    assert again["raised"] == "PermissionDeniedError" and again["status"] == 403, out
    assert again["body"]["governor"]["approval_id"] == reviewer.answered[0]
    # the outcome is given once: the identical request after it is a new step, held again
    assert out["once_more"]["status"] == 429, out
    assert out["once_more"]["body"]["governor"]["approval_id"] != reviewer.answered[0]
    assert world.calls("rejected") == 0


# --- the pure part: who takes a step held at the request -----------------------------------------


async def _outcome(future):
    return await future


def _flow(connected: bool = True):
    from types import SimpleNamespace

    return SimpleNamespace(request=SimpleNamespace(headers={}), client_conn=SimpleNamespace(connected=connected),
                           response=None)


async def test_the_newest_waiting_connection_takes_the_step_and_one_that_left_takes_nothing():
    from governor.proxy import holds

    book = holds.Holds(hold_sec=5.0, retry_after=1.0)
    forgotten = []
    review = asyncio.get_running_loop().create_future()
    held = book.start(b"k", "s", "apr_1", None, _outcome(review), shared=False, forget=forgotten.append)
    old, new, gone = _flow(), _flow(), _flow()
    waits = [asyncio.create_task(book.attend(f, held, lambda h, r: "pending")) for f in (old, new, gone)]
    await asyncio.sleep(0.05)
    gone.client_conn.connected = False  # the newest left: the newest still there takes it
    review.set_result("outcome")
    results = await asyncio.gather(*waits)
    assert results == [("gone", None), ("take", "outcome"), ("pending", None)]
    assert book.find("s", lambda: b"k") is None and book.counted["answered"] == 1
    assert forgotten == []  # taken: nothing to release

    # nobody left to take it: kept for the next identical request; once
    review = asyncio.get_running_loop().create_future()
    held = book.start(b"k", "s", "apr_2", None, _outcome(review), shared=False, forget=forgotten.append)
    left = _flow()
    wait = asyncio.create_task(book.attend(left, held, lambda h, r: "pending"))
    await asyncio.sleep(0.05)
    left.client_conn.connected = False
    review.set_result("kept")
    assert await wait == ("pending", None)
    again = book.find("s", lambda: b"k")
    assert again is held and await book.attend(_flow(), again, lambda h, r: "pending") == ("take", "kept")
    assert book.find("s", lambda: b"k") is None

    # an outcome nobody came back for is forgotten (its reservations released) when swept
    review = asyncio.get_running_loop().create_future()
    held = book.start(b"k", "s", "apr_3", None, _outcome(review), shared=False, forget=forgotten.append)
    review.set_result("unclaimed")
    await asyncio.wait({held.task})
    await asyncio.sleep(0)
    held.done_at -= holds.KEEP_ANSWER_SEC + 1
    assert book.find("s", lambda: b"k") is None and forgotten == ["unclaimed"]


async def test_a_jsonrpc_call_is_named_without_its_id_and_anything_else_counts():
    from types import SimpleNamespace

    from governor.proxy import holds

    def named(body):
        exchange = SimpleNamespace(body=body, state={"rpc_id": body.get("id")})
        return holds.identity(exchange, json.dumps(body).encode())

    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {"p": "a"}}}
    assert named(call) == named({**call, "id": 2}) == named({**call, "id": "x"})
    assert named(call) != named({**call, "params": {"name": "t", "arguments": {"p": "b"}}})
    assert named(call) != named({**call, "method": "tools/list"})
    plain = SimpleNamespace(body={"id": 1}, state={})  # not JSON-RPC: the bytes as sent
    assert holds.identity(plain, b'{"id": 1}') == b'{"id": 1}'


async def test_an_approved_call_taken_after_its_session_halted_is_refused_and_the_tool_never_runs(mcp_world):
    server, world, governor = mcp_world
    reviewer = Reviewer(world, "notes-1", 2.5).start()  # approved after the first try gave up (1 s)
    try:
        async with mcp_session(server.url, governor.proxy_url) as session:
            with pytest.raises(McpError) as pending:
                await session.call_tool("delete_note", {"path": "/notes/late.md"})
            assert pending.value.error.data["governor"]["cause"] == "review_pending"
            for _ in range(100):  # bounded wait for the approval
                if reviewer.answered:
                    break
                await asyncio.sleep(0.1)
            assert reviewer.answered
            with pytest.raises(McpError) as halting:  # an undeclared tool halts the session
                await session.call_tool("shell", {"cmd": "id"})
            assert halting.value.error.data["governor"]["action"] == "halt"
            with pytest.raises(McpError) as refused:
                await session.call_tool("delete_note", {"path": "/notes/late.md"})
    finally:
        await reviewer.stop()
    gov = refused.value.error.data["governor"]
    assert gov["action"] == "halt" and gov["approval_id"] == reviewer.answered[0], gov
    assert not any(name == "delete_note" for name, _ in server.calls)
