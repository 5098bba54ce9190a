"""Sessions belong to the principal (issue 19, items 1 and 2), end to end: an agent's real
HTTP through the real proxy and runtime (the bundled example passport: 20,000 tokens per
session), sessions opened through the control plane, records checked by `governor verify`.

A hostile agent is the subject of most tests: it invents session values, replays ended
tokens, names other sessions, sends bad passports, and floods new names.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest

from governor.cli import main as governor_cli
from governor.evidence import KeyFiles
from governor.proxy.server import Settings, serve
from governor.runtime.audit import audit_paths

CONTROL = "control-token-for-session-tests-0123456789"
REVIEWER = "reviewer-token-for-session-tests-0123456789"
WRONG = "not-the-control-token-but-long-enough-0123"
PER_CALL = 150  # the mock LLM's 100 prompt + 50 completion tokens


def settings_for(data_dir: Path, **overrides) -> Settings:
    options = dict(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=data_dir, tick_interval=0,
                   control_token=CONTROL, reviewer_tokens=(REVIEWER,))
    return Settings(**{**options, **overrides})


# A call the 20,000-token session budget refuses even with output fitting (docs/fitting.md):
# 100 answers, each of which could be fitted to at most 199 tokens, under the floor of 256.
UNFITTABLE = {"max_tokens": 30_000, "answers": 100}


class World:
    def __init__(self, running, llm, tmp: Path) -> None:
        self.running, self.llm, self.tmp = running, llm, tmp
        self.agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
        self.control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30,
                                         headers={"Authorization": f"Bearer {CONTROL}"})

    async def close(self) -> None:
        await self.agent.aclose()
        await self.control.aclose()
        await self.running.stop()

    async def open(self, **body) -> dict:
        answer = await self.control.post("/v1/sessions", json=body)
        assert answer.status_code == 201, answer.text
        return answer.json()

    async def chat(self, session: str | None = None, max_tokens: int = 100, answers: int = 1,
                   **headers) -> httpx.Response:
        if session is not None:
            headers["ADL-Session"] = session
        body = {"model": "gpt-4o-mini", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "find papers"}]}
        if answers > 1:
            body["n"] = answers
        return await self.agent.post(f"{self.llm.url}/chat/completions", headers=headers, json=body)

    async def view(self, session: str) -> dict:
        answer = await self.control.get(f"/v1/sessions/{session}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    async def tokens_used(self, session: str) -> float:
        view = await self.view(session)
        return next((b["used"] for b in view.get("budgets", []) if b["dimension"] == "tokens"
                     and b["scope"] == "per_session" and b["persona"] is None), 0.0)

    def verify(self, record: dict, name: str, capsys) -> dict:
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(record))
        capsys.readouterr()
        keys = KeyFiles(self.running.settings.data_dir / "keys")
        code = governor_cli(["verify", str(path), "--offline", "--key", str(keys.public_key), "--json"])
        report = json.loads(capsys.readouterr().out)
        assert code == 3 and report["verdict"] == "INCOMPLETE" and report["first_failure"] is None, report
        return report


@asynccontextmanager
async def served_world(llm, tmp_path: Path, data_dir: Path, **overrides) -> AsyncIterator[World]:
    """A governor served on `data_dir` (settings_for with `overrides`), its agent and control clients."""
    world = World(await serve(settings_for(data_dir, **overrides)), llm, tmp_path)
    try:
        yield world
    finally:
        await world.close()


@pytest.fixture
async def world(tmp_path, llm):
    async with served_world(llm, tmp_path, tmp_path / "data") as w:
        yield w


def refusal(response: httpx.Response) -> dict:
    assert response.status_code == 403, (response.status_code, response.text)
    assert response.headers["ADL-Governor-Action"] in ("deny", "halt")
    return response.json()["error"]["governor"]  # the OpenAI error shape, as the adapter answers


# --- item 1: a session is opened by a principal -----------------------------------------


async def test_a_halted_agent_is_refused_with_a_fresh_invented_or_absent_session_value(world):
    opened = await world.open(label="run 1")
    token, session = opened["token"], opened["session"]
    assert re.fullmatch(r"adls_[A-Za-z0-9_-]{32}", token) and token not in session  # 192 random bits
    assert (await world.chat(token)).status_code == 200
    # beyond the 20,000-token session budget even fitted (docs/fitting.md): 100 answers of 199 tokens
    halted = await world.chat(token, **UNFITTABLE)
    assert halted.status_code == 429
    assert halted.json()["error"]["governor"]["cause"] == "on_budget_exhausted"
    served = world.llm.served

    again = await world.chat(token)
    assert again.status_code == 429
    reason = again.json()["error"]["governor"]["reason"]
    assert "halted (on_budget_exhausted)" in reason and "governor sessions open" in reason

    invented = refusal(await world.chat("fresh-session-please"))
    assert invented["refusal"] == "session_token_malformed" and "governor sessions open" in invented["reason"]
    forged = refusal(await world.chat("adls_" + "A" * 32))
    assert forged["refusal"] == "session_unknown"
    tokenless = refusal(await world.chat(None))  # default session "auto": a principal opened sessions here
    assert tokenless["refusal"] == "session_token_required"
    named_by_id = refusal(await world.chat(session))  # the session's id is not its token
    assert named_by_id["refusal"] == "session_token_malformed"

    assert world.llm.served == served  # nothing refused reached the upstream
    listed = (await world.control.get("/v1/sessions")).json()["sessions"]
    assert [s["session"] for s in listed] == [session]  # the refusals opened nothing
    assert listed[0]["state"] == "halted" and listed[0]["label"] == "run 1"
    metrics = (await world.control.get("/metrics")).text
    assert 'governor_session_refusals_total{reason="session_token_malformed"} 2.0' in metrics
    assert 'governor_session_refusals_total{reason="session_unknown"} 1.0' in metrics


async def test_an_ended_sessions_token_is_refused_when_replayed(world, capsys):
    opened = await world.open(nonce="counterparty-nonce-0123456789")
    assert (await world.chat(opened["token"])).status_code == 200
    ended = await world.control.post(f"/v1/sessions/{opened['session']}/end")
    assert ended.status_code == 200
    record = ended.json()
    assert record["nonce"] == "counterparty-nonce-0123456789" and record["outcome"] == "completed"
    world.verify(record, "ended", capsys)
    served = world.llm.served
    replay = refusal(await world.chat(opened["token"]))
    assert replay["refusal"] == "session_ended" and opened["session"] in replay["reason"]
    assert world.llm.served == served
    after = (await world.control.get(f"/v1/sessions/{opened['session']}/record")).json()
    facts = lambda r: [(e["seq"], e["cause"], e["action"], e["at"]) for e in r["events"]]  # noqa: E731
    assert facts(after) == facts(record)  # the replay is recorded in no session


async def test_a_request_naming_another_session_falsely_never_halts_or_charges_it(world):
    victim = await world.open(label="victim")
    assert (await world.chat(victim["token"])).status_code == 200
    used = await world.tokens_used(victim["session"])
    assert used == PER_CALL
    bad_passport = {"ADL-Passport": "sha256=" + "A" * 43}
    near_token = victim["token"][:-1] + ("A" if victim["token"][-1] != "A" else "B")
    for named in (victim["session"], near_token, victim["session"].upper(), victim["token"][:-1]):
        answer = refusal(await world.chat(named, **bad_passport))
        assert answer["refusal"] in ("session_token_malformed", "session_unknown"), answer
        assert answer["session"] is None
        refusal(await world.chat(named, max_tokens=19000))
    view = await world.view(victim["session"])
    assert view["state"] == "active" and view["halt_cause"] is None and view["events"] == 0
    assert await world.tokens_used(victim["session"]) == used  # never charged
    assert (await world.control.get("/v1/locks")).json() == {"locks": [], "locked": False}
    assert (await world.chat(victim["token"])).status_code == 200  # and it goes on


async def test_opening_a_session_needs_the_control_token(world):
    for headers in ({}, {"Authorization": f"Bearer {WRONG}"}, {"Authorization": f"Bearer {REVIEWER}"}):
        async with httpx.AsyncClient(base_url=world.running.control_url, trust_env=False) as anonymous:
            answer = await anonymous.post("/v1/sessions", json={}, headers=headers)
        assert answer.status_code == 401, answer.text
    for body in ({"nonce": "short"}, {"label": ""}, {"label": "x" * 201}, {"color": "red"}, {"nonce": 7}):
        answer = await world.control.post("/v1/sessions", json=body)
        assert answer.status_code == 400, (body, answer.text)
    answer = await world.control.post("/v1/sessions", content=b"[1, 2", headers={"Content-Type": "application/json"})
    assert answer.status_code == 400
    assert (await world.control.get("/v1/sessions")).json()["sessions"] == []  # nothing was opened


async def test_opening_a_session_is_refused_without_any_control_token_configured(tmp_path, llm):
    running = await serve(settings_for(tmp_path / "data", control_token=None))
    try:
        async with httpx.AsyncClient(base_url=running.control_url, trust_env=False) as control:
            answer = await control.post("/v1/sessions", json={})
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "principal_token_not_configured"
    finally:
        await running.stop()


async def test_token_less_traffic_uses_the_default_session_and_off_refuses_it(tmp_path, llm):
    async with served_world(llm, tmp_path, tmp_path / "on", default_session="on") as world:
        assert (await world.chat(None)).status_code == 200
        opened = await world.open()
        assert (await world.chat(opened["token"])).status_code == 200
        assert (await world.chat(None)).status_code == 200  # "on" keeps it after a principal opened one
        default = world.running.sessions.default_id
        assert await world.tokens_used(default) == 2 * PER_CALL
    async with served_world(llm, tmp_path, tmp_path / "off", default_session="off") as world:
        served = llm.served
        assert refusal(await world.chat(None))["refusal"] == "session_token_required"
        assert llm.served == served
        # traffic no adapter governs needs a session too (default deny): token-less, it is refused
        page = await world.agent.get(f"{llm.url.rsplit('/v1', 1)[0]}/robots.txt")
        assert page.status_code == 403 and page.json()["error"]["governor"]["refusal"] == "session_token_required"
    async with served_world(llm, tmp_path, tmp_path / "fwd", default_session="off", unknown_traffic="forward") as world:
        # the opt-out: token-less traffic no adapter governs (a web page, a package index: no
        # library adds the header) is forwarded as before; a bad token on it is refused all the same
        page = await world.agent.get(f"{llm.url.rsplit('/v1', 1)[0]}/robots.txt")
        assert page.status_code == 404 and "ADL-Governor-Action" not in page.headers
        named = await world.agent.get(f"{llm.url.rsplit('/v1', 1)[0]}/robots.txt", headers={"ADL-Session": "mine"})
        assert named.status_code == 403 and named.json()["error"]["governor"]["refusal"] == "session_token_malformed"


async def test_a_halted_default_session_stays_halted_until_a_principal_ends_it(tmp_path, llm):
    async with served_world(llm, tmp_path, tmp_path / "data", default_session="on") as world:
        assert (await world.chat(None)).status_code == 200
        assert (await world.chat(None, **UNFITTABLE)).status_code == 429
        default = world.running.sessions.default_id
        await world.running.runtime.end_session(default)  # the idle sweeper ends it: that frees nothing
        served = llm.served
        stuck = refusal(await world.chat(None))
        assert stuck["refusal"] == "default_session_halted" and stuck["cause"] == "on_budget_exhausted"
        assert f"governor sessions end {default}" in stuck["reason"]
        assert llm.served == served
        assert (await world.control.post(f"/v1/sessions/{default}/end")).status_code == 200  # the principal
        assert (await world.chat(None)).status_code == 200
        assert world.running.sessions.default_id != default


# --- agent-named sessions: opt-in and capped ------------------------------------------------


async def test_the_agent_named_cap_holds_under_64_concurrent_new_names(tmp_path, llm, capsys):
    async with served_world(llm, tmp_path, tmp_path / "data", sessions="agent-named", agent_sessions_per_day=10) as world:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
        async with httpx.AsyncClient(proxy=world.running.proxy_url, trust_env=False, timeout=60, limits=limits) as agent:
            answers = await asyncio.gather(*(
                agent.post(f"{llm.url}/chat/completions", headers={"ADL-Session": f"name-{i}"},
                           json={"model": "gpt-4o-mini", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]})
                for i in range(64)))
        statuses = sorted(a.status_code for a in answers)
        assert statuses.count(200) == 10 and statuses.count(403) == 54
        refused = [a.json()["error"]["governor"] for a in answers if a.status_code == 403]
        assert {r["refusal"] for r in refused} == {"session_cap"}
        assert llm.served == 10
        assert len((await world.control.get("/v1/sessions")).json()["sessions"]) == 10
        # the refusal that hit the cap is an enforcement event of the governor's audit journal
        audit = (await world.control.get("/v1/audit/record")).json()
        assert [(e["cause"], e["action"]) for e in audit["events"]] == [("on_governor_session_cap", "halt")]
        assert audit["events"][0]["detail"]["limit"] == 10
        _, record_file, _ = audit_paths(world.running.settings.data_dir, world.running.runtime.limits.passport_digest)
        world.verify(json.loads(record_file.read_text()), "audit", capsys)
        # a name already opened goes on; principal sessions are not capped
        assert (await world.chat("name-keeps-going")).status_code == 403
        known = next(a.request.headers["ADL-Session"] for a in answers if a.status_code == 200)
        assert (await world.chat(known)).status_code == 200
        assert (await world.chat((await world.open())["token"])).status_code == 200


# --- item 2: halts that hold; locks ---------------------------------------------------------


async def test_a_locking_cause_locks_every_session_until_a_valid_lift(world, capsys):
    a, b = await world.open(label="a"), await world.open(label="b")
    assert (await world.chat(b["token"])).status_code == 200
    swapped = refusal(await world.chat(a["token"], **{"ADL-Passport": "sha256=" + "A" * 43}))
    assert swapped["cause"] == "on_governor_session_integrity"
    served = world.llm.served

    c = await world.open(label="opened while locked")
    assert c["locked"] is True
    for token in (b["token"], c["token"], a["token"]):
        locked = refusal(await world.chat(token))
        assert locked["refusal"] == "agent_locked" and "governor locks lift" in locked["reason"]
    assert world.llm.served == served
    locks = (await world.control.get("/v1/locks")).json()
    assert locks["locked"] and len(locks["locks"]) == 1
    lock = locks["locks"][0]
    assert lock["session"] == a["session"] and lock["cause"] == "on_governor_session_integrity"

    async with httpx.AsyncClient(base_url=world.running.control_url, trust_env=False) as other:
        for headers in ({}, {"Authorization": f"Bearer {WRONG}"}):
            answer = await other.post(f"/v1/locks/{lock['id']}/lift", json={"by": "mallory"}, headers=headers)
            assert answer.status_code == 401
        # a reviewer answers held steps; it does not lift the barrier (#32 item 7)
        answer = await other.post(f"/v1/locks/{lock['id']}/lift", json={"by": "alice"},
                                  headers={"Authorization": f"Bearer {REVIEWER}"})
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "reviewer_cannot_lift"
        principal = {"Authorization": f"Bearer {CONTROL}"}
        assert (await other.post(f"/v1/locks/{lock['id']}/lift", json={}, headers=principal)).status_code == 400
        for body in ({"by": "x" * 201}, {"by": "\u0007bell"}, {"by": 7}):
            assert (await other.post(f"/v1/locks/{lock['id']}/lift", json=body, headers=principal)).status_code == 400
        assert (await other.post(f"/v1/locks/{lock['id']}/lift", content=b"{by",
                                 headers={**principal, "Content-Type": "application/json"})).status_code == 400
        assert (await other.post("/v1/locks/lock-000/lift", json={"by": "x"}, headers=principal)).status_code == 404
    assert refusal(await world.chat(b["token"]))["refusal"] == "agent_locked"  # a wrong token lifted nothing

    lifted = await world.control.post(f"/v1/locks/{lock['id']}/lift", json={"by": "alice"})
    assert lifted.status_code == 200 and lifted.json()["lifted_by"] == "alice as principal"
    again = await world.control.post(f"/v1/locks/{lock['id']}/lift", json={"by": "bob"})
    assert again.status_code == 409
    assert (await world.chat(b["token"])).status_code == 200
    assert (await world.chat(c["token"])).status_code == 200
    halted = refusal(await world.chat(a["token"]))  # the halt itself holds
    assert halted["cause"] == "on_governor_session_integrity" and "halted" in halted["reason"]

    record = (await world.control.get(f"/v1/sessions/{a['session']}/record")).json()
    events = [(e["cause"], e["action"]) for e in record["events"]]
    assert events == [("on_governor_session_integrity", "halt"), ("on_governor_agent_lock", "halt"), ("on_governor_agent_lock", "continue")]
    assert record["events"][2]["detail"]["lifted_by"] == "alice as principal"
    world.verify(record, "locked-session", capsys)
    audit = (await world.control.get("/v1/audit/record")).json()
    assert [(e["cause"], e["action"], e["detail"].get("lifted_by")) for e in audit["events"]] == [
        ("on_governor_agent_lock", "halt", None), ("on_governor_agent_lock", "continue", "alice as principal")]
    report = world.verify(audit, "audit", capsys)
    assert report["verdict"] == "INCOMPLETE" and report["not_checked"] == [2, 4, 5]  # pinned key, no passport, no nonce decision


async def test_a_lock_survives_a_restart(tmp_path, llm):
    data = tmp_path / "data"
    async with served_world(llm, tmp_path, data) as world:
        a, b = await world.open(), await world.open()
        refusal(await world.chat(a["token"], **{"ADL-Passport": "sha256=" + "A" * 43}))
        assert refusal(await world.chat(b["token"]))["refusal"] == "agent_locked"
    async with served_world(llm, tmp_path, data) as world:
        assert refusal(await world.chat(b["token"]))["refusal"] == "agent_locked"
        assert refusal(await world.chat(None))["refusal"] == "agent_locked"
        lock = (await world.control.get("/v1/locks")).json()["locks"][0]
        lifted = await world.control.post(f"/v1/locks/{lock['id']}/lift", json={"by": "ops"})
        assert lifted.status_code == 200
        # the stop ended every session (each got its signed record): their tokens stay refused
        assert refusal(await world.chat(b["token"]))["refusal"] == "session_ended"
        assert refusal(await world.chat(a["token"]))["refusal"] == "session_ended"
        assert (await world.chat((await world.open())["token"])).status_code == 200
        audit = (await world.control.get("/v1/audit/record")).json()
        assert [(e["cause"], e["action"]) for e in audit["events"]] == [("on_governor_agent_lock", "halt"),
                                                                       ("on_governor_agent_lock", "continue")]
        assert audit["events"][1]["detail"]["in_session_record"] is False


# --- the principal's command line, against a running `governor run` ---------------------------


async def _start_governor_run(data: Path, *extra: str) -> tuple[asyncio.subprocess.Process, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k != "GOVERNOR_CONTROL_TOKEN"}  # the data dir's token, then
    env["PYTHONUNBUFFERED"] = "1"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "governor", "run", "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0",
        "--data-dir", str(data), *extra, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env)
    banner: dict[str, str] = {}
    lines = []
    async def read() -> None:
        while True:
            line = (await proc.stdout.readline()).decode()
            if not line:
                raise AssertionError("governor run exited:\n" + "".join(lines))
            lines.append(line)
            if line.startswith("Ctrl-C stops"):
                return
            key, _, value = line.strip().partition(":")
            banner.setdefault(key.strip(), value.strip())
    await asyncio.wait_for(read(), 60)
    banner["text"] = "".join(lines)
    return proc, banner


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "governor", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "GOVERNOR_CONTROL_TOKEN"})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_governor_sessions_open_list_show_end_against_a_running_governor(tmp_path, llm):
    data = tmp_path / "data"
    proc, banner = await _start_governor_run(data)
    try:
        token_file = data / "control-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert str(token_file) in banner["text"] and "governor sessions open" in banner["text"]
        code, out, err = await _cli("sessions", "open", "--data-dir", str(data), "--label", "cli run", "--json")
        assert code == 0, err
        opened = json.loads(out)
        proxy = banner["proxy"].split()[0]
        async with httpx.AsyncClient(proxy=proxy, trust_env=False, timeout=30) as agent:
            answer = await agent.post(f"{llm.url}/chat/completions", headers={"ADL-Session": opened["token"]},
                                      json={"model": "gpt-4o-mini", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]})
            assert answer.status_code == 200
            code, out, _ = await _cli("sessions", "list", "--data-dir", str(data))
            assert code == 0 and opened["session"] in out and "cli run" in out
            code, out, _ = await _cli("sessions", "show", opened["session"], "--data-dir", str(data), "--json")
            assert code == 0 and json.loads(out)["iterations"] == 1
            code, out, _ = await _cli("sessions", "end", opened["session"], "--data-dir", str(data))
            assert code == 0 and "ended (completed)" in out
            answer = await agent.post(f"{llm.url}/chat/completions", headers={"ADL-Session": opened["token"]},
                                      json={"model": "gpt-4o-mini", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]})
            assert answer.status_code == 403
        code, _, err = await _cli("sessions", "show", "session-nope", "--data-dir", str(data))
        assert code == 1 and "unknown_session" in err
        code, out, _ = await _cli("locks", "list", "--data-dir", str(data))
        assert code == 0 and out.strip() == "no locks"
        (tmp_path / "wrong").write_text(WRONG)
        code, _, err = await _cli("sessions", "open", "--data-dir", str(data), "--token-file", str(tmp_path / "wrong"))
        assert code == 1 and "token_invalid" in err
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    code, _, err = await _cli("sessions", "list", "--data-dir", str(tmp_path / "nowhere"))
    assert code == 2 and "no running governor" in err
