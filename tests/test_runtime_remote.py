"""The runtime on a real redis-server: the usual model call admitted and settled with one
round trip each on the store's asyncio client (no thread), the session's lock free while it
waits, caps holding across replicas, and the full round taking over when it must."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid

import pytest
import redis

from governor.policy import ModelCall, Tick, UsageReport
from governor.policy.steps import ON_BUDGET_EXHAUSTED, ON_GOVERNOR_ERROR
from tests.redis_server import NOT_INSTALLED, REDIS_SERVER, RedisServer, redis_url  # noqa: F401  (fixture)
from tests.test_runtime import Clock, make_runtime, metric, model_step, pinned  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=NOT_INSTALLED)

from governor.store.redis import RedisStore  # noqa: E402  (after the skip: needs the client only)

DAY_TOKENS = ("per_day", None, "tokens")


def evalsha_calls(url: str) -> int:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    finally:
        client.close()


def call(expected_out: int = 100) -> ModelCall:
    return ModelCall(model="gpt-4o-mini", expected_input_tokens=100, expected_output_tokens=expected_out)


@pytest.fixture
def own_server():
    server = RedisServer()
    yield server
    server.stop()  # continued first if a test stopped it


async def test_a_model_call_is_one_round_trip_to_admit_and_one_to_settle_without_a_thread(
        pinned, tmp_path, redis_url, monkeypatch):
    clock = Clock()
    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(redis_url + "?sessions=local", prefix=f"t-{uuid.uuid4().hex}:"))
    try:
        assert rt.remote is not None
        await model_step(rt, "s", 100, 50, expected_out=100)  # opens the session (its journal, from a thread)
        await rt.remote.drain()  # its settlement, queued on the pipeline without awaiting, sent
        threads = []
        real_to_thread = asyncio.to_thread

        async def counted(fn, *args, **kwargs):
            threads.append(getattr(fn, "__qualname__", repr(fn)))
            return await real_to_thread(fn, *args, **kwargs)

        monkeypatch.setattr(asyncio, "to_thread", counted)
        before = evalsha_calls(redis_url)
        clock.t += 1
        admission = await rt.admit("s", call())
        assert not admission.decision.blocks and admission.ticket.reservation
        assert evalsha_calls(redis_url) - before == 1  # the snapshot and the reservation together
        await rt.usage("s", admission.ticket, UsageReport(model="gpt-4o-mini", input_tokens=100, output_tokens=40))
        await rt.finish("s", admission.ticket)
        await rt.remote.drain()  # the settlement is queued, not awaited by the call
        assert evalsha_calls(redis_url) - before == 2  # and the commit
        assert threads == []
        live = rt._sessions["s"]
        assert live.state.in_flight == 0 and live.state.iterations == 2
        view = await rt.session_view("s")
        used = {(b["dimension"], b["scope"]): b["used"] for b in view["budgets"] if b["persona"] is None}
        assert used[("tokens", "per_session")] == 150 + 140  # what was used, not what was reserved
    finally:
        await rt.close(end_sessions=False)
        rt.store.close()


async def test_the_session_lock_is_free_while_a_step_waits_on_redis(pinned, tmp_path, own_server):
    clock = Clock()
    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(own_server.url + "?sessions=local", timeout=5.0))
    try:
        await model_step(rt, "s", 100, 50, expected_out=100)
        live = rt._sessions["s"]
        os.kill(own_server.process.pid, signal.SIGSTOP)
        try:
            waiting = [asyncio.create_task(rt.admit("s", call())) for _ in range(3)]
            await asyncio.sleep(0.3)
            assert not any(task.done() for task in waiting)
            assert not live.lock.locked()  # three steps wait on the network, none holds the session
        finally:
            os.kill(own_server.process.pid, signal.SIGCONT)
        admitted = await asyncio.wait_for(asyncio.gather(*waiting), 10)
        assert all(not a.decision.blocks for a in admitted)
        assert live.state.in_flight == 3
        for a in admitted:
            await rt.finish("s", a.ticket)  # never settled: released
        assert live.state.in_flight == 0
        assert rt.store.snapshot(rt.agent_id, "s", clock.t, [("per_session", None, "tokens")]) == {
            ("per_session", None, "tokens"): 150.0}
    finally:
        await rt.close(end_sessions=False)
        rt.store.close()


async def test_two_replicas_admitting_at_once_hold_the_per_day_cap(pinned, tmp_path, redis_url):
    """32 calls at once, 16 through each of two runtimes on one Redis, each in its own
    session: the per_day token cap (200000) admits exactly 20 of 10000 tokens."""
    prefix = f"t-{uuid.uuid4().hex}:"
    clock = Clock()
    replicas = [make_runtime(pinned, tmp_path / f"r{i}", clock, store=RedisStore(redis_url + "?sessions=local", prefix=prefix))
                for i in range(2)]
    try:
        admissions = await asyncio.gather(*(replicas[i % 2].admit(f"s{i}", call(expected_out=9900))
                                            for i in range(32)))
        admitted = [a for a in admissions if not a.decision.blocks]
        refused = [a for a in admissions if a.decision.blocks]
        assert len(admitted) == 20 and len(refused) == 12
        assert all(a.governor_object["cause"] == ON_BUDGET_EXHAUSTED for a in refused)
        assert replicas[0].store.snapshot(replicas[0].agent_id, "x", clock.t, [DAY_TOKENS]) == {DAY_TOKENS: 200000.0}
    finally:
        for rt in replicas:
            await rt.close(end_sessions=False)
            rt.store.close()


async def test_a_call_that_must_be_recorded_goes_through_the_full_round_and_holds_one_reservation(
        pinned, tmp_path, redis_url):
    """A call past the per_session cap: the fast path's reservation is refused by Redis, the
    full round decides, records the exhaustion and reserves nothing; a call that fits after
    it in another session is quiet again."""
    clock = Clock()
    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(redis_url + "?sessions=local", prefix=f"t-{uuid.uuid4().hex}:"))
    try:
        big = await rt.admit("s", call(expected_out=25000))
        assert big.decision.halts and big.governor_object["cause"] == ON_BUDGET_EXHAUSTED
        record = await rt.end_session("s")
        assert [e["cause"] for e in record["events"]] == [ON_BUDGET_EXHAUSTED]
        assert rt.store.snapshot(rt.agent_id, "s", clock.t, [DAY_TOKENS]) == {DAY_TOKENS: 0.0}
        small = await rt.admit("t", call())
        assert not small.decision.blocks
        assert rt.store.snapshot(rt.agent_id, "t", clock.t, [DAY_TOKENS]) == {DAY_TOKENS: 200.0}
    finally:
        await rt.close(end_sessions=False)
        rt.store.close()


async def test_redis_down_refuses_the_call_as_retryable_and_records_it(pinned, tmp_path, own_server):
    clock = Clock()
    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(own_server.url + "?timeout=0.3&sessions=local"))
    try:
        await model_step(rt, "s", 100, 50, expected_out=100)
        os.kill(own_server.process.pid, signal.SIGSTOP)
        try:
            refused = await asyncio.wait_for(rt.admit("s", call()), 10)
        finally:
            os.kill(own_server.process.pid, signal.SIGCONT)
        assert refused.decision.blocks and not refused.decision.halts
        assert refused.governor_object["cause"] == ON_GOVERNOR_ERROR and refused.governor_object["retryable"]
        assert rt._sessions["s"].state.in_flight == 0

        await asyncio.sleep(0.2)
        again = await asyncio.wait_for(rt.admit("s", call()), 10)  # the session goes on
        assert not again.decision.blocks
        await rt.finish("s", again.ticket)
        record = await rt.end_session("s")
        assert [e["cause"] for e in record["events"]][0] == ON_GOVERNOR_ERROR  # the refusal was recorded
    finally:
        await rt.close(end_sessions=False)
        rt.store.close()


@pytest.mark.parametrize("outage", ["stopped", "paused"])
async def test_a_settlement_that_fails_after_the_response_is_recorded_and_settled_by_the_next_step(
        pinned, tmp_path, own_server, outage):
    """The settlement is queued, not awaited: the call's usage decided at once. Redis stops
    answering before the COMMIT's reply (SIGSTOP: the COMMIT may still run when it
    continues; CLIENT PAUSE WRITE: it never runs, its client gone): the failure is journaled,
    the reservation keeps counting what it reserved, the next step is refused as retryable
    while Redis is down, and once it answers the reservation is settled at what was used,
    once, and the session goes on."""
    clock = Clock()
    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(own_server.url + "?timeout=0.3&sessions=local",
                                                                prefix=f"t-{uuid.uuid4().hex}:"))
    observer = redis.Redis.from_url(own_server.url)
    tokens = [("per_session", None, "tokens")]

    def down() -> None:
        if outage == "stopped":
            os.kill(own_server.process.pid, signal.SIGSTOP)
        else:
            observer.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")

    def up() -> None:
        if outage == "stopped":
            os.kill(own_server.process.pid, signal.SIGCONT)
        else:
            observer.execute_command("CLIENT", "UNPAUSE")

    try:
        await model_step(rt, "s", 100, 50, expected_out=100)
        live = rt._sessions["s"]
        clock.t += 1
        admission = await rt.admit("s", call())
        assert not admission.decision.blocks
        down()
        try:
            settled = await rt.usage("s", admission.ticket, UsageReport(model="gpt-4o-mini", input_tokens=100,
                                                                        output_tokens=40))
            assert not settled.blocks and live.state.in_flight == 0  # decided at once, the COMMIT queued
            await rt.finish("s", admission.ticket)
            await asyncio.wait_for(rt.remote.drain(), 5)  # its failure read (the socket timeout) and journaled
            assert len(live.unsettled) == 1 and live.unsettled[0][1] == settled.charges  # kept to settle again
            refused = await asyncio.wait_for(rt.admit("s", call()), 10)  # the full round, on a store that is down
        finally:
            up()
        assert refused.decision.blocks and not refused.decision.halts
        assert refused.governor_object["cause"] == ON_GOVERNOR_ERROR and refused.governor_object["retryable"]
        assert len(live.unsettled) == 1  # still held: settled once the store answers
        held = rt.store.snapshot(rt.agent_id, "s", clock.t, tokens)[tokens[0]]
        if outage == "paused":  # the reservation counts what it reserved (more than the 140 used) until then
            assert held > 150 + 140
        clock.t += 1
        again = await asyncio.wait_for(rt.admit("s", call()), 10)
        assert not again.decision.blocks and live.unsettled == []
        await rt.finish("s", again.ticket)  # never used: released
        assert rt.store.snapshot(rt.agent_id, "s", clock.t, tokens) == {tokens[0]: 150 + 140}  # settled once
        record = await rt.end_session("s")
        failed = [e for e in record["events"] if e["cause"] == ON_GOVERNOR_ERROR]
        assert failed[0]["action"] == "continue" and failed[0]["detail"]["deferred_settlement"] is True
        assert failed[0]["detail"]["fail_closed"] is False  # a note: the call was answered, nothing refused
        assert "once the call was answered" in failed[0]["detail"]["reason"] and len(failed) == 2  # and the refusal
    finally:
        observer.close()
        await rt.close(end_sessions=False)
        rt.store.close()


async def test_on_a_shared_session_calls_at_once_chain_their_scripts_in_one_write(pinned, tmp_path, redis_url):
    """Shared sessions (runtime/shared_fast.py): three calls admitted at once on one session
    each decide on the version the script before theirs will leave, and go in one write with
    no conflict; their settlements too, decided at once and not awaited; the saved state is
    what the six scripts left."""
    from governor.runtime.shared_fast import SharedFastSteps

    clock = Clock()
    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(redis_url, prefix=f"t-{uuid.uuid4().hex}:"))
    try:
        assert isinstance(rt.remote, SharedFastSteps)
        await model_step(rt, "s", 100, 50, expected_out=100)  # opens the session: its version known here
        await rt.remote.drain()  # its settlement, queued without awaiting, sent
        live, counters = rt._sessions["s"], rt.store.counters()
        batches = counters.pipeline.batches
        clock.t += 1
        admissions = await asyncio.gather(*(rt.admit("s", call()) for _ in range(3)))
        assert all(not a.decision.blocks and a.ticket.reservation for a in admissions)
        assert counters.pipeline.batches - batches == 1  # chained: one write, no conflict (a conflict is a trip)
        assert live.state.in_flight == 3
        await asyncio.gather(*(rt.usage("s", a.ticket, UsageReport(model="gpt-4o-mini", input_tokens=100,
                                                                   output_tokens=40)) for a in admissions))
        assert live.state.in_flight == 0 and live.state.iterations == 4  # decided at once, the scripts queued
        await rt.remote.drain()
        assert counters.pipeline.batches - batches == 2 and live.unsettled == []  # one write, no conflict
        saved = json.loads(redis.Redis.from_url(redis_url).get(f"{rt.store.prefix}st:s"))
        assert saved["in_flight"] == 0 and saved["iterations"] == 4  # every script's state saved, none lost
    finally:
        await rt.close(end_sessions=False)
        rt.store.close()


async def test_a_shared_settlement_that_conflicts_after_the_response_is_decided_again_and_applied_once(
        pinned, tmp_path, redis_url):
    """Shared sessions settle without awaiting the store (runtime/shared_fast.py): the
    settlement is decided on the state this replica predicted and queued. Another writer saved
    the session's state meanwhile (a version this replica never saw): the script's optimistic
    check refuses it, and after the response the settlement is decided again on the state as
    it stands and applied, once, with no failure recorded."""
    clock = Clock()
    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(redis_url, prefix=f"t-{uuid.uuid4().hex}:"))
    server = redis.Redis.from_url(redis_url)
    tokens = [("per_session", None, "tokens")]
    try:
        await model_step(rt, "s", 100, 50, expected_out=100)
        await rt.remote.drain()
        live, key = rt._sessions["s"], f"{rt.store.prefix}st:s"
        clock.t += 1
        admission = await rt.admit("s", call())
        assert not admission.decision.blocks
        saved = json.loads(server.get(key))
        server.set(key, json.dumps(saved, indent=1))  # the same state, other bytes: another version
        settled = await rt.usage("s", admission.ticket, UsageReport(model="gpt-4o-mini", input_tokens=100,
                                                                    output_tokens=40))
        assert not settled.blocks and live.state.in_flight == 0  # decided at once, on the predicted state
        assert json.loads(server.get(key))["in_flight"] == 1  # its script queued, not yet run: not awaited
        await rt.finish("s", admission.ticket)
        await asyncio.wait_for(rt.remote.drain(), 10)  # the conflict read, decided again, applied
        assert live.unsettled == []
        after = json.loads(server.get(key))
        assert after["in_flight"] == 0 and after["iterations"] == saved["iterations"]
        assert rt.store.snapshot(rt.agent_id, "s", clock.t, tokens) == {tokens[0]: 150 + 140}  # settled once, as used
        again = await asyncio.wait_for(rt.admit("s", call()), 10)  # the session goes on
        assert not again.decision.blocks
        await rt.finish("s", again.ticket)
        record = await rt.end_session("s")
        assert ON_GOVERNOR_ERROR not in [e["cause"] for e in record["events"]]  # it applied: no failure recorded
    finally:
        server.close()
        await rt.close(end_sessions=False)
        rt.store.close()


async def paused_settlement(rt, observer, clock) -> dict:
    """One call settled while Redis holds writes (CLIENT PAUSE WRITE: the queued settlement never
    runs, its client gone after the socket timeout), the next call refused while it does, the
    one after it once it answers; the session's record."""
    tokens = [("per_session", None, "tokens")]
    await model_step(rt, "s", 100, 50, expected_out=100)
    await rt.remote.drain()
    live = rt._sessions["s"]
    clock.t += 1
    admission = await rt.admit("s", call())
    assert not admission.decision.blocks
    observer.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
    try:
        settled = await rt.usage("s", admission.ticket, UsageReport(model="gpt-4o-mini", input_tokens=100,
                                                                    output_tokens=40))
        assert not settled.blocks and live.state.in_flight == 0  # decided at once, the settlement queued
        await rt.finish("s", admission.ticket)
        await asyncio.wait_for(rt.remote.drain(), 15)  # its failure read, its note recorded
        assert [late.charges for late in live.unsettled] == [settled.charges]  # kept to settle again
        refused = await asyncio.wait_for(rt.admit("s", call()), 10)  # settled again first: fails, kept
        assert len(live.unsettled) == 1
    finally:
        observer.execute_command("CLIENT", "UNPAUSE")
    assert refused.decision.blocks and not refused.decision.halts
    assert refused.governor_object["cause"] == ON_GOVERNOR_ERROR and refused.governor_object["retryable"]
    # never settled yet: the reservation counts the 200 it reserved, not the 140 used
    assert rt.store.snapshot(rt.agent_id, "s", clock.t, tokens) == {tokens[0]: 150 + 200}
    clock.t += 1
    again = await asyncio.wait_for(rt.admit("s", call()), 10)  # settled first, then the session goes on
    assert not again.decision.blocks and live.unsettled == []
    await rt.finish("s", again.ticket)  # never used: released
    assert rt.store.snapshot(rt.agent_id, "s", clock.t, tokens) == {tokens[0]: 150 + 140}  # settled once, as used
    return await rt.end_session("s")


async def test_a_settlement_redis_does_not_take_after_the_response_takes_one_route_in_both_session_modes(
        pinned, tmp_path, own_server):
    """Local and shared sessions (runtime/late_settlement.py): a settlement queued after the
    response that Redis does not take (CLIENT PAUSE WRITE) is recorded as the same note in
    both, its reservation counts what it reserved, and the session's next step settles it
    again once Redis answers (the shared session's saved state gets it too), once."""
    observer = redis.Redis.from_url(own_server.url)
    notes = {}
    try:
        for sessions in ("local", "shared"):
            clock = Clock()
            prefix = f"t-{uuid.uuid4().hex}:"
            rt = make_runtime(pinned, tmp_path / sessions, clock, store=RedisStore(
                own_server.url + "?timeout=0.3" + ("&sessions=local" if sessions == "local" else ""), prefix=prefix))
            try:
                record = await paused_settlement(rt, observer, clock)
                if sessions == "shared":
                    saved = json.loads(observer.get(f"{prefix}st:s"))
                    assert saved["in_flight"] == 0 and saved["iterations"] == 3  # the settlement reached it
            finally:
                await rt.close(end_sessions=False)
                rt.store.close()
            failed = [e for e in record["events"] if e["cause"] == ON_GOVERNOR_ERROR]
            assert len(failed) == 2 and failed[1]["detail"]["retryable"] is True, failed  # the note, the refusal
            notes[sessions] = failed[0]
    finally:
        observer.close()
    local, shared = notes["local"], notes["shared"]
    assert local["action"] == shared["action"] == "continue"
    assert set(local) == set(shared) and set(local["detail"]) == set(shared["detail"])  # one shape
    for key in ("step", "fail_closed", "deferred_settlement", "reason"):
        assert local["detail"][key] == shared["detail"][key], key
    assert local["detail"]["fail_closed"] is False and local["detail"]["deferred_settlement"] is True
    assert "once the call was answered" in local["detail"]["reason"]


async def test_a_shared_settlement_awaited_while_redis_holds_writes_takes_the_same_route(pinned, tmp_path, own_server):
    """Two calls in flight on a shared session when Redis holds writes: the first one's
    settlement is queued and fails after its response; the second's is then awaited (the
    session has one unsettled) and fails too. Both take the one route: two notes, no usage
    refused, each reservation settled at what was used by the next step once Redis answers,
    and the saved state has both slots freed."""
    clock = Clock()
    prefix = f"t-{uuid.uuid4().hex}:"
    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(own_server.url + "?timeout=0.3", prefix=prefix))
    observer = redis.Redis.from_url(own_server.url)
    tokens = [("per_session", None, "tokens")]
    used = UsageReport(model="gpt-4o-mini", input_tokens=100, output_tokens=40)
    try:
        await model_step(rt, "s", 100, 50, expected_out=100)
        await rt.remote.drain()
        live = rt._sessions["s"]
        clock.t += 1
        first, second = await asyncio.gather(rt.admit("s", call()), rt.admit("s", call()))
        assert not first.decision.blocks and not second.decision.blocks
        observer.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        try:
            assert not (await rt.usage("s", first.ticket, used)).blocks  # queued
            await asyncio.wait_for(rt.remote.drain(), 15)  # its failure read: one unsettled
            assert len(live.unsettled) == 1
            settled = await asyncio.wait_for(rt.usage("s", second.ticket, used), 15)  # awaited, and failed
            assert not settled.blocks and second.ticket.reservation is None
            await asyncio.wait_for(rt.remote.drain(), 15)
            assert len(live.unsettled) == 2 and live.state.in_flight == 0
        finally:
            observer.execute_command("CLIENT", "UNPAUSE")
        for admission in (first, second):
            await rt.finish("s", admission.ticket)  # claimed by the settlements: releases nothing
        assert rt.store.snapshot(rt.agent_id, "s", clock.t, tokens) == {tokens[0]: 150 + 2 * 200}  # as reserved
        clock.t += 1
        again = await asyncio.wait_for(rt.admit("s", call()), 10)  # both settled first, then the session goes on
        assert not again.decision.blocks and live.unsettled == []
        await rt.finish("s", again.ticket)
        assert rt.store.snapshot(rt.agent_id, "s", clock.t, tokens) == {tokens[0]: 150 + 2 * 140}  # as used, once
        assert json.loads(observer.get(f"{prefix}st:s"))["in_flight"] == 0
        record = await rt.end_session("s")
        failed = [e for e in record["events"] if e["cause"] == ON_GOVERNOR_ERROR]
        assert [e["detail"].get("deferred_settlement") for e in failed] == [True, True], failed  # two notes only
    finally:
        observer.close()
        await rt.close(end_sessions=False)
        rt.store.close()


async def test_a_shared_step_waits_for_its_own_replicas_round_before_sending_its_script(pinned, tmp_path, redis_url):
    """While a round of this replica holds the session (a tick, another step's full round: its
    lock), the one-round-trip admission sends nothing (its script would only meet the round's
    hold); after the round it is admitted with one script, on the state the round left."""
    clock = Clock()
    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(redis_url, prefix=f"t-{uuid.uuid4().hex}:"))
    try:
        await model_step(rt, "s", 100, 50, expected_out=100)
        await rt.remote.drain()
        live, counters = rt._sessions["s"], rt.store.counters()
        batches = counters.pipeline.batches
        clock.t += 1
        async with live.lock:  # a round in progress
            admitting = asyncio.ensure_future(rt.admit("s", call()))
            await asyncio.sleep(0.05)
            assert not admitting.done() and counters.pipeline.batches == batches  # waiting, nothing sent
        admission = await asyncio.wait_for(admitting, 10)
        assert not admission.decision.blocks and admission.ticket.reservation
        assert counters.pipeline.batches - batches == 1 and live.state.in_flight == 1  # one script, no conflict
        await rt.finish("s", admission.ticket)
    finally:
        await rt.close(end_sessions=False)
        rt.store.close()


async def test_calls_at_once_that_all_meet_another_writers_state_conflict_once_each_then_chain(
        pinned, tmp_path, redis_url):
    """Another writer saved the shared session's state (a version this replica never saw) and
    four calls (the passport's max_concurrent) are admitted at once: their scripts, chained on
    the old version, all conflict, and their replies all bring the same state. The first step
    adopts it and queues its script again on it; the next three keep that prediction and queue
    behind it (adopting the same bytes again would undo it: one step a wave got through,
    4+3+2+1 conflicts; with 32 calls on a hot session, many then out of tries). One
    conflict a call, two writes, no full round; the saved state counts every call once. The
    runtime's metrics count the conflicts and the rounds (governor_shared_*_total)."""
    clock = Clock()
    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(redis_url, prefix=f"t-{uuid.uuid4().hex}:"))
    server = redis.Redis.from_url(redis_url)
    try:
        await model_step(rt, "s", 100, 50, expected_out=100)
        await rt.remote.drain()
        live, counters, key = rt._sessions["s"], rt.store.counters(), f"{rt.store.prefix}st:s"
        saved = json.loads(server.get(key))
        server.set(key, json.dumps(saved, indent=1))  # the same state, other bytes: another version
        conflicts = metric(rt, "governor_shared_retries_total", reason="conflict")
        rounds = metric(rt, "governor_shared_rounds_total", step="model_call")
        batches = counters.pipeline.batches
        clock.t += 1
        admissions = await asyncio.wait_for(asyncio.gather(*(rt.admit("s", call()) for _ in range(4))), 20)
        assert all(not a.decision.blocks and a.ticket.reservation for a in admissions), [
            (a.decision.action, a.decision.cause, a.decision.details) for a in admissions]
        assert metric(rt, "governor_shared_retries_total", reason="conflict") - conflicts == 4  # once each
        assert metric(rt, "governor_shared_rounds_total", step="model_call") == rounds == 0  # none left the path
        assert metric(rt, "governor_shared_retries_total", reason="fallback") == 0
        assert counters.pipeline.batches - batches == 2  # the four conflicting, then the four chained
        after = json.loads(server.get(key))
        assert after["in_flight"] == 4 and after["iterations"] == saved["iterations"] + 4
        for admission in admissions:
            await rt.finish("s", admission.ticket)
        await rt.remote.drain()
        ticks = metric(rt, "governor_shared_rounds_total", step="tick")
        await rt.admit("s", Tick())  # the wall-clock's round, counted
        assert metric(rt, "governor_shared_rounds_total", step="tick") == ticks + 1
    finally:
        server.close()
        await rt.close(end_sessions=False)
        rt.store.close()
