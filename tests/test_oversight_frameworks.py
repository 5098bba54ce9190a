"""Agent frameworks and the anthropic SDK through a review that outlasts their timeout
(docs/oversight.md).

openai-agents, langchain-openai, pydantic-ai (each on an openai client at `timeout=3`) and the
anthropic SDK (`timeout=3`), each in a subprocess configured by its environment
(HTTPS_PROXY, SSL_CERT_FILE), against the real governor (example passport: delete_note
requires confirmation; Retry-After 1 s here) with reviewers on the control plane. Three
sessions at once per framework, each with the documented behaviour:

* within: a review (4.5 s) that ends within the client's retries (each held connection ends in
  429 review_pending + Retry-After, which the SDKs retry): the agent simply continues; the
  model was called once for the held step, one approval, one iteration for it;
* past: a review (3 s) that outlasts them (no retries): the framework raises the 429
  (review_pending, naming the approval); the identical call made again after the approval
  gets the approved answer and the agent continues, without a second model call for it;
* rejected: the framework raises the 403 (on_governor_oversight_trigger); the tool never runs.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

from tests.oversight_world import Reviewer, oversight_world
from tests.proxy_harness import run_python

pytestmark = pytest.mark.asyncio(loop_scope="module")

RETRY_AFTER = 1  # the SDKs honour it: a retry 1 s after each 429 (the governor's default is 10 s)

COMMON = """
import asyncio, json, time
out = {}
def failure(e):
    body = getattr(e, "body", None)
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except ValueError:
            pass
    status = getattr(e, "status_code", None) or getattr(getattr(e, "response", None), "status_code", None)
    gov = None
    if isinstance(body, dict):
        error = body.get("error", body)
        gov = (error.get("governor") if isinstance(error, dict) else None) or body.get("governor")
    return {"raised": type(e).__name__, "status": status, "governor": gov}
async def attempt(name, session, retries):
    t0 = time.monotonic()
    try:
        out[name] = {"answer": await run(session, retries)}
    except Exception as e:
        cause = e  # a framework may wrap the SDK's error: report the one with the HTTP status
        while getattr(cause, "status_code", None) is None and cause.__cause__ is not None:
            cause = cause.__cause__
        out[name] = failure(cause if getattr(cause, "status_code", None) is not None else e)
    out[name]["seconds"] = time.monotonic() - t0
deleted = {}
def delete_for(session):
    def delete(path):
        deleted.setdefault(session, []).append(path)
        return f"deleted {path}"
    return delete
def client(session, retries):
    import openai
    return openai.AsyncOpenAI(timeout=3, max_retries=retries, default_headers={"ADL-Session": session})
async def past(session):
    await attempt("past", session, 0)
    await asyncio.sleep(1.5)  # the review ends 3 s after it began: kept for the identical call (or held for it)
    await attempt("past_again", session, 0)
async def main(framework):
    await asyncio.gather(attempt("within", f"within-{framework}", 2), past(f"past-{framework}"),
                         attempt("rejected", f"rejected-{framework}", 2))
    out["deleted"] = deleted
"""

FRAMEWORKS = {
    "openai_agents": """
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
set_tracing_disabled(True)
async def run(session, retries):
    delete = delete_for(session)
    @function_tool
    def delete_note(path: str) -> str:
        \"\"\"Delete a note.\"\"\"
        return delete(path)
    agent = Agent(name="tidy", instructions="Tidy the notes.", tools=[delete_note],
                  model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client(session, retries)))
    return (await Runner.run(agent, f"tidy the notes of {session}")).final_output
""",
    "langchain": """
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
async def run(session, retries):
    delete = delete_for(session)
    def delete_note(path: str) -> str:
        \"\"\"Delete a note.\"\"\"
        return delete(path)
    llm = ChatOpenAI(model="gpt-4o-mini", timeout=3, max_retries=retries,
                     default_headers={"ADL-Session": session}).bind_tools([delete_note])
    messages = [HumanMessage(f"tidy the notes of {session}")]
    for _ in range(4):
        reply = await llm.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return reply.content
        for call in reply.tool_calls:
            messages.append(ToolMessage(delete_note(**call["args"]), tool_call_id=call["id"]))
""",
    "pydantic_ai": """
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
async def run(session, retries):
    delete = delete_for(session)
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client(session, retries)))
    agent = Agent(model, instructions="Tidy the notes.")
    @agent.tool_plain
    def delete_note(path: str) -> str:
        \"\"\"Delete a note.\"\"\"
        return delete(path)
    return (await agent.run(f"tidy the notes of {session}")).output
""",
    "anthropic": """
import anthropic
TOOLS = [{"name": "delete_note", "description": "Delete a note.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
async def run(session, retries):
    delete = delete_for(session)
    sdk = anthropic.AsyncAnthropic(timeout=3, max_retries=retries, default_headers={"ADL-Session": session})
    messages = [{"role": "user", "content": f"tidy the notes of {session}"}]
    for _ in range(4):
        reply = await sdk.messages.create(model="claude-3-5-haiku-latest", max_tokens=64, tools=TOOLS,
                                          messages=messages)
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return "".join(b.text for b in reply.content if b.type == "text")
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id, "content": delete(**b.input)} for b in uses]})
""",
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def world(tmp_path_factory):
    async with oversight_world(tmp_path_factory.mktemp("frameworks"), review_retry_after=RETRY_AFTER) as w:
        yield w


async def _counted(world, session: str) -> tuple[int, int, int]:
    """(model calls, iterations, approvals asked for) of a session."""
    view = await world.view(session)
    return world.calls(session), view["iterations"], len(await world.pauses(session))


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
async def test_a_review_past_the_frameworks_timeout_behaves_as_documented(world, framework):
    reviewers = [Reviewer(world, f"within-{framework}", 4.5).start(), Reviewer(world, f"past-{framework}", 3).start(),
                 Reviewer(world, f"rejected-{framework}", 4, "reject").start()]
    try:
        out = await run_python(COMMON + FRAMEWORKS[framework] + f"asyncio.run(main({framework!r}))\n"
                               "print(json.dumps(out))\n", world.sdk_env, timeout=120)
    finally:
        for reviewer in reviewers:
            await reviewer.stop()
    path = ["/workspace/notes/old.md"]
    # within the client's retries: the agent continues as if the model had been slow
    assert out["within"].get("answer") == "notes tidied", out
    # past the client's 3 s timeout: 429 at 2.1 s, retried at 3.1 s, answered at 4.5 s
    assert out["within"]["seconds"] > 4.5
    assert out["deleted"][f"within-{framework}"] == path
    # the held step once (model call, iteration, approval), then the call with the tool's result
    assert await _counted(world, f"within-{framework}") == (2, 2, 1)
    # past them: the framework raises the 429 naming the approval; the identical call resumes
    past = out["past"]
    assert past["status"] == 429 and past["governor"]["cause"] == "review_pending", out
    assert past["governor"]["approval_id"] == reviewers[1].answered[0]
    assert out["past_again"].get("answer") == "notes tidied", out
    assert out["deleted"][f"past-{framework}"] == path
    assert await _counted(world, f"past-{framework}") == (2, 2, 1)
    # rejected: the framework's 403, and the tool never ran
    rejected = out["rejected"]
    assert rejected["status"] == 403 and rejected["governor"]["cause"] == "on_governor_oversight_trigger", out
    assert f"rejected-{framework}" not in out["deleted"]
    assert await _counted(world, f"rejected-{framework}") == (1, 1, 1)
