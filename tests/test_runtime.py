"""The runtime: policy + SQLite store + durable journal, composed, on the bundled example passport."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from governor.runtime.prices import price_book
from governor.evidence import generate_key, recover_journal, verify_record
from governor.evidence.record import journal_path
from governor.passport import AdmissionConfig, admit, example_passport_path, load_passport
from governor.policy import (
    Action,
    ModelCall,
    PassportPresented,
    Tier,
    ToolCall,
    UsageReport,
    compile_limits,
    load_pricing,
)
from governor.policy.steps import ON_BUDGET_EXHAUSTED, ON_GOVERNOR_ERROR, ON_OVERSIGHT_TIMEOUT, ON_SESSION_INTEGRITY
from governor.runtime.core import Runtime
from governor.store import Reservation, SQLiteStore, StoreIntegrityError, StoreUnavailable, WriteBehindStore

REPO = Path(__file__).resolve().parent.parent
NOW = 1_796_000_000.0  # 2026-11-30: inside the example passport's validity, after its issued_at


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def pinned():
    report = admit(load_passport(example_passport_path()), AdmissionConfig(now=NOW))
    assert report.verified, report.to_dict()
    return report


def metric(rt: Runtime, name: str, **labels: str) -> float | None:
    """One sample of the runtime's exposition (None: not exported)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(rt.metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def make_runtime(pinned, data_dir: Path, clock: Clock, tier: Tier = Tier.R2, store=None, key=None) -> Runtime:
    limits = compile_limits(pinned.pinned.document, tier=tier, pricing=price_book(),
                            passport_digest=pinned.digest)
    return Runtime(limits=limits, store=store or SQLiteStore(data_dir / "state.db"), data_dir=data_dir,
                   key=key or generate_key(), governor_id="did:web:localhost:governor",
                   agent_id=pinned.pinned.id, clock=clock)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def runtime(pinned, tmp_path, clock):
    rt = make_runtime(pinned, tmp_path, clock)
    yield rt
    rt.store.close()


async def model_step(rt: Runtime, session: str, tokens_in: int, tokens_out: int, expected_out: int = 1000):
    admission = await rt.admit(session, ModelCall(model="gpt-4o-mini", expected_input_tokens=tokens_in,
                                                  expected_output_tokens=expected_out))
    if admission.decision.blocks:
        return admission
    await rt.usage(session, admission.ticket, UsageReport(model="gpt-4o-mini", input_tokens=tokens_in,
                                                          output_tokens=tokens_out))
    await rt.finish(session, admission.ticket)
    return admission


async def test_budget_exhaustion_halts_records_and_refuses_everything_after(runtime, clock):
    # tokens per_session cap is 20000; each step reserves 3000 and uses 2500
    blocked = None
    for i in range(20):
        clock.t += 1
        admission = await model_step(runtime, "s", 2000, 500, expected_out=1000)
        if admission.decision.blocks:
            blocked = admission
            break
    assert blocked is not None
    assert metric(runtime, "governor_sessions", state="halted") == 1
    assert metric(runtime, "governor_sessions", state="active") == 0
    # max_iterations (12) is declared with a fallback; tokens run out first: 8 x 2500 = 20000
    obj = blocked.governor_object
    assert obj["cause"] == ON_BUDGET_EXHAUSTED and obj["action"] == "halt"
    assert obj["dimension"] == "tokens" and obj["scope"] == "per_session" and obj["limit"] == 20000
    view = await runtime.session_view("s")
    used = {(b["dimension"], b["scope"], b["persona"]): b["used"] for b in view["budgets"]}
    assert used[("tokens", "per_session", None)] == 2500 * i  # actual usage replaced the reservations
    after = await runtime.admit("s", ToolCall(tool="search_papers", arguments={"query": "x"}))
    assert after.decision.halts and after.governor_object["cause"] == ON_BUDGET_EXHAUSTED
    record = await runtime.end_session("s")
    assert record["outcome"] == "halted"
    assert metric(runtime, "governor_sessions", state="ended") == 1
    assert metric(runtime, "governor_sessions", state="halted") == 0
    # the warning at 80% of the cap is recorded once, then the boundary (#32 item 7)
    assert [e["cause"] for e in record["events"]] == ["on_governor_budget_warning", ON_BUDGET_EXHAUSTED]
    assert record["events"][0]["detail"]["dimension"] == "tokens" and record["events"][0]["detail"]["fraction"] >= 0.8
    assert verify_record(record, public_key=runtime.key.public_key()).ok


async def test_requires_confirmation_pauses_and_approval_releases_only_that_step(runtime, clock):
    step = ToolCall(tool="delete_note", arguments={"path": "/workspace/notes/old.md"})
    admission = await runtime.admit("s", step)
    assert admission.decision.action is Action.PAUSE and admission.decision.blocks
    approval_id = admission.decision.approval.id
    assert [a["id"] for a in runtime.approvals()] == [approval_id]
    waiter = asyncio.create_task(runtime.await_approval("s", approval_id))
    await asyncio.sleep(0)
    assert metric(runtime, "governor_sessions", state="paused") == 1
    assert runtime.metrics.oldest_pending_at == clock.t  # the age gauge reads it against the wall clock
    clock.t += 42  # the reviewer takes 42 s
    answer = await runtime.resolve_approval(approval_id, True, "lab-lead")
    assert metric(runtime, "governor_approvals_total", outcome="approved") == 1
    assert metric(runtime, "governor_approval_wait_seconds_sum", outcome="approved") == 42
    assert metric(runtime, "governor_approval_wait_seconds_bucket", outcome="approved", le="30.0") == 0
    assert metric(runtime, "governor_approval_wait_seconds_bucket", outcome="approved", le="60.0") == 1
    assert metric(runtime, "governor_sessions", state="active") == 1
    assert metric(runtime, "governor_pending_approval_oldest_age_seconds") == 0
    assert answer["outcome"] == "approved"
    released = await waiter
    assert not released.decision.blocks
    # the approval was used once: the same step again pauses afresh
    again = await runtime.admit("s", step)
    assert again.decision.action is Action.PAUSE and again.decision.approval.id != approval_id
    with pytest.raises(KeyError):
        await runtime.resolve_approval(approval_id, True, "lab-lead")
    record = runtime.record("s")
    reviews = [e for e in record["events"] if e.get("detail", {}).get("review") == "approved"]
    assert reviews and reviews[0]["detail"]["reviewer"] == "lab-lead" and reviews[0]["action"] == "pause"
    assert verify_record(record, public_key=runtime.key.public_key()).ok


async def test_rejected_step_is_denied_and_session_goes_on(runtime):
    admission = await runtime.admit("s", ToolCall(tool="send_email", arguments={"to": "a@b", "subject": "s", "body": "b"}))
    approval_id = admission.decision.approval.id
    waiter = asyncio.create_task(runtime.await_approval("s", approval_id))
    await asyncio.sleep(0)
    await runtime.resolve_approval(approval_id, False, "lab-lead")
    assert metric(runtime, "governor_approvals_total", outcome="rejected") == 1
    assert metric(runtime, "governor_approvals_total", outcome="approved") == 0
    answered = await waiter
    assert answered.decision.blocks and not answered.decision.halts
    ok = await runtime.admit("s", ToolCall(tool="search_papers", arguments={"query": "governance"}))
    assert not ok.decision.blocks


async def test_oversight_timeout_fails_closed_when_undeclared(runtime, clock):
    admission = await runtime.admit("s", ToolCall(tool="delete_note", arguments={"path": "/workspace/notes/x"}))
    clock.t += 15 * 60 + 1  # response_time_minutes: 15
    await runtime.sweep()
    assert runtime.approvals() == []
    assert metric(runtime, "governor_approvals_total", outcome="expired") == 1
    assert metric(runtime, "governor_approval_wait_seconds_sum", outcome="expired") == 15 * 60 + 1
    view = await runtime.session_view("s")
    assert view["state"] == "halted" and view["halt_cause"] == ON_OVERSIGHT_TIMEOUT
    assert metric(runtime, "governor_sessions", state="halted") == 1
    record = runtime.record("s")
    timeout = record["events"][-1]
    assert timeout["cause"] == ON_OVERSIGHT_TIMEOUT and timeout["action"] == "halt"
    assert timeout["detail"]["fail_closed"] is True
    assert admission.decision.approval.id == timeout["detail"]["approval_id"]


async def test_store_down_fails_closed_and_is_recorded(runtime):
    await model_step(runtime, "s", 100, 100)
    runtime.store.close()  # the state store is gone
    with pytest.raises(StoreUnavailable):
        runtime.store.snapshot("a", "s", NOW, ())
    admission = await runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10, expected_output_tokens=10))
    # refused as retryable, not halted: the session goes on once the store answers (issue #30)
    assert admission.decision.blocks and admission.decision.fail_closed and not admission.decision.halts
    assert admission.governor_object["cause"] == ON_GOVERNOR_ERROR
    assert admission.governor_object["retryable"] is True and admission.governor_object["retry_after"] == 1
    assert metric(runtime, "governor_store_errors_total") >= 1
    events = recover_journal(journal_path(runtime.data_dir, "s")).events
    assert events[-1]["cause"] == ON_GOVERNOR_ERROR and events[-1]["action"] == "fallback"  # not fail-open
    assert events[-1]["detail"]["refused_step"] == "not_executed"
    assert not runtime._sessions["s"].state.halted


async def test_a_store_that_lost_its_data_halts_the_session(runtime, monkeypatch):
    await model_step(runtime, "s", 10, 10)

    def lost(*args, **kwargs):
        raise StoreIntegrityError("the fence is gone")

    monkeypatch.setattr(runtime.store, "snapshot", lost)
    admission = await runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                   expected_output_tokens=10))
    assert admission.decision.halts and admission.decision.fail_closed
    assert "retryable" not in admission.governor_object
    assert runtime._sessions["s"].state.halted


async def test_passport_swap_is_a_session_integrity_fault(runtime, pinned):
    same = await runtime.admit("s", PassportPresented(pinned.digest))
    assert not same.decision.blocks
    swapped = await runtime.admit("s", PassportPresented("x" * 43))
    assert swapped.decision.halts and swapped.governor_object["cause"] == ON_SESSION_INTEGRITY
    assert swapped.decision.fail_closed  # the example passport declares nothing for it


async def test_restart_resumes_counters_state_and_journal(pinned, tmp_path, clock):
    key = generate_key()
    first = make_runtime(pinned, tmp_path, clock, key=key)
    for _ in range(3):
        clock.t += 1
        await model_step(first, "s", 1000, 1000)
    await first.admit("s", PassportPresented(pinned.digest))
    paused = await first.admit("s", ToolCall(tool="delete_note", arguments={"path": "/workspace/notes/a"}))
    assert paused.decision.action is Action.PAUSE
    await first.close(end_sessions=False)  # a crash would leave the same files
    first.store.close()

    second = make_runtime(pinned, tmp_path, clock, key=key)
    clock.t += 1
    await model_step(second, "s", 1000, 1000)
    view = await second.session_view("s")
    used = {(b["dimension"], b["scope"], b["persona"]): b["used"] for b in view["budgets"]}
    assert used[("tokens", "per_session", None)] == 8000 and used[("tokens", "per_day", None)] == 8000
    assert view["iterations"] == 4
    record = await second.end_session("s")
    assert verify_record(record, public_key=key.public_key()).ok
    assert record["events"][0]["action"] == "pause"  # the pause journaled before the restart
    second.store.close()


async def test_concurrent_steps_never_overshoot_a_cap(runtime):
    # 40 concurrent model calls, each reserving 1500 tokens, against a 20000-token session cap
    async def one(i):
        admission = await runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=500,
                                                       expected_output_tokens=1000))
        return admission

    admissions = await asyncio.gather(*(one(i) for i in range(40)))
    admitted = [a for a in admissions if not a.decision.blocks]
    # the session halts at the first exhaustion; whatever was admitted fits the cap
    assert 1500 * len(admitted) <= 20000
    view = await runtime.session_view("s")
    used = {(b["dimension"], b["scope"], b["persona"]): b["used"] for b in view["budgets"]}
    assert used[("tokens", "per_session", None)] <= 20000


async def test_record_is_bound_to_a_nonce(runtime):
    await model_step(runtime, "s", 10, 10)
    record = runtime.record("s", nonce="n-123")
    assert record["nonce"] == "n-123"
    assert verify_record(record, public_key=runtime.key.public_key(), expected_nonce="n-123").ok
    assert not verify_record(record, public_key=runtime.key.public_key(), expected_nonce="other").ok


async def test_r1_observes_and_never_blocks(pinned, tmp_path, clock):
    rt = make_runtime(pinned, tmp_path, clock, tier=Tier.R1)
    for _ in range(12):
        admission = await model_step(rt, "s", 2000, 2000)
        assert not admission.decision.blocks
    record = rt.record("s")
    assert record["tier"] == "R1"
    assert any(e["cause"] == ON_BUDGET_EXHAUSTED for e in record["events"])
    rt.store.close()


async def test_sweep_keeps_budget_gauges_current_and_ends_idle_sessions(runtime, clock):
    await model_step(runtime, "s", 1000, 500)
    await runtime.sweep()
    text = runtime.metrics.exposition().decode()
    assert f'passport_digest="{runtime.limits.passport_digest}"' in text and "governor_build_info{" in text
    assert "process_cpu_seconds_total" in text and "python_gc_collections_total" in text
    assert 'governor_budget_used_tokens{persona="",scope="per_session"} 1500.0' in text
    assert 'governor_budget_limit_tokens{persona="",scope="per_day"} 200000.0' in text
    assert "session=" not in text  # no series by session unless opted in
    runtime.session_idle_sec = 60
    for _ in range(61):  # a minute of sweeps with no traffic: the ticks are not activity
        clock.t += 1
        await runtime.sweep()
    assert (await runtime.session_view("s"))["state"] == "ended"
    assert (runtime.data_dir / "records" / "s.json").exists()
    # the ended session's values are dropped: no live session, no per_session maximum
    assert 'scope="per_session"} 1500.0' not in runtime.metrics.exposition().decode()


def test_the_refusal_reason_states_the_comparison_the_decision_made():
    from governor.adapters.refusals import describe
    from governor.policy import Decision
    from governor.runtime.api import governor_object

    decision = Decision(action=Action.HALT, cause=ON_BUDGET_EXHAUSTED, details={
        "dimension": "tokens", "scope": "per_session", "observed": 20000.0, "projected": 21096.0, "limit": 20000.0})
    obj = governor_object(decision, "s")
    assert obj["observed"] == 20000 and isinstance(obj["observed"], int) and obj["session"] == "s"
    assert "projected 21096 > limit 20000 (used 20000)" in describe(obj)


# --- a networked store (Redis) ----------------------------------------------------------


@pytest.fixture
def redis_server_process():
    from tests.redis_server import REDIS_SERVER, NOT_INSTALLED, RedisServer

    if REDIS_SERVER is None:
        pytest.skip(NOT_INSTALLED)
    server = RedisServer()
    yield server
    server.stop()


async def test_a_redis_store_enforces_budgets_and_never_stalls_the_event_loop(pinned, tmp_path, clock,
                                                                              redis_server_process):
    import os
    import signal
    import time

    from governor.store.redis import RedisStore

    rt = make_runtime(pinned, tmp_path, clock, store=RedisStore(redis_server_process.url, timeout=3.0))
    try:
        for _ in range(8):  # 8 x 2500 tokens: the 20000-token session cap
            clock.t += 1
            assert not (await model_step(rt, "s", 2000, 500, expected_out=500)).decision.blocks
        refused = await model_step(rt, "s", 2000, 500, expected_out=500)
        assert refused.decision.halts and refused.governor_object["cause"] == ON_BUDGET_EXHAUSTED

        # Redis freezes: an admission waits on it, but the loop keeps serving everything else
        # (both when a session is first opened and on every later step of an open one)
        await model_step(rt, "other", 10, 10)
        for session in ("other", "brand-new"):
            os.kill(redis_server_process.process.pid, signal.SIGSTOP)
            try:
                waiting = asyncio.create_task(rt.admit(session, ModelCall(
                    model="gpt-4o-mini", expected_input_tokens=10, expected_output_tokens=10)))
                sweeping = asyncio.create_task(rt.sweep())  # the sweeper's ticks and budget gauges too
                viewing = asyncio.create_task(rt.sessions())  # and the control plane's session views
                started = time.monotonic()
                ticks = 0
                while time.monotonic() - started < 0.5:
                    await asyncio.sleep(0.01)
                    ticks += 1
                assert not waiting.done() and not sweeping.done() and not viewing.done()
                assert ticks >= 20  # a blocked loop would have run none of these until Redis answered
            finally:
                os.kill(redis_server_process.process.pid, signal.SIGCONT)
            admitted = await asyncio.wait_for(waiting, 10)
            assert not admitted.decision.blocks
            await asyncio.wait_for(sweeping, 10)
            views = {view["session"]: view for view in await asyncio.wait_for(viewing, 10)}
            assert "store_error" not in views["other"]
            assert any(b["scope"] == "per_session" and b["used"] > 0 for b in views["other"]["budgets"])
    finally:
        await rt.close(end_sessions=False)
        rt.store.close()


async def test_a_final_usage_report_ends_its_call_in_the_same_step(runtime):
    admission = await runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                   expected_output_tokens=10))
    live = runtime._sessions["s"]
    assert live.state.in_flight == 1
    seq = live.state.seq
    await runtime.usage("s", admission.ticket, UsageReport(model="gpt-4o-mini", input_tokens=10, output_tokens=5))
    assert live.state.in_flight == 0 and live.state.seq == seq + 1  # one step: settled and freed
    await runtime.finish("s", admission.ticket)
    assert live.state.in_flight == 0 and live.state.seq == seq + 1  # nothing left to release


async def test_a_final_usage_that_cannot_be_recorded_still_frees_its_slot(runtime, monkeypatch):
    admission = await runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                   expected_output_tokens=10))
    live = runtime._sessions["s"]

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(live.journal, "append", broken)
    # far past the session's token cap: the decision has an event to record, and cannot
    decision = await runtime.usage("s", admission.ticket, UsageReport(model="gpt-4o-mini", input_tokens=10,
                                                                      output_tokens=50_000))
    assert decision.halts and decision.fail_closed
    assert live.state.in_flight == 0


@contextlib.contextmanager
def quick_and_full(pinned, tmp_path: Path, clock: Clock, shortcut: str, backend: str = "sqlite"):
    """Two runtimes alike, but the second never takes `shortcut` (a LocalSteps method that
    decides a step at once, answering None when it does not: admit, settle); `backend` "write-behind": on
    the store `governor run` uses by default (its own reserve_within), else SQLite's."""
    (tmp_path / "quick").mkdir()
    (tmp_path / "full").mkdir()

    def store(where: Path) -> Any:
        return WriteBehindStore(where / "state.db") if backend == "write-behind" else None

    quick = make_runtime(pinned, tmp_path / "quick", clock, store=store(tmp_path / "quick"))
    full = make_runtime(pinned, tmp_path / "full", clock, store=store(tmp_path / "full"))
    setattr(full.local, shortcut, lambda *args: None)
    try:
        yield quick, full
    finally:
        quick.store.close()
        full.store.close()


def full_rounds(rt: Runtime) -> list[str]:
    """The steps `rt` decides by the full round from now on, by type name."""
    rounds: list[str] = []
    apply = rt._apply

    async def counted(live, step, ticket):
        rounds.append(type(step).__name__)
        return await apply(live, step, ticket)

    rt._apply = counted
    return rounds


# A model call admitted with 10 + 10 expected tokens reserves exactly that: reports within it
# are settled at once (LocalSteps.settle), the others by the full round.
@pytest.mark.parametrize("used_in, used_out, cached, at_once", [
    (10, 5, 0, True), (10, 10, 0, True), (10, 10, 4, True), (0, 0, 0, True),
    (11, 10, 0, False), (10, 11, 0, False), (5_000, 50_000, 0, False),
])
async def test_settling_a_model_call_at_once_is_the_full_round(pinned, tmp_path, clock, used_in, used_out, cached,
                                                               at_once):
    """Same decision, session state and counters whether a final report is settled at once or
    by the full round under the lock; and only reports within their reservation go at once."""
    outcomes = []
    with quick_and_full(pinned, tmp_path, clock, "settle") as (quick, full):
        for rt in (quick, full):
            await model_step(rt, "s", 100, 80)  # some usage first: the counters are not empty
            if rt is quick:
                rounds = full_rounds(quick)
            admission = await rt.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                      expected_output_tokens=10))
            report = UsageReport(model="gpt-4o-mini", input_tokens=used_in, output_tokens=used_out,
                                 cached_input_tokens=cached)
            decision = await rt.usage("s", admission.ticket, report)
            await rt.finish("s", admission.ticket)
            live = rt._sessions["s"]
            outcomes.append((decision, replace(live.state, counters={}), live.last_activity,
                             rt.store.snapshot(rt.agent_id, "s", clock.t), admission.ticket.in_flight,
                             admission.ticket.reservation))
        assert outcomes[0] == outcomes[1]
        assert ("UsageReport" not in rounds) == at_once


# After some usage (180 tokens of the session's 20,000, warned at 16,000), a model call that
# fires nothing is admitted at once (LocalSteps.admit); one that warns or is refused
# goes through the full round.
@pytest.mark.parametrize("backend", ["sqlite", "write-behind"])
@pytest.mark.parametrize("expected_in, expected_out, at_once", [
    (10, 10, True), (1_000, 14_000, True), (1_000, 15_000, False), (1_000, 19_000, False),
])
async def test_admitting_a_model_call_at_once_is_the_full_round(pinned, tmp_path, clock, expected_in, expected_out,
                                                                at_once, backend):
    """Same decision, session state, counters and ticket whether a model call is admitted at
    once or by the full round under the lock; and only a call that fires nothing goes at once."""
    outcomes, counters = [], []
    with quick_and_full(pinned, tmp_path, clock, "admit", backend) as (quick, full):
        for rt in (quick, full):
            clock.t = NOW
            await model_step(rt, "s", 100, 80)  # some usage first: the counters are not empty
            if rt is quick:
                rounds = full_rounds(quick)
            clock.t = NOW + 5  # the session's activity moves on
            admission = await rt.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=expected_in,
                                                      expected_output_tokens=expected_out))
            live = rt._sessions["s"]
            ticket = admission.ticket
            outcomes.append((admission.decision, admission.governor_object, replace(live.state, counters={}),
                             live.last_activity,
                             None if ticket is None else (ticket.kind, ticket.charges, ticket.in_flight,
                                                          ticket.reservation is not None)))
            counters.append((live.state.counters, rt.store.snapshot(rt.agent_id, "s", clock.t)))
        assert outcomes[0] == outcomes[1]
        # the same counters; a call that is not admitted at once reserved its charges with the
        # counters' read and released them (Store.reserve_within): x + c - c may differ from x
        # in the last bits of a float, as settling a reservation at a different amount does
        for quick_counters, full_counters in zip(*counters):
            assert quick_counters == pytest.approx(full_counters, rel=1e-12, abs=1e-15)
        if at_once:
            assert counters[0] == counters[1]
        assert ("ModelCall" not in rounds) == at_once


async def test_a_model_call_waits_for_a_step_that_holds_the_session(runtime):
    """A step holding the session's lock may be between deciding and advancing: a model
    call is not admitted past it (its state change would be lost)."""
    await model_step(runtime, "s", 10, 10)
    live = runtime._sessions["s"]
    await live.lock.acquire()
    admitting = asyncio.create_task(runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                                 expected_output_tokens=10)))
    await asyncio.sleep(0.01)
    assert not admitting.done() and live.state.in_flight == 0
    live.lock.release()
    admission = await admitting
    assert not admission.decision.blocks and live.state.in_flight == 1 and live.state.iterations == 2


async def test_a_store_down_at_admission_is_decided_in_full_and_fails_closed(runtime, monkeypatch):
    await model_step(runtime, "s", 10, 10)

    def down(*args, **kwargs):
        raise StoreUnavailable("state store down")

    monkeypatch.setattr(runtime.store, "snapshot", down)
    admission = await runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                   expected_output_tokens=10))
    assert admission.decision.blocks and admission.decision.fail_closed and not admission.decision.halts
    assert admission.decision.cause == ON_GOVERNOR_ERROR and admission.ticket is None
    assert runtime._sessions["s"].state.in_flight == 0
    events = recover_journal(journal_path(runtime.data_dir, "s")).events
    assert events[-1]["cause"] == ON_GOVERNOR_ERROR


async def test_a_reservation_refused_at_once_is_decided_again_in_full(runtime, monkeypatch):
    """A store shared with other replicas may refuse what the snapshot allowed: the full
    round then decides again on fresh counters (here, the same ones: admitted)."""
    await model_step(runtime, "s", 10, 10)
    reserve, answers = runtime.store.reserve, []

    def refused_once(*args, **kwargs):
        if not answers:
            answers.append("refused")
            return Reservation(id=None, ok=False)
        answers.append("held")
        return reserve(*args, **kwargs)

    monkeypatch.setattr(runtime.store, "reserve", refused_once)
    admission = await runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                   expected_output_tokens=10))
    assert answers == ["refused", "held"]
    assert not admission.decision.blocks and admission.ticket.reservation is not None
    assert runtime._sessions["s"].state.in_flight == 1


@pytest.mark.parametrize("answer", ["refused", "down", "quiet but not at once"])
async def test_what_reserve_within_cannot_admit_is_decided_in_full(pinned, tmp_path, clock, monkeypatch, answer):
    """On the write-behind store (governor run's): a reservation refused with the counters'
    read (another replica's step got there first), a store that fails it, or a reservation
    made for a call the quick check then does not permit: the full round decides again and
    nothing stays held."""
    rt = make_runtime(pinned, tmp_path, clock, store=WriteBehindStore(tmp_path / "state.db"))
    try:
        await model_step(rt, "s", 10, 10)
        own, calls = rt.store.reserve_within, []

        def once(*args, **kwargs):
            calls.append(answer)
            if answer == "refused":
                return {}, Reservation(id=None, ok=False)
            if answer == "down":
                raise StoreUnavailable("state store down")
            return own(*args, **kwargs)

        monkeypatch.setattr(rt.store, "reserve_within", once)
        if answer == "quiet but not at once":  # e.g. a warning level crossed: decide() records it
            monkeypatch.setattr("governor.runtime.local_steps.quiet_model_call", lambda *args: None)
        rounds = full_rounds(rt)
        admission = await rt.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                  expected_output_tokens=10))
        assert calls == [answer] and rounds == ["ModelCall"]
        assert not admission.decision.blocks and admission.ticket.reservation is not None
        live = rt._sessions["s"]
        assert live.state.in_flight == 1
        # only the full round's reservation is held: the usage of one step of 10+10 expected
        assert [held.totals for held in rt.store._held.values()] == [
            {(c.scope, c.persona, c.dimension): float(c.amount) for c in admission.ticket.charges}]
    finally:
        rt.store.close()


async def test_a_report_waits_for_a_step_that_holds_the_session(runtime):
    """A step holding the session's lock may be between deciding and advancing (awaiting its
    journal): a report within its reservation is not settled past it."""
    admission = await runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                   expected_output_tokens=10))
    live = runtime._sessions["s"]
    await live.lock.acquire()
    report = UsageReport(model="gpt-4o-mini", input_tokens=10, output_tokens=5)
    settling = asyncio.create_task(runtime.usage("s", admission.ticket, report))
    await asyncio.sleep(0.01)
    assert not settling.done() and live.state.in_flight == 1
    live.lock.release()
    decision = await settling
    assert not decision.blocks and decision.settles and live.state.in_flight == 0


async def test_a_commit_that_fails_at_once_is_decided_in_full_and_fails_closed(runtime, monkeypatch):
    admission = await runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                   expected_output_tokens=10))

    def down(*args, **kwargs):
        raise StoreUnavailable("state store down")

    monkeypatch.setattr(runtime.store, "commit", down)
    decision = await runtime.usage("s", admission.ticket, UsageReport(model="gpt-4o-mini", input_tokens=10,
                                                                      output_tokens=5))
    assert decision.blocks and decision.fail_closed and decision.cause == ON_GOVERNOR_ERROR
    assert not decision.halts and admission.ticket.reservation is None  # left counting, never released
    assert runtime._sessions["s"].state.in_flight == 0
    events = recover_journal(journal_path(runtime.data_dir, "s")).events
    assert events[-1]["cause"] == ON_GOVERNOR_ERROR


async def test_an_error_while_settling_at_once_is_decided_in_full(runtime, monkeypatch):
    """settlement() raising (a broken pricing table, say) must not escape usage(): the full
    round decides, and decide() turns the error into a recorded on_governor_error."""
    admission = await runtime.admit("s", ModelCall(model="gpt-4o-mini", expected_input_tokens=10,
                                                   expected_output_tokens=10))

    def broken(*args, **kwargs):
        raise ZeroDivisionError("pricing table broke")

    monkeypatch.setattr(type(runtime.limits.pricing), "cost", broken)  # slots: on the class, for this test
    decision = await runtime.usage("s", admission.ticket, UsageReport(model="gpt-4o-mini", input_tokens=10,
                                                                      output_tokens=5))
    assert decision.blocks and decision.cause == ON_GOVERNOR_ERROR
    events = recover_journal(journal_path(runtime.data_dir, "s")).events
    assert events[-1]["cause"] == ON_GOVERNOR_ERROR
