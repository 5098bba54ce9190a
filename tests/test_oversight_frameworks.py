"""Agent frameworks through a review that outlasts their timeout (docs/oversight.md).

openai-agents, langchain-openai and pydantic-ai, each in a subprocess configured by its
environment (HTTPS_PROXY, SSL_CERT_FILE), with an openai client at `timeout=3`, against the
real governor (example passport: delete_note requires confirmation) and a reviewer on the
control plane. The documented behaviour:

* a review that ends within the client's retries (each held connection ends in 429
  review_pending + Retry-After, which the openai SDK retries): the agent simply continues;
  the model was called once for the held step, one approval, one iteration;
* a review that outlasts them: the framework raises the 429 (review_pending, naming the
  approval); the identical call made again after the approval gets the approved answer and
  the agent continues, still without a second model call for that step;
* a rejection: the framework raises the 403.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from tests.oversight_world import DELETE, Reviewer, oversight_world
from tests.proxy_harness import run_python
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio(loop_scope="module")

RETRY_AFTER = 3  # the governor's Retry-After here: the client's retries span a short review

COMMON = """
import asyncio, json, os, sys, time
import openai
out = {}
def failure(e):
    body = getattr(e, "body", None)
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except ValueError:
            pass
    status = getattr(e, "status_code", None) or getattr(getattr(e, "response", None), "status_code", None)
    error = body.get("error", body) if isinstance(body, dict) else {}
    gov = (error.get("governor") if isinstance(error, dict) else None) or (body or {}).get("governor") \\
        if isinstance(body, dict) else None
    return {"raised": type(e).__name__, "status": status, "governor": gov, "text": str(e)[:300]}
async def attempt(name):
    t0 = time.monotonic()
    try:
        out[name] = {"answer": await run()}
    except Exception as e:
        cause = e
        while cause is not None and getattr(cause, "status_code", None) is None and cause.__cause__ is not None:
            cause = cause.__cause__
        out[name] = failure(cause if getattr(cause, "status_code", None) is not None else e)
    out[name]["seconds"] = time.monotonic() - t0
def client(retries):
    return openai.AsyncOpenAI(timeout=3, max_retries=retries)
deleted = []
"""

FRAMEWORKS = {
    "openai_agents": """
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
set_tracing_disabled(True)
@function_tool
def delete_note(path: str) -> str:
    \"\"\"Delete a note.\"\"\"
    deleted.append(path)
    return f"deleted {path}"
async def run():
    agent = Agent(name="tidy", instructions="Tidy the notes.", tools=[delete_note],
                  model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client(RETRIES)))
    result = await Runner.run(agent, "tidy the notes")
    return result.final_output
""",
    "langchain": """
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
@tool
def delete_note(path: str) -> str:
    \"\"\"Delete a note.\"\"\"
    deleted.append(path)
    return f"deleted {path}"
async def run():
    llm = ChatOpenAI(model="gpt-4o-mini", timeout=3, max_retries=RETRIES).bind_tools([delete_note])
    messages = [HumanMessage("tidy the notes")]
    for _ in range(4):
        reply = await llm.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return reply.content
        for call in reply.tool_calls:
            messages.append(ToolMessage(delete_note.invoke(call["args"]), tool_call_id=call["id"]))
    return None
""",
    "pydantic_ai": """
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
async def run():
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client(RETRIES)))
    agent = Agent(model, instructions="Tidy the notes.")
    @agent.tool_plain
    def delete_note(path: str) -> str:
        \"\"\"Delete a note.\"\"\"
        deleted.append(path)
        return f"deleted {path}"
    result = await agent.run("tidy the notes")
    return result.output
""",
}


def program(framework: str, retries: int, script: str) -> str:
    return (COMMON + f"RETRIES = {retries}\n" + FRAMEWORKS[framework]
            + f"async def main():\n{script}\n    out['deleted'] = deleted\n"
            + "asyncio.run(main())\nprint(json.dumps(out))\n")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def world(tmp_path_factory):
    async with oversight_world(tmp_path_factory.mktemp("frameworks"), review_retry_after=RETRY_AFTER) as w:
        yield w


@pytest.fixture(autouse=True)
def fresh(world):
    world.mock.reset()
    # the held step, then the answer after the tool's result
    world.mock.script(Behaviour(tool_calls=(DELETE,)), Behaviour(text="notes tidied"))
    world.mock.default = Behaviour(text="notes tidied")


async def _run(world, session: str, framework: str, retries: int, script: str, review_after: float,
               decision: str = "approve") -> tuple[dict, Reviewer]:
    env = {**world.sdk_env, "OPENAI_DEFAULT_HEADERS": ""}
    code = program(framework, retries, script).replace(
        "openai.AsyncOpenAI(timeout=3, max_retries=retries)",
        f"openai.AsyncOpenAI(timeout=3, max_retries=retries, default_headers={{'ADL-Session': {session!r}}})")
    code = code.replace('ChatOpenAI(model="gpt-4o-mini", timeout=3, max_retries=RETRIES)',
                        f'ChatOpenAI(model="gpt-4o-mini", timeout=3, max_retries=RETRIES, '
                        f'default_headers={{"ADL-Session": {session!r}}})')
    reviewer = Reviewer(world, session, review_after, decision).start()
    try:
        out = await run_python(code, env, timeout=120)
    finally:
        await reviewer.stop()
    return out, reviewer


async def _counted(world, session: str) -> tuple[int, int]:
    view = await world.view(session)
    return view["iterations"], len(await world.pauses(session))


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
async def test_a_review_within_the_clients_retries_is_waited_for(world, framework):
    session = f"within-{framework}"
    out, reviewer = await _run(world, session, framework, 2, "    await attempt('run')", review_after=7)
    assert out["run"].get("answer") == "notes tidied", out
    assert out["run"]["seconds"] > 7  # past the client's 3 s timeout, twice over
    assert out["deleted"] == ["/workspace/notes/old.md"]
    assert len(world.mock.requests) == 2  # the held step once, then the call with the tool's result
    assert await _counted(world, session) == (2, 1)
    assert len(reviewer.seen) == 1 and len(reviewer.answered) == 1


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
async def test_a_review_past_the_clients_retries_is_a_429_and_the_identical_call_resumes(world, framework):
    session = f"past-{framework}"
    script = "    await attempt('first')\n    await asyncio.sleep(4)\n    await attempt('again')"
    out, reviewer = await _run(world, session, framework, 0, script, review_after=3)
    first = out["first"]
    assert first["status"] == 429, out
    assert first["governor"]["cause"] == "review_pending"
    assert first["governor"]["approval_id"] == reviewer.answered[0]
    assert out["again"].get("answer") == "notes tidied", out
    assert out["deleted"] == ["/workspace/notes/old.md"]
    assert len(world.mock.requests) == 2
    assert await _counted(world, session) == (2, 1)


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
async def test_a_rejection_is_the_frameworks_403(world, framework):
    session = f"rejected-{framework}"
    out, _ = await _run(world, session, framework, 2, "    await attempt('run')", review_after=4, decision="reject")
    run = out["run"]
    assert run["status"] == 403, out
    assert run["governor"]["cause"] == "on_oversight_trigger"
    assert out["deleted"] == []
    assert len(world.mock.requests) == 1
    await asyncio.sleep(0)
