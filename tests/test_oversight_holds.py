"""Retry-proof holds (issue #21): a step held for a reviewer outlasts the client's timeout.

The official openai SDK (subprocess, configured by its environment) at `timeout=5` with its
default retries, against a 10 s review answered by a reviewer through the real control plane
(/v1/approvals with a reviewer token): the model is called once, one iteration and one
approval are counted, and the agent gets the approved answer, plain (each held connection
ends in 429 review_pending + Retry-After, 2 s here, which the SDK retries; the answer waits
for the identical request) and streamed (the held stream stays alive with SSE comment lines). A
rejection is a clean 403; a different request is not attached; the kept answer is taken once.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from governor.proxy import holds
from tests.oversight_world import PLAIN_AND_STREAMED, TOOLS, Reviewer, oversight_world, run_sdk

pytestmark = pytest.mark.asyncio(loop_scope="module")

RETRY_AFTER = 2
ANSWER = {"tool": "delete_note", "args": '{"path":"/workspace/notes/old.md"}'}

@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def world(tmp_path_factory):
    # Retry-After 2 s (the default is 10): the SDK's retries come back sooner, the behaviour is the same
    async with oversight_world(tmp_path_factory.mktemp("holds"), review_retry_after=RETRY_AFTER) as w:
        yield w


@pytest.fixture(autouse=True)
def fresh(world):
    world.mock.reset()


async def _counted(world, session: str) -> tuple[int, int, int]:
    """(model calls, iterations, approvals asked for) of a session (a held tool call counts as
    a tool call once admitted)."""
    view = await world.view(session)
    return world.calls(session), view["iterations"], len(await world.pauses(session))


async def test_the_openai_sdk_at_timeout_5_through_a_10s_review_plain_and_streamed(world):
    # both at once, each in its own session with its own reviewer answering after 10 s
    plain, streamed = Reviewer(world, "plain", 10), Reviewer(world, "streamed", 10)
    out = await run_sdk(world, PLAIN_AND_STREAMED, plain, streamed)
    # plain: 429 review_pending at 3.5 s, retried after 2 s (at 5.5 s: 429 at 9 s; at 11 s), the
    # third try takes the answer kept since 10 s (or the second try, if a loaded machine delays it)
    assert out["plain"] == ANSWER, out
    assert out["plain_seconds"] > 10  # it waited for the reviewer, through timeouts and retries
    assert await _counted(world, "plain") == (1, 1, 1)
    assert (await world.view("plain"))["tool_calls"] == 1  # the approved tool call, counted once
    assert len(plain.seen) == 1 and len(plain.answered) == 1
    # streamed: one connection, kept alive by comment lines every 2.5 s, resumed when approved
    assert out["streamed"] == ANSWER, out
    assert out["streamed_seconds"] > 10
    assert await _counted(world, "streamed") == (1, 1, 1)
    assert len(streamed.seen) == 1 and len(streamed.answered) == 1
    assert len(world.mock.streams) == 1


async def test_a_pending_review_is_a_429_naming_the_approval_and_its_answer_is_taken_once(world, tmp_path):
    # no retries: the agent sees the 429 itself, comes back after the approval and gets the
    # answer without a model call; the identical request once more is a new step (model call,
    # approval), held again. The reviewer answers only after the client had its 429 (its cue:
    # a file), however late a loaded machine lets that be.
    cue = tmp_path / "first-done"
    code = f"""
client = openai.OpenAI(timeout=3, max_retries=0)
run = chat(client, "pending")
record("first", run)
open({str(cue)!r}, "w").close()
time.sleep(1.5)  # the reviewer answers once it sees the cue; a later answer the hold waits for
record("again", run)
record("once_more", run)
"""
    reviewer = Reviewer(world, "pending", 2, gate=cue.exists)
    out = await run_sdk(world, code, reviewer)
    first = out["first"]
    assert first["raised"] == "RateLimitError" and first["status"] == 429, first
    gov = first["body"]["governor"]
    assert gov["cause"] == "review_pending" and gov["approval_id"] == reviewer.answered[0]
    assert first["retry_after"] == str(RETRY_AFTER) and gov["retry_after"] == RETRY_AFTER
    # held until shortly before the client's 3 s timeout: a 429, not the client's own timeout
    # (no upper bound on the time: on a loaded machine the answer can land late)
    assert out["first_seconds"] > 1.5
    assert out["again"] == ANSWER, out
    assert out["once_more"]["status"] == 429, out  # a new step, held for a new review
    assert out["once_more"]["body"]["governor"]["approval_id"] != gov["approval_id"]
    assert await _counted(world, "pending") == (2, 2, 2)


async def test_a_rejection_reaches_the_client_as_a_clean_403_once_the_review_is_over(world, tmp_path):
    cue = tmp_path / "first-done"  # the reviewer rejects only after the client had its 429
    code = f"""
client = openai.OpenAI(timeout=3, max_retries=0)
run = chat(client, "rejected")
record("first", run)
open({str(cue)!r}, "w").close()
time.sleep(2)
record("again", run)
"""
    reviewer = Reviewer(world, "rejected", 2.5, "reject", gate=cue.exists)
    out = await run_sdk(world, code, reviewer)
    assert out["first"]["status"] == 429, out
    again = out["again"]
    assert again["raised"] == "PermissionDeniedError" and again["status"] == 403, again
    assert again["body"]["governor"]["cause"] == "on_governor_oversight_trigger"
    assert await _counted(world, "rejected") == (1, 1, 1)


async def test_a_different_request_in_the_session_is_not_attached(world):
    code = """
client = openai.OpenAI(timeout=2, max_retries=0)
record("first", chat(client, "different"))
record("other", chat(client, "different", content="tidy the other notes of different"))
"""
    out = await run_sdk(world, code)
    assert out["first"]["status"] == 429 and out["other"]["status"] == 429, out
    assert out["first"]["body"]["governor"]["approval_id"] != out["other"]["body"]["governor"]["approval_id"]
    assert await _counted(world, "different") == (2, 2, 2)  # two different requests: two steps


# --- the pure parts: hostile timeouts, what names a request ------------------------------


@pytest.mark.parametrize("header, expected", [
    (None, 300.0), ("5", 3.5), ("5.0", 3.5), ("600", 300.0), ("1", 0.7), ("0.2", holds.MIN_HOLD_SEC),
    ("0", 300.0), ("-5", 300.0), ("nan", 300.0), ("inf", 300.0), ("1e400", 300.0), ("", 300.0),
    ("five", 300.0), ("5" * 5000, 300.0), ("\x00", 300.0),
])
async def test_the_hold_fits_the_clients_stated_timeout_and_ignores_nonsense(header, expected):
    headers = {} if header is None else {"x-stainless-read-timeout": header}
    assert holds.hold_time(headers, 300.0) == pytest.approx(expected)
    assert 0.25 <= holds.keepalive_interval(headers) <= holds.MAX_KEEPALIVE_SEC


async def test_a_request_is_named_by_everything_but_its_headers():
    base = ("s", None, "POST", "api.example", 443, "/v1/chat/completions", b'{"a":1}')
    key = holds.request_key(*base)
    assert holds.request_key(*base) == key
    for i, other in enumerate(["t", "p", "PUT", "api.example.org", 444, "/v1/responses", b'{"a":2}']):
        changed = list(base)
        changed[i] = other
        assert holds.request_key(*changed) != key, i
    # no ambiguity where one field ends and the next begins
    assert holds.request_key("ab", None, "c", "h", 1, "/", b"") != holds.request_key("a", None, "bc", "h", 1, "/", b"")


async def test_a_held_streams_identical_request_is_told_the_review_is_pending_not_sent_to_the_model(world):
    import ssl

    import httpx

    body = {"model": "gpt-4o-mini", "max_tokens": 64, "stream": True, "tools": TOOLS,
            "messages": [{"role": "user", "content": "tidy the notes of gave-up"}]}
    headers = {"ADL-Session": "gave-up", "x-stainless-read-timeout": "2"}
    url = f"{world.mock.base_url}/v1/chat/completions"
    reviewer = Reviewer(world, "gave-up", 3.5)
    async with httpx.AsyncClient(proxy=world.running.proxy_url, verify=ssl.create_default_context(cafile=str(world.running.ca_file)),
                                 trust_env=False, timeout=10) as agent:
        async with agent.stream("POST", url, headers=headers, json=body) as first:
            lines = first.aiter_lines()
            while (line := await anext(lines)) != ": waiting for review":  # kept alive, then given up
                pass
        reviewer.start()
        try:
            again = await agent.post(url, headers=headers, json=body)  # held 1.4 s (its 2 s timeout)
            assert again.status_code == 429, again.text
            gov = again.json()["error"]["governor"]
            assert gov["cause"] == "review_pending" and again.headers["retry-after"] == str(RETRY_AFTER)
            for _ in range(150):  # approved (bounded wait), to the stream nobody reads
                if reviewer.answered:
                    break
                await asyncio.sleep(0.1)
        finally:
            await reviewer.stop()
        assert gov["approval_id"] == reviewer.answered[0]
        assert await _counted(world, "gave-up") == (1, 1, 1)  # the retry reached no model
        # the review is over: the identical stream is a new step (a stream is not replayed)
        await asyncio.sleep(0.5)
        async with agent.stream("POST", url, headers=headers, json=body) as later:
            assert later.status_code == 200
            lines = later.aiter_lines()
            while (line := await anext(lines)) != ": waiting for review":  # held for a new review
                pass
        assert world.calls("gave-up") == 2
        assert len(await world.pauses("gave-up")) == 2
