"""The demo's flow: what a newcomer sees the governor do, end to end, in about ten seconds.

  1  the governor starts on its embedded defaults (bundled passport admitted, a fresh
     key, proxy and control plane on free loopback ports, a temporary data directory)
  2  a scripted agent calls a mock LLM and an MCP tool server through the proxy; the
     session's token and cost budgets are read back from the control plane after each call
  3  it calls delete_note (requires_confirmation): the proxy holds the request, the demo
     answers as the reviewer through the control plane, the held call goes through
  4  the agent carries on until the token budget halts it (HTTP 429, governor object)
  5  the session ends through the control plane; its signed record is saved
  6  with everything stopped, `governor verify` checks the record offline

Every one of those is checked as it happens: if the governor does not do what the
demo says it does, the demo stops with DemoFailed (exit 1), never a happy ending.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from governor.demo.agent import MAX_TOKENS, Reply, ScriptedAgent
from governor.demo.mock_llm import MockLLM
from governor.demo.mock_tools import MockTools
from governor.demo.render import Meter, Terminal
from governor.evidence import key_fingerprint
from governor.evidence.keys import public_key_pem
from governor.passport import AdmissionConfig, admit, example_passport_path, load_passport
from governor.passport import format_report
from governor.proxy.server import Running, Settings, StartupError, serve

LOOPBACK = "127.0.0.1"
DEADLINE_SEC = 50.0  # the demo finishes by itself; past this something is wrong
HELD_CALL_WAIT_SEC = 10.0  # how long a held tool call may take to show up in GET /v1/approvals
POLL_SEC = 0.05
REVIEWER = "demo reviewer"
OLD_NOTE = "/workspace/notes/old-draft.md"
VERIFY_MAIN = "import sys; from governor.cli import main; sys.exit(main(sys.argv[1:]))"


class DemoFailed(Exception):
    """The governor did not do what the demo shows it doing."""


@dataclass(frozen=True)
class DemoOptions:
    fast: bool = False  # no pauses, no animation (tests)
    keep: bool = False  # keep the temporary directory (record, key, journal) and print its path


# --- the script ----------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    prompt: str


@dataclass(frozen=True)
class UseTool:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


# The agent's plan. It would go on past the budget; the governor decides where it stops.
SCRIPT = (
    Ask("Find recent papers on runtime governance for AI agents."),
    UseTool("search_papers", {"query": "runtime governance AI agents", "limit": 3}),
    Ask("Which of these should we read first?"),
    UseTool("fetch_paper", {"paper_id": "2403.01234"}),
    Ask("Summarize it in five bullets for the notes."),
    UseTool("write_note", {"path": "/workspace/notes/governance.md",
                           "content": "Runtime governance: budgets, oversight, signed records."}),
    Ask("The old draft note is superseded by the new one. Tidy up."),
    UseTool("delete_note", {"path": OLD_NOTE}),
    Ask("Next, the audit-log paper."),
    UseTool("fetch_paper", {"paper_id": "2404.04567"}),
    Ask("How does it relate to the first paper?"),
    UseTool("fetch_paper", {"paper_id": "2405.07890"}),
    Ask("And the human-in-the-loop paper?"),
    Ask("Draft a comparison table of the three."),
    Ask("Write the final summary for the researcher."),
    Ask("Suggest three follow-up searches."),
)

# The mock LLM's answers, one per model call it serves.
REPLIES = (
    "I'll search the paper index for runtime governance of AI agents.",
    "Start with 2403.01234: it defines budgets, oversight and signed records.",
    "Summary ready: budgets cap spend, oversight pauses risky steps, records are signed.",
    "The old draft is superseded; I'll delete it.",
    "Fetching 2404.04567 on hash-chained audit logs.",
    "It supplies the tamper-evidence the first paper's records rely on.",
    "It covers when to pause for a reviewer and how long to wait.",
    "Comparison table drafted: scope, enforcement, evidence.",
    "Final summary written.",
    "Follow-ups: anomaly baselines, delegation depth, cost models.",
)


# --- formatting ----------------------------------------------------------------------


def _usd(value: float) -> str:
    return f"${value:.2f}" if round(value, 2) == value else f"${value:.4f}"


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items() if k != 'content')})"


def _clip(text: str, width: int = 64) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _event_note(detail: dict[str, Any]) -> str:
    """A few words on why an event was recorded, from its detail."""
    if "review" in detail:
        note = f"{detail['review']} by {detail.get('reviewer', 'the reviewer')}"
    elif "deviations" in detail:
        kinds = ", ".join(f"{d.get('kind')} {d.get('tool', '')}".strip() for d in detail["deviations"])
        note = f"anomaly: {kinds}"
        if detail.get("observed_only"):
            note += f" (recorded only at this tier; R3 would {detail.get('would', 'act')})"
    elif "dimension" in detail:
        note = f"{detail['dimension']} {detail.get('scope', '')}: projected {detail.get('projected', detail.get('observed'))}" \
               f" > limit {detail.get('limit')}"
    elif "reason" in detail:
        note = str(detail["reason"])
    else:
        return ""
    return f"  ({_clip(note, 90)})"


# --- the demo ------------------------------------------------------------------------


class Demo:
    def __init__(self, term: Terminal, workdir: Path) -> None:
        self.term = term
        self.workdir = workdir
        self.session = ""  # opened by the demo, as the principal, through the control plane
        self.session_token = ""  # what the agent sends in ADL-Session
        self.reviewer_token = secrets.token_urlsafe(24)  # the only credential that can answer an approval
        self.control_token = secrets.token_urlsafe(24)  # the principal's: opens sessions
        self.passport = example_passport_path()
        self.model_calls = 0
        self.approved: dict[str, Any] | None = None
        self.halt: dict[str, Any] | None = None
        self.record_file = workdir / "record.json"
        self.public_key_file = workdir / "governor-public.pem"

    async def run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            running = await self.start_governor(stack)
            control = await stack.enter_async_context(aiohttp.ClientSession(
                running.control_url, trust_env=False, timeout=aiohttp.ClientTimeout(total=15),
                headers={"Authorization": f"Bearer {self.control_token}"}))
            await self.open_session(control)
            llm = MockLLM(REPLIES)
            tools = MockTools({OLD_NOTE: "An early draft, superseded by governance.md."})
            await llm.start(LOOPBACK)
            stack.push_async_callback(llm.stop)
            await tools.start(LOOPBACK)
            stack.push_async_callback(tools.stop)
            agent = await stack.enter_async_context(
                ScriptedAgent(proxy=running.proxy_url, llm_url=llm.url, tools_url=tools.url, session=self.session_token))
            await self.work(agent, llm, tools, control)
            await self.end_session(control)
            self.term.say("   Stopping the governor, the mock LLM and the tool server.")
        await self.verify_offline()

    # 1 ---------------------------------------------------------------------------------

    async def start_governor(self, stack: contextlib.AsyncExitStack) -> Running:
        term = self.term
        term.heading(1, "Starting the governor on embedded defaults")
        term.say("   The bundled example passport goes through admission (Trust §1.1):")
        report = admit(load_passport(self.passport), AdmissionConfig(now=datetime.now(timezone.utc)))
        for line in format_report(self.passport, report).splitlines():
            term.say("     " + line)
        if not report.verified or report.pinned is None:
            raise DemoFailed("the bundled passport was refused at admission (see the report above)")
        limits = report.pinned.document["permissions"]["resource_limits"]
        budget = limits["budget"]
        iterations = report.pinned.document["runtime"]["tool_invocation"]["max_iterations"]
        term.field("limits", f"{budget['tokens']['per_session']:,} tokens and {_usd(budget['cost_usd']['per_session'])} "
                             f"per session, {iterations} iterations, delete_note and send_email need approval")
        await term.pause(0.6)

        data_dir = self.workdir / "data"
        settings = Settings(passport=self.passport, listen=(LOOPBACK, 0), control=(LOOPBACK, 0), data_dir=data_dir,
                            reviewer_tokens=(self.reviewer_token,), control_token=self.control_token)
        try:
            running = await serve(settings)
        except StartupError as exc:
            raise DemoFailed(f"the governor did not start: {exc}") from None
        stack.push_async_callback(running.stop)
        key = running.runtime.key
        self.public_key_file.write_bytes(public_key_pem(key))
        term.say()
        term.field("data dir", f"{data_dir}  (temporary: your ./.governor is not touched)")
        term.field("key", f"Ed25519 {key_fingerprint(key)}  (new for this run)")
        term.field("proxy", f"{running.proxy_url}  (regular HTTP proxy mode)")
        term.field("control", f"{running.control_url}  (sessions, approvals, records)")
        term.field("reviewer", "a bearer token generated for this run answers approvals")
        term.say("   An agent sends its traffic through the governor with this environment:")
        for name, value in running.agent_environment().items():
            term.say(f"     {name}={value}")
        await term.pause(0.8)
        return running

    async def open_session(self, control: aiohttp.ClientSession) -> None:
        """The principal opens the agent's session: the agent gets only its token."""
        async with control.post("/v1/sessions", json={"label": "governor demo"}) as response:
            body = await response.json(content_type=None)
            if response.status != 201:
                raise DemoFailed(f"POST /v1/sessions answered {response.status}: {body}")
        self.session, self.session_token = body["session"], body["token"]

    # 2-4 -------------------------------------------------------------------------------

    async def work(self, agent: ScriptedAgent, llm: MockLLM, tools: MockTools, control: aiohttp.ClientSession) -> None:
        term = self.term
        term.heading(2, "A scripted agent at work: every call goes through the proxy")
        term.field("mock LLM", f"{llm.url}  (OpenAI chat completions, {llm.tokens_per_call:,} tokens per answer)")
        term.field("tools", f"{tools.url}  (MCP tools/call over HTTP)")
        term.field("session", f"{self.session}  (opened by the principal: POST /v1/sessions with the control token)")
        term.say("   The agent gets only the session's token, which it sends in its ADL-Session header.")
        term.say(f"   The agent asks for at most {MAX_TOKENS} output tokens per call. After each call the demo reads")
        term.say(f"   the session's budgets from the control plane: GET /v1/sessions/{self.session}")
        term.say()
        for step in SCRIPT:
            if isinstance(step, Ask):
                reply = await agent.ask(step.prompt)
                self.model_calls += 1
                if not reply.ok:
                    await self.halted(reply, llm, control)
                    return
                term.say(f"   model #{self.model_calls}  {_clip(step.prompt, 38):<38}  → {_clip(reply.text, 44)}")
                await self.show_budget(control)
            else:
                await self.use_tool(step, agent, tools, control)
            await term.pause(0.25)
        raise DemoFailed(f"the agent ran its whole script ({self.model_calls} model calls) and the token budget "
                         "never halted it")

    async def show_budget(self, control: aiohttp.ClientSession) -> None:
        view = await self.session_view(control)
        found = {b["dimension"]: b for b in view.get("budgets", ())
                 if b.get("scope") == "per_session" and b.get("persona") is None}
        if "tokens" not in found or "cost_usd" not in found:
            raise DemoFailed(f"the session view has no per-session token and cost budgets: {view.get('budgets')}")
        await self.term.meters([
            Meter("tokens", found["tokens"]["used"], found["tokens"]["limit"]),
            Meter("cost_usd", found["cost_usd"]["used"], found["cost_usd"]["limit"], _usd),
        ])

    async def session_view(self, control: aiohttp.ClientSession) -> dict[str, Any]:
        async with control.get(f"/v1/sessions/{self.session}") as response:
            body = await response.json()
            if response.status != 200:
                raise DemoFailed(f"GET /v1/sessions/{self.session} answered {response.status}: {body}")
            return body

    async def use_tool(self, step: UseTool, agent: ScriptedAgent, tools: MockTools,
                       control: aiohttp.ClientSession) -> None:
        term = self.term
        call = asyncio.create_task(agent.call_tool(step.name, step.arguments))
        try:
            approval = await self.held_approval(call, control)
            if approval is not None:
                await self.review(step, approval, tools, control)
            reply = await call
        finally:
            call.cancel()
        if not reply.ok:
            raise DemoFailed(f"the tool call {_call(step.name, step.arguments)} failed: {reply.body}")
        term.say(f"   tool      {_clip(_call(step.name, step.arguments), 38):<38}  → {_clip(reply.text, 44)}")
        if approval is not None:
            if not any(name == step.name for name, _ in tools.calls):
                raise DemoFailed(f"the approved {step.name} call never reached the tool server")
            term.heading(4, "The agent carries on until the token budget halts it")

    async def held_approval(self, call: asyncio.Task, control: aiohttp.ClientSession) -> dict[str, Any] | None:
        """The approval holding this tool call, or None when the call completed without one."""
        deadline = time.monotonic() + HELD_CALL_WAIT_SEC
        while True:
            done, _ = await asyncio.wait({call}, timeout=POLL_SEC)
            if done:
                return None
            async with control.get("/v1/approvals") as response:
                approvals = (await response.json()).get("approvals", [])
            mine = [a for a in approvals if a.get("session") == self.session]
            if mine:
                return mine[0]
            if time.monotonic() > deadline:
                raise DemoFailed(f"a tool call has been held for {HELD_CALL_WAIT_SEC:g}s and no approval shows "
                                 "in GET /v1/approvals")

    async def review(self, step: UseTool, approval: dict[str, Any], tools: MockTools,
                     control: aiohttp.ClientSession) -> None:
        term = self.term
        term.heading(3, f"A call that needs a human: {step.name} is held for a reviewer")
        term.say(f"   The agent called {_call(step.name, step.arguments)}. The passport marks {step.name}")
        term.say("   requires_confirmation, so the proxy holds the request: it has not reached the tool server.")
        if any(name == step.name for name, _ in tools.calls):
            raise DemoFailed(f"{step.name} ran on the tool server before anyone approved it")
        term.say("   GET /v1/approvals shows it to the reviewer:")
        term.field("id", str(approval.get("id")), width=13)
        term.field("tool", f"{approval.get('tool')} {json.dumps(approval.get('arguments'))}", width=13)
        term.field("reason", str(approval.get("reason")), width=13)
        term.field("trigger", str(approval.get("trigger")), width=13)
        term.field("expires at", f"{approval.get('expires_at')}  (the passport's response_time_minutes)", width=13)
        await term.pause(1.2)
        term.say(f"   The demo answers as the reviewer: POST /v1/approvals/{approval['id']}, "
                 "with the reviewer's bearer token:")
        async with control.post(f"/v1/approvals/{approval['id']}", json={"decision": "approve", "reviewer": REVIEWER},
                                headers={"Authorization": f"Bearer {self.reviewer_token}"}) as response:
            answer = await response.json()
            if response.status != 200:
                raise DemoFailed(f"the approval was not accepted ({response.status}): {answer}")
        term.field("answer", f"{answer.get('decision')} by {answer.get('reviewer')}: {answer.get('outcome')}", width=13)
        self.approved = answer
        await term.pause(0.6)
        term.say("   The held request is released and reaches the tool server:")

    async def halted(self, reply: Reply, llm: MockLLM, control: aiohttp.ClientSession) -> None:
        term = self.term
        gov = reply.governor
        term.freeze()
        term.say(f"   model #{self.model_calls}  {term.bad(f'refused: HTTP {reply.status}')}, "
                 f"ADL-Governor-Action: {reply.governor_action}")
        if gov is None:
            raise DemoFailed(f"model call #{self.model_calls} failed without a governor object: "
                             f"HTTP {reply.status} {reply.body}")
        term.say("   The error body's governor object, for the agent's code to act on:")
        for key in ("cause", "action", "dimension", "scope", "observed", "projected", "limit", "message"):
            if key in gov:
                term.field(key, json.dumps(gov[key]), width=13)
        if gov.get("cause") != "on_budget_exhausted" or gov.get("dimension") != "tokens":
            raise DemoFailed(f"the agent was stopped, but not by its token budget: {gov}")
        if llm.served != self.model_calls - 1:
            raise DemoFailed(f"the mock LLM served {llm.served} calls; the refused call #{self.model_calls} "
                             "should never have reached it")
        term.say(f"   The mock LLM served {llm.served} calls: the refused one never left the governor.")
        view = await self.session_view(control)
        term.field("session", f"{view.get('state')} ({view.get('halt_cause')}), {view.get('iterations')} "
                              f"iterations, {view.get('tool_calls')} tool calls", width=13)
        self.halt = gov
        await term.pause(0.8)

    # 5-6 -------------------------------------------------------------------------------

    async def end_session(self, control: aiohttp.ClientSession) -> None:
        term = self.term
        term.heading(5, "The session ends: its signed enforcement record")
        async with control.post(f"/v1/sessions/{self.session}/end") as response:
            record = await response.json()
            if response.status != 200:
                raise DemoFailed(f"POST /v1/sessions/{self.session}/end answered {response.status}: {record}")
        self.record_file.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        term.say(f"   POST /v1/sessions/{self.session}/end returned the record, signed with the governor's key:")
        term.field("outcome", str(record.get("outcome")), width=13)
        term.field("passport", str((record.get("subject") or {}).get("passport_digest")), width=13)
        events = record.get("events") or []
        term.field("events", f"{len(events)}, hash-chained:", width=13)
        for event in events:
            term.say(f"     {event.get('seq', '?'):>3}  {event.get('cause')} → {event.get('action')}"
                     f"{_event_note(event.get('detail') or {})}")
        term.field("saved", f"{self.record_file}", width=13)
        term.field("public key", f"{self.public_key_file}", width=13)
        if record.get("outcome") != "halted":
            raise DemoFailed(f"the record's outcome is {record.get('outcome')!r}, not 'halted'")
        await term.pause(0.6)

    async def verify_offline(self) -> None:
        term = self.term
        term.heading(6, "Verifying the record offline, with nothing running")
        # --offline: the demo publishes no did:web, so step 2 uses the pinned key (PARTIAL, exit 3)
        command = ["verify", str(self.record_file), "--offline", "--key", str(self.public_key_file),
                   "--passport", str(self.passport), "--no-nonce"]
        term.say(f"   $ governor {' '.join(command)}")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", VERIFY_MAIN, *command,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await asyncio.wait_for(process.communicate(), 30)
        text = output.decode("utf-8", "replace")
        for line in text.splitlines():
            term.say("     " + line)
        only_key_unresolved = "INCOMPLETE: not every step ran in full: 2 (governor key) partial\n" in text
        if process.returncode != 0 and not (process.returncode == 3 and only_key_unresolved):
            raise DemoFailed(f"the offline verifier rejected the record (exit {process.returncode})")
        term.say(term.ok("   ✓ the record verified: signature, passport binding and hash chain all check out; "
                         "the key is pinned, not resolved from a did:web, hence INCOMPLETE rather than VALID"))


async def run_demo(options: DemoOptions, out: TextIO | None = None) -> int:
    """Run the demo; 0 when the governor did everything shown, 1 (with the reason) otherwise."""
    term = Terminal(out, pace=not options.fast)
    workdir = Path(tempfile.mkdtemp(prefix="governor-demo-"))
    started = time.monotonic()
    term.say(term.style("governor demo: a scripted agent under the governor, on loopback only", "1"))
    failure = None
    try:
        await asyncio.wait_for(Demo(term, workdir).run(), DEADLINE_SEC)
    except DemoFailed as exc:
        failure = str(exc)
    except TimeoutError:
        failure = f"it did not finish within {DEADLINE_SEC:g}s"
    except (aiohttp.ClientError, OSError) as exc:  # a loopback connection failed: say which, no traceback
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    term.freeze()
    if failure is not None:
        term.say()
        term.say(term.bad(f"demo FAILED: {failure}"))
    if options.keep:
        term.say()
        term.say(f"Kept the demo's files in {workdir}")
        term.say(f"  governor verify {workdir / 'record.json'} --offline --key {workdir / 'governor-public.pem'}")
    if failure is not None:
        return 1
    term.say()
    term.say(f"Done in {time.monotonic() - started:.1f}s. Next: `governor run` governs your own agent "
             "(set the environment shown in step 1).")
    return 0
