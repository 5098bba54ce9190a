"""What `tick_interval` governs, observed on a real governor (issue #30; docs/reference/configuration.md):
the wall-clock Tick the proxy sends while a call is in flight (its refusal cuts the call), every
`tick_interval` seconds, none when 0. It is not the sweeper's period: the sweeper passes every
second whatever it is, so the deadlines it keeps (a session's wall-clock cap, idle ends) fire
with tick_interval 0 and with a large value alike, never silently stop.

One governor (mitmproxy allows one per process), its passport's sessions capped at 1 s of
wall-clock, a 1 s idle timeout, an upstream that answers after 4 s; the proxy's policy is
changed live between calls, as tests/test_proxy_transit.py does (the option's value when a
call starts is what its in-flight ticker uses)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from datetime import datetime

import pytest

from tests.proxy_harness import agent_named_world
from tests.restartable_governor import write_passport
from tests.upstreams import Behaviour

pytestmark = pytest.mark.asyncio

HANG = 4.0  # the upstream's answer: long past the 1 s cap and the sweeper's next pass


def one_second_sessions(document: dict) -> None:
    document["permissions"]["resource_limits"]["budget"]["wall_clock_sec"] = {"per_session": 1, "per_day": 7200}


def epoch(at: str) -> float:
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


async def test_tick_interval_sets_the_in_flight_ticks_and_never_stops_the_sweepers_deadlines(tmp_path):
    passport = write_passport(tmp_path / "passport.json", mutate=one_second_sessions)
    async with agent_named_world(tmp_path, passport=passport, tick_interval=0, session_idle=1.0) as (
            running, mock, agent):
        assert running.runtime.sweep_interval_sec == 1.0  # governor run's sweeper: every second, whatever the option
        mock.default = Behaviour(hang=HANG)

        async def call(session: str, tick: float) -> tuple[object, float]:
            running.chain.policy = dataclasses.replace(running.chain.policy, tick_interval=tick)
            answer = await agent.post(f"{mock.base_url}/v1/chat/completions", headers={"ADL-Session": session},
                                      json={"model": "gpt-4o-mini", "max_tokens": 20,
                                            "messages": [{"role": "user", "content": "hi"}]})
            return answer, time.time()

        # a large value (its first in-flight tick would come after 60 s), and 0 (none): both calls at once
        large = asyncio.ensure_future(call("tick-60", 60.0))
        await asyncio.sleep(0.3)  # its call started (and its ticker) under 60 before the policy changes to 0
        (large_answer, large_at), (none_answer, none_at) = await asyncio.gather(large, call("tick-0", 0.0))
        cut_answer, cut_at = await call("tick-quarter", 0.25)

        records = {}
        deadline = time.monotonic() + 30
        for session in ("tick-60", "tick-0", "tick-quarter"):  # each ended idle by the sweeper
            path = running.settings.data_dir / "records" / f"{session}.json"
            while not path.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert path.exists(), f"{session}: the sweeper never ended the idle session"
            records[session] = json.loads(path.read_text())

    for session, answer, answered in (("tick-60", large_answer, large_at), ("tick-0", none_answer, none_at),
                                      ("tick-quarter", cut_answer, cut_at)):
        record = records[session]
        capped = [e for e in record["events"] if e["cause"] == "on_budget_exhausted"
                  and e.get("detail", {}).get("dimension") == "wall_clock_sec"]
        assert capped and record["outcome"] == "halted", (session, record["outcome"], record["events"])
        # the cap fired while the call was in flight: by the sweeper's tick (60, 0) or by an
        # in-flight tick (0.25), never only once the call had come back
        assert epoch(capped[0]["at"]) < answered, (session, capped[0], answered)
    # an in-flight tick's refusal cuts the call: the agent gets the refusal, not the answer
    assert cut_answer.status_code in (403, 429), cut_answer.text
    assert cut_answer.json()["error"]["governor"]["cause"] == "on_budget_exhausted", cut_answer.text
    # no in-flight tick came to the other two: the sweeper's halt does not cut a call in flight
    for answer in (large_answer, none_answer):
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"], answer.text
