"""The statistical envelope on a real redis-server: the Lua fold against the pure module, and
two governors (two runtimes, two RedisStores, one agent) feeding one envelope, so a burst that
neither governor's own share makes is seen fleet-wide, halts a session on either, and one reset
clears it for both."""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from governor.policy import ModelCall
from governor.policy.envelope import METRICS, EnvelopeConfig
from governor.store.redis import RedisStore
from governor.store.envelope_books import EnvelopeBook, open_envelope_book
from governor.store.redis_envelope import RedisEnvelopeBook
from tests.redis_server import redis_url  # noqa: F401  (fixture)
from tests.test_envelope_runtime import BASE, WINDOW, Clock, model_calls, pinned, runtime_at_r3  # noqa: F401

CONFIG = EnvelopeConfig(window_sec=WINDOW, k=4.0, min_windows=3)


def test_the_lua_fold_is_the_pure_fold(redis_url):  # noqa: F811
    rng = random.Random(7)
    local = EnvelopeBook()
    with RedisStore(redis_url, prefix=f"test-{uuid.uuid4().hex}:") as store:
        remote = open_envelope_book(store)
        assert isinstance(remote, RedisEnvelopeBook)
        t = BASE
        for _ in range(400):
            t += rng.choice([0.5, 3.0, 20.0, WINDOW, 3 * WINDOW, -2 * WINDOW])  # backwards too: skew
            counts = {m: rng.choice([0, 1, 2.5, 1e6, 0.000123]) for m in rng.sample(METRICS, rng.randint(0, 4))}
            counts = {m: v for m, v in counts.items() if v}
            tools = {rng.choice(["a", "b", "c"]): rng.randint(1, 3)} if rng.random() < 0.5 else {}
            a, closed_a = local.feed("agent", CONFIG, t, counts, tools)
            b, closed_b = remote.feed("agent", CONFIG, t, counts, tools)
            assert (closed_a is None) == (closed_b is None)
            if closed_a is not None:
                assert closed_a.index == closed_b.index and closed_a.tools == closed_b.tools
                assert closed_a.counts == pytest.approx(closed_b.counts)
            assert a.window == b.window and a.tools == b.tools and a.tool_history == b.tool_history
            assert a.counts == pytest.approx(b.counts)
            assert set(a.stats) == set(b.stats)
            for m in a.stats:
                assert a.stats[m].n == b.stats[m].n
                assert a.stats[m].mean == pytest.approx(b.stats[m].mean, rel=1e-12)
                assert a.stats[m].m2 == pytest.approx(b.stats[m].m2, rel=1e-9, abs=1e-9)
        # the sticky mark: the first stands; reset clears it and says what it cleared
        assert remote.mark("agent", {"id": "one"})["id"] == "one"
        assert remote.mark("agent", {"id": "two"})["id"] == "one"
        assert remote.load("agent").deviation == {"id": "one"}
        assert remote.reset("agent") == {"id": "one"} and remote.reset("agent") is None


async def test_two_governors_feed_one_envelope(pinned, tmp_path, redis_url):  # noqa: F811
    prefix = f"test-{uuid.uuid4().hex}:"
    clock = Clock(BASE)
    a = runtime_at_r3(pinned, tmp_path / "a", clock, store=RedisStore(redis_url, prefix=prefix))
    b = runtime_at_r3(pinned, tmp_path / "b", clock, store=RedisStore(redis_url, prefix=prefix))
    for rt in (a, b):
        rt.envelope.config = CONFIG
    try:
        for w in range(4):  # each governor one call a window: the fleet's mean is 2
            clock.t = BASE + w * WINDOW + 1
            for name, rt in (("a", a), ("b", b)):
                assert not (await model_calls(rt, f"calm-{name}-{w}", 1)).decision.blocks
        # 4 + 4: each governor alone stays within 1 + 4 * 1, the fleet's 8 is beyond 2 + 4 * 1
        clock.t = BASE + 4 * WINDOW + 1
        for name, rt in (("a", a), ("b", b)):
            assert not (await model_calls(rt, f"burst-{name}", 4)).decision.blocks
        # Both tallies in the shared book before the clock moves on: a flush a runtime scheduled
        # in window 4 and ran in window 5 would close the window itself, and the other runtime
        # would learn the deviation at its next flush (FLUSH_SEC later), not at its next step.
        for rt in (a, b):
            await rt.envelope.flush()
        await asyncio.sleep(0.05)  # the flushes each observed step scheduled, run in window 4
        clock.t = BASE + 5 * WINDOW + 1
        on_b = await b.admit("next-b", ModelCall(model="gpt-4o-mini", expected_input_tokens=1, expected_output_tokens=1))
        assert on_b.decision.halts and on_b.governor_object["cause"] == "on_anomaly"
        on_a = await a.admit("next-a", ModelCall(model="gpt-4o-mini", expected_input_tokens=1, expected_output_tokens=1))
        assert on_a.decision.halts and on_a.governor_object["cause"] == "on_anomaly"
        record = await a.end_session("next-a")
        (event,) = [e for e in record["events"] if e["cause"] == "on_anomaly"]
        spike = next(d for d in event["detail"]["deviations"] if d.get("metric") == "requests")
        assert spike["observed"] == 8 and spike["baseline"]["mean"] == 2.0 and spike["baseline"]["windows"] == 4
        # the principal resets it on one governor: the other learns it at its next flush
        assert (await a.envelope.reset("principal"))["reset"] is True
        clock.t += 2
        assert not (await model_calls(b, "after-b", 1)).decision.blocks
        assert not (await model_calls(a, "after-a", 1)).decision.blocks
    finally:
        await a.close()
        await b.close()
