"""Retry-proof holds (issue #21): a step held for a reviewer outlasts the client's timeout.

The official openai SDK (subprocess, configured by its environment) at `timeout=5` with its
default retries, against a 20 s review answered by a reviewer through the real control plane:
the model is called once, one iteration and one approval are counted, and the agent gets the
approved answer (plain: 429 review_pending with Retry-After until the review is over, then the
kept answer; streamed: the held stream stays alive with SSE comment lines). A rejection is a
clean 403; a different request is not attached; the kept answer is taken once.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

from tests.oversight_world import DELETE, TOOLS, Reviewer, oversight_world
from tests.proxy_harness import run_python
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

PRELUDE = """
import json, time, openai
client = openai.OpenAI(timeout=5)
out = {}
def record(name, fn):
    t0 = time.monotonic()
    try:
        out[name] = fn()
    except openai.APIStatusError as e:
        out[name] = {"raised": type(e).__name__, "status": e.status_code, "body": e.body,
                     "retry_after": e.response.headers.get("retry-after")}
    except openai.APIError as e:
        out[name] = {"raised": type(e).__name__, "message": e.message}
    out[name + "_seconds"] = time.monotonic() - t0
"""


def chat_code(session: str, *, stream: bool = False, content: str = "tidy the notes") -> str:
    call = (f"client.chat.completions.create(model='gpt-4o-mini', max_tokens=64, tools={TOOLS!r}, stream={stream}, "
            f"messages=[{{'role': 'user', 'content': {content!r}}}], extra_headers={{'ADL-Session': {session!r}}})")
    if stream:
        body = f"""
    chunks = list({call})
    calls = [tc.function for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    return {{"tool": next(f.name for f in calls if f.name), "args": "".join(f.arguments or "" for f in calls)}}"""
    else:
        body = f"""
    r = {call}
    return {{"tool": r.choices[0].message.tool_calls[0].function.name, "args": r.choices[0].message.tool_calls[0].function.arguments}}"""
    return f"def run():{body}\n"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def world(tmp_path_factory):
    async with oversight_world(tmp_path_factory.mktemp("holds")) as w:
        yield w


@pytest.fixture(autouse=True)
def fresh(world):
    world.mock.reset()
    world.mock.default = Behaviour(tool_calls=(DELETE,))


async def _held_call(world, session: str, review_after: float, *, stream: bool = False, decision: str = "approve",
                     extra: str = "record('first', run)\n") -> tuple[dict, Reviewer]:
    reviewer = Reviewer(world, session, review_after, decision).start()
    try:
        out = await run_python(PRELUDE + chat_code(session, stream=stream) + extra + "print(json.dumps(out))\n",
                               world.sdk_env, timeout=90)
    finally:
        await reviewer.stop()
    return out, reviewer


async def test_a_plain_call_outlasting_the_sdk_timeout_reaches_the_model_once_and_gets_the_approved_answer(world):
    out, reviewer = await _held_call(world, "plain-held", 20)
    assert out["first"] == {"tool": "delete_note", "args": '{"path":"/workspace/notes/old.md"}'}, out
    assert out["first_seconds"] > 20  # it waited for the reviewer, through timeouts and retries
    assert len(world.mock.requests) == 1  # the model was called once
    view = await world.view("plain-held")
    assert view["iterations"] == 1 and view["tool_calls"] == 1, view
    assert len(reviewer.seen) == 1 and len(reviewer.answered) == 1
    assert len(await world.pauses("plain-held")) == 1  # one approval asked for, one recorded


async def test_a_held_stream_is_kept_alive_past_the_sdk_timeout_and_resumes_when_approved(world):
    out, reviewer = await _held_call(world, "stream-held", 20, stream=True)
    assert out["first"] == {"tool": "delete_note", "args": '{"path":"/workspace/notes/old.md"}'}, out
    assert out["first_seconds"] > 20
    assert len(world.mock.requests) == 1
    assert len(world.mock.streams) == 1
    view = await world.view("stream-held")
    assert view["iterations"] == 1 and view["tool_calls"] == 1, view
    assert len(reviewer.seen) == 1 and len(await world.pauses("stream-held")) == 1


async def test_a_rejection_reaches_the_retrying_client_as_a_clean_403(world):
    out, reviewer = await _held_call(world, "rejected", 5, decision="reject")
    first = out["first"]
    assert first["raised"] == "PermissionDeniedError" and first["status"] == 403, first
    assert first["body"]["governor"]["cause"] == "on_oversight_trigger"
    assert len(world.mock.requests) == 1
    assert len(reviewer.seen) == 1


async def test_a_pending_review_is_a_429_naming_the_approval_and_the_answer_is_taken_once(world):
    # no retries: the agent sees the 429 itself; it comes back after the approval and gets the
    # answer; the identical request once more is a new model call (and a new approval)
    code = PRELUDE.replace("openai.OpenAI(timeout=5)", "openai.OpenAI(timeout=3, max_retries=0)") + chat_code("pending") + """
record("first", run)
import urllib.request
time.sleep(8)
record("again", run)
print(json.dumps(out))
"""
    reviewer = Reviewer(world, "pending", 3).start()
    try:
        out = await run_python(code, world.sdk_env, timeout=90)
    finally:
        await reviewer.stop()
    first = out["first"]
    assert first["raised"] == "RateLimitError" and first["status"] == 429, first
    gov = first["body"]["governor"]
    assert gov["cause"] == "review_pending" and gov["approval_id"] in reviewer.seen
    assert first["retry_after"] == "10" and gov["retry_after"] == 10
    assert out["again"] == {"tool": "delete_note", "args": '{"path":"/workspace/notes/old.md"}'}, out
    assert len(world.mock.requests) == 1
    view = await world.view("pending")
    assert view["iterations"] == 1, view


async def test_a_different_request_is_not_attached_to_the_held_one(world):
    code = PRELUDE.replace("openai.OpenAI(timeout=5)", "openai.OpenAI(timeout=3, max_retries=0)") \
        + chat_code("different") + "record('first', run)\n" \
        + chat_code("different", content="tidy the other notes").replace("def run", "def other") \
        + "record('other', other)\nprint(json.dumps(out))\n"
    out = await run_python(code, world.sdk_env, timeout=60)
    assert out["first"]["status"] == 429 and out["other"]["status"] == 429, out
    assert out["first"]["body"]["governor"]["approval_id"] != out["other"]["body"]["governor"]["approval_id"]
    assert len(world.mock.requests) == 2  # two different requests: two model calls
