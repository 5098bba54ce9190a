"""A scripted runtime implementing RuntimeAPI, for testing the control plane and the
wire adapters apart from the real policy engine.

Decisions come from a script: `rules` maps a step to a Decision (first rule whose
predicate matches wins; PERMIT otherwise). Pauses are real: a PAUSE admission
registers an approval that `resolve_approval` answers and `await_approval` waits
for, with a real timeout. Records are really signed (Ed25519 over JCS) so tests
can check that a nonce is covered by the signature.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governor.runtime.prices import price_book
from governor.common.canonical import b64url, canonicalize, digest_of
from governor.policy.steps import (
    Action, ApprovalRequest, Decision, PERMIT, Step, ToolCall, UsageReport, ON_OVERSIGHT_TIMEOUT,
    ON_OVERSIGHT_TRIGGER,
)
from governor.runtime.api import Admission, governor_object

Rule = tuple[Callable[[str, Step], bool], Callable[[str, Step], Decision]]


def pause_decision(approval_id: str, reason: str = "requires_confirmation", response_time: float = 30.0,
                   step_digest: str = "") -> Decision:
    return Decision(
        action=Action.PAUSE, cause=ON_OVERSIGHT_TRIGGER,
        approval=ApprovalRequest(id=approval_id, reason=reason, step_digest=step_digest,
                                 expires_at=time.time() + response_time, trigger=reason),
        event={"cause": ON_OVERSIGHT_TRIGGER, "action": "pause"})


@dataclass
class _Pending:
    session: str
    step: Step
    request: ApprovalRequest
    answered: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class ScriptedRuntime:
    def __init__(self, rules: list[Rule] | None = None, *, ready: bool | dict = True,
                 allowed: dict[str | None, frozenset[str] | None] | None = None) -> None:
        self.rules = list(rules or [])
        self.ready_state = ready
        self.allowed = allowed or {}
        self.steps: list[tuple[str, Step]] = []
        self.finished: list[tuple[str, Any, str | None]] = []
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.ended: set[str] = set()
        self.pending: dict[str, _Pending] = {}
        self.answers: dict[str, tuple[bool, str]] = {}
        self.key = Ed25519PrivateKey.generate()
        self._tickets = 0

    # --- steps -------------------------------------------------------------------------

    def decide(self, session: str, step: Step) -> Decision:
        for predicate, decision in self.rules:
            if predicate(session, step):
                return decision(session, step)
        return PERMIT

    async def admit(self, session: str, step: Step) -> Admission:
        self.steps.append((session, step))
        self.events.setdefault(session, [])
        if session in self.ended:
            return Admission(Decision(action=Action.HALT, cause="on_governor_session_integrity"), session,
                             governor_object={"cause": "on_governor_session_integrity", "action": "halt",
                                              "message": "session ended"})
        decision = self.decide(session, step)
        if decision.event is not None:
            self.events[session].append(dict(decision.event))
        if decision.approval is not None:
            self.pending[decision.approval.id] = _Pending(session, step, decision.approval)
        self._tickets += 1
        return Admission(decision, session, ticket=self._tickets, governor_object=governor_object(decision, session))

    async def await_approval(self, session: str, approval_id: str) -> Admission:
        pending = self.pending[approval_id]
        timeout = max(0.0, pending.request.expires_at - time.time())
        try:
            approved = await asyncio.wait_for(asyncio.shield(pending.answered), timeout)
        except asyncio.TimeoutError:
            self.pending.pop(approval_id, None)
            decision = Decision(action=Action.HALT, cause=ON_OVERSIGHT_TIMEOUT, fail_closed=True,
                                event={"cause": ON_OVERSIGHT_TIMEOUT, "action": "halt"})
            self.events[session].append(dict(decision.event))
            self.ended.add(session)
            return Admission(decision, session, governor_object=governor_object(decision, session))
        if approved:
            self._tickets += 1
            return Admission(PERMIT, session, ticket=self._tickets)
        decision = Decision(action=Action.DENY, cause=ON_OVERSIGHT_TRIGGER,
                            event={"cause": ON_OVERSIGHT_TRIGGER, "action": "deny"})
        return Admission(decision, session, governor_object=governor_object(decision, session))

    async def usage(self, session: str, ticket: Any, report: UsageReport) -> Decision:
        self.steps.append((session, report))
        return PERMIT

    async def finish(self, session: str, ticket: Any, *, error: str | None = None) -> None:
        self.finished.append((session, ticket, error))

    # --- control plane -----------------------------------------------------------------

    async def ready(self) -> dict[str, Any]:
        if isinstance(self.ready_state, dict):
            return self.ready_state
        return {"ready": self.ready_state, "store": "ok" if self.ready_state else "unreachable"}

    def allowed_tools(self, session: str, persona: str | None = None) -> frozenset[str] | None:
        return self.allowed.get(persona)

    def has_session(self, session: str) -> bool:
        return session in self.events

    async def sessions(self, after: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        ids = [s for s in sorted(self.events) if after is None or s > after]
        return [await self.session_view(s) for s in ids[:limit]]

    async def session_view(self, session: str) -> dict[str, Any] | None:
        if session not in self.events:
            return None
        return {"session": session, "state": "ended" if session in self.ended else "active",
                "steps": sum(1 for s, _ in self.steps if s == session),
                "pending_approvals": [a for a, p in self.pending.items() if p.session == session]}

    def approvals(self) -> list[dict[str, Any]]:
        return [{"id": a, "session": p.session, "reason": p.request.reason,
                 "tool": getattr(p.step, "tool", None), "expires_at": p.request.expires_at}
                for a, p in self.pending.items()]

    async def resolve_approval(self, approval_id: str, approve: bool, reviewer: str) -> dict[str, Any]:
        pending = self.pending.pop(approval_id, None)
        if pending is None or pending.answered.done():
            raise KeyError(approval_id)
        self.answers[approval_id] = (approve, reviewer)
        pending.answered.set_result(approve)
        return {"id": approval_id, "decision": "approve" if approve else "reject", "reviewer": reviewer,
                "session": pending.session}

    async def end_session(self, session: str) -> dict[str, Any]:
        if session not in self.events:
            raise KeyError(session)
        self.ended.add(session)
        return self.record(session)

    def record(self, session: str, nonce: str | None = None) -> dict[str, Any]:
        if session not in self.events:
            raise KeyError(session)
        body: dict[str, Any] = {"adl_enforcement_record": "1.0", "session": session,
                                "events": self.events[session],
                                "outcome": "completed" if session in self.ended else "paused"}
        if nonce is not None:
            body["nonce"] = nonce
        body["signature"] = {"algorithm": "Ed25519", "value": b64url(self.key.sign(canonicalize(body))),
                             "signed_content": "canonical"}
        return body


async def start_control_plane(runtime: Any = None, **options: Any) -> Any:
    """The control plane (create_app) on a loopback port in front of `runtime` (a fresh
    ScriptedRuntime when None), with an aiohttp client: a namespace of url, runtime, metrics,
    origin, runner, http, port; `options` go to ControlContext.build."""
    import aiohttp

    from governor.control import ControlContext, ProxyOrigin, control_url, create_app, start_control
    from governor.runtime.metrics import Metrics

    runtime = runtime if runtime is not None else ScriptedRuntime()
    metrics, origin = options.pop("metrics", None), options.pop("origin", None)
    metrics = metrics if metrics is not None else Metrics()
    origin = origin if origin is not None else ProxyOrigin()
    runner = await start_control(create_app(ControlContext.build(runtime, metrics=metrics, origin=origin, **options)), "127.0.0.1", 0)
    return SimpleNamespace(url=control_url(runner), runtime=runtime, metrics=metrics, origin=origin, runner=runner,
                           http=aiohttp.ClientSession(), port=runner.addresses[0][1])


@pytest.fixture(name="serve")
async def control_planes() -> Any:
    """A test's `serve`: `await serve(runtime=None, **ControlContext.build options)` starts a control
    plane (start_control_plane); every one it started is stopped after the test."""
    started = []

    async def start(runtime: Any = None, **options: Any) -> Any:
        started.append(await start_control_plane(runtime, **options))
        return started[-1]

    yield start
    for ctl in started:
        await ctl.http.close()
        await ctl.runner.cleanup()


def verify_record(runtime: ScriptedRuntime, record: dict[str, Any]) -> bool:
    """True when the record's signature is the harness key's over the record minus signature."""
    from cryptography.exceptions import InvalidSignature
    from governor.common.canonical import b64url_decode

    body = {k: v for k, v in record.items() if k != "signature"}
    try:
        runtime.key.public_key().verify(b64url_decode(record["signature"]["value"]), canonicalize(body))
    except InvalidSignature:
        return False
    return True


def tool_is(name: str) -> Callable[[str, Step], bool]:
    return lambda session, step: isinstance(step, ToolCall) and step.tool == name


def step_digest(step: ToolCall) -> str:
    return digest_of({"tool": step.tool, "arguments": dict(step.arguments)})


# --- a loopback A2A peer ---------------------------------------------------------------


def peer_passport(key, *, name: str = "summarizer", domain: str = "127.0.0.1",
                  scopes: tuple[str, ...] = ("papers:read",), tokens: tuple[int, int] = (1000, 5000),
                  identifier: str | None = None) -> dict[str, Any]:
    """A signed ADL passport for a peer agent."""
    from governor.passport import sign_passport

    document = {
        "adl_spec": "0.4.0", "name": name, "description": f"peer agent {name}", "version": "1.0.0",
        "id": identifier or f"https://{domain}/agents/{name}",
        "data_classification": {"sensitivity": "internal"},
        "lifecycle": {"status": "active"},
        "security": {"authentication": {"type": "api_key", "scopes": list(scopes)}},
        "permissions": {"resource_limits": {"budget": {
            "tokens": {"per_session": tokens[0], "per_day": tokens[1]}}}},
    }
    return sign_passport(document, key)


class A2APeer:
    """An aiohttp A2A JSON-RPC server that also serves its ADL discovery document,
    its passports and (optionally) its A2A agent card. Counts GETs per path."""

    def __init__(self, passports: dict[str, dict[str, Any]], *, card_name: str | None = None,
                 discovery: dict[str, Any] | None = None) -> None:
        from aiohttp import web

        self.passports = passports  # file name -> document
        self.card_name = card_name
        self.discovery = discovery
        self.hits: dict[str, int] = {}
        self.received: list[tuple[dict[str, str], Any]] = []
        app = web.Application()
        app.router.add_get("/.well-known/adl-agents", self._discovery)
        app.router.add_get("/.well-known/agent-card.json", self._card)
        app.router.add_get("/passports/{file}", self._passport)
        app.router.add_post("/a2a", self._rpc)
        self.app = app
        self.runner = None
        self.url = ""

    async def start(self) -> "A2APeer":
        from aiohttp import web

        self.runner = web.AppRunner(self.app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def _hit(self, request) -> None:
        self.hits[request.path] = self.hits.get(request.path, 0) + 1

    async def _discovery(self, request):
        from aiohttp import web

        self._hit(request)
        if self.discovery is not None:
            return web.json_response(self.discovery)
        return web.json_response({"adl_discovery": "1.0", "agents": [
            {"id": doc["id"], "name": doc["name"], "adl_document": f"/passports/{file}"}
            for file, doc in self.passports.items()]})

    async def _card(self, request):
        from aiohttp import web

        self._hit(request)
        if self.card_name is None:
            raise web.HTTPNotFound()
        return web.json_response({"name": self.card_name, "url": f"{self.url}/a2a", "version": "1.0.0"})

    async def _passport(self, request):
        from aiohttp import web

        self._hit(request)
        document = self.passports.get(request.match_info["file"])
        if document is None:
            raise web.HTTPNotFound()
        return web.json_response(document)

    async def _rpc(self, request):
        from aiohttp import web

        body = await request.json()
        self.received.append((dict(request.headers), body))
        text = "".join(p.get("text", "") for p in body["params"]["message"]["parts"])
        reply = {"kind": "message", "role": "agent", "messageId": f"reply-{len(self.received)}",
                 "parts": [{"kind": "text", "text": f"done: {text}"}]}
        payload = {"jsonrpc": "2.0", "id": body["id"], "result": reply}
        if body["method"] == "message/stream":
            import orjson

            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: " + orjson.dumps(payload) + b"\n\n")
            await resp.write_eof()
            return resp
        return web.json_response(payload)


# --- the real runtime on a test passport -----------------------------------------------


def real_runtime(document: dict[str, Any], data_dir, *, metrics=None, clock=time.time,
                 sweep_interval_sec: float = 1.0, tier: str = "R2"):
    """A started `governor.runtime.core.Runtime` for `document` (signed here with a fresh key
    and admitted and pinned as `governor run` does: see proxy/server.build_runtime), SQLite
    state in `data_dir`, at `tier` (R2 unless told). Returns (runtime, the signed passport)."""
    from governor.evidence.keys import generate_key
    from governor.passport import AdmissionConfig, admit, sign_passport
    from governor.policy import compile_limits, load_pricing
    from governor.policy.steps import Tier
    from governor.runtime.core import Runtime
    from governor.store import open_store
    from tests.conftest import REPO

    passport = sign_passport(document, Ed25519PrivateKey.generate())
    report = admit(passport, AdmissionConfig(now=time.time()))
    assert report.verified, report.to_dict()
    limits = compile_limits(report.pinned.document, tier=Tier(tier),
                            pricing=price_book(), passport_digest=report.digest)
    runtime = Runtime(limits=limits, store=open_store(data_dir / "state.db"), data_dir=data_dir, key=generate_key(),
                      governor_id="did:web:localhost:governor", agent_id=report.pinned.id or report.pinned.name,
                      metrics=metrics, clock=clock, sweep_interval_sec=sweep_interval_sec, pinned=report.pinned)
    runtime.start()
    return runtime, passport
