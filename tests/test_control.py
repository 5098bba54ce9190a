"""The control plane over real HTTP on loopback, against the scripted runtime."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from governor.control import MemoryNonces, ProxyOrigin, TokenConfigError, load_control_token, load_reviewer_tokens
from governor.policy.steps import Action, ToolCall
from tests.control_harness import (  # control_planes: the `serve` fixture
    ScriptedRuntime, control_planes, pause_decision, tool_is, verify_record,  # noqa: F401
)

REVIEWER = "reviewer-token-0123456789abcdef"
OTHER_REVIEWER = "second-reviewer-token-fedcba987654"
CONTROL = "control-token-abcdefghijklmnop"


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _json(resp: aiohttp.ClientResponse):
    assert resp.content_type == "application/json", await resp.text()
    return await resp.json()


def _pausing_runtime() -> ScriptedRuntime:
    return ScriptedRuntime([(tool_is("delete_file"), lambda s, st: pause_decision("appr-1"))])


async def _pause(runtime: ScriptedRuntime, session: str = "s1", tool: str = "delete_file"):
    admission = await runtime.admit(session, ToolCall(tool=tool, arguments={"path": "/tmp/x"}))
    assert admission.decision.action is Action.PAUSE
    return asyncio.create_task(runtime.await_approval(session, admission.decision.approval.id))


# --- health, readiness, metrics --------------------------------------------------------


async def test_healthz_is_open_and_alive(serve):
    ctl = await serve(control_token=CONTROL)
    async with ctl.http.get(f"{ctl.url}/healthz") as resp:
        assert resp.status == 200
        assert (await _json(resp))["status"] == "alive"


@pytest.mark.parametrize("ready, status", [(True, 200), (False, 503)])
async def test_readyz_follows_the_runtime(serve, ready, status):
    ctl = await serve(ScriptedRuntime(ready=ready))
    async with ctl.http.get(f"{ctl.url}/readyz") as resp:
        assert resp.status == status
        body = await _json(resp)
        assert body["ready"] is ready
        assert body["store"] == ("ok" if ready else "unreachable")


async def test_readyz_fails_closed_when_the_check_raises_or_is_missing(serve):
    class Broken(ScriptedRuntime):
        async def ready(self):
            raise ConnectionError("redis at 127.0.0.1:1 refused")

    class Silent:  # a runtime without ready()
        def approvals(self):
            return []

    broken = await serve(Broken())
    async with broken.http.get(f"{broken.url}/readyz") as resp:
        assert resp.status == 503
        assert "redis at 127.0.0.1:1 refused" in (await _json(resp))["reason"]
    silent = await serve(Silent())
    async with silent.http.get(f"{silent.url}/readyz") as resp:
        assert resp.status == 503
        assert "does not report readiness" in (await _json(resp))["reason"]


async def test_readyz_times_out_a_hanging_check(serve):
    class Hanging(ScriptedRuntime):
        async def ready(self):
            await asyncio.sleep(60)

    ctl = await serve(Hanging(), ready_timeout=0.05)
    async with ctl.http.get(f"{ctl.url}/readyz") as resp:
        assert resp.status == 503
        assert "took over" in (await _json(resp))["reason"]


async def test_metrics_exposes_the_governors_own_registry(serve):
    runtime = _pausing_runtime()
    ctl = await serve(runtime)
    ctl.metrics.decision("on_budget_exhausted", Action.HALT, 0.0002)
    waiter = await _pause(runtime)
    from prometheus_client import REGISTRY, Counter

    global_only = Counter("on_the_global_registry_only", "x")  # prometheus_client's global registry
    try:
        async with ctl.http.get(f"{ctl.url}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await resp.text()
    finally:
        REGISTRY.unregister(global_only)
    assert 'governor_decisions_total{action="halt",cause="on_budget_exhausted",enforced="true"} 1.0' in text
    assert "governor_pending_approvals 1.0" in text
    assert "governor_decision_seconds_bucket" in text
    # The global registry is not mixed in; the process and Python families are on the governor's own.
    assert "on_the_global_registry_only" not in text
    assert "process_resident_memory_bytes" in text and "python_gc_objects_collected_total" in text
    waiter.cancel()


# --- sessions --------------------------------------------------------------------------


async def test_sessions_list_view_and_unknown(serve):
    runtime = ScriptedRuntime()
    await runtime.admit("alpha", ToolCall(tool="read_file"))
    ctl = await serve(runtime)
    async with ctl.http.get(f"{ctl.url}/v1/sessions") as resp:
        sessions = (await _json(resp))["sessions"]
    assert [s["session"] for s in sessions] == ["alpha"]
    async with ctl.http.get(f"{ctl.url}/v1/sessions/alpha") as resp:
        assert resp.status == 200
        assert (await _json(resp))["steps"] == 1
    async with ctl.http.get(f"{ctl.url}/v1/sessions/nope") as resp:
        assert resp.status == 404
        assert (await _json(resp))["error"]["code"] == "unknown_session"


async def test_end_session_returns_the_signed_final_record(serve):
    runtime = ScriptedRuntime()
    await runtime.admit("alpha", ToolCall(tool="read_file"))
    ctl = await serve(runtime)
    async with ctl.http.post(f"{ctl.url}/v1/sessions/alpha/end") as resp:
        assert resp.status == 200
        record = await _json(resp)
    assert record["outcome"] == "completed" and verify_record(runtime, record)
    assert "alpha" in runtime.ended
    async with ctl.http.post(f"{ctl.url}/v1/sessions/ghost/end") as resp:
        assert resp.status == 404


# --- approvals -------------------------------------------------------------------------


async def test_reviewer_approves_a_paused_step_over_http(serve):
    runtime = _pausing_runtime()
    ctl = await serve(runtime, reviewer_tokens=[REVIEWER, OTHER_REVIEWER])
    waiter = await _pause(runtime)
    async with ctl.http.get(f"{ctl.url}/v1/approvals") as resp:
        listed = (await _json(resp))["approvals"]
    assert [(a["id"], a["tool"]) for a in listed] == [("appr-1", "delete_file")]
    async with ctl.http.post(f"{ctl.url}/v1/approvals/appr-1", headers=_auth(OTHER_REVIEWER),
                             json={"decision": "approve", "reviewer": "alice"}) as resp:
        assert resp.status == 200
        assert (await _json(resp))["decision"] == "approve"
    admission = await asyncio.wait_for(waiter, 5)
    assert admission.decision.action is Action.PERMIT
    assert runtime.answers["appr-1"] == (True, "alice")
    # Answered once: a second answer is refused.
    async with ctl.http.post(f"{ctl.url}/v1/approvals/appr-1", headers=_auth(REVIEWER),
                             json={"decision": "reject", "reviewer": "bob"}) as resp:
        assert resp.status == 404
        assert (await _json(resp))["error"]["code"] == "approval_not_pending"


async def test_reviewer_rejects_a_paused_step(serve):
    runtime = _pausing_runtime()
    ctl = await serve(runtime, reviewer_tokens=[REVIEWER])
    waiter = await _pause(runtime)
    async with ctl.http.post(f"{ctl.url}/v1/approvals/appr-1", headers=_auth(REVIEWER),
                             json={"decision": "reject", "reviewer": "bob"}) as resp:
        assert resp.status == 200
    admission = await asyncio.wait_for(waiter, 5)
    assert admission.decision.action is Action.DENY


@pytest.mark.parametrize("headers, status, code", [
    ({}, 401, "token_required"),
    ({"Authorization": "Bearer not-a-reviewer-token-at-all"}, 401, "token_invalid"),
    ({"Authorization": f"Basic {REVIEWER}"}, 401, "token_required"),
    ({"Authorization": f"Bearer {CONTROL}"}, 401, "token_invalid"),  # the control token cannot approve
])
async def test_answering_needs_a_reviewer_token(serve, headers, status, code):
    runtime = _pausing_runtime()
    ctl = await serve(runtime, reviewer_tokens=[REVIEWER], control_token=CONTROL)
    waiter = await _pause(runtime)
    async with ctl.http.post(f"{ctl.url}/v1/approvals/appr-1", headers=headers,
                             json={"decision": "approve", "reviewer": "mallory"}) as resp:
        assert resp.status == status
        assert (await _json(resp))["error"]["code"] == code
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert "appr-1" in runtime.pending and not waiter.done()
    waiter.cancel()


async def test_no_reviewer_token_configured_refuses_every_answer(serve):
    runtime = _pausing_runtime()
    ctl = await serve(runtime)
    waiter = await _pause(runtime)
    async with ctl.http.post(f"{ctl.url}/v1/approvals/appr-1", headers=_auth(REVIEWER),
                             json={"decision": "approve", "reviewer": "alice"}) as resp:
        assert resp.status == 403
        body = await _json(resp)
    assert body["error"]["code"] == "approvals_disabled"
    assert "GOVERNOR_REVIEWER_TOKENS" in body["error"]["message"]
    assert "appr-1" in runtime.pending
    waiter.cancel()


@pytest.mark.parametrize("body, code", [
    (b"{not json", "bad_json"),
    (b"[1, 2]", "bad_json"),
    (b"", "body_required"),
    (json.dumps({"decision": "maybe", "reviewer": "alice"}).encode(), "bad_decision"),
    (json.dumps({"decision": "approve"}).encode(), "bad_reviewer"),
    (json.dumps({"decision": "approve", "reviewer": "  "}).encode(), "bad_reviewer"),
    (json.dumps({"decision": "approve", "reviewer": "a\nb"}).encode(), "bad_reviewer"),
    (json.dumps({"decision": "approve", "reviewer": "alice", "reason": 7}).encode(), "bad_reason"),
    (json.dumps({"decision": "reject", "reviewer": "alice", "reason": "x" * 501}).encode(), "bad_reason"),
    (json.dumps({"decision": "reject", "reviewer": "alice", "reason": "ok\x1b[2J"}).encode(), "bad_reason"),
])
async def test_bad_approval_bodies_are_clear_400s(serve, body, code):
    runtime = _pausing_runtime()
    ctl = await serve(runtime, reviewer_tokens=[REVIEWER])
    waiter = await _pause(runtime)
    async with ctl.http.post(f"{ctl.url}/v1/approvals/appr-1", data=body,
                             headers={**_auth(REVIEWER), "Content-Type": "application/json"}) as resp:
        assert resp.status == 400
        assert (await _json(resp))["error"]["code"] == code
    assert "appr-1" in runtime.pending
    waiter.cancel()


async def test_unknown_approval_is_404(serve):
    ctl = await serve(reviewer_tokens=[REVIEWER])
    async with ctl.http.post(f"{ctl.url}/v1/approvals/nope", headers=_auth(REVIEWER),
                             json={"decision": "approve", "reviewer": "alice"}) as resp:
        assert resp.status == 404
        assert "nope" in (await _json(resp))["error"]["message"]


# --- the governed agent cannot reach the control plane through the proxy ---------------


async def test_marker_header_is_refused_even_with_a_valid_token(serve):
    runtime = _pausing_runtime()
    ctl = await serve(runtime, reviewer_tokens=[REVIEWER])
    waiter = await _pause(runtime)
    headers = {**_auth(REVIEWER), ctl.origin.header: ctl.origin.marker}
    async with ctl.http.post(f"{ctl.url}/v1/approvals/appr-1", headers=headers,
                             json={"decision": "approve", "reviewer": "agent"}) as resp:
        assert resp.status == 403
        assert (await _json(resp))["error"]["code"] == "through_proxy"
    # Whatever its value: presence is enough.
    async with ctl.http.get(f"{ctl.url}/v1/approvals", headers={"adl-governor-via": "x"}) as resp:
        assert resp.status == 403
    assert "appr-1" in runtime.pending
    waiter.cancel()


@pytest.mark.parametrize("via, status", [
    ("1.1 mitmproxy", 403),
    ("1.0 fred, 1.1 adl-governor", 403),
    ("1.1 ingress-nginx", 200),  # a reviewer behind an ordinary ingress is fine
])
async def test_via_headers_naming_an_intercepting_proxy_are_refused(serve, via, status):
    ctl = await serve()
    async with ctl.http.get(f"{ctl.url}/v1/sessions", headers={"Via": via}) as resp:
        assert resp.status == status


async def test_requests_from_a_proxy_upstream_socket_are_refused(serve):
    ctl = await serve(reviewer_tokens=[REVIEWER])

    async def raw_get(register: bool) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", ctl.port)
        sockname = writer.get_extra_info("sockname")
        if register:  # what the proxy addon reports in server_connected
            ctl.origin.connected(sockname)
        writer.write(b"GET /v1/sessions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        await writer.drain()
        data = await reader.read()
        writer.close()
        ctl.origin.disconnected(sockname)
        return data

    assert (await raw_get(register=True)).startswith(b"HTTP/1.1 403")
    assert (await raw_get(register=False)).startswith(b"HTTP/1.1 200")


async def test_the_proxy_is_told_not_to_connect_to_the_control_plane(serve):
    ctl = await serve()
    origin = ctl.origin
    for host in ("127.0.0.1", "localhost", "LOCALHOST.", "127.0.0.2"):
        assert origin.refuses_connect(host, ctl.port), host
    assert not origin.refuses_connect("127.0.0.1", ctl.port + 1 if ctl.port < 65535 else ctl.port - 1)
    assert not origin.refuses_connect("api.openai.com", ctl.port)


def test_a_control_plane_on_all_interfaces_is_refused_on_loopback_and_own_addresses():
    origin = ProxyOrigin()
    origin.listening([("0.0.0.0", 8081)])
    assert origin.refuses_connect("127.0.0.1", 8081)
    assert origin.refuses_connect("::1", 8081)
    assert origin.refuses_connect("0.0.0.0", 8081)
    assert not origin.refuses_connect("192.0.2.10", 8081)  # TEST-NET: not this host
    assert not origin.refuses_connect("127.0.0.1", 8080)


# --- nonces and records ----------------------------------------------------------------


async def test_nonce_bound_record_is_single_use(serve):
    runtime = ScriptedRuntime()
    await runtime.admit("alpha", ToolCall(tool="read_file"))
    ctl = await serve(runtime)
    async with ctl.http.post(f"{ctl.url}/v1/nonces") as resp:
        assert resp.status == 201
        issued = await _json(resp)
        assert resp.headers["WWW-Authenticate"] == f'ADL nonce="{issued["nonce"]}"'
    nonce = issued["nonce"]
    assert len(nonce) >= 22 and issued["expires_at"].endswith("Z")
    async with ctl.http.get(f"{ctl.url}/v1/sessions/alpha/record", params={"nonce": nonce}) as resp:
        assert resp.status == 200
        record = await _json(resp)
    assert record["nonce"] == nonce and verify_record(runtime, record)
    record["nonce"] = "another"
    assert not verify_record(runtime, record)  # the nonce is under the signature
    async with ctl.http.get(f"{ctl.url}/v1/sessions/alpha/record", params={"nonce": nonce}) as resp:
        assert resp.status == 409
        assert (await _json(resp))["error"]["code"] == "nonce_reused"


async def test_expired_and_unknown_nonces_are_refused(serve):
    clock = FakeClock()
    runtime = ScriptedRuntime()
    await runtime.admit("alpha", ToolCall(tool="read_file"))
    ctl = await serve(runtime, nonces=MemoryNonces(60, clock=clock))
    async with ctl.http.post(f"{ctl.url}/v1/nonces") as resp:
        nonce = (await _json(resp))["nonce"]
    clock.now += 61
    async with ctl.http.get(f"{ctl.url}/v1/sessions/alpha/record", params={"nonce": nonce}) as resp:
        assert resp.status == 410
        assert (await _json(resp))["error"]["code"] == "nonce_expired"
    async with ctl.http.get(f"{ctl.url}/v1/sessions/alpha/record", params={"nonce": "A" * 24}) as resp:
        assert resp.status == 400
        assert (await _json(resp))["error"]["code"] == "nonce_unknown"


async def test_counterparty_brings_its_own_nonce(serve):
    runtime = ScriptedRuntime()
    await runtime.admit("alpha", ToolCall(tool="read_file"))
    ctl = await serve(runtime)
    own = "counterparty-chosen-nonce-0001"
    async with ctl.http.post(f"{ctl.url}/v1/nonces", json={"nonce": own}) as resp:
        assert resp.status == 201
        assert (await _json(resp))["nonce"] == own
    async with ctl.http.post(f"{ctl.url}/v1/nonces", json={"nonce": own}) as resp:
        assert resp.status == 409  # registering it twice would allow a replay
    async with ctl.http.post(f"{ctl.url}/v1/nonces", json={"nonce": "short"}) as resp:
        assert resp.status == 400
        assert (await _json(resp))["error"]["code"] == "nonce_malformed"
    async with ctl.http.get(f"{ctl.url}/v1/sessions/alpha/record", params={"nonce": own}) as resp:
        assert (await _json(resp))["nonce"] == own


async def test_record_for_unknown_session_does_not_burn_the_nonce(serve):
    runtime = ScriptedRuntime()
    await runtime.admit("alpha", ToolCall(tool="read_file"))
    ctl = await serve(runtime)
    async with ctl.http.post(f"{ctl.url}/v1/nonces") as resp:
        nonce = (await _json(resp))["nonce"]
    async with ctl.http.get(f"{ctl.url}/v1/sessions/ghost/record", params={"nonce": nonce}) as resp:
        assert resp.status == 404
    async with ctl.http.get(f"{ctl.url}/v1/sessions/alpha/record", params={"nonce": nonce}) as resp:
        assert resp.status == 200


async def test_record_without_nonce_is_an_unbound_snapshot(serve):
    runtime = ScriptedRuntime()
    await runtime.admit("alpha", ToolCall(tool="read_file"))
    ctl = await serve(runtime)
    async with ctl.http.get(f"{ctl.url}/v1/sessions/alpha/record") as resp:
        record = await _json(resp)
    assert "nonce" not in record and verify_record(runtime, record)


def test_nonce_capacity_is_bounded():
    from governor.control.nonces import TooManyNonces

    clock = FakeClock()
    nonces = MemoryNonces(10, capacity=3, clock=clock)
    for _ in range(3):
        nonces.issue()
    with pytest.raises(TooManyNonces):
        nonces.issue()
    clock.now += 25  # two TTLs later every one is pruned
    nonces.issue()


# --- the optional control token --------------------------------------------------------


@pytest.mark.parametrize("path, method", [
    ("/v1/sessions", "GET"), ("/v1/sessions/alpha", "GET"), ("/v1/approvals", "GET"),
    ("/v1/nonces", "POST"), ("/v1/sessions/alpha/record", "GET"), ("/v1/sessions/alpha/end", "POST"),
])
async def test_control_token_guards_v1_when_set(serve, path, method):
    runtime = ScriptedRuntime()
    await runtime.admit("alpha", ToolCall(tool="read_file"))
    ctl = await serve(runtime, control_token=CONTROL, reviewer_tokens=[REVIEWER])
    async with ctl.http.request(method, f"{ctl.url}{path}") as resp:
        assert resp.status == 401
        assert (await _json(resp))["error"]["code"] == "token_required"
    async with ctl.http.request(method, f"{ctl.url}{path}", headers=_auth("wrong-token-wrong-token")) as resp:
        assert resp.status == 401
    for token in (CONTROL, REVIEWER):
        async with ctl.http.request(method, f"{ctl.url}{path}", headers=_auth(token)) as resp:
            assert resp.status in (200, 201), await resp.text()


async def test_probes_and_metrics_stay_open_with_a_control_token(serve):
    ctl = await serve(control_token=CONTROL)
    for path in ("/healthz", "/readyz", "/metrics"):
        async with ctl.http.get(f"{ctl.url}{path}") as resp:
            assert resp.status == 200, path


# --- errors are JSON, never tracebacks -------------------------------------------------


async def test_unknown_routes_wrong_methods_and_big_bodies_are_json(serve):
    ctl = await serve(reviewer_tokens=[REVIEWER])
    async with ctl.http.get(f"{ctl.url}/v2/nothing") as resp:
        assert resp.status == 404 and (await _json(resp))["error"]["code"] == "not_found"
    async with ctl.http.delete(f"{ctl.url}/v1/sessions") as resp:
        assert resp.status == 405 and "GET" in resp.headers["Allow"]
        await _json(resp)
    async with ctl.http.post(f"{ctl.url}/v1/approvals/a", headers={**_auth(REVIEWER), "Content-Type": "application/json"},
                             data=b"{" + b" " * 100_000 + b"}") as resp:
        assert resp.status == 413
        await _json(resp)


async def test_a_runtime_failure_is_a_500_json_without_traceback(serve):
    class Failing(ScriptedRuntime):
        def sessions(self):
            raise RuntimeError("secret internal detail")

    ctl = await serve(Failing())
    async with ctl.http.get(f"{ctl.url}/v1/sessions") as resp:
        assert resp.status == 500
        body = await _json(resp)
    assert body["error"]["code"] == "internal_error"
    assert "secret internal detail" not in json.dumps(body) and "Traceback" not in json.dumps(body)


# --- token configuration ---------------------------------------------------------------


def test_reviewer_tokens_from_file_and_environment(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"# reviewers\n{REVIEWER}\n\n  {OTHER_REVIEWER}  \n")
    env = {"GOVERNOR_REVIEWER_TOKEN": "env-single-token-1234567890",
           "GOVERNOR_REVIEWER_TOKENS": f"env-a-token-1234567890,env-b-token-1234567890 {REVIEWER}"}
    assert load_reviewer_tokens(path, env) == (
        REVIEWER, OTHER_REVIEWER, "env-single-token-1234567890", "env-a-token-1234567890",
        "env-b-token-1234567890")
    assert load_reviewer_tokens(None, {}) == ()


def test_bad_token_configuration_is_a_clear_error(tmp_path):
    with pytest.raises(TokenConfigError, match="guessable"):
        load_reviewer_tokens(None, {"GOVERNOR_REVIEWER_TOKEN": "short"})
    with pytest.raises(TokenConfigError, match="No such file"):
        load_reviewer_tokens(tmp_path / "missing", {})
    with pytest.raises(TokenConfigError, match="guessable"):
        load_control_token("tiny", {})
    assert load_control_token(None, {"GOVERNOR_CONTROL_TOKEN": CONTROL}) == CONTROL
    assert load_control_token(None, {}) is None
