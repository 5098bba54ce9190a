"""Rate limits per tumbling window (issue #32 item 7: per agent, per tool, fleet-wide across
replicas on Redis): read from the operator's configuration, drawn atomically before a step is
decided, refused with 429 and Retry-After (when the window rolls) and recorded in the session's
signed record; over the real runtime, the real proxy and a real redis-server shared by two
governors."""

from __future__ import annotations

import json

import httpx
import pytest

from governor.cli import UsageError, main as governor_cli
from governor.demo.mock_llm import MockLLM
from governor.evidence import KeyFiles, verify_record
from governor.policy import ModelCall, ToolCall
from governor.policy.rates import ON_GOVERNOR_RATE_LIMIT, RateLimitError, parse_rate_limit, parse_rate_limits
from governor.proxy.server import Settings, serve
from governor.store import MemoryStore
from governor.store.windows import LocalWindows, WindowCharge
from tests.test_runtime import NOW, Clock, make_runtime, model_step, pinned  # noqa: F401 (fixture)

CONTROL = "control-token-for-rate-limit-tests-0123456789"
CHAT = {"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


# --- reading limits ----------------------------------------------------------------------------

def test_limits_are_read_in_every_scope_and_unit():
    limits = parse_rate_limits(["agent:requests=60/1m, tool:search_papers:tool_calls=10/30s", "fleet:cost_usd=5/1h",
                                "tool:*:requests=3/1d", "agent:tokens=1000/90"])
    assert [(l.scope, l.tool, l.dimension, l.limit, l.window_sec) for l in limits] == [
        ("agent", None, "requests", 60, 60), ("tool", "search_papers", "tool_calls", 10, 30),
        ("fleet", None, "cost_usd", 5, 3600), ("tool", "*", "requests", 3, 86400), ("agent", None, "tokens", 1000, 90)]
    assert parse_rate_limit("agent:requests=60/1m").text() == "agent:requests=60/60s"


@pytest.mark.parametrize("text", [
    "", "agent", "agent:requests", "agent:requests=", "agent:requests=10", "agent:writes=10/1m", "user:requests=1/1m",
    "tool:tokens=1/1m", "tool:search:tokens=5/1m", "agent:search:requests=1/1m", "agent:requests=-1/1m",
    "agent:requests=1.5/1m", "agent:requests=nan/1m", "agent:requests=inf/1m", "agent:requests=1/0s",
    "agent:requests=1/0.5s", "agent:requests=1/8d", "agent:requests=1/1w", "tool:Bad-Name:requests=1/1m",
    "agent:requests=1e400/1m", "agent:requests=1/1m;DROP", "agent:requests=1/1m\nfleet:requests=1/1m",
])
def test_a_limit_that_cannot_be_read_is_refused_saying_why(text):
    with pytest.raises(RateLimitError, match="rate limit"):
        parse_rate_limit(text)


def test_two_limits_on_one_counter_and_non_text_entries_are_refused():
    with pytest.raises(RateLimitError, match="twice"):
        parse_rate_limits("agent:requests=1/1m,agent:requests=2/60s")
    with pytest.raises(RateLimitError, match="text"):
        parse_rate_limits([5])
    with pytest.raises(RateLimitError, match="list"):
        parse_rate_limits({"agent": 1})


def test_the_run_option_is_read_from_flag_environment_and_config(tmp_path):
    import argparse

    from governor.cli.run import register, resolve

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["run", "--rate-limit", "agent:requests=2/1m"])
    assert [l.text() for l in resolve(args, {}).rate_limits] == ["agent:requests=2/60s"]
    args = parser.parse_args(["run"])
    assert resolve(args, {"GOVERNOR_RATE_LIMITS": "fleet:tokens=10/1h"}).rate_limits[0].scope == "fleet"
    config = tmp_path / "config.yaml"
    config.write_text("rate_limit:\n  - agent:requests=1/1m\n  - tool:search_papers:tool_calls=1/1m\n")
    args = parser.parse_args(["run", "--config", str(config)])
    assert len(resolve(args, {}).rate_limits) == 2
    with pytest.raises(UsageError, match="--rate-limit"):
        resolve(parser.parse_args(["run", "--rate-limit", "agent:requests=many/1m"]), {})


# --- the window counters -----------------------------------------------------------------------

def test_a_take_is_all_or_nothing_and_the_window_rolls():
    windows = LocalWindows()
    a = WindowCharge("a:requests:60", 60, 1, 2)
    b = WindowCharge("t:search:60", 60, 1, 1)
    assert windows.take_window([a, b], 120.0).ok
    refused = windows.take_window([a, b], 130.0)  # b is full: a is not taken either
    assert not refused.ok and refused.failed == 1 and refused.observed == 1 and refused.rolls_at == 180.0
    assert windows.take_window([a], 131.0).ok  # a had 1: its second fits
    assert not windows.take_window([a], 132.0).ok
    assert windows.take_window([a, b], 180.0).ok  # the next window starts from zero
    windows.adjust_window([(a, 3, -1.0)])  # given back in its own window
    assert windows.take_window([a], 181.0).ok and windows.take_window([a], 182.0).ok  # 2 of 2
    windows.adjust_window([(a, 2, -5.0)])  # an old window: nothing changes now
    assert not windows.take_window([a], 183.0).ok


# --- the runtime ------------------------------------------------------------------------------

def runtime_with(pinned, tmp_path, clock, limits: str, store=None):
    rt = make_runtime(pinned, tmp_path, clock, store=store or MemoryStore())
    rt.limit_rates(parse_rate_limits(limits))
    return rt


def rate_events(record: dict) -> list[dict]:
    return [e for e in record["events"] if e["cause"] == ON_GOVERNOR_RATE_LIMIT]


async def test_a_full_window_refuses_with_when_it_rolls_and_is_recorded(pinned, tmp_path):
    clock = Clock(NOW - NOW % 60 + 10)  # 10 s into a minute
    rt = runtime_with(pinned, tmp_path, clock, "agent:requests=2/1m")
    for _ in range(2):
        assert not (await model_step(rt, "s", 100, 50)).decision.blocks
    refused = await model_step(rt, "s", 100, 50)
    assert refused.decision.blocks and refused.decision.cause == ON_GOVERNOR_RATE_LIMIT
    assert refused.governor_object["retry_after"] == 50 and refused.governor_object["retryable"] is True
    assert refused.governor_object["limit"] == 2 and refused.governor_object["observed"] == 2
    clock.t += 50  # the window rolled
    assert not (await model_step(rt, "s", 100, 50)).decision.blocks
    record = rt.record("s")
    assert verify_record(record, public_key=rt.key.public_key()).ok
    [event] = rate_events(record)
    assert event["detail"]["rate_limit"] == "agent:requests=2/60s" and event["detail"]["refused_step"] == "not_executed"
    assert event["action"] == "fallback"  # the refusal stands in for the step: nothing failed open
    await rt.close()


async def test_per_tool_limits_count_that_tool_only_and_a_refused_step_gives_its_draw_back(pinned, tmp_path):
    clock = Clock()
    rt = runtime_with(pinned, tmp_path, clock, "tool:search_papers:tool_calls=1/1h,agent:requests=3/1h")
    first = await rt.admit("s", ToolCall(tool="search_papers", arguments={"query": "a"}))
    assert not first.decision.blocks
    second = await rt.admit("s", ToolCall(tool="search_papers", arguments={"query": "b"}))
    assert second.decision.cause == ON_GOVERNOR_RATE_LIMIT and second.governor_object["tool"] == "search_papers"
    # a tool the passport does not grant is refused by the policy (the session halts): its draw on
    # requests is given back; the agent's limit goes on counting in its next session
    denied = await rt.admit("s", ToolCall(tool="format_disk", arguments={}))
    assert denied.decision.blocks and denied.decision.cause != ON_GOVERNOR_RATE_LIMIT
    other = [await rt.admit("s2", ToolCall(tool="read_note", arguments={"path": f"/workspace/notes/{i}.md"}))
             for i in range(3)]
    assert [a.decision.blocks for a in other] == [False, False, True]  # requests: 1 + 2 of 3, the denied one not
    assert other[2].decision.cause == ON_GOVERNOR_RATE_LIMIT
    await rt.close()


async def test_tokens_are_drawn_at_the_estimate_and_corrected_to_the_usage(pinned, tmp_path):
    rt = runtime_with(pinned, tmp_path, Clock(), "agent:tokens=1000/1h")
    # estimate 100 + 1000 = 1100 > 1000: refused before anything is used
    too_big = await model_step(rt, "s", 100, 50, expected_out=1000)
    assert too_big.decision.cause == ON_GOVERNOR_RATE_LIMIT and too_big.governor_object["projected"] == 1100
    for _ in range(5):  # each estimated 100 + 200 = 300, used 150: corrected, five fit in 1000 (not three)
        assert not (await model_step(rt, "s", 100, 50, expected_out=200)).decision.blocks
    refused = await model_step(rt, "s", 100, 50, expected_out=200)
    assert refused.decision.cause == ON_GOVERNOR_RATE_LIMIT and refused.governor_object["observed"] == 750
    await rt.close()


async def test_a_cost_limit_refuses_a_model_without_a_price(pinned, tmp_path):
    rt = runtime_with(pinned, tmp_path, Clock(), "agent:cost_usd=1/1h")
    admission = await rt.admit("s", ModelCall(model="no-such-model-x", expected_input_tokens=10,
                                              expected_output_tokens=10))
    assert admission.decision.cause == ON_GOVERNOR_RATE_LIMIT and "no price" in admission.decision.details["reason"]
    assert rate_events(rt.record("s"))
    await rt.close()


async def test_without_limits_nothing_is_drawn(pinned, tmp_path):
    rt = make_runtime(pinned, tmp_path, Clock(), store=MemoryStore())
    rt.limit_rates(())
    assert rt.rates is None
    await rt.close()


# --- Redis: one window for every replica ---------------------------------------------------------

@pytest.fixture
def redis_url():
    from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        pytest.skip(NOT_INSTALLED)
    server = RedisServer()
    yield server.url
    server.stop()


async def test_two_governors_on_one_redis_share_the_agent_and_fleet_windows(pinned, tmp_path, redis_url):
    from governor.store.redis import RedisStore

    clock = Clock(NOW - NOW % 3600 + 60)
    first = runtime_with(pinned, tmp_path / "a", clock, "agent:requests=3/1h,fleet:tokens=100000/1h",
                         store=RedisStore(redis_url))
    second = runtime_with(pinned, tmp_path / "b", clock, "agent:requests=3/1h,fleet:tokens=100000/1h",
                          store=RedisStore(redis_url))
    results = []
    for rt in (first, second, first, second):
        results.append((await model_step(rt, "s-" + str(id(rt)), 100, 50, expected_out=20)).decision.cause)
    assert results == [None, None, None, ON_GOVERNOR_RATE_LIMIT]
    refused = await model_step(first, "another", 1, 1, expected_out=1)
    assert refused.governor_object["retry_after"] == 3540
    # the fleet's token window holds the corrected usage of the three calls (150 each)
    import redis as redis_client

    keys = redis_client.Redis.from_url(redis_url, decode_responses=True).keys("*w:f:tokens*")
    assert len(keys) == 1
    assert float(redis_client.Redis.from_url(redis_url).get(keys[0])) == 450.0
    for rt in (first, second):
        await rt.close()
        rt.store.close()


def test_a_counter_edited_in_redis_is_never_read_as_zero_nor_overwritten(redis_url):
    """The store's side of tests/test_rate_limits_fleet.py's forged counters: a take naming one
    raises CounterDamaged, as a budget counter does (nothing taken, on any of its counters), an adjustment leaves
    it as found, and a sound counter charged twice in one take still counts both."""
    import redis as redis_client

    from governor.store.redis import RedisStore
    from governor.store import CounterDamaged

    store, server = RedisStore(redis_url), redis_client.Redis.from_url(redis_url, decode_responses=True)
    try:
        sound, forged = WindowCharge("a:1:x:requests:60", 60, 1, 5), WindowCharge("f:requests:60", 60, 1, 5)
        index = int(NOW // 60)
        assert store.take_window([sound, sound], NOW).ok and server.get(f"governor:w:{sound.counter}@{index}") == "2"
        for value in ("many", "nan", "-5", "inf", "1e999"):
            server.set(f"governor:w:{forged.counter}@{index}", value)
            with pytest.raises(CounterDamaged, match="is not a count") as caught:
                store.take_window([sound, forged], NOW)
            assert caught.value.key == f"governor:w:{forged.counter}@{index}" and caught.value.found == value
            store.adjust_window([(forged, index, -1.0), (sound, index, 1.0)])
            assert server.get(f"governor:w:{forged.counter}@{index}") == value  # left as found
        assert server.get(f"governor:w:{sound.counter}@{index}") == "7"  # 2, and +1 per adjustment; no take
        server.delete(f"governor:w:{forged.counter}@{index}")
        server.hset(f"governor:w:{forged.counter}@{index}", "n", "1")
        with pytest.raises(CounterDamaged, match="type hash"):
            store.take_window([forged], NOW)
        store.adjust_window([(forged, index, 1.0)])  # another type: left as found, no error
        assert server.hgetall(f"governor:w:{forged.counter}@{index}") == {"n": "1"}
    finally:
        server.close()
        store.close()


async def test_a_rate_limit_on_an_unreachable_redis_is_refused_as_retryable_and_recorded(pinned, tmp_path, redis_url):
    from governor.store.redis import RedisStore

    store = RedisStore(redis_url + "?timeout=0.5")
    rt = runtime_with(pinned, tmp_path, Clock(), "agent:requests=3/1h", store=store)
    assert not (await model_step(rt, "s", 10, 5, expected_out=5)).decision.blocks
    import redis as redis_client

    redis_client.Redis.from_url(redis_url).shutdown(nosave=True)
    refused = await rt.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=1, expected_output_tokens=1))
    assert refused.decision.blocks and refused.governor_object.get("retryable") is True
    await rt.close(end_sessions=False)


async def test_a_rate_limit_on_a_redis_that_lost_its_data_fails_closed_as_a_budget_does(pinned, tmp_path, redis_url):
    """The rate limits' window and a budget's reservation take one route to the record
    (runtime/refusals.store_refusal): a Redis emptied under the governor is a loss, refused as a
    governor error (the session halted, as the budget path halts it), not as a retryable outage
    (which the window's path answered until session 21)."""
    import redis as redis_client

    from governor.store.redis import RedisStore

    rt = runtime_with(pinned, tmp_path, Clock(), "agent:requests=3/1h", store=RedisStore(redis_url))
    assert not (await model_step(rt, "s", 10, 5, expected_out=5)).decision.blocks
    redis_client.Redis.from_url(redis_url).flushall()
    refused = await rt.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=1, expected_output_tokens=1))
    assert refused.decision.blocks and refused.decision.cause == "on_governor_error"
    assert refused.decision.action.value == "halt" and refused.governor_object.get("retryable") is not True
    assert "lost" in refused.decision.details["error"]
    await rt.close(end_sessions=False)


# --- the proxy: 429, Retry-After, the record -----------------------------------------------------

@pytest.fixture
async def llm():
    mock = MockLLM(prompt_tokens=100, completion_tokens=50)
    await mock.start()
    yield mock
    await mock.stop()


async def test_over_the_limit_the_agent_gets_429_with_retry_after_and_the_record_says_so(tmp_path, llm, capsys):
    running = await serve(Settings(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), data_dir=tmp_path / "data",
                                   tick_interval=0, control_token=CONTROL,
                                   rate_limits=parse_rate_limits("agent:requests=2/1h")))
    agent = httpx.AsyncClient(proxy=running.proxy_url, trust_env=False, timeout=30)
    control = httpx.AsyncClient(base_url=running.control_url, trust_env=False, timeout=30,
                                headers={"Authorization": f"Bearer {CONTROL}"})
    try:
        opened = (await control.post("/v1/sessions", json={"label": "rates"})).json()
        headers = {"ADL-Session": opened["token"]}
        statuses = [(await agent.post(f"{llm.url}/chat/completions", json=CHAT, headers=headers)) for _ in range(3)]
        assert [a.status_code for a in statuses] == [200, 200, 429]
        refused = statuses[2]
        assert 1 <= int(refused.headers["retry-after"]) <= 3600
        assert refused.headers["x-should-retry"] == "true" and refused.headers["adl-governor-action"] == "deny"
        governor = refused.json()["error"]["governor"]
        assert governor["cause"] == ON_GOVERNOR_RATE_LIMIT and governor["rate_limit"] == "agent:requests=2/3600s"
        assert llm.served == 2  # the refused call never went upstream
        # hostile: a body that is not JSON is refused by its adapter, not counted against the window
        junk = await agent.post(f"{llm.url}/chat/completions", content=b"{not json", headers=headers)
        assert junk.status_code == 400
        record = (await control.get(f"/v1/sessions/{opened['session']}/record")).json()
        [event] = rate_events(record)
        assert event["detail"]["observed"] == 2 and event["detail"]["retry_after"] >= 1 and event["action"] == "fallback"
        path = tmp_path / "record.json"
        path.write_text(json.dumps(record))
        capsys.readouterr()
        keys = KeyFiles(running.settings.data_dir / "keys")
        assert governor_cli(["verify", str(path), "--offline", "--key", str(keys.public_key)]) == 3  # pinned key: INCOMPLETE
    finally:
        await agent.aclose()
        await control.aclose()
        await running.stop()


def test_windows_and_announcements_on_a_redis_cluster_run_in_the_stores_slot(tmp_path):
    """On Redis Cluster the store's prefix is a hash tag: every window counter lives in the
    fence's slot, so a take touching several counters is one script on one node."""
    from tests.redis_server import NOT_INSTALLED, REDIS_SERVER
    from tests.redis_topology import cluster

    if REDIS_SERVER is None:
        pytest.skip(NOT_INSTALLED)
    from governor.store.redis import RedisStore

    with cluster(tmp_path / "cluster") as c:
        first, second = RedisStore(c.url("timeout=2")), RedisStore(c.url("timeout=2"))
        try:
            limits = parse_rate_limits("agent:requests=3/1h,fleet:requests=4/1h,tool:*:tool_calls=2/1h")
            charges = [WindowCharge(l.counter("agent-x", "search"), l.window_sec, 1, l.limit) for l in limits]
            answers = [store.take_window(charges, NOW).ok for store in (first, second, first, second)]
            assert answers == [True, True, False, False]  # the tool's 2 per hour, across both
            other_tool = [WindowCharge(l.counter("agent-x", "fetch"), l.window_sec, 1, l.limit) for l in limits]
            assert second.take_window(other_tool, NOW).ok  # agent 3 of 3, fleet 3 of 4
            refused = first.take_window(other_tool, NOW)
            assert not refused.ok and refused.failed == 0 and refused.observed == 3
            assert first.prefix.startswith("{") and first.announce("i-1", {"instance": "i-1"}, 5) == []
            assert second.announce("i-2", {"instance": "i-2"}, 5) == [{"instance": "i-1"}]
        finally:
            first.close()
            second.close()
