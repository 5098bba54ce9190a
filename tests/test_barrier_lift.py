"""The absorbing barrier (#32 item 7): a lock on every session, set by a session-integrity halt,
is lifted only by the principal (the control token) or the operator role named for it (a
lock-lifter token, `--lock-lifter-tokens`), never by a reviewer; each lift is recorded with the
role that made it. Through the real proxy, runtime and control plane."""

from __future__ import annotations

import httpx
import pytest

from governor.cli import UsageError
from governor.cli.barrier_options import apply_barrier_settings
from tests.test_sessions import CONTROL, REVIEWER, WRONG, refusal, served_world

LIFTER = "lock-lifter-token-for-barrier-tests-0123456789"


async def _locked(world) -> tuple[dict, dict]:
    """Two principal sessions; `a` presents another passport: halted, and the agent locked."""
    a, b = await world.open(label="a"), await world.open(label="b")
    assert refusal(await world.chat(a["token"], **{"ADL-Passport": "sha256=" + "A" * 43}))["cause"] == "on_governor_session_integrity"
    assert refusal(await world.chat(b["token"]))["refusal"] == "agent_locked"
    (lock,) = (await world.control.get("/v1/locks")).json()["locks"]
    return lock, b


async def _lift(world, lock: dict, token: str, by: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=world.running.control_url, trust_env=False, timeout=30) as client:
        return await client.post(f"/v1/locks/{lock['id']}/lift", json={"by": by},
                                 headers={"Authorization": f"Bearer {token}"})


async def test_a_lock_lifter_lifts_and_the_record_names_the_role(tmp_path, llm):
    async with served_world(llm, tmp_path, tmp_path / "data", lock_lifter_tokens=(LIFTER,)) as world:
        lock, b = await _locked(world)
        lifted = await _lift(world, lock, LIFTER, "night-ops")
        assert lifted.status_code == 200 and lifted.json()["lifted_by"] == "night-ops as lock_lifter"
        assert (await world.chat(b["token"])).status_code == 200
        audit = (await world.control.get("/v1/audit/record")).json()
    assert audit["events"][-1]["detail"]["lifted_by"] == "night-ops as lock_lifter"


async def test_a_reviewer_or_a_stranger_cannot_lift_and_nothing_is_recorded(tmp_path, llm):
    """Hostile: a reviewer forging a lift (naming the principal as `by`), a stranger's token,
    and the agent's own session token: refused, the lock holds, no lift is recorded."""
    async with served_world(llm, tmp_path, tmp_path / "data", lock_lifter_tokens=(LIFTER,)) as world:
        lock, b = await _locked(world)
        forged = await _lift(world, lock, REVIEWER, "principal")
        assert forged.status_code == 403 and forged.json()["error"]["code"] == "reviewer_cannot_lift"
        for token in (WRONG, b["token"]):
            assert (await _lift(world, lock, token, "principal")).status_code == 401
        assert refusal(await world.chat(b["token"]))["refusal"] == "agent_locked"
        assert (await world.control.get("/v1/locks")).json()["locked"] is True
        audit = (await world.control.get("/v1/audit/record")).json()
        assert [(e["cause"], e["action"]) for e in audit["events"]] == [("on_governor_agent_lock", "halt")]
        # the principal then lifts it, once
        assert (await _lift(world, lock, CONTROL, "lead")).json()["lifted_by"] == "lead as principal"
        assert (await _lift(world, lock, LIFTER, "late")).status_code == 409


async def test_without_a_control_token_a_reviewer_still_cannot_lift(tmp_path, llm):
    async with served_world(llm, tmp_path, tmp_path / "data", control_token=None) as world:
        world.control.headers.pop("Authorization")
        assert refusal(await world.chat(None, **{"ADL-Passport": "sha256=" + "A" * 43}))["cause"] == "on_governor_session_integrity"
        (lock,) = (await world.control.get("/v1/locks")).json()["locks"]
        answer = await _lift(world, lock, REVIEWER, "alice")
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "principal_token_not_configured"
        assert (await world.control.get("/v1/locks")).json()["locked"] is True


class _Settings:
    reviewer_tokens = (REVIEWER,)
    lock_lifter_tokens: tuple[str, ...] = ()


def test_the_lock_lifter_option_reads_a_token_file_and_refuses_bad_ones(tmp_path):
    good = tmp_path / "lifters"
    good.write_text(f"# night operations\n{LIFTER}\n\n{LIFTER}\n")
    settings = _Settings()
    apply_barrier_settings(settings, {"lock_lifter_tokens": str(good)}.get)
    assert settings.lock_lifter_tokens == (LIFTER,)
    cases = {"short": "tooshort\n", "empty": "# nobody\n", "reviewer": REVIEWER + "\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(UsageError):
            apply_barrier_settings(_Settings(), {"lock_lifter_tokens": str(tmp_path / name)}.get)
    with pytest.raises(UsageError):
        apply_barrier_settings(_Settings(), {"lock_lifter_tokens": str(tmp_path / "absent")}.get)


async def test_governor_run_takes_lock_lifter_tokens_and_the_cli_lifts_with_one(tmp_path, llm):
    """`governor run --lock-lifter-tokens FILE` as a real process; `governor locks lift
    --token-file` with a reviewer's token is refused, with the lock lifter's it lifts."""
    import asyncio
    import json
    import signal

    from tests.test_sessions import _cli, _start_governor_run

    data = tmp_path / "data"
    (tmp_path / "lifters").write_text(LIFTER + "\n")
    (tmp_path / "reviewer").write_text(REVIEWER + "\n")
    proc, banner = await _start_governor_run(data, "--lock-lifter-tokens", str(tmp_path / "lifters"),
                                             "--reviewer-tokens", str(tmp_path / "reviewer"))
    try:
        code, out, err = await _cli("sessions", "open", "--data-dir", str(data), "--json")
        assert code == 0, err
        token = json.loads(out)["token"]
        async with httpx.AsyncClient(proxy=banner["proxy"].split()[0], trust_env=False, timeout=30) as agent:
            answer = await agent.post(f"{llm.url}/chat/completions", json={
                "model": "gpt-4o-mini", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]},
                headers={"ADL-Session": token, "ADL-Passport": "sha256=" + "A" * 43})
            assert answer.status_code == 403
        code, out, _ = await _cli("locks", "list", "--data-dir", str(data), "--json")
        (lock,) = json.loads(out)["locks"]
        code, _, err = await _cli("locks", "lift", lock["id"], "--by", "rita", "--data-dir", str(data),
                                  "--token-file", str(tmp_path / "reviewer"))
        assert code == 1 and "reviewer_cannot_lift" in err
        code, out, err = await _cli("locks", "lift", lock["id"], "--by", "night-ops", "--data-dir", str(data),
                                    "--token-file", str(tmp_path / "lifters"))
        assert code == 0, err
        code, out, _ = await _cli("locks", "list", "--data-dir", str(data), "--json")
        assert json.loads(out)["locks"][0]["lifted_by"] == "night-ops as lock_lifter"
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
