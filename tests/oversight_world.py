"""A real governor (real runtime, the bundled example passport: delete_note requires
confirmation) with its control plane and a reviewer token, in front of the loopback TLS mock
LLM; and a reviewer that answers held steps through the control plane's /v1/approvals after
a chosen delay, counting every approval it saw. Shared by the oversight-hold tests."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import httpx
import orjson

from tests.proxy_harness import AGENT_NAMED, sdk_environment
from tests.upstreams import Behaviour, MockLLM, make_tls

REVIEWER = "reviewer-token-for-oversight-holds-0123456789"
DELETE = ("delete_note", {"path": "/workspace/notes/old.md"})
TOOLS = [{"type": "function", "function": {"name": "delete_note", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]


class ToolThenText(MockLLM):
    """The model of a one-step agent: asks for delete_note, and once the conversation carries
    the tool's result, answers with text. Chosen by the request, so concurrent sessions each
    get their own turn."""

    def _next(self) -> Behaviour:
        body = orjson.dumps(self.requests[-1].body) if self.requests else b""
        if b'"role":"tool"' in body or b'"tool_result"' in body:
            return Behaviour(text="notes tidied")
        return Behaviour(tool_calls=(DELETE,))


@dataclass
class World:
    running: Any
    mock: MockLLM
    control: httpx.AsyncClient
    sdk_env: dict[str, str]

    def calls(self, tag: str) -> int:
        """Model calls whose conversation names `tag` (the tests put the session in the prompt)."""
        return sum(tag.encode() in orjson.dumps(r.body) for r in self.mock.requests)

    async def view(self, session: str) -> dict[str, Any]:
        resp = await self.control.get(f"/v1/sessions/{session}")
        assert resp.status_code == 200, resp.text
        return resp.json()

    async def pauses(self, session: str) -> list[dict[str, Any]]:
        """The session's recorded pause events (one per approval asked for)."""
        resp = await self.control.get(f"/v1/sessions/{session}/record")
        assert resp.status_code == 200, resp.text
        # an approval is recorded as `pause` too, closing the pause it answers (detail.review)
        return [e for e in resp.json()["events"] if e["action"] == "pause" and "review" not in (e.get("detail") or {})]


# the start of a program the tests run with the openai SDK in a subprocess: record(name, fn)
# keeps what fn returned, or the SDK error it raised (status, body, Retry-After), and its time
SDK_RECORDER = """
import json, threading, time, openai
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

# SDK_RECORDER, TOOLS, and chat(client, session): a chat completion offering TOOLS, whose
# tool call it returns (read from the stream when streamed)
SDK_CHAT = SDK_RECORDER + f"TOOLS = {TOOLS!r}\n" + """
def chat(client, session, stream=False, content=None):
    def call():
        return client.chat.completions.create(
            model="gpt-4o-mini", max_tokens=64, tools=TOOLS, stream=stream, extra_headers={"ADL-Session": session},
            messages=[{"role": "user", "content": content or f"tidy the notes of {session}"}])
    def run():
        if not stream:
            f = call().choices[0].message.tool_calls[0].function
            return {"tool": f.name, "args": f.arguments}
        calls = [tc.function for c in call() if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        return {"tool": next(f.name for f in calls if f.name), "args": "".join(f.arguments or "" for f in calls)}
    return run
"""

# sessions "plain" and "streamed" at once, through an SDK whose timeout (5 s) is shorter than the review
PLAIN_AND_STREAMED = """
client = openai.OpenAI(timeout=5)
runs = [threading.Thread(target=record, args=(name, chat(client, name, stream=name == "streamed")))
        for name in ("plain", "streamed")]
[t.start() for t in runs]
[t.join() for t in runs]
"""


async def run_sdk(world: World, code: str, *reviewers: Reviewer) -> dict[str, Any]:
    """`code` after SDK_CHAT in an SDK subprocess through the world's proxy, with `reviewers`
    answering meanwhile: the program's `out`."""
    from tests.proxy_harness import run_python

    for reviewer in reviewers:
        reviewer.start()
    try:
        return await run_python(SDK_CHAT + code + "\nprint(json.dumps(out))\n", world.sdk_env, timeout=120)
    finally:
        for reviewer in reviewers:
            await reviewer.stop()


@dataclass
class Reviewer:
    """Answers the first pending approval of `session` `after` seconds after it appeared."""

    world: World
    session: str
    after: float
    decision: str = "approve"
    seen: set[str] = field(default_factory=set)
    answered: list[str] = field(default_factory=list)
    task: asyncio.Task | None = None
    gate: Callable[[], bool] | None = None  # answers only once this says so too (a client's cue)

    def start(self) -> "Reviewer":
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def _pending(self) -> list[dict[str, Any]]:
        listed = (await self.world.control.get("/v1/approvals")).json()["approvals"]
        return [a for a in listed if a["session"] == self.session]

    async def _run(self) -> None:
        first_seen = None
        for _ in range(int((self.after + 60) / 0.1)):  # bounded: gives up a minute past its answer
            pending = await self._pending()
            self.seen.update(a["id"] for a in pending)
            loop = asyncio.get_running_loop()
            if pending and first_seen is None:
                first_seen = loop.time()
            if (pending and first_seen is not None and loop.time() - first_seen >= self.after and not self.answered
                    and (self.gate is None or self.gate())):
                approval = pending[0]["id"]
                resp = await self.world.control.post(
                    f"/v1/approvals/{approval}", json={"decision": self.decision, "reviewer": "lead"},
                    headers={"Authorization": f"Bearer {REVIEWER}"})
                assert resp.status_code == 200, resp.text
                self.answered.append(approval)
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass


@asynccontextmanager
async def oversight_world(tmp: Path, **settings: Any) -> AsyncIterator[World]:
    from governor.proxy.server import Settings, serve

    tls = make_tls(tmp / "tls")
    mock = ToolThenText(tls)
    await mock.start()
    options = dict(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp / "data",
                   upstream_ca=tls.ca_file, reviewer_tokens=(REVIEWER,), tick_interval=0.5, **AGENT_NAMED)
    running = await serve(Settings(**{**options, **settings}))
    control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30)
    try:
        yield World(running, mock, control, sdk_environment(running, mock))
    finally:
        await control.aclose()
        await running.stop()
        await mock.stop()
