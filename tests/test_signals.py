"""`governor run` and process signals (governor/cli/reload.py, governor/proxy/drain.py).

A real `governor run` process, a loopback mock upstream, real HTTP through the proxy:

  * SIGHUP reloads the allow-list (a path newly allowed is let through on the next request),
    the reviewer and control tokens (the old refused, the new accepted), the log level, and
    logs what it cannot reload (restart to change it); a config file that does not parse is
    rejected whole, the running settings stay and the process lives;
  * SIGTERM drains: `/readyz` turns not-ready at once, a request arriving meanwhile gets 503
    with Retry-After (recorded in its session), the slow stream in flight completes, the
    record is written and verifies, exit 0, no traceback;
  * a stream longer than the grace period is cut with the provider's error event and the
    cut recorded; a second SIGTERM during the drain stops at once, the records still written.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import orjson

from governor.cli import main as governor_cli
from governor.evidence import KeyFiles, record_path
from tests.governor_process import GovernorProcess
from tests.upstreams import Behaviour, MockLLM

CHAT = {"model": "gpt-4o-mini", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
TOKEN_A = "reviewer-token-aaaaaaaaaaaaaaaa"
TOKEN_B = "reviewer-token-bbbbbbbbbbbbbbbb"


def agent(governor: GovernorProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(proxy="http://%s:%d" % governor.proxy, trust_env=False, timeout=30)


async def wait_for(predicate, timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def exited(governor: GovernorProcess, timeout: float) -> int:
    assert governor.proc is not None
    return await asyncio.wait_for(asyncio.to_thread(governor.proc.wait), timeout)


def output(governor: GovernorProcess) -> str:
    return governor.log.read_text(errors="replace") + "\n".join(governor.output)


def verified(data_dir, session: str, capsys) -> dict:
    path = record_path(data_dir, session)
    capsys.readouterr()
    code = governor_cli(["verify", str(path), "--offline", "--key", str(KeyFiles(data_dir / "keys").public_key)])
    out = capsys.readouterr().out
    assert code == 3 and "\nINCOMPLETE" in out and "FAIL " not in out, out  # pinned key: not VALID
    return json.loads(path.read_text())


def shutdown_refusals(record: dict) -> list[dict]:
    return [e["detail"] for e in record["events"]
            if e["cause"] == "on_governor_request_refused" and e["detail"]["reason"] == "shutting_down"]


async def stream_until(client: httpx.AsyncClient, url: str, session: str, started: asyncio.Event) -> bytes:
    received = b""
    async with client.stream("POST", url, json={**CHAT, "stream": True}, headers={"ADL-Session": session}) as answer:
        assert answer.status_code == 200
        async for chunk in answer.aiter_bytes():
            received += chunk
            started.set()
    return received


def events(received: bytes) -> list[dict]:
    return [orjson.loads(line[6:]) for line in received.split(b"\n") if line.startswith(b"data: {")]


# --- SIGTERM -------------------------------------------------------------------------------


async def test_sigterm_drains_a_slow_stream_refuses_newcomers_and_exits_cleanly(tmp_path, capsys):
    mock = MockLLM()
    await mock.start()
    data = tmp_path / "data"
    governor = await GovernorProcess(data, ["--drain-timeout", "8"]).start()
    try:
        mock.script(Behaviour(chunks=8, chunk_delay=0.3))  # the stream: about 2.5 s
        async with agent(governor) as client, agent(governor) as newcomer, httpx.AsyncClient(timeout=5) as probe:
            assert (await probe.get(f"{governor.control_url}/readyz")).status_code == 200
            started = asyncio.Event()
            streaming = asyncio.create_task(
                stream_until(client, f"{mock.base_url}/v1/chat/completions", "draining", started))
            await asyncio.wait_for(started.wait(), 10)
            sent = time.monotonic()
            governor.proc.send_signal(signal.SIGTERM)
            # not ready at once: a Service stops sending
            for _ in range(100):
                ready = await probe.get(f"{governor.control_url}/readyz")
                if ready.status_code == 503:
                    break
                await asyncio.sleep(0.02)
            assert ready.status_code == 503 and ready.json()["draining"] is True, ready.text
            # a new request meanwhile (its own connection): 503, retryable elsewhere, in its session's record
            refused = await newcomer.post(f"{mock.base_url}/v1/chat/completions", json=CHAT,
                                          headers={"ADL-Session": "draining"})
            assert refused.status_code == 503, refused.text
            assert int(refused.headers["retry-after"]) > 0
            assert refused.headers["connection"].lower() == "close"
            assert "shutting down" in refused.json()["error"]["message"]
            received = await asyncio.wait_for(streaming, 15)
        # the stream in flight finished whole, as the upstream sent it
        assert received.endswith(b"data: [DONE]\n\n")
        assert not any("error" in e for e in events(received))
        assert mock.streams[0].completed and len(mock.requests) == 1  # the refused request never went upstream
        assert await exited(governor, 15) == 0  # by itself: the drain ended when nothing was left in flight
        assert time.monotonic() - sent < 8  # not the whole grace period
    finally:
        await governor.stop()
        await mock.stop()
    text = output(governor)
    assert "Traceback" not in text, text[-3000:]
    assert "draining" in text
    record = verified(data, "draining", capsys)
    assert [d["status"] for d in shutdown_refusals(record)] == [503]
    assert record["outcome"] == "completed"


async def test_a_stream_longer_than_the_grace_period_is_cut_with_the_providers_error_and_recorded(tmp_path, capsys):
    mock = MockLLM()
    await mock.start()
    data = tmp_path / "data"
    governor = await GovernorProcess(data, ["--drain-timeout", "1.5"]).start()
    try:
        async with agent(governor) as client, agent(governor) as idle, agent(governor) as other:
            # keep-alive connections left open through the stop (each logged a traceback before)
            for keeper, session in ((idle, "idle"), (other, "other")):
                answer = await keeper.post(f"{mock.base_url}/v1/chat/completions", json=CHAT,
                                           headers={"ADL-Session": session})
                assert answer.status_code == 200
            mock.script(Behaviour(chunks=60, chunk_delay=0.25))  # 15 s: far past the grace period
            started = asyncio.Event()
            streaming = asyncio.create_task(
                stream_until(client, f"{mock.base_url}/v1/chat/completions", "too-long", started))
            await asyncio.wait_for(started.wait(), 10)
            sent = time.monotonic()
            governor.proc.send_signal(signal.SIGTERM)
            received = await asyncio.wait_for(streaming, 15)
            cut_after = time.monotonic() - sent
            assert await exited(governor, 15) == 0  # the idle connections still open
        assert 1.0 < cut_after < 6, cut_after
        last = events(received)[-1]
        assert last["error"]["type"] == "governor_stream_cut", last
        assert "shutting down" in last["error"]["message"]
        assert received.endswith(b"data: [DONE]\n\n")  # the OpenAI stream ends as OpenAI's does
        await asyncio.wait_for(mock.streams[0].done.wait(), 10)
        assert not mock.streams[0].completed  # generation aborted upstream
    finally:
        await governor.stop()
        await mock.stop()
    text = output(governor)
    assert "Traceback" not in text, text[-3000:]
    record = verified(data, "too-long", capsys)
    assert [d["status"] for d in shutdown_refusals(record)] == [503]  # the cut, recorded
    for session in ("idle", "other"):
        assert verified(data, session, capsys)["outcome"] == "completed"


async def test_a_second_sigterm_during_the_drain_stops_at_once_and_the_record_is_written(tmp_path, capsys):
    mock = MockLLM()
    await mock.start()
    data = tmp_path / "data"
    governor = await GovernorProcess(data, ["--drain-timeout", "60"]).start()
    try:
        mock.script(Behaviour(chunks=60, chunk_delay=0.25))
        async with agent(governor) as client:
            started = asyncio.Event()
            streaming = asyncio.create_task(
                stream_until(client, f"{mock.base_url}/v1/chat/completions", "hurried", started))
            await asyncio.wait_for(started.wait(), 10)
            sent = time.monotonic()
            governor.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            governor.proc.send_signal(signal.SIGINT)
            received = await asyncio.wait_for(streaming, 15)
        assert events(received)[-1]["error"]["type"] == "governor_stream_cut"
        assert await exited(governor, 15) == 0
        assert time.monotonic() - sent < 8  # not the 60 s grace period
    finally:
        await governor.stop()
        await mock.stop()
    text = output(governor)
    assert "Traceback" not in text, text[-3000:]
    assert "stopping at once" in text
    assert [d["status"] for d in shutdown_refusals(verified(data, "hurried", capsys))] == [503]


# --- SIGHUP --------------------------------------------------------------------------------


async def hup(governor: GovernorProcess, marker: str) -> None:
    before = output(governor).count(marker)
    governor.proc.send_signal(signal.SIGHUP)
    await wait_for(lambda: output(governor).count(marker) > before, what=f"{marker!r} in the log")


async def test_sighup_reloads_the_allow_list_and_the_tokens_and_rejects_a_broken_config(tmp_path):
    mock = MockLLM()
    await mock.start()
    data = tmp_path / "data"
    tokens = tmp_path / "reviewers.txt"
    tokens.write_text(TOKEN_A + "\n")
    config = tmp_path / "governor.yaml"
    config.write_text("allow:\n  - GET 127.0.0.1/already/**\n")
    governor = await GovernorProcess(data, ["--config", str(config), "--reviewer-tokens", str(tokens)]).start()
    try:
        control_a = (data / "control-token").read_text().strip()
        async with agent(governor) as client, httpx.AsyncClient(timeout=5) as control:
            session = {"ADL-Session": "reloaded"}

            async def fetch(path: str) -> httpx.Response:
                return await client.get(f"{mock.base_url}{path}", headers=session)

            async def approvals(token: str) -> int:
                answer = await control.get(f"{governor.control_url}/v1/approvals",
                                           headers={"Authorization": f"Bearer {token}"})
                return answer.status_code

            assert (await fetch("/already/x")).status_code == 200
            assert (await fetch("/newly/x")).status_code == 403  # default deny
            assert await approvals(TOKEN_A) == 200 and await approvals(TOKEN_B) == 401
            assert await approvals(control_a) == 200

            # the allow-list, the reviewer token, the control token, the log level; and a setting
            # that needs a restart
            config.write_text("allow:\n  - GET 127.0.0.1/already/**\n  - GET 127.0.0.1/newly/**\n"
                              "log_level: DEBUG\nsession_idle: 120\n")
            tokens.write_text(TOKEN_B + "\n")
            control_b = "control-token-after-the-reload-0123456789"
            (data / "control-token").write_text(control_b + "\n")
            await hup(governor, "SIGHUP: reloaded allow")
            assert (await fetch("/newly/x")).status_code == 200
            assert mock.requests[-1].path == "/newly/x"
            assert await approvals(TOKEN_A) == 401 and await approvals(TOKEN_B) == 200
            assert await approvals(control_a) == 401 and await approvals(control_b) == 200
            text = output(governor)
            for name in ("reviewer tokens", "control token", "log_level"):
                assert f"SIGHUP: reloaded {name}" in text, text[-3000:]
            assert "session_idle changed but cannot be reloaded: restart to change it" in text

            # a config file that does not parse: rejected whole, the process lives, nothing changes
            config.write_text("allow: [GET 127.0.0.1/other/**\nlog_level: [\n")
            tokens.write_text(TOKEN_A + "\n")
            await hup(governor, "reload rejected")
            assert governor.proc.poll() is None
            assert (await fetch("/newly/x")).status_code == 200
            assert (await fetch("/other/x")).status_code == 403
            assert await approvals(TOKEN_B) == 200 and await approvals(TOKEN_A) == 401

            # a config that parses but does not validate: rejected whole too
            config.write_text("allow:\n  - GET 127.0.0.1/other/**\ntier: R9\n")
            await hup(governor, "reload rejected")
            assert governor.proc.poll() is None
            assert (await fetch("/other/x")).status_code == 403
            assert await approvals(TOKEN_B) == 200

            # routes naming an adapter that does not exist: rejected whole, the tokens file with it
            config.write_text("allow:\n  - GET 127.0.0.1/other/**\n"
                              "routes:\n  - {host: '*', path: /x/**, adapter: no-such-adapter}\n")
            tokens.write_text(TOKEN_A + "\n")
            await hup(governor, "reload rejected")
            assert "no-such-adapter" in output(governor)
            assert (await fetch("/other/x")).status_code == 403
            assert await approvals(TOKEN_B) == 200 and await approvals(TOKEN_A) == 401
    finally:
        code = await governor.stop()
        await mock.stop()
    assert code == 0
    text = output(governor)
    assert "Traceback" not in text, text[-3000:]


async def test_a_call_held_for_a_reviewer_is_answered_review_pending_when_the_drain_is_over(tmp_path, capsys):
    mock = MockLLM()
    await mock.start()
    data = tmp_path / "data"
    governor = await GovernorProcess(data, ["--drain-timeout", "1.5"]).start()
    try:
        # the bundled passport: delete_note needs a reviewer, so the model's answer is held
        mock.script(Behaviour(text="Deleting it.", tool_calls=(("delete_note", {"path": "/workspace/notes/a.md"}),)))
        async with agent(governor) as client:
            held = asyncio.create_task(client.post(f"{mock.base_url}/v1/chat/completions", json=CHAT,
                                                   headers={"ADL-Session": "held"}))
            async with httpx.AsyncClient(timeout=5) as control:
                token = (data / "reviewer-token").read_text().strip()

                async def pending() -> int:
                    answer = await control.get(f"{governor.control_url}/v1/approvals",
                                               headers={"Authorization": f"Bearer {token}"})
                    return len(answer.json().get("approvals", answer.json()) or [])

                for _ in range(200):
                    if await pending():
                        break
                    await asyncio.sleep(0.05)
            sent = time.monotonic()
            governor.proc.send_signal(signal.SIGTERM)
            answer = await asyncio.wait_for(held, 15)
            waited = time.monotonic() - sent
        assert answer.status_code == 429, answer.text
        assert int(answer.headers["retry-after"]) > 0
        assert 1.0 < waited < 6, waited
        assert await exited(governor, 15) == 0
    finally:
        await governor.stop()
        await mock.stop()
    text = output(governor)
    assert "Traceback" not in text, text[-3000:]
    record = verified(data, "held", capsys)
    assert record["events"][0]["cause"] == "on_governor_oversight_trigger"


async def test_sighup_reloads_the_webhooks(tmp_path):
    from tests.test_webhooks import SECRET, Receiver

    mock = MockLLM()
    await mock.start()
    receiver = await Receiver().start()
    data = tmp_path / "data"
    config = tmp_path / "governor.yaml"
    config.write_text("log_level: INFO\n")
    governor = await GovernorProcess(data, ["--config", str(config), "--drain-timeout", "1"],
                                     env={"GOVERNOR_WEBHOOK_SECRET": SECRET}).start()
    try:
        config.write_text(f"webhook: [{receiver.url}]\n")
        await hup(governor, "SIGHUP: reloaded webhook")
        # a held step: the reloaded notifier tells the receiver, signed with the secret
        mock.script(Behaviour(text="Deleting it.", tool_calls=(("delete_note", {"path": "/workspace/notes/b.md"}),)))
        async with agent(governor) as client:
            held = asyncio.create_task(client.post(f"{mock.base_url}/v1/chat/completions", json=CHAT,
                                                   headers={"ADL-Session": "hooked"}))
            await receiver.wait_for(lambda: receiver.seen, "a notification")
            assert [p["event"] for p in receiver.verified()][:1] == ["approval.pending"]
            governor.proc.send_signal(signal.SIGTERM)
            assert (await asyncio.wait_for(held, 15)).status_code == 429
        assert await exited(governor, 15) == 0
    finally:
        await governor.stop()
        await receiver.stop()
        await mock.stop()
    assert "Traceback" not in output(governor)


def test_the_charts_grace_period_leaves_the_drain_5_seconds_for_the_records():
    from tests import chart_tools

    if chart_tools.helm_binary() is None:
        import pytest

        pytest.skip("helm is not on PATH and .ci/k8s-tools could not fetch it")
    for grace, drain in ((None, "25"), (60, "55")):
        values = {} if grace is None else {"terminationGracePeriodSeconds": grace}
        ((_, pod),) = chart_tools.pod_specs(chart_tools.render(values))
        assert pod["terminationGracePeriodSeconds"] == (grace or 30)
        governor = next(c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == "governor")
        env = {e["name"]: e.get("value") for e in governor["env"]}
        assert env["GOVERNOR_DRAIN_TIMEOUT"] == drain


async def test_a_call_the_upstream_has_not_answered_by_the_end_of_the_drain_gets_503(tmp_path, capsys):
    mock = MockLLM()
    await mock.start()
    data = tmp_path / "data"
    governor = await GovernorProcess(data, ["--drain-timeout", "1.5"]).start()
    try:
        mock.script(Behaviour(hang=30))  # no headers for 30 s
        async with agent(governor) as client:
            waiting = asyncio.create_task(client.post(f"{mock.base_url}/v1/chat/completions", json=CHAT,
                                                      headers={"ADL-Session": "unanswered"}))
            for _ in range(200):
                if mock.requests:
                    break
                await asyncio.sleep(0.05)
            governor.proc.send_signal(signal.SIGTERM)
            answer = await asyncio.wait_for(waiting, 15)
        assert answer.status_code == 503, answer.text
        assert int(answer.headers["retry-after"]) > 0
        assert "shutting down" in answer.json()["error"]["message"]
        assert await exited(governor, 15) == 0
    finally:
        await governor.stop()
        await mock.stop()
    assert "Traceback" not in output(governor)
    assert [d["status"] for d in shutdown_refusals(verified(data, "unanswered", capsys))] == [503]
