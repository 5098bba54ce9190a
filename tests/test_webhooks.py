"""Webhook notifications (#21 item 5) against local receivers (aiohttp on 127.0.0.1): a real
`governor run` (tests/governor_process.py) with real agent traffic through the real proxy
(the bundled passport: delete_note is held for review; 20,000 tokens a session, warned at
80 %), receivers that verify each delivery's signature, one that is down and one that is
slow; and the notifier in-process for its queue bound and its refusal to follow redirects."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import httpx
import orjson
import pytest
from aiohttp import web

from governor.demo.mock_llm import MockLLM
from governor.demo.mock_tools import MockTools
from governor.runtime.metrics import Metrics
from governor.notify import SignatureError, sign, verify
from governor.notify.events import session_halted
from governor.notify.webhooks import WebhookConfig, WebhookConfigError, WebhookNotifier
from tests.governor_process import GovernorProcess

SECRET = "webhook-secret-for-tests-0123456789"
HANG_GUARD = 60.0  # stops a hung call from hanging the suite; not a timing assertion
# A governed call answers within this while its notification is stuck at a receiver that
# holds each of 2 attempts for 5 s: blocking on delivery would take 10 s or more (5 s, past
# this bound, for blocking on the first attempt alone).
ENFORCEMENT_BOUND = 4.0


class Receiver:
    """A webhook receiver on loopback: records every delivery; may answer late or not 2xx."""

    def __init__(self, *, delay: float = 0.0, status: int = 200, location: str | None = None) -> None:
        self.delay, self.status, self.location = delay, status, location
        self.seen: list[tuple[str, dict[str, str], bytes]] = []  # (path, headers, body)
        self.arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> "Receiver":
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._hook)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/hook"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _hook(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, dict(request.headers), await request.read()))
        self.arrived.set()
        if self.delay:
            await asyncio.sleep(self.delay)
        headers = {"Location": self.location} if self.location else None
        return web.Response(status=self.status, headers=headers)

    def verified(self) -> list[dict]:
        """Every delivery's payload, each checked with the package's verifier."""
        out = []
        for _, headers, body in self.seen:
            verify(SECRET, body, headers.get("ADL-Webhook-Timestamp"), headers.get("ADL-Webhook-Signature"))
            out.append(orjson.loads(body))
        return out

    async def wait_for(self, predicate, what: str) -> None:
        for _ in range(int(HANG_GUARD / 0.05)):
            if predicate():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the receiver never saw {what}: {[b[:200] for _, _, b in self.seen]}")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def metric(control_url: str, name: str, **labels: str) -> float:
    async with httpx.AsyncClient(trust_env=False, timeout=HANG_GUARD) as client:
        text = (await client.get(f"{control_url}/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def chat(agent: httpx.AsyncClient, llm: MockLLM, session: str, max_tokens: int, answers: int = 1):
    body = {"model": "gpt-4o-mini", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
    if answers > 1:  # 100 answers: output fitting (docs/fitting.md) cannot fit them above its floor
        body["n"] = answers
    return agent.post(f"{llm.url}/chat/completions", headers={"ADL-Session": session}, json=body)


@pytest.fixture
async def upstreams():
    llm, tools = MockLLM(prompt_tokens=100, completion_tokens=50), MockTools({"/workspace/notes/old.md": "x"})
    await llm.start()
    await tools.start()
    yield llm, tools
    await tools.stop()
    await llm.stop()


# --- signing ------------------------------------------------------------------------------


def test_a_signature_verifies_and_a_replayed_forged_or_foreign_one_does_not():
    body = b'{"event":"session.halted","text":"x"}'
    headers = sign(SECRET, body, timestamp=1_800_000_000)
    stamp, signature = headers["ADL-Webhook-Timestamp"], headers["ADL-Webhook-Signature"]
    assert re.fullmatch(r"v1=[0-9a-f]{64}", signature)
    verify(SECRET, body, stamp, signature, now=1_800_000_010)  # authentic: no exception
    verify(SECRET, body, stamp, "v1=" + "0" * 64 + ", " + signature, now=1_800_000_010)  # one of several (rotation)
    for secret, data, ts, sig, now, why in [
        (SECRET, body, stamp, signature, 1_800_000_000 + 301, "tolerance"),  # replayed later
        (SECRET, body, stamp, signature, 1_800_000_000 - 301, "tolerance"),  # from the future
        (SECRET, body + b" ", stamp, signature, 1_800_000_000, "does not match"),  # body changed
        (SECRET, body, "1800000001", signature, 1_800_000_000, "does not match"),  # timestamp changed
        ("another-secret-0123456789abcdef", body, stamp, signature, 1_800_000_000, "does not match"),
        (SECRET, body, stamp, signature.replace("v1=", "v0="), 1_800_000_000, "does not match"),
        (SECRET, body, stamp, "v1=" + "é" * 64, 1_800_000_000, "does not match"),
        (SECRET, body, None, signature, 1_800_000_000, "timestamp"),
        (SECRET, body, "-5", signature, 1_800_000_000, "timestamp"),
        (SECRET, body, stamp, None, 1_800_000_000, "missing signature"),
    ]:
        with pytest.raises(SignatureError, match=why):
            verify(secret, data, ts, sig, now=now)


def test_webhook_settings_are_checked():
    with pytest.raises(WebhookConfigError, match="http"):
        WebhookConfig(("file:///etc/passwd",), SECRET)
    with pytest.raises(WebhookConfigError, match="at least 16"):
        WebhookConfig(("http://127.0.0.1/hook",), "short")


# --- a real governor, real traffic ----------------------------------------------------------


async def test_a_review_a_threshold_a_halt_and_a_lock_are_notified_signed(tmp_path, upstreams):
    llm, tools = upstreams
    receiver = await Receiver().start()
    secret_file = tmp_path / "webhook-secret"
    secret_file.write_text(SECRET + "\n")
    governor = GovernorProcess(tmp_path / "data", ["--webhook", receiver.url, "--webhook-secret-file", str(secret_file),
                                                   "--lock-on", "on_budget_exhausted"])
    await governor.start()
    agent = httpx.AsyncClient(proxy="http://%s:%d" % governor.proxy, trust_env=False, timeout=HANG_GUARD)
    try:
        held = asyncio.create_task(agent.post(tools.url, headers={"ADL-Session": "hooked"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "delete_note", "arguments": {"path": "/workspace/notes/old.md"}}}))
        await receiver.wait_for(lambda: receiver.seen, "a pending review")
        pending = receiver.verified()[0]
        assert pending["event"] == "approval.pending" and pending["data"]["tool"] == "delete_note"
        assert pending["data"]["arguments"] == {"path": "/workspace/notes/old.md"}
        assert pending["data"]["session"] == "hooked" and "delete_note" in pending["text"]
        assert f"governor approvals show {pending['data']['approval_id']}" in pending["text"]
        token = (governor.data_dir / "reviewer-token").read_text().strip()
        async with httpx.AsyncClient(base_url=governor.control_url, trust_env=False, timeout=HANG_GUARD) as control:
            listed = (await control.get("/v1/approvals", headers={"Authorization": f"Bearer {token}"})).json()
            assert [a["id"] for a in listed["approvals"]] == [pending["data"]["approval_id"]]
            answered = await control.post(f"/v1/approvals/{pending['data']['approval_id']}",
                                          json={"decision": "reject", "reviewer": "lead", "reason": "no"},
                                          headers={"Authorization": f"Bearer {token}"})
            assert answered.status_code == 200
        await asyncio.wait_for(held, HANG_GUARD)

        assert (await chat(agent, llm, "spender", 17_000)).status_code == 200  # past 80 % of 20,000, under the cap
        await receiver.wait_for(lambda: len(receiver.seen) >= 2, "a threshold warning")
        assert (await chat(agent, llm, "spender", 25_000, 100)).status_code == 429  # the cap: halt, and lock
        await receiver.wait_for(lambda: len(receiver.seen) >= 4, "a halt and a lock")
        payloads = receiver.verified()
        by_event = {p["event"]: p for p in payloads}
        assert [p["event"] for p in payloads] == ["approval.pending", "budget.threshold", "session.halted", "agent.locked"]
        threshold = by_event["budget.threshold"]
        assert threshold["data"]["thresholds"][0]["dimension"] == "tokens"
        assert threshold["data"]["thresholds"][0]["fraction"] >= 0.8 and "tokens" in threshold["text"]
        assert by_event["session.halted"]["data"] == {**by_event["session.halted"]["data"],
                                                      "session": "spender", "cause": "on_budget_exhausted"}
        lock = by_event["agent.locked"]["data"]["lock_id"]
        assert f"governor locks lift {lock}" in by_event["agent.locked"]["text"]
        assert len({p["id"] for p in payloads}) == 4 and all(p["governor"] and p["time"].endswith("Z") for p in payloads)
        for _, headers, _ in receiver.seen:
            assert headers["ADL-Webhook-Event"] in by_event and headers["Content-Type"] == "application/json"
        assert await metric(governor.control_url, "governor_webhook_deliveries_total",
                            event="session.halted", outcome="delivered") == 1

        # a captured delivery replayed later, or with its body changed, does not verify
        _, headers, body = receiver.seen[2]
        stamp = int(headers["ADL-Webhook-Timestamp"])
        with pytest.raises(SignatureError):
            verify(SECRET, body, str(stamp), headers["ADL-Webhook-Signature"], now=stamp + 600)
        with pytest.raises(SignatureError):
            verify(SECRET, body.replace(b"spender", b"someone"), str(stamp), headers["ADL-Webhook-Signature"])
    finally:
        await agent.aclose()
        await governor.stop()
        await receiver.stop()


async def test_a_receiver_down_or_slow_never_delays_enforcement_and_failures_are_counted(tmp_path, upstreams):
    llm, _ = upstreams
    slow = await Receiver(delay=30.0).start()
    down = f"http://127.0.0.1:{closed_port()}/hook"
    config = tmp_path / "governor.yaml"
    config.write_text(f"webhook: [{down}, {slow.url}]\nwebhook_timeout: 5\nwebhook_attempts: 2\nwebhook_backoff: 0.2\n")
    governor = GovernorProcess(tmp_path / "data", ["--config", str(config)], env={"GOVERNOR_WEBHOOK_SECRET": SECRET})
    await governor.start()
    agent = httpx.AsyncClient(proxy="http://%s:%d" % governor.proxy, trust_env=False, timeout=HANG_GUARD)
    try:
        started = time.monotonic()
        refused = await chat(agent, llm, "halts", 25_000, 100)  # halts the session: a notification to both
        took = time.monotonic() - started
        assert refused.status_code == 429 and refused.json()["error"]["governor"]["cause"] == "on_budget_exhausted"
        assert took < ENFORCEMENT_BOUND, f"the halting call took {took:.1f}s"
        await slow.wait_for(lambda: slow.seen, "the first attempt")
        started = time.monotonic()  # the slow receiver holds the attempt now: other traffic goes on
        assert (await chat(agent, llm, "other", 10)).status_code == 200
        assert time.monotonic() - started < ENFORCEMENT_BOUND

        # two attempts at each (a retry: the third would add 5 s and prove nothing more); the
        # slow receiver saw both, each signed afresh
        await slow.wait_for(lambda: len(slow.seen) >= 2, "two attempts")
        ids = {headers["ADL-Webhook-Id"] for _, headers, _ in slow.seen}
        assert len(ids) == 1 and [p["event"] for p in slow.verified()] == ["session.halted"] * 2
        for _ in range(int(HANG_GUARD / 0.1)):
            failed = await metric(governor.control_url, "governor_webhook_deliveries_total",
                                  event="session.halted", outcome="failed")
            if failed >= 2:
                break
            await asyncio.sleep(0.1)
        assert failed == 2  # the one that is down and the slow one, each after its 2 attempts
        assert await metric(governor.control_url, "governor_webhook_retries_total", event="session.halted") == 2
        assert await metric(governor.control_url, "governor_webhook_deliveries_total", outcome="delivered") == 0
    finally:
        await agent.aclose()
        await governor.stop()
        await slow.stop()
    log = governor.log.read_text()
    assert "session.halted notification" in log and "not delivered after 2 attempt(s)" in log
    assert "/hook" not in log  # URLs are logged by scheme, host and port (chat tools' carry secrets in the path)


# --- the notifier in-process ---------------------------------------------------------------


async def test_a_full_queue_drops_the_oldest_and_counts_it():
    slow = await Receiver(delay=1.0).start()  # holds each delivery 1 s: the five emits take microseconds
    metrics = Metrics()
    notifier = WebhookNotifier(WebhookConfig((slow.url,), SECRET, timeout=5, attempts=1, queue=2),
                               governor="did:web:test", metrics=metrics)
    try:
        notifier.emit(session_halted("agent", "s0", "on_budget_exhausted"))
        await slow.wait_for(lambda: slow.seen, "the first delivery")  # s0 is at the receiver, which holds it
        started = time.monotonic()
        for n in range(1, 6):
            notifier.emit(session_halted("agent", f"s{n}", "on_budget_exhausted"))
        assert time.monotonic() - started < 1.0  # emit queues; it never waits on the receiver
        await slow.wait_for(lambda: len(slow.seen) >= 3, "three deliveries")
        sessions = [p["data"]["session"] for p in slow.verified()]
        # s0 went out at once; the queue of 2 kept the newest (s4, s5), dropping s1-s3
        assert sessions == ["s0", "s4", "s5"]
        exposition = metrics.exposition().decode()
        assert 'governor_webhook_deliveries_total{event="session.halted",outcome="dropped"} 3.0' in exposition
    finally:
        await notifier.close(drain=5)
        await slow.stop()


async def test_a_redirect_is_not_followed():
    elsewhere = await Receiver().start()
    redirecting = await Receiver(status=307, location=elsewhere.url).start()
    metrics = Metrics()
    notifier = WebhookNotifier(WebhookConfig((redirecting.url,), SECRET, timeout=5, attempts=3, backoff=0.05),
                               governor="did:web:test", metrics=metrics)
    try:
        notifier.emit(session_halted("agent", "s", "on_budget_exhausted"))
        await redirecting.wait_for(lambda: redirecting.seen, "the delivery")
        for _ in range(100):
            if "outcome=\"failed\"" in metrics.exposition().decode():
                break
            await asyncio.sleep(0.05)
        assert len(redirecting.seen) == 1 and elsewhere.seen == []  # not retried, not followed
        assert 'governor_webhook_deliveries_total{event="session.halted",outcome="failed"} 1.0' in metrics.exposition().decode()
    finally:
        await notifier.close()
        await redirecting.stop()
        await elsewhere.stop()


def test_webhook_options_from_the_command_line_the_environment_and_the_config_file(tmp_path):
    import argparse

    from governor.cli import UsageError
    from governor.cli.run import OPTIONS, resolve

    def args(**values):
        return argparse.Namespace(**{**{name: None for name in OPTIONS}, **values})

    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    settings = resolve(args(webhook=["http://127.0.0.1:9/a", "https://hooks.example.com/b"],
                            webhook_secret_file=str(secret)), {})
    assert settings.webhooks.urls == ("http://127.0.0.1:9/a", "https://hooks.example.com/b")
    assert settings.webhooks.secret == SECRET and settings.webhooks.attempts == 5
    env = {"GOVERNOR_WEBHOOKS": "http://127.0.0.1:9/a, http://127.0.0.1:9/c", "GOVERNOR_WEBHOOK_SECRET": SECRET}
    assert resolve(args(), env).webhooks.urls == ("http://127.0.0.1:9/a", "http://127.0.0.1:9/c")
    config = tmp_path / "governor.yaml"
    config.write_text("webhook: [http://127.0.0.1:9/a]\nwebhook_attempts: 2\nwebhook_timeout: 0.5\n")
    tuned = resolve(args(config=str(config)), {"GOVERNOR_WEBHOOK_SECRET": SECRET}).webhooks
    assert (tuned.attempts, tuned.timeout) == (2, 0.5)
    assert resolve(args(), {}).webhooks is None
    for bad, env, why in [
        (args(webhook=["http://127.0.0.1:9/a"]), {}, "needs a secret"),
        (args(webhook=["ftp://127.0.0.1/a"]), {"GOVERNOR_WEBHOOK_SECRET": SECRET}, "http"),
        (args(webhook=["http://127.0.0.1:9/a"], webhook_secret_file=str(tmp_path / "missing")), {}, "missing"),
        (args(webhook=["http://127.0.0.1:9/a"]), {"GOVERNOR_WEBHOOK_SECRET": "short"}, "at least 16"),
    ]:
        with pytest.raises(UsageError, match=why):
            resolve(bad, env)
    config.write_text("webhook: [http://127.0.0.1:9/a]\nwebhook_attempts: many\n")
    with pytest.raises(UsageError, match="webhook_attempts must be a number"):
        resolve(args(config=str(config)), {"GOVERNOR_WEBHOOK_SECRET": SECRET})


def test_the_receiver_snippet_in_the_docs_verifies_what_the_governor_signs():
    """docs/notifications.md's verification snippet, run as written, agrees with the package."""
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "notifications.md").read_text()
    snippet = page.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(snippet, "docs/notifications.md", "exec"), scope)
    body = orjson.dumps(session_halted("agent", "s", "on_budget_exhausted"))
    headers = sign(SECRET, body)
    stamp, signature = headers["ADL-Webhook-Timestamp"], headers["ADL-Webhook-Signature"]
    assert scope["verify"](SECRET.encode(), body, stamp, signature) is True
    assert scope["verify"](SECRET.encode(), body + b"x", stamp, signature) is False
    assert scope["verify"](SECRET.encode(), body, str(int(stamp) - 600), signature) is False
