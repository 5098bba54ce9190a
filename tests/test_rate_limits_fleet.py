"""Rate limits fleet-wide across replicas (issue #32 item 7, docs/rate-limits.md), proved with
processes: three real `governor run` processes on one real redis-server, agents calling through
their proxies over real HTTP to a mock upstream that counts what reaches it. Replicas A1 and
A2 govern agent X (one passport, one key: one gateway, docs/reference/shared-sessions.md); B
governs agent Y (its own passport and key). Every governor runs with

    --rate-limit agent:requests=4/1h,fleet:requests=6/1h

(B with the same limits in its --config file's `rate_limit:` list).

One set-up for the module (starting the processes is the slow part); each check starts from
empty windows (it deletes the window counters) and counts at the mock only its own calls.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import redis

from governor.cli import main as governor_cli
from governor.policy import ON_GOVERNOR_ERROR
from governor.policy.rates import ON_GOVERNOR_RATE_LIMIT, parse_rate_limit
from tests.governor_process import GovernorProcess
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER
from tests.shared_replicas import public_key, shared_keys
from tests.stream_budget_harness import PASSPORT
from tests.upstreams import Behaviour, MockLLM

pytestmark = [pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED), pytest.mark.asyncio(loop_scope="module")]

AGENT_LIMIT, FLEET_LIMIT, WINDOW = 4, 6, 3600
LIMITS = f"agent:requests={AGENT_LIMIT}/1h,fleet:requests={FLEET_LIMIT}/1h"
AGENT_X, AGENT_Y = "https://example.com/agents/rate-x", "https://example.com/agents/rate-y"
PREFIX = "governor:"  # the Redis store's default key prefix
HANG_GUARD = 60.0  # not a timing assertion: a hung call fails the test instead of hanging the suite


def signed_passport(path: Path, agent: str) -> Path:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from governor.passport import sign_passport

    passport = {**json.loads(json.dumps(PASSPORT)), "id": agent, "name": agent.rsplit("/", 1)[1]}
    path.write_text(json.dumps(sign_passport(passport, Ed25519PrivateKey.generate())))
    return path


class Governor:
    """One `governor run` process and the clients a check drives it with."""

    def __init__(self, name: str, process: GovernorProcess) -> None:
        self.name, self.process = name, process
        self.agent = httpx.AsyncClient(proxy="http://%s:%d" % process.proxy, trust_env=False, timeout=HANG_GUARD)
        token = (process.data_dir / "control-token").read_text().strip()
        self.control = httpx.AsyncClient(base_url=process.control_url, trust_env=False, timeout=HANG_GUARD,
                                         headers={"Authorization": f"Bearer {token}"})

    async def open_session(self, label: str) -> tuple[str, str]:
        """A session opened on this replica's control plane (any replica of its gateway serves
        it): its id and the token the agent presents."""
        answer = await self.control.post("/v1/sessions", json={"label": label})
        assert answer.status_code == 201, answer.text
        return answer.json()["session"], answer.json()["token"]

    async def chat(self, upstream: MockLLM, token: str, tag: str) -> httpx.Response:
        """One model call in the session of `token`; `tag` marks it at the mock (what the check counts)."""
        return await self.agent.post(f"{upstream.base_url}/v1/chat/completions", headers={"ADL-Session": token},
                                     json={"model": "gpt-4o-mini", "max_tokens": 20,
                                           "messages": [{"role": "user", "content": tag}]})

    async def close(self) -> None:
        await self.agent.aclose()
        await self.control.aclose()
        await self.process.stop()


class Fleet:
    def __init__(self, a1: Governor, a2: Governor, b: Governor, upstream: MockLLM, redis_url: str,
                 keys: Path) -> None:
        self.a1, self.a2, self.b, self.upstream, self.keys = a1, a2, b, upstream, keys
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=10)

    def reached(self, tag: str) -> int:
        """How many calls marked `tag` reached the upstream."""
        return sum(1 for r in self.upstream.requests
                   if isinstance(r.body, dict) and r.body.get("messages", [{}])[0].get("content") == tag)

    def empty_windows(self) -> None:
        for key in list(self.redis.scan_iter(match=f"{PREFIX}w:*", count=1000)):
            self.redis.delete(key)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fleet(tmp_path_factory):
    from tests.redis_server import RedisServer

    tmp = tmp_path_factory.mktemp("ratefleet")
    server = RedisServer()
    upstream = MockLLM()
    await upstream.start()
    upstream.default = Behaviour(input_tokens=5, output_tokens=10)
    keys = shared_keys(tmp)  # A1 and A2: one gateway, one key
    env = {k: v for k, v in os.environ.items() if k == "GOVERNOR_SHARED_DIR"}
    passports = {agent: signed_passport(tmp / f"{agent.rsplit('/', 1)[1]}.json", agent) for agent in (AGENT_X, AGENT_Y)}
    processes = []
    for name, agent in (("a1", AGENT_X), ("a2", AGENT_X), ("b", AGENT_Y)):
        data = tmp / name
        if name == "b":  # its own key; the same limits in the config file's form
            config = tmp / "b-config.yaml"
            config.write_text("rate_limit:\n" + "".join(f"  - {limit}\n" for limit in LIMITS.split(",")))
            limits = ["--config", str(config)]
        else:  # A1 and A2: one gateway, one key and one passport
            shutil.copytree(keys, data / "keys")
            limits = ["--rate-limit", LIMITS]
        processes.append(GovernorProcess(data, ["--passport", str(passports[agent]), "--store", server.url, *limits],
                                         env=env))
    started = await asyncio.gather(*[p.start(timeout=120) for p in processes], return_exceptions=True)
    governors: list[Governor] = []
    try:
        for name, process, outcome in zip(("a1", "a2", "b"), processes, started):
            if isinstance(outcome, BaseException):
                raise outcome
            governors.append(Governor(name, process))
        fleet = Fleet(*governors, upstream=upstream, redis_url=server.url, keys=keys)
        yield fleet
        fleet.redis.close()
    finally:
        await asyncio.gather(*[g.close() for g in governors], return_exceptions=True)
        await asyncio.gather(*[p.stop() for p in processes], return_exceptions=True)
        await upstream.stop()
        server.stop()


async def in_one_window() -> float:
    """Now, at least 15 s before the hour-long window rolls (waiting for the roll when closer:
    a check takes a few seconds), so its calls all count in one window; returns when it rolls."""
    now = time.time()
    if WINDOW - now % WINDOW < 15:
        await asyncio.sleep(WINDOW - now % WINDOW + 0.5)
        now = time.time()
    return (math.floor(now / WINDOW) + 1) * WINDOW


def rate_refusal(answer: httpx.Response) -> dict:
    assert answer.status_code == 429, answer.text
    governor = answer.json()["error"]["governor"]
    assert governor["cause"] == ON_GOVERNOR_RATE_LIMIT, governor
    return governor


def says_when_the_window_rolls(answer: httpx.Response, rolls_at: float) -> None:
    retry_after = int(answer.headers["retry-after"])
    assert abs(retry_after - (rolls_at - time.time())) <= 3, (retry_after, rolls_at - time.time())
    assert answer.headers["x-should-retry"] == "true"


async def ended_record(governor: Governor, session: str) -> dict:
    ended = await governor.control.post(f"/v1/sessions/{session}/end")
    assert ended.status_code == 200, ended.text
    answer = await governor.control.get(f"/v1/sessions/{session}/record")
    assert answer.status_code == 200, answer.text
    return answer.json()


def verified(tmp_path: Path, record: dict, key: Path, capsys) -> None:
    path = tmp_path / f"record-{record['session']}.json"
    path.write_text(json.dumps(record))
    capsys.readouterr()
    code = governor_cli(["verify", str(path), "--offline", "--key", str(public_key(key)), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 3 and report["verdict"] == "INCOMPLETE", report  # a pinned key: all but its binding checked


def rate_events(record: dict) -> list[dict]:
    return [e for e in record["events"] if e["cause"] == ON_GOVERNOR_RATE_LIMIT]


async def test_an_agent_limit_holds_across_two_replicas_and_both_refuse_with_when_the_window_rolls(
        fleet, tmp_path, capsys):
    fleet.empty_windows()
    rolls_at = await in_one_window()
    session, token = await fleet.a1.open_session("agent limit")
    tag = "agent-limit"
    answers = [await (fleet.a1 if i % 2 == 0 else fleet.a2).chat(fleet.upstream, token, tag)
               for i in range(AGENT_LIMIT + 2)]
    assert [a.status_code for a in answers[:AGENT_LIMIT]] == [200] * AGENT_LIMIT, answers[1].text
    assert fleet.reached(tag) == AGENT_LIMIT  # exactly the limit reached the upstream
    for refused in answers[AGENT_LIMIT:]:  # the next, on A1 and on A2
        governor = rate_refusal(refused)
        assert governor["rate_limit"] == f"agent:requests={AGENT_LIMIT}/{WINDOW}s" and governor["observed"] == 4
        says_when_the_window_rolls(refused, rolls_at)
    record = await ended_record(fleet.a1, session)  # the session's one record, both replicas' events
    events = rate_events(record)
    assert len(events) == 2 and all(e["action"] == "fallback" for e in events), events
    assert {e["detail"]["rate_limit"] for e in events} == {f"agent:requests={AGENT_LIMIT}/{WINDOW}s"}
    assert all(e["detail"]["refused_step"] == "not_executed" for e in events)
    verified(tmp_path, record, fleet.keys, capsys)


async def test_a_fleet_limit_holds_across_two_governors_of_two_agents(fleet, tmp_path, capsys):
    fleet.empty_windows()
    rolls_at = await in_one_window()
    tag = "fleet-limit"
    (_, x), (y_session, y) = await fleet.a1.open_session("fleet x"), await fleet.b.open_session("fleet y")
    # X on A1 and A2, Y on B, in turn: three calls each fill the fleet's six, neither agent's four
    turns = [(fleet.a1, x), (fleet.b, y), (fleet.a2, x), (fleet.b, y), (fleet.a1, x), (fleet.b, y)]
    answers = [await governor.chat(fleet.upstream, token, tag) for governor, token in turns]
    assert [a.status_code for a in answers] == [200] * FLEET_LIMIT, [a.text for a in answers]
    for governor, token in ((fleet.b, y), (fleet.a2, x)):
        refused = await governor.chat(fleet.upstream, token, tag)
        detail = rate_refusal(refused)
        assert detail["rate_limit"] == f"fleet:requests={FLEET_LIMIT}/{WINDOW}s" and detail["scope"] == "rate:fleet"
        assert detail["observed"] == FLEET_LIMIT
        says_when_the_window_rolls(refused, rolls_at)
    assert fleet.reached(tag) == FLEET_LIMIT
    record = await ended_record(fleet.b, y_session)  # B's agent: its refusal is in its own session's record
    [event] = rate_events(record)
    assert event["detail"]["scope"] == "rate:fleet"


async def test_calls_fired_at_once_on_both_replicas_admit_exactly_the_limit(fleet):
    fleet.empty_windows()
    await in_one_window()
    tag = "at-once"
    opened = [await fleet.a1.open_session(f"burst {i}") for i in range(2 * AGENT_LIMIT)]
    calls = [(fleet.a1 if i % 2 else fleet.a2).chat(fleet.upstream, token, tag) for i, (_, token) in enumerate(opened)]
    answers = await asyncio.gather(*calls)
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * AGENT_LIMIT + [429] * AGENT_LIMIT, [a.text for a in answers]
    assert fleet.reached(tag) == AGENT_LIMIT  # one atomic take per call: never more than the limit
    for answer in answers:
        if answer.status_code == 429:
            assert rate_refusal(answer)["rate_limit"] == f"agent:requests={AGENT_LIMIT}/{WINDOW}s"


def window_key(limit_text: str, agent: str) -> str:
    """The Redis key of a limit's counter in the current window (docs/rate-limits.md)."""
    limit = parse_rate_limit(limit_text)
    return f"{PREFIX}w:{limit.counter(agent, None)}@{math.floor(time.time() / limit.window_sec)}"


FORGED = [("text", "lots"), ("nan", "nan"), ("negative", "-1000"), ("infinite", "-inf"), ("hash", {"n": "1"}),
          ("list", ["1"])]


@pytest.mark.parametrize("kind,forged", FORGED, ids=[kind for kind, _ in FORGED])
async def test_a_forged_window_counter_fails_closed_and_is_recorded(fleet, kind, forged):
    """Someone who can write to Redis garbles a counter (a value that is not a count, or a key
    of another type): the step is refused and recorded on every replica, never admitted on a
    count read as zero, and the forged value is left for the operator to find. It is refused as
    a damaged budget counter is (one outcome for "a count in the store is not a count": 503
    on_governor_error, not retryable, the key named); the session goes on once it is deleted."""
    fleet.empty_windows()
    await in_one_window()
    tag = f"forged-{kind}"
    scope, governor, agent = ("agent", fleet.a2, AGENT_X) if kind not in ("list", "infinite") else \
        ("fleet", fleet.b, AGENT_Y)
    key = window_key(f"{scope}:requests=1/1h", agent)
    if isinstance(forged, dict):
        fleet.redis.hset(key, mapping=forged)
    elif isinstance(forged, list):
        fleet.redis.rpush(key, *forged)
    else:
        fleet.redis.set(key, forged)
    before = fleet.redis.dump(key)
    session, token = await governor.open_session(f"forged {kind}")
    refused = await governor.chat(fleet.upstream, token, tag)
    assert refused.status_code == 503, refused.text
    detail = refused.json()["error"]["governor"]
    assert detail["cause"] == ON_GOVERNOR_ERROR and detail["fail_closed"] is True, detail
    assert "not a count" in detail["reason"] and key in detail["reason"], detail
    assert "retry-after" not in refused.headers and refused.headers["x-should-retry"] == "false"
    assert fleet.reached(tag) == 0 and fleet.redis.dump(key) == before  # not admitted, not overwritten
    fleet.redis.delete(key)  # the operator removes it: the window counts again, the same session goes on
    assert (await governor.chat(fleet.upstream, token, tag)).status_code == 200
    assert fleet.reached(tag) == 1
    record = await ended_record(governor, session)
    [event] = [e for e in record["events"] if e["cause"] == ON_GOVERNOR_ERROR]
    assert event["action"] == "fallback" and event["detail"]["fail_closed"] is True, event
    assert event["detail"]["counter"] == key and event["detail"]["retryable"] is False, event
    assert not rate_events(record) and record["outcome"] != "halted", record["outcome"]
