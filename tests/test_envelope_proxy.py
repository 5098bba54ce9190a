"""The statistical envelope through the real proxy, runtime and control plane at R3 (#32 item 7):
calm windows of principal-opened sessions, a burst in one window, and the next session's first
call is halted with on_anomaly in its signed record (the statistic, the window, the baseline);
sticky for every session until the principal resets it over the control plane. Hostile: a
reviewer token (even naming the principal), a stranger's token, the agent's session token and
forged bodies are refused and reset nothing."""

from __future__ import annotations

import contextlib
import copy
import math
import time
from typing import AsyncIterator

import httpx

from governor.evidence.verify import verify_record
from governor.policy.envelope import EnvelopeConfig
from governor.proxy.server import Settings, serve
from tests.control_harness import real_runtime
from tests.conftest import SHARED
from tests.test_mcp_sdk_runtime import PASSPORT, JumpingClock
from tests.test_sessions import CONTROL, REVIEWER, WRONG, World, _cli

WINDOW = 60.0
SCHEMA = SHARED / "adl" / "schemas" / "schema-enforcement-record.json"


def schema_errors(record: dict) -> list:
    """The official enforcement-record schema's complaints (none checked without ../shared:
    the rest of the test still runs)."""
    if not SCHEMA.exists():
        return []
    import json

    import jsonschema

    return list(jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).iter_errors(record))
DOCUMENT = copy.deepcopy(PASSPORT)  # on_anomaly undeclared: the fail-closed halt


@contextlib.asynccontextmanager
async def envelope_world(tmp_path, llm) -> AsyncIterator[tuple[World, JumpingClock, int]]:
    """A governor at R3 with a session book; the clock at the start of a window far ahead: (world,
    clock, that window's index)."""
    clock = JumpingClock()
    runtime, _ = real_runtime(DOCUMENT, tmp_path, clock=clock, sweep_interval_sec=0.05, tier="R3")
    runtime.envelope.config = EnvelopeConfig(window_sec=WINDOW, min_windows=3)
    settings = Settings(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path, tick_interval=0,
                        control_token=CONTROL, reviewer_tokens=(REVIEWER,))
    world = World(await serve(settings, runtime), llm, tmp_path)
    first = math.ceil(time.time() / WINDOW) + 100
    try:
        yield world, clock, first
    finally:
        await world.close()


def into_window(clock: JumpingClock, index: int) -> None:
    clock.offset = index * WINDOW + 2 - time.time()


async def calls(world: World, token: str, n: int) -> None:
    for _ in range(n):
        answer = await world.chat(token)
        assert answer.status_code == 200, answer.text


async def burst_after_calm(world: World, clock: JumpingClock, first: int) -> None:
    for w in range(4):  # calm: one session a window, two calls each
        into_window(clock, first + w)
        session = await world.open(label=f"calm-{w}")
        await calls(world, session["token"], 2)
    into_window(clock, first + 4)  # the burst, from two sessions of the agent
    for label in ("burst-a", "burst-b"):
        session = await world.open(label=label)
        await calls(world, session["token"], 6)
    into_window(clock, first + 5)


async def reset(world: World, token: str | None, body: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=world.running.control_url, trust_env=False, timeout=30) as client:
        return await client.post("/v1/envelope/reset", json=body, headers=headers)


async def test_a_burst_halts_the_next_session_with_on_anomaly_in_its_record_until_the_principal_resets(tmp_path, llm):
    async with envelope_world(tmp_path, llm) as (world, clock, first):
        await burst_after_calm(world, clock, first)
        nxt = await world.open(label="next")
        stopped = await world.chat(nxt["token"])
        assert stopped.status_code in (403, 429), stopped.text
        governed = stopped.json()["error"]["governor"]
        assert governed["cause"] == "on_anomaly" and governed["action"] == "halt"
        ended = await world.control.post(f"/v1/sessions/{nxt['session']}/end")
        record = ended.json()
        assert verify_record(record, public_key=world.running.runtime.key.public_key()).ok
        assert not schema_errors(record)  # the official enforcement-record schema
        (event,) = [e for e in record["events"] if e["cause"] == "on_anomaly"]
        assert event["detail"]["across_sessions"] is True
        requests = next(d for d in event["detail"]["deviations"] if d.get("metric") == "requests")
        assert requests["observed"] == 12 and requests["window"]["index"] == first + 4
        assert requests["baseline"]["windows"] == 4 and requests["baseline"]["mean"] == 2.0
        assert requests["statistic"] > requests["k"]
        # sticky: a later session is halted too
        later = await world.open(label="later")
        assert (await world.chat(later["token"])).json()["error"]["governor"]["cause"] == "on_anomaly"
        shown = (await world.control.get("/v1/envelope")).json()
        assert shown["deviation"]["window"] == first + 4

        # hostile: a reviewer forging the principal, a stranger, the agent's own session token,
        # no token, forged bodies: refused, nothing reset, nothing recorded
        forged = await reset(world, REVIEWER, {"by": "principal"})
        assert forged.status_code == 403 and forged.json()["error"]["code"] == "reviewer_cannot_reset"
        for token in (WRONG, later["token"], None):
            assert (await reset(world, token, {"by": "principal"})).status_code == 401
        for body in ({}, {"by": ""}, {"by": "x" * 201}, {"by": "a\nb"}, {"by": "ops", "agent": "other"}, ["by"],
                     {"by": 7}):
            answer = await reset(world, CONTROL, body)
            assert answer.status_code == 400, (body, answer.text)
        assert (await world.control.get("/v1/envelope")).json()["deviation"] is not None
        audit = await world.control.get("/v1/audit/record")
        events = audit.json()["events"] if audit.status_code == 200 else []  # 404: nothing in the audit journal
        assert not [e for e in events if e["cause"] == "on_governor_envelope_reset"]
        still = await world.open(label="still")
        assert (await world.chat(still["token"])).json()["error"]["governor"]["cause"] == "on_anomaly"

        # the CLI: show; a reset with a reviewer's token file refused (exit 1); the principal's done
        url = ["--control-url", world.running.control_url]
        tokens = {}
        for name, token in (("control", CONTROL), ("reviewer", REVIEWER)):
            tokens[name] = tmp_path / f"{name}-token"
            tokens[name].write_text(token + "\n")
        code, out, err = await _cli("envelope", "show", *url, "--token-file", str(tokens["control"]))
        assert code == 0 and "DEVIATION in window" in out and "requests" in out, err
        code, out, err = await _cli("envelope", "reset", "--by", "lead", *url, "--token-file", str(tokens["reviewer"]))
        assert code == 1 and "reviewer_cannot_reset" in err
        assert (await world.control.get("/v1/envelope")).json()["deviation"] is not None
        # the principal resets it: recorded in the audit journal; a new session goes on
        code, out, err = await _cli("envelope", "reset", "--by", "lead", *url, "--token-file", str(tokens["control"]))
        assert code == 0 and "reset by lead" in out, err
        assert (await reset(world, CONTROL, {"by": "lead"})).json()["reset"] is False  # nothing left to reset
        after = await world.open(label="after")
        assert (await world.chat(after["token"])).status_code == 200
        audit = (await world.control.get("/v1/audit/record")).json()
        assert not schema_errors(audit)
        entry, again = [e for e in audit["events"] if e["cause"] == "on_governor_envelope_reset"]
        assert entry["detail"]["reset_by"] == "lead as principal" and again["detail"]["cleared"] is None
        assert entry["detail"]["cleared"]["window"] == first + 4


async def test_without_a_burst_nothing_fires(tmp_path, llm):
    async with envelope_world(tmp_path, llm) as (world, clock, first):
        for w in range(6):
            into_window(clock, first + w)
            session = await world.open(label=f"calm-{w}")
            await calls(world, session["token"], 2)
        shown = (await world.control.get("/v1/envelope")).json()
        assert shown["deviation"] is None and shown["closed_windows"] == 5 and shown["cold_start"] is False


class _Settings:
    envelope = None


def test_the_envelope_options_make_its_configuration_and_refuse_bad_values():
    from governor.cli import UsageError
    from governor.cli.envelope_options import apply_envelope_settings

    settings = _Settings()
    apply_envelope_settings(settings, {}.get)
    assert settings.envelope is None  # none given: the defaults
    apply_envelope_settings(settings, {"envelope_window": "60", "envelope_k": "3.5", "envelope_min_windows": "4",
                                       "envelope_concentration": "0.8"}.get)
    assert settings.envelope == EnvelopeConfig(window_sec=60.0, k=3.5, min_windows=4, concentration_share=0.8)
    for bad in ({"envelope_window": "soon"}, {"envelope_window": "0"}, {"envelope_k": "-1"},
                {"envelope_min_windows": "1"}, {"envelope_min_windows": "2.5"}, {"envelope_concentration": "1.5"}):
        try:
            apply_envelope_settings(_Settings(), bad.get)
        except UsageError as exc:
            assert "envelope" in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")


async def test_governor_run_settings_reach_the_runtime(tmp_path):
    from tests.proxy_harness import real_governor

    config = EnvelopeConfig(window_sec=30.0, min_windows=3)
    async with real_governor(tmp_path, envelope=config) as (running, _):
        assert running.runtime.envelope.config == config
